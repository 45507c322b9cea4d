"""Open MPI's system parameter file, openmpi-mca-params.conf, owned whole
by nictune (host.mpi; the rules all owned files share are in
knobs/envfile.py).

Where Open MPI reads it.  opal/mca/base/mca_base_var.c
mca_base_var_cache_files: $HOME/.openmpi/mca-params.conf, then
$(sysconfdir)/openmpi-mca-params.conf (unless OPAL_SYS_PARAMS_GIVEN);
OMPI_MCA_* environment variables and mpirun --mca beat both.  Open MPI's
own build puts it in $prefix/etc (docs/installing-open-mpi/sysadmins.rst);
Debian's and Ubuntu's openmpi packages configure --sysconfdir=/etc/openmpi,
so host.mpi.path defaults to /etc/openmpi/openmpi-mca-params.conf.  Those
packages ship the file with settings of their own: it is someone else's
file, replaced only with adopt: true.

Syntax.  opal/util/keyval/keyval_lex.l and keyval_parse.c parse_line:
`name = value`, blanks around '=' and at the end of the value dropped, the
value the rest of the line; '#' and '//' lines and /* */ blocks are
comments; names are MCA parameter names without the OMPI_MCA_ prefix the
environment uses.  A later line for the same name replaces the earlier
value (mca_base_parse_paramfile.c save_value).  parse() does the same and
keys any line it does not read as `name = value` (a "-mca name value"
line, say) by its line, so such a file never equals a profile.  nictune
writes `name=value` lines (keyval_lex.l reads them as `name = value`): with
names that are shell identifiers (validate.MCA_NAME) and values a shell
takes literally (NCCL_VALUE: Open MPI keeps quotes, so it cannot quote),
a shell that sources the file only assigns, where `name = value` would
run the command `name`.  mca_base_env_list with several variables needs
a separator other than ';' (mca_base_env_list_sep).

Traffic classes: Open MPI's RDMA traffic goes through UCX (pml ucx), which
reads host.ucx; `mca_base_env_list` here can forward UCX_* variables to
remote ranks as well.
"""

from __future__ import annotations

from typing import Dict

from nictune.host.knobs.envfile import OwnedFileFamily, Syntax
from nictune.host.validate import MCA_NAME, NCCL_VALUE

DEFAULT_PATH = "/etc/openmpi/openmpi-mca-params.conf"
# keyval_lex.l WHITE and CHAR.
_WHITE = " \t\f\v"
_CHAR = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")


class McaSyntax(Syntax):
    what = "Open MPI MCA parameter"
    family = "mpi"
    name_pattern = MCA_NAME
    value_pattern = NCCL_VALUE  # what Open MPI and a shell both take literally

    def line(self, name: str, text: str) -> str:
        return f"{name}={text}\n"

    def parse(self, text: str) -> Dict[str, str]:
        """The parameters Open MPI takes from the file (keyval_parse.c)."""
        params: dict = {}
        in_comment = False
        for number, line in enumerate(text.split("\n"), 1):
            stripped = line.strip(_WHITE)
            if in_comment:
                in_comment = "*/" not in stripped
                continue
            if not stripped or stripped.startswith(("#", "//")):
                continue
            if stripped.startswith("/*"):
                in_comment = "*/" not in stripped[2:]
                continue
            name, equal, value = stripped.partition("=")
            name = name.rstrip(_WHITE)
            if equal and name and set(name) <= _CHAR:
                params[name] = value.strip(_WHITE)
            else:
                params[f"(line {number}, not name = value)"] = stripped
        return params


class MpiFamily(OwnedFileFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
host:
  mpi:
    params: {btl: ^openib, pml: ucx}
"""
    name = "mpi"
    position = 18
    host_sections = ("mpi",)
    settings = ("mpi.path", "mpi.params", "mpi.adopt", "mpi.allowed_dirs")
    section = "mpi"
    values_key = "params"
    default_path = DEFAULT_PATH
    syntax = McaSyntax()
    title = ("Open MPI's system MCA parameter file, openmpi-mca-params.conf (OMPI_MCA_* "
             "variables and mpirun --mca override it).")
    values_description = ("MCA parameters by the names the file uses (pml, btl_tcp_if_include...), "
                          "without the OMPI_MCA_ prefix; true and false are written as 1 and 0.")
