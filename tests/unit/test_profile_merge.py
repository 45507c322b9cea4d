"""extends and the merge directives replace/drop, with positions."""

from __future__ import annotations

import os
import textwrap

import pytest

from nictune.profile import ProfileError, load_profile, load_profile_text

HERE = os.path.dirname(os.path.abspath(__file__))


def write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def load_err(path):
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    err = info.value
    assert "\n" not in str(err)
    return err


@pytest.fixture
def rack(monkeypatch):
    # Relative paths, as a user would type them: sources keep that form.
    monkeypatch.chdir(HERE)
    return load_profile("profiles/site/rack-a.yaml")


BASE = "profiles/base-ai-host.yaml"
CX7 = "profiles/cx7.yaml"
RACK = "profiles/site/rack-a.yaml"


def test_three_level_chain_doc(rack):
    assert rack.doc == {
        "nictune": 1,
        "description": "ConnectX-7 hosts",
        "on_unsupported": "warn",
        "host": {
            "sysctl": {
                "net.ipv4.tcp_ecn": 1,
                "net.ipv4.tcp_rmem": [4096, 87380, 16777216],
                "net.core.netdev_max_backlog": 250000,
            },
            # replace: true -- the inherited NCCL_IB_HCA and NCCL_DEBUG are gone
            "nccl": {"env": {"NCCL_SOCKET_IFNAME": "=ens1", "NCCL_IB_DISABLE": False}},
        },
        "interfaces": {  # drop: [mgmt]
            "rails": {
                "match": {"driver": "mlx5_core", "pci_id": "15b3:1021"},  # deep-merged
                "mtu": {"min": 4200},
                "features": {"rx-udp-gro-forwarding": True},  # replace: true
                "rings": {"rx": 8192, "tx": 4096},
                "channels": {"combined": 32},  # a scalar replaces the inherited bound
                "coalesce": {"adaptive-rx": True, "rx-usecs": 8},
            },
        },
    }


def test_three_level_chain_sources(rack):
    assert rack.files == [BASE, CX7, RACK]
    expected = {
        "nictune": f"{RACK}:1",
        "description": f"{CX7}:3",
        "on_unsupported": f"{RACK}:3",
        "host/sysctl/net.ipv4.tcp_ecn": f"{BASE}:7",
        "host/sysctl/net.ipv4.tcp_rmem": f"{BASE}:9",
        "host/sysctl/net.core.netdev_max_backlog": f"{CX7}:6",
        "host/nccl/env": f"{RACK}:8",
        "host/nccl/env/NCCL_SOCKET_IFNAME": f"{RACK}:10",
        "interfaces/rails/match": f"{CX7}:9",
        "interfaces/rails/match/driver": f"{BASE}:17",
        "interfaces/rails/match/pci_id": f"{CX7}:10",
        "interfaces/rails/mtu": f"{RACK}:18",
        "interfaces/rails/features/rx-udp-gro-forwarding": f"{RACK}:17",
        "interfaces/rails/rings/rx": f"{CX7}:11",
        "interfaces/rails/rings/tx": f"{BASE}:20",
        "interfaces/rails/coalesce/rx-usecs": f"{CX7}:13",
    }
    for key, where in expected.items():
        assert rack.sources[key] == where, key
    assert "interfaces/mgmt" not in rack.sources
    assert "host/sysctl/net.core.rmem_max" not in rack.sources
    assert rack.source("interfaces", "rails", "rings", "tx") == f"{BASE}:20"
    assert rack.source("interfaces", "rails", "nosuch") == rack.sources["interfaces/rails"]


def test_every_merged_key_has_a_source(rack):
    def walk(path, value):
        if path:
            assert "/".join(path) in rack.sources
        if isinstance(value, dict):
            for k, v in value.items():
                walk(path + (k,), v)

    walk((), rack.doc)


