"""Everything nictune ships, run through plan and apply on the strict fakes
of its NIC class.

An artifact is a profile nictune ships: each profiles/*.yaml, the profile
of each play of playbooks/*.yaml (play_profile, with the play's
vars.nictune), and each README.md, playbooks/README.md and docs/howto/*.md
yaml block that is a profile (shipped.profile_blocks) or a playbook (each
of its plays: shipped.play_blocks, profile paths relative to playbooks/)
or an entry's settings without a match (shipped.entry_blocks: run as an
entry matching each NIC class's driver in turn), and each family's example in the generated docs/reference/profile.md.  Its NIC classes are the
drivers its entries match (match.driver, match.lower_driver) that have a
fake host here; one that names none (host settings, veth labs) runs on
every class's.

The fake hosts are the recorded ConnectX-7 and MANA hosts of tests/golden
(tests/fakes.py), the ConnectX-7 one with the devlink eswitches, VFs and
SR-IOV files an ASAP2 profile needs.  Their writes meet every "refused"
rule of nicclass.RULES (FakeKernel._refuse_by_rules): a rule declared
there, with its holds(facts), applies to plan and to the fakes alike.

A run reports a problem when nictune would predict a success that the
driver would refuse:
  - a change plan shows as pending that a refusing rule holds for, with
    the port's facts on the fake, the value (facts["value"]) and what the
    plan itself will set on it (facts["planned"]: profile key -> value, the
    eswitch mode included);
  - a write the fake refused, or that read back otherwise, in the apply;
  - a change plan refuses by such a rule: the artifact asks its own NIC
    class for what the driver refuses.
Families whose handles are the running kernel's (macsec, ipsec, ovs) are
planned but not applied (Engine.apply only=).  A key the fake host cannot
take for a reason of its own (an HCA this two-rail host lacks, no OVSDB
server) plans as unsupported and is not applied: no rule is checked there."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List

from fakes import cx7_eswitch_state, load_state
from nictune.control.rollout.playbook import load_playbook, load_playbook_parsed, play_profile
from nictune.host import model as m
from nictune.host.facts import nicclass
from nictune.host.knobs.crypto import CRYPTO_BITS
from nictune.host.transaction.engine import Engine
from nictune.profile.loader import Profile, load_profile, load_profile_text
from nictune.profile.yamlpos import parse_text
from shipped import REPO, entry_blocks, play_blocks, profile_blocks

GOLDEN = os.path.join(REPO, "tests", "golden")
PROFILE_FILES = sorted(glob.glob(os.path.join(REPO, "profiles", "*.yaml")))
PLAYBOOK_FILES = sorted(glob.glob(os.path.join(REPO, "playbooks", "*.yaml")))
DOC_PAGES = [Path(REPO) / "README.md", Path(REPO) / "playbooks" / "README.md",
             *sorted((Path(REPO) / "docs" / "howto").glob("*.md")), Path(REPO) / "docs" / "reference" / "profile.md"]
# Written through handles of the running kernel or another daemon, not a fake.
NOT_FAKED = frozenset({"macsec", "ipsec", "ovs"})


@dataclass
class Artifact:
    label: str   # where it is shipped: "profiles/x.yaml", "playbooks/y.yaml play 0", ...
    file: str    # the file it comes from
    load: Callable[[], Profile]


def shipped_artifacts() -> List[Artifact]:
    out = [Artifact(os.path.relpath(p, REPO), p, lambda p=p: load_profile(p)) for p in PROFILE_FILES]
    for path in PLAYBOOK_FILES:
        for n, play in enumerate(load_playbook(path)):
            out.append(Artifact(f"{os.path.relpath(path, REPO)} play {n}", path,
                                lambda play=play: play_profile(play)))
    for page in DOC_PAGES:
        rel = str(page.relative_to(REPO))
        for n, block in enumerate(profile_blocks(page.read_text())):
            text = block if block.startswith("nictune:") else "nictune: 1\n" + block
            out.append(Artifact(f"{rel} block {n}", str(page), lambda text=text, rel=rel, n=n: load_profile_text(
                text, f"{rel} (block {n})", base_dir=os.path.join(REPO, "profiles"))))
        for n, block in enumerate(play_blocks(page.read_text())):
            plays = load_playbook_parsed(parse_text(block, f"{rel} (playbook block {n})", "playbook"),
                                         os.path.join(REPO, "playbooks", "README.md"))
            out += [Artifact(f"{rel} playbook block {n} play {k}", str(page), lambda play=play: play_profile(play))
                    for k, play in enumerate(plays)]
        for n, block in enumerate(entry_blocks(page.read_text())):
            for driver in FAKE_HOSTS:
                text = f"nictune: 1\ninterfaces:\n  example:\n    match: {{driver: {driver}}}\n{block}"
                out.append(Artifact(f"{rel} entry block {n} on {driver}", str(page),
                                    lambda text=text, rel=rel, n=n: load_profile_text(text, f"{rel} (entry block {n})")))
    return out


# -- the fake host of each NIC class ------------------------------------------------

CX7_PFS = ("enp23s0f0np0", "enp23s0f1np1")


def mlx5_state() -> dict:
    """The shipped lossless profile's recorded ConnectX-7 host (both rails
    up, dcbnl, counters), each rail the uplink of a legacy devlink eswitch
    with SR-IOV (fakes.cx7_eswitch_state's, for ASAP2 profiles); the
    pfc-prevention-tout tunable on both rails; the inline-crypto feature
    bits changeable."""
    state = load_state(os.path.join(GOLDEN, "cx7-shipped-roce-lossless", "observed.json"))
    state["eswitch"] = cx7_eswitch_state()["eswitch"]
    state["tunables"] = {name: {"pfc-prevention-tout": 8000} for name in CX7_PFS}
    for name in CX7_PFS:  # a crypto-enabled ConnectX-7 lets them change
        state["features"][name]["changeable"] += sorted(CRYPTO_BITS.values())
    return _with_library_dirs(state)


def _with_library_dirs(state: dict) -> dict:
    """The directories the library files go in (UCX, Open MPI, profile.d),
    as an installed host has them."""
    state["dirs"] = state.get("dirs", []) + ["etc/ucx", "etc/openmpi", "etc/profile.d"]
    return state


def mana_state() -> dict:
    """The recorded MANA host with mana_ib on its VF (tests/fixtures/mana-host)."""
    return _with_library_dirs(load_state(os.path.join(GOLDEN, "maia-rdma-queues", "observed.json")))


FAKE_HOSTS = {"mlx5_core": mlx5_state, "mana": mana_state}


def nic_classes(doc: dict) -> List[str]:
    drivers = set()
    for entry in (doc.get("interfaces") or {}).values():
        match = (entry or {}).get("match") or {}
        for selector in ("driver", "lower_driver"):
            value = match.get(selector)
            drivers |= set(value if isinstance(value, list) else [value] if value else [])
    return sorted(d for d in drivers if d in FAKE_HOSTS) or sorted(FAKE_HOSTS)


# -- one run ---------------------------------------------------------------------

def _key_files(node, where: Path, size: int = 32) -> None:
    """Key files the profile names, made (0600) under `where`: the fake
    host's keys are test keys, never the ones a real host keeps.  `size`
    bytes: a MACsec key (32), an IPsec SA's AES-256 key and salt (36)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "key_file" and isinstance(value, str):
                path = where / f"key{len(list(where.glob('key*')))}"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                os.write(fd, b"11" * size + b"\n")
                os.close(fd)
                node[key] = str(path)
            else:
                _key_files(value, where, 36 if key == "ipsec" else size)
    elif isinstance(node, list):
        for value in node:
            _key_files(value, where, size)


def _profile_key(change) -> str:
    return ".".join(getattr(change.source, "path", ()))


def _planned(changes: list, target: str, handle) -> dict:
    """What the plan will leave on a port: profile key -> value, its own
    keys and its devlink instance's (the eswitch mode)."""
    return {_profile_key(c): c.after for c in changes
            if c.key.target in (target, handle) and c.status in (m.PENDING, m.OK)}


def _sweep(host, changes: list) -> List[str]:
    """The changes a refusing rule holds for on the fake: planned as a
    success, or refused by plan on the artifact's own NIC class."""
    problems = []
    for c in changes:
        driver = host.kernel.driver_of(c.key.target)
        if c.status not in (m.PENDING, m.UNSUPPORTED) or driver is None:
            continue
        facts = dict(host.kernel.facts(c.key.target), value=c.after,
                     planned=_planned(changes, c.key.target, host.kernel.eswitch_of(c.key.target)[0]))
        found = nicclass.refusal(driver, _profile_key(c), facts)
        if found is None:
            continue
        why = f"{driver} refuses it while {found.when}: {found.why} ({found.source})"
        problems.append(f"plan predicts {c.key.family} {c.key.name} on {c.key.target} ({c.source}) but {why}"
                        if c.status == m.PENDING else
                        f"{c.key.family} {c.key.name} on {c.key.target} ({c.source}) is refused on its "
                        f"own NIC class: {why}")
    return problems


def _refused_in_plan(changes: list, reported: List[str]) -> List[str]:
    """Changes plan refused in a rule's words where the fake's facts did not
    make the rule hold (plan counts what it cannot read as the worst case)."""
    refusing = [r for r in nicclass.RULES if r.effect == "refused"]
    out = []
    for c in changes:
        where = f"{c.key.family} {c.key.name} on {c.key.target} ({c.source})"
        if c.status == m.UNSUPPORTED and any(r.why in c.note for r in refusing) and not any(
                p.startswith(where) for p in reported):
            out.append(f"{where} is refused on its own NIC class: {c.note}")
    return out


def strict_run(profile: Profile, state: dict, tmp: Path) -> tuple:
    """(problems, changes planned as pending) of one artifact on one fake host."""
    from fakes import FakeHost  # after conftest put tests/ on the path

    host = FakeHost(state, tmp / "root")
    keys = tmp / "keys"
    keys.mkdir()
    _key_files(profile.doc, keys)
    engine = Engine(host, str(tmp / "state"))
    planned = engine.plan(profile.doc, profile.sources)
    pending = [c for c in planned.changes if c.status == m.PENDING]
    problems = _sweep(host, planned.changes)
    problems += _refused_in_plan(planned.changes, problems)
    if planned.error and planned.error.get("kind") != "unsupported":
        problems.append(f"plan failed: {planned.error}")
    out = engine.apply(profile.doc, profile.sources, "strict.yaml",
                       only=lambda key: key.family not in NOT_FAKED)
    problems += [f"apply: {c.key.family} {c.key.name} on {c.key.target} ({c.source}) planned as a "
                 f"success, then: {c.note}" for c in out.changes if c.status == m.FAILED]
    return problems, pending
