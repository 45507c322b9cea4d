"""Which inventory host names nictune takes: the names reach argv lists.

A play's hooks and a gate's nccl-tests launcher put host names into the
commands they run on the controller ({host}, {hosts}: the batch's names
joined by ","), so a name must stay one argument meaning one host: it
must not start with "-" (a program would read it as an option:
`ssh -oProxyCommand=...` runs a command), nor hold "," (it would add
hosts to `nodename={hosts}` or `mpirun -H {hosts}`), blanks or control
and format characters (invisible, or a second word to whatever splits
the argument again).  Ansible takes such names; nictune refuses them when
the inventory loads, naming the file and line.
"""

from __future__ import annotations

import unicodedata
from typing import Optional

from .errors import shown

RULE = "nictune refuses host names that start with '-' or hold ',', blanks or control characters"
# Cc control, Cf format (zero-width, bidi overrides), Zs/Zl/Zp separators.
_HIDDEN = ("Cc", "Cf", "Zs", "Zl", "Zp")


def host_name_problem(name: str) -> Optional[str]:
    """Why a host name cannot reach a command line, or None when it can."""
    if name.startswith("-"):
        return f"host name {shown(name)} starts with '-', so a hook or launcher would pass it as an option"
    if "," in name:
        return f"host name {shown(name)} holds ',', so {{hosts}} in a hook or launcher would read it as several hosts"
    for char in name:
        if char.isspace() or unicodedata.category(char) in _HIDDEN:
            what = "a blank" if char.isspace() else "a control character"
            return f"host name {shown(name)} holds {what} (U+{ord(char):04X})"
    return None
