"""Edges of inventory reading where nictune once differed from ansible-core.

Each case is asked of the real ansible-core (ansible-inventory, and
ansible-playbook --list-hosts, in an empty directory with an empty
ansible.cfg, as test_ansible_oracle.py does) and of nictune: where
Ansible reads an inventory, nictune reads it the same; where Ansible
cannot (it fails, or makes a host nothing can reach), nictune refuses
with a message that says why, naming the file and line.  Unparsed files
are failures for Ansible here (ANSIBLE_INVENTORY_UNPARSED_FAILED and
ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED, also in a directory), so a
refusal is a non-zero exit rather than a warning.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest

from nictune.control.rollout.playbook import load_playbook
from nictune.inventory import InventoryError, load_inventory
from nictune.inventory.ranges import split_port

from .test_ansible_oracle import ANSIBLE_INVENTORY, ANSIBLE_PLAYBOOK, CASES, _listed_hosts, as_ansible_list

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(ANSIBLE_INVENTORY is None, reason="ansible-core (the oracle) is not installed")


def ansible(tmp_path: Path, *args: str) -> Tuple[int, str, str]:
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    (cwd / "ansible.cfg").write_text("")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_HOME=str(cwd), ANSIBLE_LOCAL_TEMP=str(cwd),
               ANSIBLE_CONFIG=str(cwd / "ansible.cfg"), ANSIBLE_INVENTORY_UNPARSED_FAILED="1",
               ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="1")
    proc = subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def ansible_list(tmp_path: Path, source: str) -> dict:
    rc, out, err = ansible(tmp_path, ANSIBLE_INVENTORY, "-i", source, "--list")
    assert rc == 0, err
    listing = json.loads(out)
    listing["_meta"].pop("profile", None)
    return listing


def refused(source: str) -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        load_inventory(source)
    assert "\n" not in str(caught.value)
    return caught.value


def write_bytes(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


# -- ranges with blanks: Ansible's int() strips them ---------------------------

RANGES_INI = '[g]\n"spaced[1: 3]"\n"pad[ 01:03]"\n"wide[001: 10:4]"\n"step[1:5: 2]"\n'
RANGES_YAML = 'g:\n  hosts:\n    "spaced[1: 3]":\n    "pad[ 01:03]":\n    "x[ 2 :3 ]y":\n'


@pytest.mark.parametrize("name,text", [("ranges.ini", RANGES_INI), ("ranges.yml", RANGES_YAML)])
def test_a_range_with_blanks_expands_as_ansible_expands_it(tmp_path, name, text):
    path = write_bytes(tmp_path, name, text.encode())
    theirs = ansible_list(tmp_path, path)
    assert len(theirs["g"]["hosts"]) >= 8, theirs  # the case must expand something
    assert as_ansible_list(load_inventory(path)) == theirs


@pytest.mark.parametrize("pattern", ['"pad[01 :10]"', '"alpha[ a:c]"'])
def test_a_range_ansible_cannot_expand_is_refused(tmp_path, pattern):
    path = write_bytes(tmp_path, "bad.ini", f"[g]\n{pattern}\n".encode())
    rc, _out, err = ansible(tmp_path, ANSIBLE_INVENTORY, "-i", path, "--list")
    assert rc != 0 and ("host range" in err or "int()" in err), err
    assert refused(path).message.startswith(f"{path}:2: host pattern ")


# -- a byte-order mark: fine in YAML and JSON, part of the first line in INI ---

def test_a_byte_order_mark_in_an_ini_file_is_refused_as_ansible_fails_on_it(tmp_path):
    section = write_bytes(tmp_path, "section.ini", b"\xef\xbb\xbf[g]\nh1\n")
    rc, _out, err = ansible(tmp_path, ANSIBLE_INVENTORY, "-i", section, "--list")
    assert rc != 0 and "host range must be begin:end" in err, err
    message = refused(section).message
    assert message.startswith(f"{section}:1: the file starts with a UTF-8 byte-order mark (BOM)")
    assert "without a BOM" in message


def test_a_byte_order_mark_before_a_host_makes_ansible_name_an_unreachable_host(tmp_path):
    host = write_bytes(tmp_path, "host.ini", b"\xef\xbb\xbfh0\n[g]\nh1\n")
    assert ansible_list(tmp_path, host)["ungrouped"]["hosts"] == ["\ufeffh0"]
    assert "byte-order mark" in refused(host).message


@pytest.mark.parametrize("name,data", [
    ("bom.yml", b"\xef\xbb\xbfg:\n  hosts:\n    h1:\n      a: 1\n"),
    ("bom.json", b'\xef\xbb\xbf{"g": {"hosts": {"h1": {"a": 1}}}}'),
])
def test_a_byte_order_mark_in_yaml_or_json_reads_as_ansible_reads_it(tmp_path, name, data):
    path = write_bytes(tmp_path, name, data)
    assert as_ansible_list(load_inventory(path)) == ansible_list(tmp_path, path)


# -- IPv6 addresses: Ansible's own expression ----------------------------------

def test_a_nat64_address_with_a_port_is_refused_as_ansible_fails_on_it(tmp_path):
    ini = write_bytes(tmp_path, "v6.ini", b"[g]\n[64:ff9b::192.0.2.33]:2201\n")
    rc, _out, err = ansible(tmp_path, ANSIBLE_INVENTORY, "-i", ini, "--list")
    assert rc != 0 and "host range must be begin:end" in err, err
    message = refused(ini).message
    assert message.startswith(f"{ini}:2: host pattern '[64:ff9b::192.0.2.33]:2201': Ansible does not read")
    assert "write the address as [64:ff9b::c000:221]:2201" in message
    # The hex form is what Ansible reads, and nictune the same.
    hexed = write_bytes(tmp_path, "hex.ini", b"[g]\n[64:ff9b::c000:221]:2201\n")
    assert as_ansible_list(load_inventory(hexed)) == ansible_list(tmp_path, hexed)


def test_a_nat64_address_in_a_host_list_is_refused_where_ansible_names_it_whole(tmp_path):
    text = "[64:ff9b::192.0.2.33]:2201,"
    assert ansible_list(tmp_path, text)["ungrouped"]["hosts"] == ["[64:ff9b::192.0.2.33]:2201"]
    message = refused(text).message
    assert message.startswith("host list: Ansible does not read 64:ff9b::192.0.2.33") and "c000:221" in message


def _addresses(rng: random.Random) -> List[str]:
    """IPv6 addresses in every spelling ipaddress gives, embedded IPv4 forms
    and NAT64 ones, ranges in a group, each bare and as "[...]:port"."""
    import ipaddress

    out = ["::", "::1", "1:2:3:4:5:6:7::", "::ffff:198.18.0.1", "0:0:0:0:0:ffff:198.18.0.1", "1::2:3.4.5.6",
           "2001:db8::[1:3]", "2001:db8::[a:f]:1", "fe80::1%eth0", "198.18.0.[1:3]", "web[1:3]", "a_", "a.b"]
    for _ in range(1500):
        prefix = rng.choice([0, 0xFFFF, 0x64FF9B << 64, rng.getrandbits(96)])
        address = ipaddress.IPv6Address((prefix << 32) | rng.getrandbits(32))
        out += [address.compressed, address.exploded]
        head = address.compressed.rsplit(":", 2)[0]
        if address.compressed.count(":") >= 3:
            out.append(f"{head}:{ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)}")
    return out + [f"[{a}]:22" for a in out]


def test_addresses_and_ports_split_as_ansibles_parse_address_splits_them():
    from ansible.parsing.utils.addresses import parse_address

    def theirs(text):
        try:
            return parse_address(text, allow_ranges=True)
        except Exception:  # noqa: BLE001 - Ansible's way of saying "not an address"
            return None

    def ours(text):
        try:
            return split_port(text)
        except ValueError:
            return None

    samples = _addresses(random.Random(20261204))
    assert len(samples) > 6000
    differ = [(s, ours(s), theirs(s)) for s in samples if ours(s) != theirs(s)]
    accepted = sum(1 for s in samples if theirs(s) is not None)
    assert 1000 < accepted < len(samples) - 1000, accepted  # both answers are exercised
    assert differ == [], differ[:5]


# -- a script without its executable bit ---------------------------------------

SCRIPT = "#!/usr/bin/env python3\nimport json\nprint(json.dumps({'g2': {'hosts': ['h2']}}))\n"


def test_a_script_without_its_executable_bit_says_what_it_is(tmp_path):
    directory = tmp_path / "inv"
    write_bytes(tmp_path, "inv/hosts", b"[g]\nh1\n")
    script = write_bytes(tmp_path, "inv/dynamic.py", SCRIPT.encode())
    os.chmod(script, 0o644)
    rc, _out, err = ansible(tmp_path, ANSIBLE_INVENTORY, "-i", str(directory), "--list")
    # Ansible does not run it: it reads it as INI, which fails on line 2.
    assert rc != 0 and "Expected key=value host variable assignment, got: json" in err, err
    message = refused(str(directory)).message
    assert message.startswith(f"{script}:2: expected key=value")
    assert "starts with '#!' like an inventory script but is not executable" in message
    assert "nictune does not run inventory scripts" in message


def test_a_script_without_its_executable_bit_that_is_valid_ini_reads_as_ini(tmp_path):
    path = write_bytes(tmp_path, "hosts", b"#!/bin/false\n[g]\nh1 a=1\n")
    os.chmod(path, 0o644)
    assert as_ansible_list(load_inventory(path)) == ansible_list(tmp_path, path)


# -- a play's list of patterns: one pattern (playbooks/README.md) ---------------

def test_a_list_in_hosts_is_one_pattern_as_the_readme_says(tmp_path):
    hosts = ["rack_a:&training", "rack_b"]  # the README's ["web:&edge", "db"]
    theirs_file, ours_file = tmp_path / "ansible.yaml", tmp_path / "nictune.yaml"
    theirs_file.write_text(json.dumps([{"hosts": hosts, "gather_facts": False, "tasks": []}]))
    ours_file.write_text(json.dumps([{"hosts": hosts, "profile": "p.yaml"}]))
    rc, out, err = ansible(tmp_path, ANSIBLE_PLAYBOOK, "-i", str(CASES / "fabric.ini"), str(theirs_file),
                           "--list-hosts")
    assert rc == 0, err
    theirs = sorted(_listed_hosts(out))
    inventory = load_inventory(str(CASES / "fabric.ini"))
    union = {h.name for item in hosts for h in inventory.select(item)}
    (play,) = load_playbook(str(ours_file))
    ours = sorted(h.name for h in inventory.select(play.hosts))
    assert ours == theirs and set(theirs) != union, (theirs, union)
    readme = (REPO / "playbooks" / "README.md").read_text()
    # The example play's comment and the key table must say the same.
    comment = next(line for line in readme.splitlines() if line.lstrip().startswith("hosts:"))
    assert "union" not in comment and "the parts make one pattern" in readme
