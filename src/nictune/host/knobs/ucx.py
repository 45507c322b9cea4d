"""UCX's configuration file, ucx.conf, owned whole by nictune (host.ucx;
the rules all owned files share are in knobs/envfile.py).

UCX users (Open MPI's pml ucx, OpenSHMEM, NIXL) take their traffic class
from UCX_IB_TRAFFIC_CLASS (src/uct/ib/base/ib_iface.c "TRAFFIC_CLASS"),
never from NCCL_IB_TC.  Its default, auto, is 106 on a RoCE v2 GID
(UCT_IB_DEFAULT_ROCEV2_DSCP, ib_device.h: DSCP 26 with ECT(0)) and 0
otherwise (ib_iface.c, the iface's init).  So without the file UCX already
rides 106 on RoCE v2, the class the shipped profiles make lossless; the
file matters where the fabric's lossless class is another one, and to pin
the value against a site's or an image's ucx.conf.  Inside a container UCX
reads the image's own ucx.conf (NGC images carry HPC-X under /opt/hpcx),
never the host's: host.enroot_environ (knobs/jobenv.py) carries UCX_
variables there, and the environment beats every ucx.conf.

Where UCX reads it.  src/ucs/config/parser.c ucs_config_parse_config_files:
$(sysconfdir)/ucx/ucx.conf (UCX_CONFIG_DIR, set by configure: /etc/ucx
for distribution packages, ucx.spec.in's %{_sysconfdir}/ucx/ucx.conf),
then <libdir>/../etc/ucx/ucx.conf, $HOME/ucx.conf, $UCX_CONFIG_DIR/ucx.conf
and ./ucx.conf, each overriding the ones before; an environment variable
beats them all (ucs_config_apply_config_vars).  host.ucx.path defaults to
/etc/ucx/ucx.conf; an HPC-X or site build under /opt reads
<prefix>/etc/ucx/ucx.conf, which the profile names with allowed_dirs.

Syntax.  The file is parsed by inih (src/ucs/config/ini.c ini_parse_stream,
options in ini.h): NAME=VALUE or NAME:VALUE, blanks around both trimmed,
';' and '#' lines are comments, ';' after a blank starts a comment, a line
that starts with a blank continues the previous value, lines are read in
199-byte pieces (INI_MAX_LINE 200), and a later NAME overrides an earlier
one (ucs_config_parse_config_file_line, override).  Since UCX 1.17 a
[section] holds settings that apply only where its "CPU vendor", "CPU
model" or "Product name" lines match this machine
(ucs_config_parse_check_filter), and UCX's own ucx.conf ships such
sections (config/ucx.conf: Grace Hopper, Vera Rubin, Fujitsu ARM).
parse() keys a sectioned setting by "[section] NAME", so a file with
sections never equals a profile (which cannot say them): UCX's shipped
file is someone else's file, replaced only with adopt: true, and that
drops its platform sections, which the plan says.  nictune writes
UCX_NAME=VALUE lines with no section, each under 199 bytes, with values
that inih and a shell alike take literally (validate.UCX_VALUE: no blanks,
';', '#', quotes or other shell metacharacters).

`auto`.  UCX_NET_DEVICES: auto becomes this host's RoCE ports as
dev:port,dev:port, and UCX_IB_GID_INDEX: auto their common RoCE v2 IPv4
GID index, resolved on the host as NCCL's are (nccl.auto_as).  UCX reads
the word "auto" itself for UCX_IB_GID_INDEX (ib_md.c "GID_INDEX", its
default): to leave the choice to UCX, leave the variable out.
"""

from __future__ import annotations

from typing import Dict

from nictune.host.errors import InvalidInput
from nictune.host.facts import ibauto
from nictune.host.knobs.envfile import OwnedFileFamily, Syntax, auto_schema
from nictune.host.knobs.nccl import auto_as
from nictune.host.validate import UCX_NAME, UCX_VALUE

DEFAULT_PATH = "/etc/ucx/ucx.conf"
# ini.h INI_MAX_LINE: fgets reads 199 bytes of a line at a time.
MAX_LINE = 199
_BLANKS = " \t\n\v\f\r"  # C isspace


