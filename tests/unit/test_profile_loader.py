"""Loading single profiles: YAML handling, positions, and error messages."""

from __future__ import annotations

import os
import textwrap

import pytest
import yaml

from nictune.profile import ProfileError, load_profile, load_profile_text
from nictune.profile import yamlpos

HERE = os.path.dirname(os.path.abspath(__file__))
FULL = os.path.join(HERE, "profiles", "full.yaml")

# A valid profile head; tests append lines to the "rails" entry (line 5 on).
HEAD = "nictune: 1\ninterfaces:\n  rails:\n    match: {name: 'ens*'}\n"


def err_of(text, name="p.yaml"):
    with pytest.raises(ProfileError) as info:
        load_profile_text(textwrap.dedent(text).lstrip("\n") if text.startswith("\n") else text, name)
    err = info.value
    # The one-paragraph promise holds for every error.
    assert "\n" not in str(err) and "\r" not in str(err)
    assert str(err).startswith(name)
    return err


@pytest.fixture(params=["c", "python"])
def any_loader(request, monkeypatch):
    """Run a test with libyaml and with the pure-Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(yamlpos, "LOADER", yaml.SafeLoader)
    elif not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("PyYAML without libyaml")
    return request.param


# -- good profiles -----------------------------------------------------------

def test_full_profile(any_loader):
    p = load_profile(FULL)
    assert p.path == FULL and p.files == [FULL]
    rails = p.doc["interfaces"]["rails"]
    assert rails["match"]["driver"] == ["mlx5_core", "mana"]
    assert rails["features"] == {"gro": True, "rx-udp-gro-forwarding": True, "lro": False}  # on/off
    assert rails["txqueuelen"] == {"min": 10000}
    assert p.doc["host"]["nccl"]["env"] == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": 3, "NCCL_IB_DISABLE": False}
    assert p.doc["host"]["sysctl"]["net.ipv4.tcp_rmem"] == [4096, 87380, 16777216]
    assert p.sources["interfaces/rails/mtu"] == f"{FULL}:24"
    assert p.sources["host/sysctl/net.ipv4.tcp_ecn"] == f"{FULL}:6"
    assert p.sources["host/nccl/env/NCCL_IB_HCA"] == f"{FULL}:13"
    assert p.sources["interfaces/rails/features/gro"] == f"{FULL}:27"
    assert p.sources["interfaces/rails/coalesce/tx-usecs"] == f"{FULL}:39"
    assert p.sources["interfaces/rails"] == f"{FULL}:17"


def test_same_result_as_safe_load(any_loader):
    with open(FULL) as f:
        expected = yaml.safe_load(f)
    assert load_profile(FULL).doc == expected


def test_relative_path_kept_as_given(monkeypatch):
    monkeypatch.chdir(HERE)
    p = load_profile("profiles/full.yaml")
    assert p.sources["nictune"] == "profiles/full.yaml:1"


def test_scalars():
    p = load_profile_text(HEAD + textwrap.dedent("""\
        features: {a: yes, b: no, c: on, d: off, e: true, f: False}
        sysctl: {ipv4.a: 0x10, ipv4.b: 1_000, ipv4.c: '010', ipv4.d: 2024-01-01}
    """).replace("\n", "\n    ").replace("features", "    features", 1))
    rails = p.doc["interfaces"]["rails"]
    assert rails["features"] == {"a": True, "b": False, "c": True, "d": False, "e": True, "f": False}
    # Timestamps stay text; quoted numbers stay text.
    assert rails["sysctl"] == {"ipv4.a": 16, "ipv4.b": 1000, "ipv4.c": "010", "ipv4.d": "2024-01-01"}


def test_aliases_are_expanded():
    p = load_profile_text(
        "nictune: 1\ninterfaces:\n"
        "  a: {match: {name: x}, features: &f {gro: true}}\n"
        "  b: {match: {name: y}, features: *f}\n")
    assert p.doc["interfaces"]["b"]["features"] == {"gro": True}
    assert p.doc["interfaces"]["a"]["features"] is not p.doc["interfaces"]["b"]["features"]


def test_description_may_span_lines():
    p = load_profile_text("nictune: 1\ndescription: |\n  one\n  two\n")
    assert p.doc["description"] == "one\ntwo\n"


# -- YAML-level errors --------------------------------------------------------

def test_duplicate_key(any_loader):
    err = err_of(HEAD + "    mtu: 9000\n    state: up\n    mtu: 1500\n")
    assert (err.line, err.keypath) == (7, "interfaces.rails.mtu")
    assert "duplicate key 'mtu'" in err.message and "line 5" in err.message


@pytest.mark.parametrize("text, line", [
    ("nictune: 1\nhost: [1,\n  2\nx: 3\n", 4),
    ("nictune: 1\ninterfaces:\n  rails:\n    mtu: 1\n   state: up\n", 5),
    ("nictune: 1\nhost: \"abc\n", 3),
    ("nictune: 1\n\thost: 1\n", 2),
    ("nictune: 1\n---\nnictune: 1\n", 2),
])
def test_malformed_yaml(any_loader, text, line):
    err = err_of(text)
    assert err.line == line, str(err)
    assert err.message.startswith("invalid YAML: ")


def test_control_character_in_file():
    err = err_of("nictune: 1\nhost:\n  x: \x07\n")
    assert err.line == 3 and "U+0007" in err.message


@pytest.mark.parametrize("text, words", [
    ("", "is empty"),
    ("# just a comment\n", "is empty"),
    ("- nictune: 1\n", "top level"),
    ("just text\n", "top level"),
    ("nictune: 1\nx: !!binary aGk=\n", "tag"),
    ("nictune: 1\nx: !custom 1\n", "tag"),
    ("nictune: 1\na: &a {x: 1}\nb:\n  <<: *a\n", "merge keys"),
    ("nictune: 1\nx: &a [*a]\n", "alias"),
    ("nictune: 1\non: 1\n", "put it in quotes"),
    ("nictune: 1\n[a]: 1\n", "plain text"),
    ("nictune: 1\nx: " + "9" * 200 + "\n", "too long"),
    ("nictune: 1\nx: !!int abc\n", "not a valid int"),
    ("nictune: 1\nx: " + "[" * 40 + "]" * 40 + "\n", "nested"),
])
def test_yaml_shapes_refused(any_loader, text, words):
    assert words in err_of(text).message


def test_billion_laughs():
    rows = ["nictune: 1", "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    rows += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    err = err_of("\n".join(rows) + "\n")
    assert "more than 100000 values" in err.message


# -- schema errors -------------------------------------------------------------

def test_unknown_key_did_you_mean():
    err = err_of(HEAD + "    mtuu: 9000\n")
    assert (err.file, err.line, err.keypath) == ("p.yaml", 5, "interfaces.rails")
    assert "unknown key 'mtuu' (did you mean 'mtu'?)" in err.message
    assert "allowed keys: match, on_unsupported, on_drift, mtu," in err.message


def test_unknown_top_level_key():
    err = err_of("nictune: 1\nhosts: {}\n")
    assert err.line == 2 and "did you mean 'host'?" in err.message


def test_enum():
    err = err_of("nictune: 1\non_unsupported: maybe\n")
    assert (err.line, err.keypath) == (2, "on_unsupported")
    assert "'maybe' is not allowed" in err.message and "fail, warn, skip" in err.message
    assert "did you mean 'warn'?" in err_of("nictune: 1\non_unsupported: warm\n").message


def test_example_message_format():
    err = err_of(HEAD + "    mtu: 70000\n", name="profiles/cx7.yaml")
    assert str(err) == (
        "profiles/cx7.yaml:5: interfaces.rails.mtu: 70000 is above the maximum 65535 "
        "(allowed: an integer from 68 to 65535, or {min: N} / {max: N}).")


@pytest.mark.parametrize("value, words", [
    ("'9000x'", "expected an integer from 68 to 65535, or {min: N} / {max: N}, got the string '9000x'"),
    ("9000.0", "got the number 9000.0"),
    ("yes", "got the boolean true"),
    ("[9000]", "got a list"),
    ("", "got an empty value (null)"),
    ("{min: 70000}", "70000 is above the maximum 65535"),
    ("{min: 1500, max: 9000}", "either min or max, not both"),
    ("{mn: 1500}", "unknown key 'mn' (did you mean 'min'?)"),
    ("{}", "an empty mapping is not allowed (allowed: an integer from 68 to 65535, or {min: N} / {max: N})"),
    ("67", "67 is below the minimum 68"),
])
def test_value_or_bound_messages(value, words):
    err = err_of(HEAD + f"    mtu: {value}\n")
    assert err.line == 5 and err.keypath.startswith("interfaces.rails.mtu")
    assert words in err.message, err.message
    assert "anyOf" not in err.message and "{'" not in err.message


def test_missing_required():
    err = err_of("interfaces: {}\n")
    assert err.line == 1 and "required key 'nictune' is missing" in err.message
    err = err_of("nictune: 1\ninterfaces:\n  rails:\n    mtu: 9000\n")
    assert (err.line, err.keypath) == (3, "interfaces.rails")
    assert "required key 'match' is missing" in err.message


def test_empty_match():
    err = err_of("nictune: 1\ninterfaces:\n  rails:\n    match: {}\n")
    assert err.line == 4 and "name, driver, lower_driver, pci_id, mac" in err.message


def test_unquoted_mac_hint():
    # 10:22:33:44:55:66 is a base-60 integer to YAML 1.1.
    err = err_of("nictune: 1\ninterfaces:\n  rails:\n    match: {mac: 10:22:33:44:55:56}\n")
    assert err.line == 4 and "write it in quotes" in err.message


def test_wrong_format_version():
    assert "2 is not allowed (allowed: 1)" in err_of("nictune: 2\n").message
    assert err_of("nictune: true\n").line == 1


def test_first_problem_by_position_and_count():
    err = err_of("nictune: 1\non_unsupported: maybe\ninterfaces:\n  rails:\n    mtu: 1\n    statee: up\n")
    assert err.line == 2
    assert err.message.endswith("(and 3 more problems)")


def test_list_item_error():
    err = err_of("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_rmem:\n      - 4096\n      - lots\n")
    assert (err.line, err.keypath) == (6, "host.sysctl.net.ipv4.tcp_rmem[1]")


# -- hostile input -----------------------------------------------------------------

@pytest.mark.parametrize("text, line, keypath", [
    ("nictune: 1\ninterfaces:\n  'eth0; reboot':\n    match: {name: x}\n", 3, "interfaces"),
    ("nictune: 1\ninterfaces:\n  rails:\n    match: {name: 'eth0; reboot'}\n", 4, "interfaces.rails.match.name"),
    ("nictune: 1\ninterfaces:\n  rails:\n    match:\n      name: [ens1, '$(reboot)']\n", 5, "interfaces.rails.match.name[1]"),
    ("nictune: 1\ninterfaces:\n  rails:\n    match: {driver: '../mlx5'}\n", 4, "interfaces.rails.match.driver"),
    ("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.../../etc: 1\n", 4, "host.sysctl"),
    ("nictune: 1\nhost:\n  sysctl:\n    kernel.core_pattern: '|/bin/sh'\n", 4, "host.sysctl"),
    ("nictune: 1\nhost:\n  sysctl:\n    net.core.x: '1; reboot'\n", 4, "host.sysctl.net.core.x"),
    ("nictune: 1\ninterfaces:\n  rails:\n    match: {name: x}\n    sysctl: {'ipv4/../../x': 1}\n", 5, "interfaces.rails.sysctl"),
    ("nictune: 1\ninterfaces:\n  rails:\n    match: {name: x}\n    features: {'gro;x': true}\n", 5, "interfaces.rails.features"),
    ("nictune: 1\nhost:\n  nccl:\n    path: ../../etc/passwd\n", 4, "host.nccl.path"),
    ("nictune: 1\nhost:\n  nccl:\n    path: /etc/../etc/shadow\n", 4, "host.nccl.path"),
    ("nictune: 1\nhost:\n  nccl:\n    path: /etc/nccl.conf/\n", 4, "host.nccl.path"),
    ("nictune: 1\nhost:\n  nccl:\n    env: {'LD_PRELOAD': /tmp/x.so}\n", 4, "host.nccl.env"),
])
def test_injection_rejected(text, line, keypath):
    err = err_of(text)
    assert (err.line, err.keypath) == (line, keypath), str(err)
    assert "is not allowed" in err.message and "(allowed: " in err.message


@pytest.mark.parametrize("text, line, keypath", [
    ("nictune: 1\nhost:\n  nccl:\n    env:\n      NCCL_DEBUG: \"INFO\\nNCCL_X=1\"\n", 5, "host.nccl.env.NCCL_DEBUG"),
    ("nictune: 1\nhost:\n  nccl:\n    env:\n      NCCL_DEBUG: \"INFO\\n\"\n", 5, "host.nccl.env.NCCL_DEBUG"),
    ("nictune: 1\nhost:\n  sysctl:\n    net.core.x: \"1\\n\"\n", 4, "host.sysctl.net.core.x"),
    ("nictune: 1\nhost:\n  sysctl:\n    \"net.core.x\\n\": 1\n", 4, "host.sysctl"),
    ("nictune: 1\ninterfaces:\n  rails:\n    match: {name: \"eth0\\n\"}\n", 4, "interfaces.rails.match.name"),
    ("nictune: 1\ninterfaces:\n  \"rails\\n\":\n    match: {name: x}\n", 3, "interfaces"),
    ("nictune: 1\ndescription: \"clear \\e[2J screen\"\n", 2, "description"),
])
def test_embedded_newline_or_control(text, line, keypath):
    err = err_of(text)
    assert (err.line, err.keypath) == (line, keypath), str(err)
    assert "control character" in err.message


def test_block_scalar_newline_rejected():
    err = err_of("nictune: 1\nhost:\n  nccl:\n    env:\n      NCCL_DEBUG: |\n        INFO\n        NCCL_X=1\n")
    assert err.line == 5 and "control character" in err.message


@pytest.mark.parametrize("where", ["nccl", "sysctl", "description", "key"])
def test_huge_value_not_echoed(tmp_path, where):
    big = "A" * 10_000_000
    text = {
        "nccl": f"nictune: 1\nhost:\n  nccl:\n    env:\n      NCCL_X: '{big}'\n",
        "sysctl": f"nictune: 1\nhost:\n  sysctl:\n    net.core.x: '{big}'\n",
        "description": f"nictune: 1\ndescription: {big}\n",
        "key": f"nictune: 1\nhost:\n  nccl:\n    env:\n      ? {big}\n      : 1\n",
    }[where]
    path = tmp_path / "big.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    msg = str(info.value)
    assert len(msg) < 400 and "A" * 50 not in msg and "\n" not in msg
    assert "10000000 characters" in msg


def test_keypath_with_odd_key_is_escaped():
    err = err_of("nictune: 1\ninterfaces:\n  \"a\\nb\":\n    mtu: 1\n")
    assert "\n" not in err.keypath + err.message


# -- files -------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(ProfileError) as info:
        load_profile(str(tmp_path / "nope.yaml"))
    assert info.value.line is None and "no such file" in str(info.value)


def test_directory_and_fifo(tmp_path):
    with pytest.raises(ProfileError, match="directory"):
        load_profile(str(tmp_path))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ProfileError, match="not a regular file"):
        load_profile(str(tmp_path / "fifo"))  # must not block


def test_too_large(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.truncate(16 * 1024 * 1024 + 1)
    with pytest.raises(ProfileError, match="too large"):
        load_profile(str(path))


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"nictune: 1\ndescription: caf\xe9\n")
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert info.value.line == 2 and "UTF-8" in info.value.message


def test_utf8_bom_and_crlf(tmp_path):
    path = tmp_path / "win.yaml"
    path.write_bytes(b"\xef\xbb\xbfnictune: 1\r\non_unsupported: warn\r\n")
    p = load_profile(str(path))
    assert p.doc == {"nictune": 1, "on_unsupported": "warn"}
    assert p.sources["on_unsupported"].endswith(":2")


def test_error_attributes():
    err = err_of(HEAD + "    state: sideways\n")
    assert (err.file, err.line, err.keypath) == ("p.yaml", 5, "interfaces.rails.state")
    assert err.message.startswith("'sideways' is not allowed")
    assert str(err) == f"p.yaml:5: interfaces.rails.state: {err.message}."
