"""nictune's inventories against Ansible's own reading of them.

Ansible is the oracle: every inventory is read by nictune.inventory and by
`ansible-inventory -i INVENTORY --list`, and nictune's result is turned into
the same JSON shape (`_meta.hostvars`, each group's `hosts` and `children`,
`all`, `ungrouped`, empty groups left out) and compared whole: hosts, group
structure with children, and every variable with its type.

Jinja templates ("{{ ... }}") are compared as raw strings: neither side
renders them (`--list` prints them unrendered).  `!unsafe` and `!vault`
values are compared in the tagged form `--list` prints them in.

The inventories: the real-world ones in the shared reference directory
(tests/real_world.py: ../shared/reference/real-world/inventories beside the
repository, or under NICTUNE_REAL_WORLD; not ours to copy into the
repository, so skipped when absent, but a failure under CI), the cases
in tests/inventory/cases/ and a few comma-separated host lists.  Host
selection (--limit patterns) is compared the same way, and for a few
patterns the order of `ansible PATTERN --list-hosts` too (with --limit,
and for a play's list of patterns, `ansible-playbook --list-hosts`).
Connection values are converted as Ansible's ensure_type converts them.

Ansible takes about a second per call, so every call is made once, up
front, four at a time.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from nictune.control.rollout.playbook import load_playbook
from nictune.inventory import Inventory, InventoryError, Unsafe, Vaulted, load_inventory
from real_world import REAL_WORLD as REFERENCE, require

BIN = Path(sys.executable).parent
ANSIBLE_INVENTORY = shutil.which("ansible-inventory", path=str(BIN)) or shutil.which("ansible-inventory")
ANSIBLE = shutil.which("ansible", path=str(BIN)) or shutil.which("ansible")
ANSIBLE_PLAYBOOK = shutil.which("ansible-playbook", path=str(BIN)) or shutil.which("ansible-playbook")
CASES = Path(__file__).parent / "cases"
REAL_WORLD = REFERENCE / "inventories"

# ansible-core comes with the test extras (pyproject.toml): without it CI
# would compare nothing, so there the skip fails (tests/skips.py).
pytestmark = pytest.mark.skipif(ANSIBLE_INVENTORY is None or ANSIBLE is None or ANSIBLE_PLAYBOOK is None,
                                reason="ansible-core (the oracle) is not installed")


def _real_world() -> List[Path]:
    if not REAL_WORLD.is_dir():
        return []
    out = []
    for entry in sorted(REAL_WORLD.iterdir()):
        if entry.is_dir():  # a directory with its inventory file beside group_vars/host_vars
            out += [p for p in sorted(entry.iterdir()) if p.is_file()]
        else:
            out.append(entry)
    return out


REAL_WORLD_INVENTORIES = _real_world()
CASE_INVENTORIES = [CASES / name for name in ("fabric.ini", "fabric.yml", "inventory.json", "site", "priority.ini",
                                               "json", "twice")]
# -i "a,b,...": Ansible's host_list plugin (no ranges; "[v6]:port" and "name:port").
HOST_LISTS = [
    "web1,[2001:db8::1]:2022,",
    "web[1:3],198.18.0.1:22,[web2]:5,2001:db8::2,gpu-01.example.net:2200,bad_:22",
]

# (inventory, --limit pattern): each compared as `ansible-inventory --limit P --list`.
LIMITS = [
    ("fabric.ini", "rack_a"),
    ("fabric.ini", "gpu-b*"),
    ("fabric.ini", "racks:!training"),
    ("fabric.ini", "fabric:&training"),
    ("fabric.ini", "~gpu-a0[1-4]"),
    ("fabric.ini", "rack_a[1:3],spines[-1]"),
    ("fabric.ini", "rack_a[2:]"),
    ("fabric.ini", "rack_a[0],mgmt02"),
    ("fabric.ini", "198.18.1.*:&rack_b"),
    ("fabric.ini", "all:!rack_b:!mgmt*"),
    ("fabric.yml", "training"),
    ("fabric.yml", "&rack_b"),
    ("fabric.yml", "fabric,!rack_a,standalone"),
    ("site", "rails,&rack1,storage[1]"),
]
# (inventory, pattern): the order of `ansible PATTERN --list-hosts` too.  Ansible
# walks groups below the first level through a set, so only patterns whose
# order it fixes are here.
ORDERED = [
    ("fabric.ini", "rack_b"),
    ("fabric.ini", "rack_a:spines:mgmt01"),
    ("fabric.ini", "gpu-a0*:&rack_a:!gpu-a02"),
    ("site", "rack2,rack1[0],nvme*"),
]
# (inventory, pattern, --limit): the order of `ansible PATTERN --limit L --list-hosts`
# follows the pattern (the inventory for "all"), never the limit.
ORDERED_LIMITS = [
    ("fabric.ini", "all", "gpu-a02,mgmt02,gpu-a01,mgmt01"),
    ("fabric.ini", "all", "@" + str(CASES / "fabric-limit.txt")),
    ("fabric.ini", "rack_a", "gpu-a05,gpu-a01,gpu-a03"),
]
# (inventory, a play's hosts list): the hosts of `ansible-playbook --list-hosts`
# (which lists them in no fixed order).
PLAY_HOSTS = [
    ("fabric.ini", ["rack_b:!198.18.1.2", "spines:mgmt01"]),
    ("fabric.ini", ["rack_a:spines", "!~gpu-a0[1-4]", "mgmt02"]),
    ("site", ["rack2", "rack1[0]:nvme*"]),
]


def _run(argv: List[str], cwd: str) -> Tuple[int, str, str]:
    # An empty working directory: ansible-inventory would also read
    # group_vars/ found next to a playbook directory, which is not ours.
    # An empty ansible.cfg there keeps any user or system configuration out.
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_HOME=cwd, ANSIBLE_LOCAL_TEMP=cwd,
               ANSIBLE_CONFIG=os.path.join(cwd, "ansible.cfg"))
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def oracle():
    """Every ansible answer this module needs, keyed by what was asked."""
    calls: Dict[Tuple[str, str, Optional[str]], List[str]] = {}
    for path in REAL_WORLD_INVENTORIES + CASE_INVENTORIES:
        calls[("list", str(path), None)] = [ANSIBLE_INVENTORY, "-i", str(path), "--list"]
    for name, limit in LIMITS:
        path = str(CASES / name)
        calls[("list", path, limit)] = [ANSIBLE_INVENTORY, "-i", path, "--limit", limit, "--list"]
    for name, pattern in ORDERED:
        path = str(CASES / name)
        calls[("hosts", path, pattern)] = [ANSIBLE, "-i", path, pattern, "--list-hosts"]
    for text in HOST_LISTS:
        calls[("list", text, None)] = [ANSIBLE_INVENTORY, "-i", text, "--list"]
    for name, pattern, limit in ORDERED_LIMITS:
        path = str(CASES / name)
        calls[("hosts", path, pattern, limit)] = [ANSIBLE, "-i", path, pattern, "--limit", limit, "--list-hosts"]
    with tempfile.TemporaryDirectory(prefix="nt-oracle-") as cwd:
        Path(cwd, "ansible.cfg").write_text("")
        for number, (name, hosts) in enumerate(PLAY_HOSTS):
            playbook = Path(cwd, f"play{number}.yml")
            playbook.write_text(json.dumps([{"hosts": hosts, "gather_facts": False, "tasks": []}]))
            calls[("play", str(CASES / name), tuple(hosts))] = [ANSIBLE_PLAYBOOK, "-i", str(CASES / name),
                                                                 str(playbook), "--list-hosts"]
        with ThreadPoolExecutor(4) as pool:
            results = dict(zip(calls, pool.map(lambda argv: _run(argv, cwd), calls.values())))
    return results


def _answer(oracle, key) -> str:
    rc, out, err = oracle[key]
    assert rc == 0, f"ansible failed on {key}: {err}"
    return out


def ansible_list(oracle, path: str, limit: Optional[str] = None) -> dict:
    listing = json.loads(_answer(oracle, ("list", path, limit)))
    listing["_meta"].pop("profile", None)  # the output format's name, not inventory content
    return listing


def _tagged(value: Any) -> Any:
    """A variable as `ansible-inventory --list` prints it."""
    if isinstance(value, Unsafe):
        return {"__ansible_unsafe": str(value)}
    if isinstance(value, Vaulted):
        return {"__ansible_vault": value.ciphertext}
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _tagged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    return value


def as_ansible_list(inv: Inventory, limit: Optional[str] = None) -> dict:
    """nictune's inventory in the shape of `ansible-inventory --list` (see the module docstring)."""
    hosts = inv.select("all", limit=limit) if inv.hosts else []
    available = {h.name for h in hosts}
    out: Dict[str, Any] = {}

    def group(g) -> None:
        entry: Dict[str, Any] = {}
        if g.name != "all":
            entry["hosts"] = [h for h in g.host_names if h in available]
        entry["children"] = g.child_names
        entry = {k: v for k, v in entry.items() if v}
        if entry:
            out[g.name] = entry
        for child in g.children:
            if child.name not in seen:
                seen.add(child.name)
                group(child)

    seen: set = set()
    group(inv.groups["all"])
    hostvars = {h.name: _tagged(h.vars) for h in hosts if h.vars}
    # JSON turns non-text keys (1, None) into text, as Ansible's output does.
    out["_meta"] = json.loads(json.dumps({"hostvars": hostvars}))
    return out


