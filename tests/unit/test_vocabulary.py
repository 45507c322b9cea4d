"""One vocabulary: errors are {kind, message}, refusals are NictuneErrors,
and user-facing text names no tracker numbers."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import nictune
from nictune.host.errors import NictuneError, SYSTEM
from nictune.host.knobs.ethtool import ApplyRefused

PACKAGE = Path(nictune.__file__).parent
TRACKER = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(path: Path):
    """The string literals of a module that are not docstrings: what it may print."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_user_facing_string_names_a_tracker_number():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50  # the whole package was scanned
    hits = [f"{p.relative_to(PACKAGE)}:{line}: {text!r}" for p in modules
            for line, text in _strings(p) if TRACKER.search(text)]
    assert hits == []


def test_a_features_write_the_kernel_ignores_is_a_nictune_refusal():
    # knobs/base.py: apply raises OSError, ValueError or a NictuneError.
    e = ApplyRefused("eth0: the kernel did not change rx-gro")
    assert isinstance(e, NictuneError)
    assert e.as_dict() == {"kind": SYSTEM, "message": "eth0: the kernel did not change rx-gro"}


# -- one result shape: hooks, gates, agent install -----------------------------------------

RESULT_KEYS = {"ok", "changed", "message", "error"}


def _assert_failed(result: dict, kind: str, words: str) -> None:
    assert RESULT_KEYS <= set(result), result
    assert result["ok"] is False and result["changed"] == []
    assert result["error"] == {"kind": kind, "message": result["message"]}, result
    assert words in result["message"], result


def test_a_hook_command_answers_in_the_one_result_shape():
    from nictune.control.rollout import hooks

    ok = hooks.run_command([sys.executable, "-c", "pass"], {}, 30)
    assert {k: ok[k] for k in RESULT_KEYS} == {"ok": True, "changed": [], "message": "", "error": None}
    failed = hooks.run_command([sys.executable, "-c", "raise SystemExit(7)"], {}, 30)
    _assert_failed(failed, "hook-failed", "exited with 7")
    assert failed["exit_code"] == 7
    missing = hooks.run_command(["/nonexistent/nt-drain"], {}, 30)
    _assert_failed(missing, "hook-failed", "cannot start /nonexistent/nt-drain")


def test_a_gate_answers_in_the_one_result_shape():
    from nictune.control.rollout.gate.runner import Gate
    from nictune.control.rollout.gate.spec import GateSpec, Iperf3Spec

    spec = GateSpec(rails=["eth2"], source="pb.yaml:5", iperf3=Iperf3Spec(seconds=1))
    # A batch of one, no peers and nothing kept: nothing to measure against.
    result = Gate(spec, connect=lambda host: None)(1, ["h1"])
    assert result["passed"] is False and result["results"] == []
    _assert_failed(result, "traffic-gate", "nothing to measure h1 against")


def test_a_rollouts_gate_entry_is_in_the_one_result_shape_whatever_the_gate_said():
    from nictune.control.rollout.playbook import _traffic_gate

    bare = _traffic_gate(lambda number, hosts: {"passed": True, "message": "fine"}, 1, ["h1"])
    assert {k: bare[k] for k in RESULT_KEYS} == {"ok": True, "changed": [], "message": "fine", "error": None}
    broken = _traffic_gate(lambda number, hosts: 1 / 0, 2, ["h1"])
    _assert_failed(broken, "traffic-gate", "the gate failed: ZeroDivisionError")


def test_agent_install_answers_in_the_one_result_shape(tmp_path):
    from nictune.control.install import agent_install
    from nictune.control.remote.ssh import SshOptions
    from nictune.inventory import load_inventory

    inventory = tmp_path / "inv.ini"
    inventory.write_text("h1 ansible_host=198.18.0.1 nictune_state_dir=relative/state\n")
    hosts = load_inventory(str(inventory)).select(None)
    assert len(hosts) == 1
    # Refused before any connection: the state directory is not absolute.
    [refused] = agent_install.run_fleet(hosts, SshOptions(), "status", None, False, 30.0, "127.0.0.1:9463")
    assert refused["host"] == "h1"
    _assert_failed(refused, "invalid-input", "nictune_state_dir 'relative/state' is not a plain absolute path")
    # The installer, which runs without nictune, says why as a string.
    said = agent_install._exchange(None, lambda: b'{"ok": false, "error": "boom"}\n', "status", "/s",
                                   30.0, "", "h2")
    _assert_failed(said, "system", "boom")
    done = agent_install._exchange(None, lambda: b'{"ok": true, "changed": ["/u"]}\n', "uninstall", "/s",
                                   30.0, "", "h3")
    assert {k: done[k] for k in RESULT_KEYS} == {"ok": True, "changed": ["/u"], "message": "", "error": None}


def test_gate_record_reports_its_error_as_kind_and_message(tmp_path):
    from typer.testing import CliRunner

    from nictune.cli.app import app

    (tmp_path / "p.yaml").write_text("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n")
    path = tmp_path / "pb.yaml"
    path.write_text("- name: rails\n  hosts: all\n  profile: p.yaml\n  gate:\n"
                    "    rails: [eth2]\n    iperf3: {min_gbps: -1}\n")
    inventory = tmp_path / "inv.ini"
    inventory.write_text("h1 ansible_host=198.18.0.1\n")
    result = CliRunner().invoke(app, ["gate", "record", str(path), "-i", str(inventory), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["error"]["kind"] == "profile"
    assert report["error"]["message"].startswith(f"{path}:6: [0].gate.iperf3.min_gbps: ")


# -- output through the printer; the shared options object ---------------------------------

# The printer itself, the last-resort handler of cli/app.py (no printer
# exists yet, or any more), and the zipapp's bootstrap, which runs on hosts
# without the CLI.
WRITES_STDERR = {"cli/output.py", "cli/app.py", "control/remote/agentzip.py"}


def test_the_cli_and_controller_write_to_stderr_only_through_the_printer():
    modules = [p for room in ("cli", "control") for p in (PACKAGE / room).rglob("*.py")]
    assert len(modules) > 20
    found = sorted(str(p.relative_to(PACKAGE)) for p in modules if "sys.stderr.write" in p.read_text())
    assert set(found) <= WRITES_STDERR, found


def test_an_agent_status_error_is_printed_with_its_control_characters_visible(tmp_path):
    from typer.testing import CliRunner

    from nictune.cli.app import app

    state = tmp_path / "nt\x1bstate"
    state.mkdir()
    (state / "agent-status.json").write_text("{}")  # JSON, but no agent status: refused, naming the file
    result = CliRunner().invoke(app, ["agent", "status", "--state-dir", str(state)])
    assert result.exit_code == 1
    assert result.stderr.startswith("nictune agent status: ") and "nt\\x1bstate" in result.stderr
    assert "\x1b" not in result.stderr, result.stderr


def test_the_agent_and_gate_commands_take_the_shared_options_object():
    import inspect

    from nictune.cli import gate_cmds, resident_cmds
    from nictune.cli.options import Options

    commands = [resident_cmds.run, resident_cmds.install, resident_cmds.uninstall, resident_cmds.status,
                gate_cmds.record]
    for command in commands:
        body = inspect.signature(inspect.unwrap(command))
        assert len(body.parameters) == 2, (command.__name__, list(body.parameters))
        assert list(body.parameters.values())[1].annotation in (Options, "Options")