def _cut_comment(text: str) -> str:
    """text up to a ';' that follows a blank (ini.c find_chars_or_comment)."""
    for i in range(1, len(text)):
        if text[i] == ";" and text[i - 1] in _BLANKS:
            return text[:i]
    return text


class UcxSyntax(Syntax):
    what = "UCX variable"
    family = "ucx"
    name_pattern = UCX_NAME
    value_pattern = UCX_VALUE

    def line(self, name: str, text: str) -> str:
        line = f"{name}={text}\n"
        if len(line.encode()) > MAX_LINE:
            raise InvalidInput(f"invalid value of {name}: UCX reads lines of at most {MAX_LINE} "
                               f"bytes, and {name}={text[:20]}... is {len(line.encode())}")
        return line

    def parse(self, text: str) -> Dict[str, str]:
        """The settings UCX takes from the file (ini.c ini_parse_stream with
        UCX's ini.h options; parser.c keeps the last of a name)."""
        env: dict = {}
        section = previous = ""
        for number, line in enumerate(text.split("\n")):
            if number == 0 and line.startswith("\ufeff"):
                line = line[1:]
            stripped = line.strip(_BLANKS)
            if not stripped or stripped[0] in ";#":
                continue
            if previous and line[0] in _BLANKS:  # continues the previous value
                env[self._name(section, previous)] = stripped
            elif stripped[0] == "[":
                inside = _cut_comment(stripped[1:])
                if "]" in inside:
                    section, previous = inside[:inside.index("]")], ""
            else:
                head = _cut_comment(stripped)
                cut = min((head.find(c) for c in "=:" if c in head), default=-1)
                if cut >= 0:
                    name = head[:cut].rstrip(_BLANKS)
                    env[self._name(section, name)] = _cut_comment(stripped[cut + 1:]).strip(_BLANKS)
                    previous = name
        return env

    @staticmethod
    def _name(section: str, name: str) -> str:
        # What applies only on some platforms is not the same setting.
        return f"[{section}] {name}" if section else name


class UcxFamily(OwnedFileFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
host:
  ucx:
    env: {UCX_IB_TRAFFIC_CLASS: 106, UCX_NET_DEVICES: auto}
"""
    name = "ucx"
    position = 17
    host_sections = ("ucx",)
    settings = ("ucx.path", "ucx.env", "ucx.env.UCX_NET_DEVICES", "ucx.env.UCX_IB_GID_INDEX",
                "ucx.adopt", "ucx.allowed_dirs")
    section = "ucx"
    default_path = DEFAULT_PATH
    syntax = UcxSyntax()
    title = ("UCX's configuration file, ucx.conf (UCX reads $(sysconfdir)/ucx/ucx.conf, then "
             "$UCX_CONFIG_DIR/ucx.conf; the environment wins).")
    values_description = "UCX variables such as UCX_IB_TRAFFIC_CLASS; true and false are written as 1 and 0."
    max_value_length = 128
    auto_properties = auto_schema("UCX_NET_DEVICES", "Devices UCX uses", "dev:port", UCX_VALUE, 128,
                                  "UCX_IB_GID_INDEX", 0, " (leave it out to let UCX choose)")

    def resolve(self, env):
        return auto_as(self, env, "UCX_NET_DEVICES", "UCX_IB_GID_INDEX")

    def note(self, key):
        said = super().note(key)
        text = self._text.get(key)
        if isinstance(text, str) and key not in self._foreign:
            # A written UCX_IB_GID_INDEX that no longer points at the RoCE v2
            # GID (an address came or went and the GID table moved): verify says why.
            stale = ibauto.gid_index_problem(self.host, self.syntax.parse(text),
                                             ibauto.interfaces_for_auto(self.profile_interfaces),
                                             "UCX_IB_GID_INDEX", "UCX_NET_DEVICES")
            said = "; ".join(s for s in (said, stale) if s)
        if key in self._foreign:
            # How many, not which: the section names are that file's content.
            count = len({n[:n.index("]")] for n in self.syntax.parse(self._text.get(key) or "")
                         if n.startswith("[")})
            if count:
                said = "; ".join(s for s in (said, f"it has {count} platform section(s) ([name] "
                                             "blocks, as UCX's own ucx.conf ships), which go with "
                                             "it if it is replaced") if s)
        return said