def test_parents_merge_left_to_right(tmp_path):
    write(tmp_path, "a.yaml", """
        nictune: 1
        interfaces:
          rails: {match: {name: "ens*"}, mtu: 1500, state: up}
        """)
    write(tmp_path, "b.yaml", """
        interfaces:
          rails: {mtu: 9000}
        """)
    child = write(tmp_path, "c.yaml", """
        extends: [a.yaml, b.yaml]
        interfaces:
          rails: {state: down}
        """)
    p = load_profile(child)
    assert p.doc["interfaces"]["rails"] == {"match": {"name": "ens*"}, "mtu": 9000, "state": "down"}
    assert p.sources["interfaces/rails/mtu"].endswith("b.yaml:2")
    assert p.sources["nictune"].endswith("a.yaml:1")
    assert [os.path.basename(f) for f in p.files] == ["a.yaml", "b.yaml", "c.yaml"]


def test_diamond_is_not_a_cycle(tmp_path):
    write(tmp_path, "base.yaml", "nictune: 1\n")
    write(tmp_path, "a.yaml", "extends: base.yaml\n")
    write(tmp_path, "b.yaml", "extends: base.yaml\n")
    p = load_profile(write(tmp_path, "top.yaml", "extends: [a.yaml, b.yaml]\n"))
    assert p.doc == {"nictune": 1}
    assert [os.path.basename(f) for f in p.files] == ["base.yaml", "a.yaml", "b.yaml", "top.yaml"]


def test_bound_replaces_bound(tmp_path):
    # {min} then {max} must not deep-merge into {min, max}.
    write(tmp_path, "a.yaml", "nictune: 1\ninterfaces:\n  r: {match: {name: x}, mtu: {min: 1000}}\n")
    p = load_profile(write(tmp_path, "b.yaml", "extends: a.yaml\ninterfaces:\n  r: {mtu: {max: 9000}}\n"))
    assert p.doc["interfaces"]["r"]["mtu"] == {"max": 9000}


def test_lists_replace(tmp_path):
    write(tmp_path, "a.yaml", "nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_rmem: [1, 2, 3]\n")
    p = load_profile(write(tmp_path, "b.yaml", "extends: a.yaml\nhost:\n  sysctl:\n    net.ipv4.tcp_rmem: [4]\n"))
    assert p.doc["host"]["sysctl"]["net.ipv4.tcp_rmem"] == [4]


def test_drop_then_redefine(tmp_path):
    write(tmp_path, "a.yaml", "nictune: 1\ninterfaces:\n  r: {match: {name: x}, mtu: 1500, state: up}\n")
    p = load_profile(write(tmp_path, "b.yaml", """
        extends: a.yaml
        interfaces:
          drop: [r]
          r: {match: {driver: mana}}
        """))
    assert p.doc["interfaces"] == {"r": {"match": {"driver": "mana"}}}


def test_top_level_replace(tmp_path):
    write(tmp_path, "a.yaml", "nictune: 1\non_unsupported: skip\n")
    p = load_profile(write(tmp_path, "b.yaml", "extends: a.yaml\nreplace: true\nnictune: 1\n"))
    assert p.doc == {"nictune": 1}


def test_directives_without_parent(tmp_path):
    p = load_profile(write(tmp_path, "a.yaml", "nictune: 1\nhost:\n  replace: true\n  sysctl: {net.a.b: 1}\n"))
    assert p.doc == {"nictune": 1, "host": {"sysctl": {"net.a.b": 1}}}


def test_cycle(tmp_path):
    a = write(tmp_path, "a.yaml", "nictune: 1\nextends: b.yaml\n")
    write(tmp_path, "b.yaml", "\nextends: c.yaml\n")
    write(tmp_path, "c.yaml", "extends: [a.yaml]\n")
    err = load_err(a)
    assert err.file.endswith("c.yaml") and err.line == 1 and err.keypath == "extends[0]"
    chain = err.message.split("extends cycle: ")[1]
    assert [os.path.basename(f) for f in chain.split(" -> ")] == ["a.yaml", "b.yaml", "c.yaml", "a.yaml"]


def test_self_extends(tmp_path):
    a = write(tmp_path, "a.yaml", "nictune: 1\nextends: ./a.yaml\n")
    err = load_err(a)
    assert err.line == 2 and "extends cycle" in err.message


