"""The profiles the how-tos and the README show are profiles nictune loads:
every ```yaml block whose keys are a profile's top-level keys (a block
without `nictune:` gets the version in front; `extends:` is read from
profiles/, where the shipped base profiles are)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nictune.profile.loader import load_profile_text
from shipped import profile_blocks

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs" / "howto").glob("*.md"))]
EXAMPLES = [(page, n, block) for page in PAGES for n, block in enumerate(profile_blocks(page.read_text()))]


def test_the_docs_show_profiles():
    assert len(PAGES) >= 10 and len(EXAMPLES) >= 6, len(EXAMPLES)


@pytest.mark.parametrize("page,n,block", EXAMPLES,
                         ids=[f"{p.name}-{n}" for p, n, _ in EXAMPLES])
def test_each_profile_a_doc_shows_loads(page, n, block):
    text = block if block.startswith("nictune:") else "nictune: 1\n" + block
    load_profile_text(text, f"{page.relative_to(REPO)} (block {n})", base_dir=str(REPO / "profiles"))


def test_a_profile_that_stopped_loading_is_found():
    (block,) = profile_blocks("```yaml\ninterfaces:\n  rails:\n    match: {driver: mlx5_core}\n"
                              "    mtu: 90000\n```\n```yaml\non: pull_request\n```\n")
    with pytest.raises(Exception, match="mtu"):
        load_profile_text("nictune: 1\n" + block, "page.md")
