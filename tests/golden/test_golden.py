"""Golden plans: profile + recorded host state -> the plan nictune must show.

Each case is a directory tests/golden/<case>/ with
    profile.yaml   the profile (may extend ../../../profiles/*.yaml)
    observed.json  the host's state for the fake kernel (tests/fakes.py),
                   usually {"base": "cx7-host" | "maia-host", ...changes}
    expected.json  the plan: exit code, error, warnings, and every change
                   (key, before, after, status, source, note, bound)

The host state is recorded, not live: the fake kernel stands in for
ConnectX-7 and MANA hardware that no kernel here has.  Real-kernel
behaviour is tested in tests/netns.

expected.json is the spec: review it by eye.  After an intended change of
behaviour, regenerate with
    NICTUNE_UPDATE_GOLDEN=1 pytest tests/golden
and read the diff before committing it.
"""

from __future__ import annotations

import json
import os

import pytest

from fakes import FakeHost, load_state
from nictune.host import agent
from nictune.profile.loader import load_profile

pytestmark = pytest.mark.recorded

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CASES = sorted(d for d in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, d, "profile.yaml")))
UPDATE = os.environ.get("NICTUNE_UPDATE_GOLDEN") == "1"


def _stable(value, tmp: str):
    """Paths in sources and messages relative to the repository."""
    if isinstance(value, str):
        return value.replace(REPO + os.sep, "").replace(tmp, "<tmp>")
    if isinstance(value, list):
        return [_stable(v, tmp) for v in value]
    if isinstance(value, dict):
        return {k: _stable(v, tmp) for k, v in value.items()}
    return value


def run_case(case: str, tmp_path) -> dict:
    case_dir = os.path.join(HERE, case)
    profile = load_profile(os.path.join(case_dir, "profile.yaml"))
    host = FakeHost(load_state(os.path.join(case_dir, "observed.json")), tmp_path / "root")
    before = host.kernel.snapshot()
    request = {"nictune_request": agent.REQUEST_FORMAT, "command": "plan", "host": case,
               "state_dir": str(tmp_path / "state"),
               "profile": {"path": profile.path, "doc": profile.doc, "sources": profile.sources}}
    # agent.run: Engine(host, state_dir).plan(doc, sources), with errors
    # turned into the report's error exactly as on a real host.
    report = agent.run(request, host=host)
    # A plan never writes.
    assert host.kernel.writes == []
    assert host.kernel.snapshot() == before
    result = {
        "exit_code": report["exit_code"],
        "error": report["error"],
        "warnings": report["warnings"],
        "changes": report["changes"],
    }
    return _stable(result, str(tmp_path))


def dump(result: dict) -> str:
    """One change per line, so that a diff of expected.json reads like a plan."""
    lines = ["{"]
    for field in ("exit_code", "error", "warnings"):
        lines.append(f' "{field}": {json.dumps(result[field])},')
    rows = [json.dumps(c) for c in result["changes"]]
    if rows:
        lines.append(' "changes": [')
        lines.extend(f"  {row}," for row in rows[:-1])
        lines.append(f"  {rows[-1]}")
        lines.append(" ]")
    else:
        lines.append(' "changes": []')
    lines.append("}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", CASES)
def test_golden_plan(case, tmp_path):
    result = run_case(case, tmp_path)
    path = os.path.join(HERE, case, "expected.json")
    if UPDATE:
        with open(path, "w") as f:
            f.write(dump(result))
        return
    if not os.path.exists(path):
        pytest.fail(f"{case}: no expected.json; generate it with NICTUNE_UPDATE_GOLDEN=1 and review it")
    with open(path) as f:
        expected = json.load(f)
    assert result["exit_code"] == expected["exit_code"]
    assert result["error"] == expected["error"]
    assert result["warnings"] == expected["warnings"]
    assert len(result["changes"]) == len(expected["changes"])
    for got, want in zip(result["changes"], expected["changes"]):
        assert got == want


def test_every_case_is_complete():
    for case in CASES:
        for name in ("profile.yaml", "observed.json", "expected.json"):
            assert os.path.isfile(os.path.join(HERE, case, name)), f"{case}/{name}"


def test_recorded_states_load():
    for name in ("cx7-host", "maia-host"):
        state = load_state(name)
        names = {link["name"] for link in state["links"]}
        assert set(state["drvinfo"]) <= names
        for op in ("features", "rings", "channels", "coalesce", "pause"):
            assert set(state.get(op, {})) <= names, op
