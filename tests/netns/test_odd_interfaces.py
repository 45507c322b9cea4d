"""Interfaces whose names the kernel takes and nictune does not (issue 9,
item 11): skipped with a warning, never a reason to fail the profile.

Real links in namespace A of the veth_pair fixture, made with `ip link add`
from an argv (so the escape character reaches the kernel as it is), one of
them with a name that is not UTF-8 (b'u\\xff1').
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from typer.testing import CliRunner

from nictune.cli.app import app

pytestmark = pytest.mark.netns

ODD = ["rt#1", "rt\x1b[31m", b"u\xff1"]
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
PROFILE = """\
nictune: 1
interfaces:
  rail:
    match: {name: ntv0}
    mtu: 9000
"""


@pytest.fixture
def odd(veth_pair, tmp_path):
    """Namespace A with three oddly named veth pairs besides ntv0."""
    for i, name in enumerate(ODD):
        argv = ["ip", "-n", veth_pair.ns_a, "link", "add", name, "type", "veth", "peer", "name", f"ntodd{i}"]
        proc = subprocess.run(argv, capture_output=True)
        assert proc.returncode == 0, proc.stderr
    veth_pair.profile = tmp_path / "p.yaml"
    veth_pair.profile.write_text(PROFILE)
    veth_pair.state = str(tmp_path / "state")
    return veth_pair


def run(odd, *args: str):
    return CliRunner().invoke(app, [*args, "--netns", odd.ns_a, "--state-dir", odd.state])


def skipped(warnings: list) -> list:
    return sorted(w for w in warnings if w.startswith("skipped interface"))


EXPECTED = sorted([
    "skipped interface 'rt#1': a name nictune does not handle",
    "skipped interface 'rt\\x1b[31m' (escaped): a name nictune does not handle",
    "skipped interface 'u\\xff1' (escaped): a name nictune does not handle",
])


def test_a_plan_skips_them_and_says_so(odd):
    result = run(odd, "plan", str(odd.profile), "--json")
    assert result.exit_code == 2, result.output
    [host] = json.loads(result.stdout)["hosts"]
    assert [(c["key"]["target"], c["status"]) for c in host["changes"]] == [("ntv0", "pending")]
    assert [w.split(" (it takes")[0] for w in skipped(host["warnings"])] == EXPECTED

    result = run(odd, "apply", str(odd.profile))
    assert result.exit_code == 0, result.output
    assert "warning: skipped interface 'rt\\x1b[31m' (escaped)" in result.stderr
    assert not CONTROL.search(result.stdout + result.stderr)


def test_show_skips_them_and_says_so(odd):
    result = run(odd, "show")
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)["interfaces"].values()
    assert sorted(e["match"]["name"] for e in shown) == ["ntodd0", "ntodd1", "ntodd2", "ntv0"]
    assert [w.split(" (it takes")[0] for w in skipped(
        [line[len("warning: "):] for line in result.stderr.splitlines()])] == EXPECTED
    assert not CONTROL.search(result.stdout + result.stderr)
