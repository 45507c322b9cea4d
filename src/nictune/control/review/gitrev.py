"""A git revision of the repository that holds a profile, as files.

`nictune plan TARGET --base REF` needs the profile, every file it extends
and the inventory (group_vars, host_vars) as they were at REF.  They are
written into a temporary directory from git's object store -- `git ls-tree`
and `git cat-file --batch`, never a checkout -- so relative `extends:` paths
and inventory directories resolve exactly as they do in the work tree, and
the user's work tree and index are never touched.  Every git command is an
argv list; REF is refused if it could read as an option.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from nictune.host.errors import INVALID_INPUT, NictuneError

GIT_TIMEOUT = 60
# Blobs larger than this are not profile material; skipping them keeps a
# repository with big artefacts from filling the temporary directory.
MAX_BLOB = 16 << 20


class GitRevError(NictuneError):
    kind = INVALID_INPUT


@dataclass
class Revision:
    """The files of one revision under `root` (a temporary directory).
    `repo` is the work tree's top directory; `path_of` maps a work-tree
    path to its place in the revision (None: not in the repository)."""

    ref: str
    commit: str
    repo: str
    root: str
    files: List[str]
    # Symbolic links of the revision that lead outside it, left out: name -> target.
    refused: Dict[str, str] = field(default_factory=dict)

    def path_of(self, path: str) -> Optional[str]:
        # The directory by its real path (the repository may be reached
        # through a link), the name as given: a link is the revision's to resolve.
        real = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))),
                            os.path.basename(path))
        rel = os.path.relpath(real, self.repo)
        if rel.startswith(os.pardir + os.sep) or rel == os.pardir or os.path.isabs(rel):
            return None
        self._refuse_through_a_left_out_link(rel)
        return os.path.join(self.root, rel)

    def has(self, path: str) -> bool:
        inside = self.path_of(path)
        return inside is not None and os.path.lexists(inside)

    def _refuse_through_a_left_out_link(self, rel: str) -> None:
        parts = rel.split(os.sep)
        for i in range(1, len(parts) + 1):
            name = "/".join(parts[:i])
            if name in self.refused:
                raise GitRevError(f"{rel} at {self.ref} is reached through the symbolic link "
                                  f"{name} -> {self.refused[name]}, which leads outside the "
                                  "repository: --base does not follow it")

    def refused_links(self, shown: int = 3) -> Optional[str]:
        """One warning for the links left out, or None."""
        if not self.refused:
            return None
        names = sorted(self.refused)
        listed = ", ".join(f"{n} -> {self.refused[n]}" for n in names[:shown])
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        return (f"--base {self.ref}: {len(names)} symbolic link(s) lead outside the repository "
                f"and are left out of the base: {listed}{more}")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "Revision":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _git(repo: str, *args: str, stdin: Optional[bytes] = None) -> bytes:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    # A user's GIT_DIR or GIT_WORK_TREE would point these commands elsewhere.
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(name, None)
    try:
        proc = subprocess.run(["git", "-C", repo, *args], input=stdin, capture_output=True,
                              timeout=GIT_TIMEOUT, env=env)
    except FileNotFoundError:
        raise GitRevError("--base needs git, which is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitRevError(f"git {args[0]} took longer than {GIT_TIMEOUT} s in {repo}") from None
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
        raise GitRevError(f"git {args[0]} failed in {repo}: {why[-1]}")
    return proc.stdout


def checkout_free(path: str, ref: str) -> Revision:
    """The files of the repository holding `path`, at `ref`, in a new
    temporary directory (the caller closes the Revision)."""
    if not ref or ref.startswith("-") or "\0" in ref:
        raise GitRevError(f"--base {ref!r} is not a git revision")
    start = os.path.dirname(os.path.realpath(path)) or "."
    try:
        repo = _git(start, "rev-parse", "--show-toplevel").decode().strip()
    except GitRevError:
        raise GitRevError(f"--base {ref}: {path} is not in a git repository "
                          "(use --base-file OLD for a profile outside git)") from None
    repo = os.path.realpath(repo)
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", ref + "^{commit}").decode().strip()
    except GitRevError:
        raise GitRevError(f"--base {ref}: no such revision in {repo} "
                          "(in CI, fetch it first: git fetch origin main)") from None
    root = tempfile.mkdtemp(prefix="nictune-base-")
    try:
        files, refused = _write_tree(repo, commit, root)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return Revision(ref, commit, repo, root, files, refused)


# A hand-made tree (git mktree) may name a path twice, as a link "a" and a
# file "a/b": what comes second finds the path taken and is left out.
_TAKEN = (FileExistsError, NotADirectoryError, IsADirectoryError)


def _write_tree(repo: str, commit: str, root: str) -> Tuple[List[str], Dict[str, str]]:
    """The revision's files under root: (names written, refused links:
    name -> target).  Regular files first, links after them (so nothing is
    written through a link), then every link checked where it really leads."""
    entries = _ls_tree(repo, commit)
    blobs = [(mode, sha, name) for mode, kind, sha, size, name in entries
             if kind == "blob" and size <= MAX_BLOB and _inside(root, name) is not None]
    contents = _cat_blobs(repo, [sha for _, sha, _ in blobs])
    written: List[str] = []
    for mode, sha, name in blobs:
        if mode != "120000":
            try:
                _write_file(_inside(root, name), contents[sha])
            except _TAKEN:
                continue
            written.append(name)
    links = {name: contents[sha].decode(errors="replace") for mode, sha, name in blobs
             if mode == "120000"}
    refused: Dict[str, str] = {}
    for name, link in links.items():
        try:
            made = _symlink(root, _inside(root, name), link)
        except _TAKEN:
            continue
        except OSError:  # a hand-made tree's link inside a link that leads nowhere yet
            made = False
        if made:
            written.append(name)
        else:
            refused[name] = link
    for name in _escaping_links(root, [n for n in links if n in written]):
        refused[name] = links[name]
        written.remove(name)
    return written, refused


def _write_file(target: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)


def _escaping_links(root: str, names: List[str]) -> List[str]:
    """The links that lead outside root once every link is in place, now
    removed.  Each link alone may point inside while a chain of them does
    not (a/b -> ../d, then x -> ../a/b/../../f is root/../f): so the real
    path of each, again until none is removed (a removed link changes
    where others lead)."""
    top = os.path.realpath(root)
    removed: List[str] = []
    while True:
        escaping = [name for name in names if name not in removed
                    and not _is_within(os.path.realpath(os.path.join(root, name)), top)]
        if not escaping:
            return removed
        for name in escaping:
            with suppress(FileNotFoundError):  # inside a link removed before it
                os.unlink(os.path.join(root, name))
        removed += escaping


def _is_within(path: str, top: str) -> bool:
    return path == top or path.startswith(top + os.sep)


def _ls_tree(repo: str, commit: str) -> list:
    out = []
    for record in _git(repo, "ls-tree", "-r", "-z", "--long", "--full-tree", commit).split(b"\0"):
        if not record:
            continue
        meta, _, name = record.partition(b"\t")
        mode, kind, sha, size = meta.decode().split()
        out.append((mode, kind, sha, int(size) if size.isdigit() else 0,
                    name.decode(errors="surrogateescape")))
    return out


def _cat_blobs(repo: str, shas: List[str]) -> Dict[str, bytes]:
    """Every blob in one `git cat-file --batch` process."""
    if not shas:
        return {}
    raw = _git(repo, "cat-file", "--batch", stdin="".join(s + "\n" for s in shas).encode())
    out: Dict[str, bytes] = {}
    pos = 0
    for _ in shas:
        end = raw.index(b"\n", pos)
        sha, _kind, size = raw[pos:end].decode().split()
        start = end + 1
        out[sha] = raw[start:start + int(size)]
        pos = start + int(size) + 1  # the newline after each object
    return out


def _inside(root: str, name: str) -> Optional[str]:
    target = os.path.normpath(os.path.join(root, name))
    return target if target.startswith(root + os.sep) else None


def _symlink(root: str, target: str, link: str) -> bool:
    """A symlink of the revision, made only when it points inside it: a
    link to /etc/... must not make the base read this machine's files.
    Its directory is made only where it really is inside root (the links
    made before it may lead out); a chain of links is checked once all
    are made (_escaping_links)."""
    resolved = os.path.normpath(os.path.join(os.path.dirname(target), link))
    if os.path.isabs(link) or not resolved.startswith(root + os.sep):
        return False
    if not _is_within(os.path.realpath(os.path.dirname(target)), os.path.realpath(root)):
        return False
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.symlink(link, target)
    return True