def test_drop_of_missing_key(tmp_path):
    write(tmp_path, "a.yaml", "nictune: 1\nhost:\n  sysctl:\n    net.core.rmem_max: 1\n    net.ipv4.tcp_ecn: 1\n")
    b = write(tmp_path, "b.yaml", "extends: a.yaml\nhost:\n  sysctl:\n    drop: [net.ipv4.tcp_ecn, net.core.rmem_maxx]\n")
    err = load_err(b)
    assert err.file == b and err.line == 4 and err.keypath == "host.sysctl.drop[1]"
    assert "'net.core.rmem_maxx'" in err.message
    assert "did you mean 'net.core.rmem_max'?" in err.message


def test_drop_with_nothing_inherited(tmp_path):
    err = load_err(write(tmp_path, "a.yaml", "nictune: 1\ninterfaces:\n  drop: rails\n"))
    assert err.line == 3 and "nothing is inherited" in err.message


@pytest.mark.parametrize("text, line, words", [
    ("host:\n  replace: yes please\n", 3, "replace must be true or false"),
    ("host:\n  drop: {a: 1}\n", 3, "drop must be a list"),
    ("host:\n  drop: [1]\n", 3, "drop must be a list"),
    ("host:\n  replace: true\n  drop: [sysctl]\n", 4, "not both"),
])
def test_bad_directives(tmp_path, text, line, words):
    write(tmp_path, "a.yaml", "nictune: 1\nhost:\n  sysctl: {net.a.b: 1}\n")
    b = write(tmp_path, "b.yaml", "extends: a.yaml\n" + text)
    err = load_err(b)
    assert err.file == b and err.line == line, str(err)
    assert words in err.message


def test_missing_parent_points_at_extends(tmp_path):
    a = write(tmp_path, "a.yaml", "nictune: 1\nextends:\n  - nope.yaml\n")
    err = load_err(a)
    assert err.file == a and err.line == 3 and err.keypath == "extends[0]"
    assert "'nope.yaml'" in err.message and "no such file" in err.message


def test_error_in_parent_points_into_parent(tmp_path):
    parent = write(tmp_path, "sub/p.yaml", "nictune: 1\ninterfaces:\n  r:\n    match: {name: x}\n    mtu: 70000\n")
    child = write(tmp_path, "c.yaml", "extends: sub/p.yaml\ninterfaces:\n  r: {state: up}\n")
    err = load_err(child)
    assert (err.file, err.line, err.keypath) == (parent, 5, "interfaces.r.mtu")


def test_child_override_fixes_parent_value(tmp_path):
    write(tmp_path, "p.yaml", "nictune: 1\ninterfaces:\n  r:\n    match: {name: x}\n    mtu: 70000\n")
    p = load_profile(write(tmp_path, "c.yaml", "extends: p.yaml\ninterfaces:\n  r: {mtu: 9000}\n"))
    assert p.doc["interfaces"]["r"]["mtu"] == 9000


def test_parent_yaml_error_points_into_parent(tmp_path):
    parent = write(tmp_path, "p.yaml", "nictune: 1\nhost: [\n")
    err = load_err(write(tmp_path, "c.yaml", "extends: p.yaml\n"))
    assert err.file == parent and "invalid YAML" in err.message


@pytest.mark.parametrize("entry", ["\"a\\n.yaml\"", "\"a\\x00.yaml\"", "''", "[a.yaml, 3]", "{a: 1}"])
def test_bad_extends_values(tmp_path, entry):
    a = write(tmp_path, "a.yaml", f"nictune: 1\nextends: {entry}\n")
    err = load_err(a)
    assert err.file == a and err.line == 2 and err.keypath.startswith("extends")


def test_extends_a_directory_or_fifo(tmp_path):
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "f")
    err = load_err(write(tmp_path, "a.yaml", "nictune: 1\nextends: d\n"))
    assert "directory" in err.message
    err = load_err(write(tmp_path, "b.yaml", "nictune: 1\nextends: f\n"))
    assert "not a regular file" in err.message


def test_extends_from_text_needs_base_dir(tmp_path):
    write(tmp_path, "a.yaml", "nictune: 1\non_unsupported: skip\n")
    with pytest.raises(ProfileError) as info:
        load_profile_text("extends: a.yaml\n")
    assert info.value.line == 1
    p = load_profile_text("extends: a.yaml\n", "t.yaml", base_dir=str(tmp_path))
    assert p.doc == {"nictune": 1, "on_unsupported": "skip"}
    assert p.sources["on_unsupported"] == f"{tmp_path}/a.yaml:2"
