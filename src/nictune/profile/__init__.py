"""Profiles: YAML files of wanted NIC settings, with extends and a JSON Schema.

Controller side: may import anything; the host side never imports this.

Only ProfileError is imported eagerly.  Everything else is loaded on first
use (PEP 562), so that code which needs just the error type or yamlpos
(rollback, show, inventories) does not pay for the loader and jsonschema.
"""

from importlib import import_module

from .errors import ProfileError

# name -> submodule that defines it
_LAZY = {
    "Profile": "loader",
    "load_profile": "loader",
    "load_profile_text": "loader",
    "SCHEMA": "schema",
    "schema_json": "schema",
}

__all__ = ["SCHEMA", "Profile", "ProfileError", "load_profile", "load_profile_text", "schema_json"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        # AttributeError lets `from nictune.profile import check` fall back
        # to importing the submodule.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
