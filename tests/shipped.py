"""The shipped profiles and the interface names of the recorded hosts
(tests/golden/states) that unit tests run them against, and which yaml
blocks of the docs are profiles."""

from __future__ import annotations

import os
import re

import yaml

from nictune.profile.loader import load_profile, load_profile_text
from nictune.profile.schema import SCHEMA

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CX7_TRAINING = load_profile(os.path.join(REPO, "profiles", "connectx7-training.yaml"))
# The training profile without its PCIe section (the file says why).
CX7_PATH = os.path.join(REPO, "tests", "fixtures", "profiles", "connectx7-training-no-pcie.yaml")
CX7 = load_profile(CX7_PATH)
MAIA = load_profile(os.path.join(REPO, "profiles", "maia-mana.yaml"))
# The shipped profile names the TSO bits; ethtool's "tso" alias stands for
# every tx-tcp*-segmentation bit, mixed on a fresh MANA VF.
MAIA_TSO = load_profile_text(
    "nictune: 1\nextends: maia-mana.yaml\ninterfaces:\n  mana-vf:\n    features: {tso: true}\n",
    "maia-tso.yaml", os.path.join(REPO, "profiles"))
P0, P1 = "enp23s0f0np0", "enp23s0f1np1"  # the ConnectX-7 ports of cx7-host
VF = "enP30832p0s0"                       # the MANA VF of maia-host

BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)


def profile_blocks(text: str) -> list:
    """The yaml blocks that are whole profiles (not a play, a CI job or an
    indented fragment of an entry)."""
    found = []
    for block in BLOCK.findall(text):
        doc = yaml.safe_load(block)
        if isinstance(doc, dict) and doc and set(doc) <= set(SCHEMA["properties"]) and not block.startswith(" "):
            found.append(block)
    return found


def play_blocks(text: str) -> list:
    """The yaml blocks that are whole playbooks: a list of plays, each with
    hosts and a profile (playbooks/README.md's example)."""
    found = []
    for block in BLOCK.findall(text):
        doc = yaml.safe_load(block)
        if isinstance(doc, list) and doc and all(
                isinstance(p, dict) and {"hosts", "profile"} <= set(p) for p in doc):
            found.append(block)
    return found


ENTRY_INDENT = "    "  # under "interfaces:" and an entry's name


def entry_blocks(text: str) -> list:
    """The yaml blocks that are an entry's settings without its match,
    indented as under interfaces.<name> (docs/howto/ipsec.md's example)."""
    keys = set(SCHEMA["$defs"]["entry"]["properties"]) - {"match"}
    found = []
    for block in BLOCK.findall(text):
        doc = yaml.safe_load(block)
        if (block.startswith(ENTRY_INDENT) and not block.startswith(ENTRY_INDENT + " ")
                and isinstance(doc, dict) and doc and set(doc) <= keys):
            found.append(block)
    return found
