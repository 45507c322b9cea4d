"""group_vars/ and host_vars/ next to an inventory, found as Ansible's host_group_vars plugin finds them.

For a group or host NAME, the first of NAME, NAME.yml, NAME.yaml, NAME.json
that exists is used; if it is a directory, every file below it whose name
has no extension or one of those extensions, in name order, descending into
sub-directories without a dot in their name, skipping hidden files and
backups (~).
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

from nictune.profile.errors import ProfileError
from nictune.profile.yamlpos import VAULT_HEADER, read_file

from .errors import InventoryError
from .model import Layer, Warn
from .yamlinv import read_vars_file

EXTENSIONS = (".yml", ".yaml", ".json")
BOM = "\ufeff"


def read_text(path: str, keep_bom: bool = False) -> str:
    """A file's text (UTF-8, at most 16 MiB, not vault-encrypted), or an InventoryError saying why not.
    keep_bom: a byte-order mark stays, as U+FEFF (Ansible's INI parser reads it as text)."""
    try:
        text = read_file(path, "utf-8" if keep_bom else "utf-8-sig")
    except ProfileError as e:
        raise InventoryError(e.file, e.line, e.message) from None
    if text.lstrip(BOM).startswith(VAULT_HEADER):
        # ansible-inventory decrypts vault files into its output (not !vault values in a file).
        raise InventoryError(path, 1, "is encrypted with Ansible Vault, which nictune does not decrypt: write "
                             "the inventory out decrypted with `ansible-inventory -i INVENTORY --list -y "
                             "--ask-vault-pass > FILE` and point -i at FILE")
    return text


class VarsDirs:
    """The variables files of one inventory directory, read once each."""

    def __init__(self, base: Optional[str], warn: Warn):
        self.warn = warn
        self.listing: Dict[str, Optional[set]] = {}
        self.cache: Dict[str, Optional[Layer]] = {}
        self.found: Dict[tuple, List[Layer]] = {}
        self.base = os.path.normpath(base) if base is not None else None

    def layers(self, kind: str, name: str) -> List[Layer]:
        """The variables files for group (kind "group_vars") or host ("host_vars") NAME, in load order."""
        key = (kind, name)
        if key not in self.found:
            self.found[key] = self._find(kind, name)
        return self.found[key]

    def _find(self, kind: str, name: str) -> List[Layer]:
        if self.base is None or not name or name in (".", "..") or "/" in name or "\0" in name:
            return []
        directory = os.path.join(self.base, kind)
        names = self._names(directory)
        if not names:
            return []
        for candidate in (name,) + tuple(name + ext for ext in EXTENSIONS):
            if candidate in names:
                path = os.path.join(directory, candidate)
                files = self._tree(path) if os.path.isdir(path) else [path]
                return [layer for layer in map(self._read, files) if layer is not None]
        return []

    def _names(self, directory: str) -> Optional[set]:
        if directory not in self.listing:
            names = None
            if os.path.isdir(directory):
                try:
                    names = set(os.listdir(directory))
                except OSError as e:
                    raise InventoryError(directory, None, f"cannot list it: {e.strerror}") from None
            elif os.path.exists(directory):
                self.warn((directory, None), "is not a directory; skipped")
            self.listing[directory] = names
        return self.listing[directory]

    def _tree(self, directory: str) -> List[str]:
        found = []
        try:
            entries = sorted(os.listdir(directory))
        except OSError as e:
            raise InventoryError(directory, None, f"cannot list it: {e.strerror}") from None
        for entry in entries:
            if entry.startswith(".") or entry.endswith("~"):
                continue
            ext = os.path.splitext(entry)[1]
            path = os.path.join(directory, entry)
            if os.path.isdir(path) and not ext:
                found += self._tree(path)
            elif os.path.isfile(path) and (not ext or ext in EXTENSIONS):
                found.append(path)
        return found

    def _read(self, path: str) -> Optional[Layer]:
        if path not in self.cache:
            self.cache[path] = read_vars_file(read_text(path), path, self.warn)
        return self.cache[path]
