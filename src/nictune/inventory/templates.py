"""Which inventory and play values Ansible would render as Jinja templates.

nictune renders no template: a value Ansible would render is refused
rather than used as the text it was written as (an NCCL_SOCKET_IFNAME of
"={{ rail_if }}" must not reach /etc/nccl.conf).  A string is a template
exactly when ansible-core 2.19's is_possibly_template says so: it holds a
block, variable or comment start ("{%", "{{", "{#") or begins with the
"#jinja2:" overrides header.  A `!unsafe` string (Unsafe, below)
is never rendered, so it never counts.  Keys are not rendered by Ansible,
so only values are looked at.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

# ansible/_internal/_templating/_jinja_bits.py: JINJA2_OVERRIDE and the
# default block, variable and comment start strings.
OVERRIDES_HEADER = "#jinja2:"
START_STRINGS = ("{%", "{{", "{#")
NOT_RENDERED = "is a Jinja template, which nictune does not render"


class Unsafe(str):
    """A `!unsafe` string: Ansible never templates it (kept here, beside the
    rule it changes; inventory/model.py and the readers import it from here)."""


def is_template(value: Any) -> bool:
    """True for a string Ansible would render as a template when the variable is used."""
    if not isinstance(value, str):
        return False
    if type(value) is not str:
        if isinstance(value, Unsafe):
            return False
    return "{" in value and any(start in value for start in START_STRINGS) or value.startswith(OVERRIDES_HEADER)


def first_template(value: Any) -> Optional[Tuple[tuple, str]]:
    """(key path, text) of the first templated string in a value, walking
    mappings and lists in order; None when Ansible would render nothing."""
    todo = [((), value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, dict):
            todo += reversed([(path + (key,), child) for key, child in item.items()])
        elif isinstance(item, list):
            todo += reversed([(path + (index,), child) for index, child in enumerate(item)])
        elif is_template(item):
            return path, item
    return None
