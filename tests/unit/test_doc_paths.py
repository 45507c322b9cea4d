"""Every repository path the docs cite exists: in README.md, docs/ and the
READMEs beside playbooks/, bench/ and tests/vm/, each link's target, each path in
`backticks` that names a place in this repository (a top-level directory,
or a room of src/nictune/ such as `host/knobs/sriov.py`), and each such
path to a file written as plain text (`tests/unit/test_x.py checks it`)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", REPO / "playbooks" / "README.md", REPO / "bench" / "README.md",
               REPO / "tests" / "vm" / "README.md",
               *(REPO / "docs").rglob("*.md")])
TOP = {"src", "tests", "docs", "profiles", "playbooks", "bench", "scripts", "contrib", ".ci"}
# Rooms of the package, cited without src/nictune/ in front; knobs/ sits
# below host/, netlink/ below host/transports/.
ROOTS = {"nictune": REPO / "src", "knobs": REPO / "src" / "nictune" / "host",
         "netlink": REPO / "src" / "nictune" / "host" / "transports"}
PACKAGE = REPO / "src" / "nictune"
FENCE = re.compile(r"^(`{3,})[^\n]*\n.*?^\1\s*$", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9_.+-]*(/[A-Za-z0-9_.+-]+)*/?$")
# A file path in running text: a first part the repository or the package
# has, at least one '/', a file extension; not the tail of a longer path.
PLAIN = re.compile(r"(?<![\w./-])((?:src|tests|docs|profiles|playbooks|bench|scripts|contrib|nictune"
                   r"|host|control|cli|profile|inventory|lab|knobs|netlink)/[\w./-]*\w\.[a-z]+)\b")
# Paths the docs name that are made at run time or are a user's own.
NOT_IN_REPO = {
    "bench/.venv-tools": "made by bench_fleet.py --install",
    "bench/.venv-tools/bin": "made by bench_fleet.py --install",
    "scripts/drain.sh": "an example of a user's hook, relative to the user's playbook",
}


def _prose(text: str) -> str:
    """The text outside fenced blocks (examples of users' own files live there)."""
    return FENCE.sub("", text)


def _base(first: str):
    """Where a cited path whose first part is `first` must be, or None when
    the path is not one of this repository's."""
    if first in TOP:
        return REPO
    if first in ROOTS:
        return ROOTS[first]
    if (PACKAGE / first).is_dir():
        return PACKAGE
    return None


def cited_paths(doc: Path) -> list:
    """(as written, resolved Path) of the repository paths a doc cites."""
    text = _prose(doc.read_text())
    found = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:|^#", target):
            continue
        target = target.split("#", 1)[0]
        found.append((target, (doc.parent / target).resolve()))
    for token in CODE.findall(text) + PLAIN.findall(CODE.sub("", text)):
        token = token.split(":", 1)[0] if re.search(r"\.\w+:\d", token) else token  # file.py:123
        if "/" not in token.rstrip("/") or not PATHLIKE.match(token) or token.rstrip("/") in NOT_IN_REPO:
            continue
        base = _base(token.split("/", 1)[0])
        if base is not None:
            found.append((token, base / token))
    return found


def test_every_path_the_docs_cite_exists():
    assert len(DOCS) >= 15, [d.name for d in DOCS]
    cited = [(doc, written, path) for doc in DOCS for written, path in cited_paths(doc)]
    assert len(cited) >= 100, len(cited)  # the search found what the docs cite
    missing = [f"{doc.relative_to(REPO)}: {written}" for doc, written, path in cited if not path.exists()]
    assert not missing, "the docs cite paths that do not exist:\n" + "\n".join(missing)


def test_a_missing_path_is_found(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("See `src/nictune/host/nope.py`, `knobs/sriov.py`, [x](gone.md) and\n"
                   "```sh\nnictune plan profiles/rails.yaml\n```\n`/etc/nccl.conf`, `./.venv`;\n"
                   "<!-- tests/unit/test_reference.py checks it -->\n")
    cited = cited_paths(doc)
    assert [w for w, _ in cited] == ["gone.md", "src/nictune/host/nope.py", "knobs/sriov.py",
                                     "tests/unit/test_reference.py"]
    assert [p.exists() for _, p in cited] == [False, False, True, False]


def slugs(doc: Path) -> set:
    """The anchors GitHub gives a page's headings: lower case, punctuation
    dropped, blanks as '-', a repeated one numbered -1, -2..."""
    seen, found = {}, set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _prose(doc.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def anchors(doc: Path) -> list:
    """(as written, target page, anchor) of each link into a heading."""
    found = []
    for target in LINK.findall(_prose(doc.read_text())):
        if re.match(r"^[a-z]+:", target) or "#" not in target:
            continue
        page, anchor = target.split("#", 1)
        found.append((target, (doc.parent / page).resolve() if page else doc, anchor))
    return found


def test_every_link_into_a_heading_finds_it():
    links = [(doc, *link) for doc in DOCS for link in anchors(doc)]
    assert len(links) >= 5, len(links)
    broken = [f"{doc.relative_to(REPO)}: {written}" for doc, written, page, anchor in links
              if not page.exists() or anchor not in slugs(page)]
    assert not broken, "links to headings that are not there:\n" + "\n".join(broken)


def test_a_link_to_a_heading_that_moved_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Drain hooks\n\n## The `gate:` entry\n")
    doc = tmp_path / "page.md"
    doc.write_text("# Page\n\n## Latest figures\n\n## Latest figures\n\nSee [a](#drain-hooks), "
                   "[b](other.md#drain-hooks), [c](other.md#the-gate-entry), [d](#latest-figures-1).\n")
    assert [(w, anchor in slugs(page)) for w, page, anchor in anchors(doc)] == [
        ("#drain-hooks", False), ("other.md#drain-hooks", True),
        ("other.md#the-gate-entry", True), ("#latest-figures-1", True)]