def _ids(paths: List[Path]) -> List[str]:
    return [p.name if p.parent in (CASES, REAL_WORLD) else f"{p.parent.name}/{p.name}" for p in paths]


def test_real_world_inventories_are_there():
    # The test below runs once per inventory found, so with none it would
    # skip and the run pass having compared nothing: here a missing
    # directory fails under CI, and a present one must hold inventories.
    require(REAL_WORLD)
    assert REAL_WORLD_INVENTORIES, f"no inventory found in {REAL_WORLD}"


@pytest.mark.skipif(not REAL_WORLD_INVENTORIES, reason=f"no real-world inventories at {REAL_WORLD}")
@pytest.mark.parametrize("path", REAL_WORLD_INVENTORIES, ids=_ids(REAL_WORLD_INVENTORIES))
def test_real_world_inventory_reads_as_ansible_reads_it(oracle, path):
    assert as_ansible_list(load_inventory(str(path))) == ansible_list(oracle, str(path))


@pytest.mark.parametrize("path", CASE_INVENTORIES, ids=_ids(CASE_INVENTORIES))
def test_case_inventory_reads_as_ansible_reads_it(oracle, path):
    inv = load_inventory(str(path))
    assert inv.hosts, "a case with no host would prove little"
    assert as_ansible_list(inv) == ansible_list(oracle, str(path))


