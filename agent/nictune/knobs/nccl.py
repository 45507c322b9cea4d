"""The NCCL configuration file, owned whole by nictune.

NCCL reads NAME=VALUE lines, splits at the first '=' and trims nothing, so
the file is rendered exactly, written atomically, and compared as text.
"""

from __future__ import annotations

import os

from nictune.files import write_atomic
from nictune.knobs.base import Family
from nictune.model import HOST, Desired, Key, Unsupported, Want
from nictune.validate import NCCL_NAME, NCCL_VALUE, check, check_path

DEFAULT_PATH = "/etc/nccl.conf"
HEADER = "# Managed by nictune: edit the profile, not this file.\n"


def render(env: dict) -> str:
    lines = [HEADER]
    for name, value in env.items():
        check(NCCL_NAME, name, "NCCL variable name")
        if isinstance(value, bool):
            value = int(value)
        text = check(NCCL_VALUE, str(value), f"value of {name}")
        lines.append(f"{name}={text}\n")
    return "".join(lines)


def parse(text: str) -> dict:
    env = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            env[name] = value
    return env


class NcclFamily(Family):
    name = "nccl"
    host_sections = ("nccl",)

    def expand(self, target, sections, source):
        section = sections.get("nccl")
        if not section:
            return []
        path = check_path(section.get("path", DEFAULT_PATH), "NCCL config path")
        text = render(section.get("env", {}))
        return [Desired(Key(self.name, HOST, path), Want(text), source("nccl"))]

    def _file(self, key: Key) -> str:
        return self.host.path(check_path(key.name).lstrip("/"))

    def read(self, keys):
        out = {}
        for key in keys:
            path = self._file(key)
            try:
                with open(path) as f:
                    out[key] = f.read()
            except FileNotFoundError:
                parent = os.path.dirname(path)
                out[key] = None if os.path.isdir(parent) else Unsupported(
                    f"directory {os.path.dirname(key.name)} does not exist")
            except (OSError, UnicodeDecodeError) as e:
                out[key] = Unsupported(f"cannot read: {e}")
        return out

    def apply(self, items):
        for key, text in items:
            path = self._file(key)
            if text is None:  # reverting to "there was no file"
                if os.path.lexists(path):
                    os.unlink(path)
            else:
                write_atomic(path, text, 0o644, busy_in_place=True)

    def show(self, target):
        if target != HOST:
            return {}
        key = Key(self.name, HOST, DEFAULT_PATH)
        text = self.read([key])[key]
        if not isinstance(text, str) or not parse(text):
            return {}  # no file, or nothing NCCL would read from it
        return {"nccl": {"path": DEFAULT_PATH, "env": parse(text)}}

