"""Host names that could become options or several hosts on the controller.

Hooks and the nccl-tests launcher put host names into argv lists
({host}, {hosts} joined by ","): a host named "-oProxyCommand=..." made
`[ssh, "{host}", true]` run a command on the controller, and a name with
a comma added nodes to `nodename={hosts}`.  Inventories refuse such names
when they load, from every source, naming the file and line
(inventory/hostnames.py); hooks and the launcher refuse them again before
anything runs.  The end-to-end case runs the real ssh client, whose
ProxyCommand is what an option-shaped host name would run.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.rollout import hooks as hooklib
from nictune.control.rollout.gate import NcclTestsSpec
from nictune.control.rollout.playbook import load_playbook, rollout
from nictune.host.errors import NictuneError
from nictune.inventory import InventoryError, load_inventory

from .test_playbook_hooks import LoggedFleet, events, hook, playbook, write

# (inventory file name, text, line of the bad name, the name as the message shows it)
HOSTILE_INVENTORIES = [
    ("dash.ini", "ok1\n[g]\n-oProxyCommand=touch${IFS}/tmp/x\n", 3, "starts with '-'"),
    ("dash-range.ini", "[g]\n-n[1:2]\n", 2, "'-n1' starts with '-'"),
    ("comma.ini", "[g]\nnode1,node2 a=1\n", 2, "holds ','"),
    ("comma-range.ini", '[g]\n"n[1:2],x"\n', 2, "holds ','"),
    ("quoted-blank.ini", '[g]\n"two words" a=1\n', 2, "holds a blank (U+0020)"),
    ("dash.yml", "g:\n  hosts:\n    ok1:\n    -x:\n", 4, "starts with '-'"),
    ("blank.yml", 'g:\n  hosts:\n    "a b":\n', 3, "holds a blank"),
    ("tab.yml", 'g:\n  hosts:\n    "a\\tb":\n', 3, "holds a blank (U+0009)"),
    ("control.yml", 'g:\n  hosts:\n    "a\\x01b":\n', 3, "holds a control character (U+0001)"),
    ("newline.json", '{"g": {"hosts": {"ok": null,\n "a\\nb": null}}}', 2, "holds a blank (U+000A)"),
    ("bidi.yml", 'g:\n  hosts:\n    "gpu\\u202e1":\n', 3, "holds a control character (U+202E)"),
    ("comma.yml", 'all:\n  children:\n    g:\n      hosts:\n        "a,b":\n', 5, "holds ','"),
]


@pytest.mark.parametrize("name,text,line,words", HOSTILE_INVENTORIES, ids=[c[0] for c in HOSTILE_INVENTORIES])
def test_an_inventory_with_a_hostile_host_name_is_refused_naming_file_and_line(tmp_path, name, text, line, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: host name ") and words in message, message
    assert "\n" not in message and "nictune refuses host names that start with '-'" in message


@pytest.mark.parametrize("text,words", [("ok,-oProxyCommand=x", "starts with '-'"), ("a b,c", "holds a blank")])
def test_a_host_list_with_a_hostile_name_is_refused(text, words):
    with pytest.raises(InventoryError) as caught:
        load_inventory(text)
    assert str(caught.value).startswith("host list: host name ") and words in str(caught.value)


@pytest.mark.parametrize("name", ["gpu-01", "node_1.example.net", "198.18.0.1", "2001:db8::1", "gpü1", "a=b",
                                  "root@h", "x:y"])
def test_ordinary_and_unusual_but_harmless_names_load(tmp_path, name):
    path = write(tmp_path, "hosts.yml", f"g:\n  hosts:\n    {json.dumps(name)}:\n")
    assert list(load_inventory(path).hosts) == [name]


# -- hooks: defence in depth -----------------------------------------------------

def test_a_hook_refuses_an_option_shaped_host_and_runs_nothing(tmp_path):
    log = str(tmp_path / "log")
    path = playbook(tmp_path, f"""
        before_batch: {hook(tmp_path, "drain", "{host}")}
        """, serial="[2]")
    (play,) = load_playbook(path)
    fleet = LoggedFleet(log)
    report = rollout(play, ["h0", "-oProxyCommand=x"], fleet)
    assert report["stopped"]["kind"] == "hook-failed" and fleet.calls == []
    (refused,) = report["batches"][0]["hooks"]
    assert refused["error"]["message"].startswith("was not run: host name '-oProxyCommand=x' starts with '-'")
    assert refused["argv"][-1] == "{host}" and refused["exit_code"] is None
    assert not (tmp_path / "log").exists() or [e for e in events(log) if "argv" in e] == []


@pytest.mark.parametrize("names,words", [(["a", "b,c"], "holds ','"), (["a b"], "holds a blank")])
def test_hosts_that_would_split_are_refused_by_a_hook(names, words):
    once = hooklib.Hook("before_batch", ("scontrol", "update", "nodename={hosts}"), "pb:1", False)
    with pytest.raises(ValueError, match=words):
        hooklib.commands(once, 1, names)


def test_a_placeholder_never_turns_an_argument_into_an_option():
    assert hooklib.filled_argument("--nodes={hosts}", "--nodes=a,b") == "--nodes=a,b"
    assert hooklib.filled_argument("{host}", "gpu1") == "gpu1"
    with pytest.raises(ValueError, match="would become the option '-x'"):
        hooklib.filled_argument("{host}", "-x")


def test_the_launcher_refuses_names_and_addresses_that_would_split_or_become_options():
    spec = NcclTestsSpec(launcher=["mpirun", "-np", "{np}", "-H", "{hosts}", "--addr", "{addresses}"],
                         binary="/opt/nccl-tests/build/all_reduce_perf", gpus=8)
    argv = spec.argv(["a", "b"], ["198.18.0.1", "198.18.0.2"])
    assert argv[:7] == ["mpirun", "-np", "16", "-H", "a,b", "--addr", "198.18.0.1,198.18.0.2"]
    for names, addresses in ((["a", "b,c"], ["x", "y"]), (["a"], ["-oX"]), (["a"], ["1,2"])):
        with pytest.raises(NictuneError, match="nccl-tests was not run"):
            spec.argv(names, addresses)
    leading = NcclTestsSpec(launcher=["launch", "{hosts}"], binary="/opt/nccl-tests/build/all_reduce_perf")
    with pytest.raises(NictuneError, match="the host name '-x'"):
        leading.argv(["-x"], ["198.18.0.1"])


# -- end to end: the real ssh client, through the CLI -----------------------------

@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_a_host_named_like_an_ssh_option_runs_nothing_on_the_controller(tmp_path):
    marker = tmp_path / "ran"
    # ssh would run its ProxyCommand (through the user's shell) on the controller.
    host = f"-oProxyCommand=touch${{IFS}}{marker}"
    inventory = write(tmp_path, "inv.ini", f"[fleet]\n{host} ansible_host=198.18.0.1\n")
    ssh = json.dumps(["ssh", "-F", "/dev/null", "-oBatchMode=yes", "-oConnectTimeout=2", "{host}", "true"])
    path = playbook(tmp_path, f"before_batch: {ssh}\n")
    result = CliRunner().invoke(app, ["apply", path, "-i", inventory, "--connect-timeout", "2"])
    assert not marker.exists(), "the host name ran a command on the controller"
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {inventory}:2: host name '-oProxyCommand="), lines


# -- a failed drain says what happened -------------------------------------------

def test_a_failed_before_batch_says_which_hook_failed_for_which_hosts(tmp_path, capsys):
    from nictune.cli.output import Printer, envelope

    fails = json.dumps([sys.executable, "-c", "import sys; sys.exit(3)", "{hosts}"])
    path = playbook(tmp_path, f"before_batch: {fails}\n", serial="[2]")
    (play,) = load_playbook(path)
    report = rollout(play, ["h0", "h1", "h2"], LoggedFleet(str(tmp_path / "log")))
    assert report["not_started"] == ["h0", "h1", "h2"]
    Printer(False).fleet(envelope("apply", [], rollouts=[report]))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "none selected" not in last, last
    assert last.startswith("no host was written; 3 host(s) not started, the rollout stopped: batch 1: "
                           f"before_batch hook ({path}:6)"), last
    assert "exited with 3; nothing was written in this batch of 2 host(s) (h0, h1)" in last


@pytest.mark.parametrize("value", ["-oProxyCommand=x", "198.18.0.1,198.18.0.2"])
def test_an_address_that_would_become_an_option_or_two_is_refused(tmp_path, value):
    # ansible_host reaches a ProxyCommand's %h (~/.ssh/config) and the launcher's {addresses}.
    path = write(tmp_path, "hosts.ini", f"ok ansible_host=198.18.0.9\nh1 a=1 ansible_host={value}\n")
    inventory = load_inventory(path)
    assert inventory.hosts["ok"].address == "198.18.0.9"
    with pytest.raises(InventoryError) as caught:
        inventory.hosts["h1"].address
    assert str(caught.value).startswith(f"{path}:2: ansible_host of host 'h1' must not start with '-' or hold ','")