@pytest.mark.parametrize("name,limit", LIMITS, ids=[f"{n}:{p}" for n, p in LIMITS])
def test_limit_selects_what_ansible_selects(oracle, name, limit):
    path = str(CASES / name)
    ours = as_ansible_list(load_inventory(path), limit=limit)
    theirs = ansible_list(oracle, path, limit)
    assert ours == theirs
    assert 0 < len(ours["_meta"]["hostvars"]) < len(load_inventory(path).hosts), "the limit must select some, not all"


@pytest.mark.parametrize("name,pattern", ORDERED, ids=[f"{n}:{p}" for n, p in ORDERED])
def test_pattern_order_is_ansibles(oracle, name, pattern):
    lines = _answer(oracle, ("hosts", str(CASES / name), pattern)).splitlines()
    assert lines[0].strip().startswith("hosts (")
    theirs = [line.strip() for line in lines[1:] if line.strip()]
    ours = [h.name for h in load_inventory(str(CASES / name)).select(pattern)]
    assert ours == theirs


def _listed_hosts(out: str) -> List[str]:
    """The host names under "hosts (N):" in --list-hosts output."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("hosts ("))
    return [line.strip() for line in lines[start + 1:] if line.strip()]


@pytest.mark.parametrize("text", HOST_LISTS)
def test_a_host_list_reads_as_ansible_reads_it(oracle, text):
    assert as_ansible_list(load_inventory(text)) == ansible_list(oracle, text)


@pytest.mark.parametrize("name,pattern,limit", ORDERED_LIMITS, ids=[f"{n}:{p}:{l}" for n, p, l in ORDERED_LIMITS])
def test_limit_keeps_the_patterns_order(oracle, name, pattern, limit):
    path = str(CASES / name)
    theirs = _listed_hosts(_answer(oracle, ("hosts", path, pattern, limit)))
    ours = [h.name for h in load_inventory(path).select(pattern, limit=limit)]
    assert ours == theirs


@pytest.mark.parametrize("name,hosts", PLAY_HOSTS, ids=[f"{n}:{h}" for n, h in PLAY_HOSTS])
def test_a_plays_list_of_patterns_selects_what_ansible_playbook_selects(oracle, tmp_path, name, hosts):
    playbook = tmp_path / "pb.yaml"
    playbook.write_text(json.dumps([{"hosts": hosts, "profile": "p.yaml"}]))
    (play,) = load_playbook(str(playbook))
    path = str(CASES / name)
    theirs = _listed_hosts(_answer(oracle, ("play", path, tuple(hosts))))
    assert theirs, "a case with no host would prove little"
    assert sorted(h.name for h in load_inventory(path).select(play.hosts)) == sorted(theirs)


# Values as the INI parser makes them, for the ssh connection's options:
# remote_user, host and private_key_file are strings, port an int.
CONNECTION_VALUES = [1000, 2222.0, 1.5, "2222", "2.2e3", 2222.5, "x", 0, 70000]


@pytest.mark.parametrize("value", CONNECTION_VALUES, ids=[repr(v) for v in CONNECTION_VALUES])
def test_connection_values_convert_as_ansible_converts_them(tmp_path, value):
    from ansible.config.manager import ensure_type

    inv = Inventory("test")
    host = inv.add_host("h1", "ungrouped", None, ("test", 1))
    for name in ("ansible_user", "ansible_port", "ansible_host", "ansible_private_key_file"):
        inv.set_variable("h1", name, value, ("test", 1))
    inv.finish()

    def ours(attribute):
        try:
            return getattr(host, attribute)
        except InventoryError:
            return "refused"

    def theirs(kind):
        try:
            return ensure_type(value, kind)
        except ValueError:
            return "refused"

    for attribute in ("user", "address", "key_file"):
        assert ours(attribute) == theirs("string")
    port = theirs("int")
    # Ansible passes any int on, and ssh fails on it; nictune checks the range.
    assert ours("port") == (port if port == "refused" or 0 < port < 65536 else "refused")
