"""Profiles: YAML files of wanted NIC settings, with extends and a JSON Schema.

Controller side: may import anything; the host side never imports this.
"""

from .errors import ProfileError
from .loader import Profile, load_profile, load_profile_text
from .schema import SCHEMA, schema_json

__all__ = ["SCHEMA", "Profile", "ProfileError", "load_profile", "load_profile_text", "schema_json"]
