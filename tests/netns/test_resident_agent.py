"""The resident agent (host/resident/daemon.py) as a process inside a namespace.

No systemd here: the unit's command line is run directly, under `ip netns
exec`, as `nictune agent run --netns` does.  The desired state comes from a
real `nictune apply`; drift is injected with `ip`, `sysctl` and `ethtool`,
and every effect is read back with those tools.  The agent is killed and
the namespaces removed even when a test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from netns_helpers import ResidentAgent, nictune, wait_for
from typer.testing import CliRunner

import nictune as nictune_pkg
from nictune.cli.app import app

pytestmark = pytest.mark.netns

INTERVAL = 0.5


def _profile(on_drift: str, mtu: int = 9000) -> str:
    return textwrap.dedent(f"""\
        nictune: 1
        on_drift: {on_drift}
        host:
          sysctl:
            net.ipv4.tcp_ecn: 1
        interfaces:
          rail:
            match: {{name: ntv0, driver: veth}}
            mtu: {mtu}
            features: {{gro: on}}
            sysctl: {{ipv4.rp_filter: 2}}
        """)


@pytest.fixture
def lab(veth_pair, tmp_path):
    veth_pair.state = tmp_path / "state"
    veth_pair.dir = tmp_path
    return veth_pair


class Agent(ResidentAgent):
    def __init__(self, lab, *extra: str):
        super().__init__(lab, INTERVAL, *extra)

    def status(self) -> dict:
        return self.report()

    def key(self, name: str) -> dict:
        return ((self.status().get("agent") or {}).get("keys") or {}).get(name) or {}


@pytest.fixture
def agent(lab):
    started = []

    def start(*extra):
        a = Agent(lab, *extra)
        started.append(a)
        assert wait_for(lambda: (a.status().get("agent") or {}).get("updated")
                        or a.proc.poll() is not None), "the agent never wrote its status"
        assert a.proc.poll() is None, a.stop()
        return a

    yield start
    for a in started:
        a.stop()


def apply(lab, on_drift: str, mtu: int = 9000) -> str:
    path = lab.dir / f"p{mtu}.yaml"
    path.write_text(_profile(on_drift, mtu))
    code, report = nictune(lab, "apply", str(path))
    assert code == 0, report
    return str(path)


def mtu(lab) -> int:
    return json.loads(lab.run(lab.ns_a, ["ip", "-j", "link", "show", "ntv0"]).stdout)[0]["mtu"]


def sysctl(lab, key: str) -> str:
    return lab.run(lab.ns_a, ["sysctl", "-n", key]).stdout.strip()


def gro(lab) -> str:
    out = lab.run(lab.ns_a, ["ethtool", "-k", "ntv0"]).stdout
    return next(line.split(":")[1].split()[0] for line in out.splitlines()
                if line.startswith("generic-receive-offload:"))


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def must(lab, *argv: str) -> None:
    r = lab.run(lab.ns_a, list(argv))
    assert r.returncode == 0, r.stderr


def test_restore_puts_drift_back_within_the_interval(lab, agent):
    apply(lab, "restore")
    a = agent()
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    must(lab, "sysctl", "-qw", "net.ipv4.conf.ntv0.rp_filter=0")
    must(lab, "ethtool", "-K", "ntv0", "gro", "off")
    must(lab, "sysctl", "-qw", "net.ipv4.tcp_ecn=2")
    started = time.monotonic()
    assert wait_for(lambda: mtu(lab) == 9000 and sysctl(lab, "net.ipv4.conf.ntv0.rp_filter") == "2"
                    and gro(lab) == "on" and sysctl(lab, "net.ipv4.tcp_ecn") == "1", 10), a.stop()
    assert time.monotonic() - started < 4 * INTERVAL + 2
    # The values come back before the agent writes its status: wait for that too.
    wanted = {"link:ntv0:mtu", "sysctl:ntv0:net.ipv4.conf.ntv0.rp_filter", "features:ntv0:rx-gro",
              "sysctl:host:net.ipv4.tcp_ecn"}
    wait_for(lambda: {k for k, v in a.status()["agent"]["keys"].items() if v["restores"]} >= wanted, 5)
    found = a.status()["agent"]
    drifted = {k: v for k, v in found["keys"].items() if v["drifts"]}
    assert set(drifted) == {"link:ntv0:mtu", "sysctl:ntv0:net.ipv4.conf.ntv0.rp_filter",
                            "features:ntv0:rx-gro", "sysctl:host:net.ipv4.tcp_ecn"}, drifted
    assert all(v["restores"] == 1 and not v["left_alone"] and v["on_drift"] == "restore"
               for v in drifted.values()), drifted
    assert found["reapplies"] >= 1 and found["last_reapply"]["journal"]
    # Each restore is journaled like any apply.
    journal = json.loads((lab.state / "netns" / lab.ns_a / "journal.json").read_text())
    assert journal["status"] == "committed" and journal["id"] == found["last_reapply"]["journal"]


def test_report_mode_records_drift_and_leaves_it(lab, agent):
    apply(lab, "report")
    a = agent()
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: a.key("link:ntv0:mtu").get("drifts") == 1, 10), a.stop()
    time.sleep(3 * INTERVAL)
    assert mtu(lab) == 1500
    rec = a.key("link:ntv0:mtu")
    assert rec["drifts"] == 1 and rec["restores"] == 0 and rec["drifted"]
    assert rec["on_drift"] == "report"
    assert a.status()["agent"]["reapplies"] == 0
    assert a.status()["agent"]["last_verify_ok"] is not None  # the one before the drift
    text = CliRunner().invoke(app, ["agent", "status", "--netns", lab.ns_a,
                                    "--state-dir", str(lab.state)]).stdout
    assert "link:ntv0:mtu: 1 drift(s), 0 restored" in text and "differs now" in text


def test_a_recreated_veth_is_retuned(lab, agent):
    # report mode: what puts the MTU back is the re-tune, not a restore.
    apply(lab, "report")
    a = agent()
    must(lab, "ip", "link", "del", "ntv0")
    must(lab, "ip", "link", "add", "ntv0", "type", "veth", "peer", "name", "ntv0p")
    assert wait_for(lambda: mtu(lab) == 9000 and gro(lab) == "on"
                    and sysctl(lab, "net.ipv4.conf.ntv0.rp_filter") == "2", 10), a.stop()
    found = a.status()["agent"]
    assert found["reapplies"] == 1
    assert found["last_reapply"]["reason"] == "appeared: ntv0"
    assert found["last_reapply"]["written"] == 3 and found["last_reapply"]["error"] is None


def test_a_flapping_key_is_left_alone_after_its_limit(lab, agent):
    apply(lab, "restore")
    a = agent("--flap-limit", "3")
    for n in (1, 2):
        must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
        assert wait_for(lambda: a.key("link:ntv0:mtu").get("restores") == n
                        and mtu(lab) == 9000, 10), a.stop()
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: a.key("link:ntv0:mtu").get("left_alone"), 10), a.stop()
    time.sleep(3 * INTERVAL)
    assert mtu(lab) == 1500
    rec = a.key("link:ntv0:mtu")
    assert rec["drifts"] == 3 and rec["restores"] == 2
    text = CliRunner().invoke(app, ["agent", "status", "--netns", lab.ns_a,
                                    "--state-dir", str(lab.state)]).stdout
    assert "LEFT ALONE" in text
    # The other keys are still kept.
    must(lab, "sysctl", "-qw", "net.ipv4.conf.ntv0.rp_filter=0")
    assert wait_for(lambda: sysctl(lab, "net.ipv4.conf.ntv0.rp_filter") == "2", 10), a.stop()


def test_without_a_desired_state_the_agent_idles(lab, agent):
    a = agent()
    found = a.status()
    assert found["desired"] is None and found["running"]
    assert found["agent"]["idle"].startswith("no desired state")
    # Idle means asleep: link events change nothing, and cost next to no CPU.
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1400")
    cpu = _cpu_seconds(a.proc.pid)
    time.sleep(4 * INTERVAL)
    assert _cpu_seconds(a.proc.pid) - cpu < 0.3
    assert mtu(lab) == 1400 and a.status()["agent"]["reapplies"] == 0
    # Once an apply commits a profile, the agent takes it up at its next poll.
    apply(lab, "restore")
    assert wait_for(lambda: (a.status()["agent"] or {}).get("desired"), 10), a.stop()
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: mtu(lab) == 9000, 10), a.stop()


def test_it_keeps_what_the_last_apply_or_rollback_left(lab, agent):
    first = apply(lab, "restore")
    second = apply(lab, "restore", mtu=4000)
    code, report = nictune(lab, "rollback")  # the second apply, and its desired state
    assert code == 0 and mtu(lab) == 9000, report
    a = agent()
    assert a.status()["agent"]["desired"]["path"] == first
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: mtu(lab) == 9000, 10), a.stop()
    apply(lab, "restore", mtu=4000)  # while it runs: taken up at its next turn
    assert wait_for(lambda: a.status()["agent"]["desired"]["path"] == second, 10), a.stop()
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: mtu(lab) == 4000, 10), a.stop()


@pytest.mark.parametrize("detail", [False, True], ids=["default", "metrics-detail"])
def test_the_running_agent_serves_its_drift_as_metrics(lab, agent, detail):
    # The agent's own endpoint (host/resident/metrics.py), scraped over the
    # namespace's loopback: the drift it recorded, as Prometheus reads it;
    # `nictune agent run --metrics-detail` gets the per-key counters through.
    from prometheus_client.parser import text_string_to_metric_families

    apply(lab, "report")
    a = agent("--metrics-address", "127.0.0.1:9463", *(["--metrics-detail"] if detail else []))
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: a.key("link:ntv0:mtu").get("drifts") == 1, 10), a.stop()

    def scrape() -> dict:
        r = lab.run(lab.ns_a, [sys.executable, "-c", "import urllib.request; print(urllib.request"
                               ".urlopen('http://127.0.0.1:9463/metrics', timeout=5).read().decode())"])
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(r.stdout) for s in family.samples}

    key = (("family", "link"), ("name", "mtu"), ("target", "ntv0"))
    assert wait_for(lambda: scrape().get(("nictune_drift", key)) == 1, 10), a.stop()
    samples = scrape()
    assert samples[("nictune_drift_events_total", key if detail else ())] == 1
    assert (("nictune_drift_events_total", ()) in samples) is not detail  # never both: no double count
    assert samples[("nictune_reapplies_total", ())] == 0


def test_rollback_while_the_agent_runs_restores_the_users_last_apply(lab, agent):
    first = apply(lab, "restore")
    apply(lab, "restore", mtu=4000)
    a = agent()
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: a.key("link:ntv0:mtu").get("restores") == 1 and mtu(lab) == 4000,
                    10), a.stop()
    state = lab.state / "netns" / lab.ns_a
    assert json.loads((state / "journal.json").read_text())["by"] == "agent"
    code, report = nictune(lab, "rollback")
    # The first apply's values, not the drifted 1500 the agent's record holds.
    assert code == 0 and mtu(lab) == 9000, report
    assert json.loads((state / "desired.json").read_text())["path"] == first
    assert wait_for(lambda: a.status()["agent"]["desired"]["path"] == first, 10), a.stop()
    # No fight: the agent keeps what the rollback left, over a few intervals...
    reapplies = a.status()["agent"]["reapplies"]
    for _ in range(4):
        time.sleep(INTERVAL)
        assert mtu(lab) == 9000 and sysctl(lab, "net.ipv4.tcp_ecn") == "1"
        assert sysctl(lab, "net.ipv4.conf.ntv0.rp_filter") == "2" and gro(lab) == "on"
    assert a.status()["agent"]["reapplies"] == reapplies
    # ...and restores it, not the rolled-back profile's, on the next drift.
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: mtu(lab) == 9000, 10), a.stop()
    time.sleep(2 * INTERVAL)
    assert mtu(lab) == 9000


def test_a_restarted_agent_reports_what_an_operator_changed_and_leaves_it(lab, agent):
    # on_drift: report (the default): a restart must not undo the change
    # an operator is looking into; it is reported as drift.
    apply(lab, "report")
    first = agent()
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: first.key("link:ntv0:mtu").get("drifts") == 1, 10), first.stop()
    first.stop()
    second = agent()
    assert wait_for(lambda: second.key("link:ntv0:mtu").get("drifted"), 10), second.stop()
    time.sleep(3 * INTERVAL)
    assert mtu(lab) == 1500
    found = second.status()["agent"]
    assert found["reapplies"] == 0 and found["keys"]["link:ntv0:mtu"]["on_drift"] == "report"


def test_a_damaged_desired_state_gives_way_to_its_copy(lab, agent):
    apply(lab, "restore")
    state = lab.state / "netns" / lab.ns_a
    (state / "desired.json").write_bytes(b'{"doc": {"nictune": 1, "interf')  # torn
    a = agent()
    found = a.status()["agent"]
    assert found["idle"] is None and found["desired_state"]["from_copy"], found
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: mtu(lab) == 9000, 10), a.stop()
    text = CliRunner().invoke(app, ["agent", "status", "--netns", lab.ns_a,
                                    "--state-dir", str(lab.state)]).stdout
    assert "desired state: the desired state" in text and "using its copy" in text
    assert "using its copy" in a.stop()


def test_a_link_whose_name_is_not_utf8_stops_neither_the_agent_nor_its_metrics(lab, agent):
    # Linux takes any bytes but '/', ':', whitespace and NUL in a name.
    must(lab, "ip", "link", "add", b"nt\xff\xfe", "type", "veth", "peer", "name", "ntraw0")
    apply(lab, "restore")
    textfile = lab.dir / "nictune.prom"
    a = agent("--metrics-address", "127.0.0.1:9463", "--metrics-textfile", str(textfile))
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
    assert wait_for(lambda: mtu(lab) == 9000, 10), a.stop()
    assert a.status()["agent"]["error"] is None
    r = lab.run(lab.ns_a, [sys.executable, "-c", "import urllib.request; print(urllib.request"
                           ".urlopen('http://127.0.0.1:9463/metrics', timeout=5).status)"])
    assert r.stdout.strip() == "200", r.stderr
    assert wait_for(lambda: textfile.exists() and 'device="nt:xff:xfe"' in textfile.read_text(),
                    10), a.stop()


# What the resident agent's process never imports: the CLI's modules (it is
# exec'd as the unit starts it), OpenSSL (_ssl, _hashlib: 5 MB of RSS for a
# plain-HTTP endpoint and one hash), shutil's archive formats (_bz2, _lzma),
# pyroute2.  (ssl, bz2 and lzma themselves are listed: imports that the
# agent makes fail, daemon.NOT_LOADED.)
NEVER_IMPORTED = ("typer", "rich", "click", "yaml", "jsonschema", "_ssl", "_hashlib", "_bz2", "_lzma",
                  "pyroute2")


def _imports_of_the_last_interpreter(log: str) -> set:
    """The modules listed by PYTHONPROFILEIMPORTTIME (every interpreter
    prints its own list, header first) after the last header: those of the
    process `agent run` exec'd, the resident agent."""
    assert "| imported package" in log, log[-2000:]
    own = log.rsplit("| imported package", 1)[1]
    return {line.rsplit("|", 1)[1].strip() for line in own.splitlines()
            if line.startswith("import time:")}


def test_the_agent_process_imports_no_cli_module_nor_openssl(lab, agent, monkeypatch):
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    apply(lab, "restore")
    a = agent("--metrics-address", "127.0.0.1:9463")
    must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")  # a restore: the engine writes, journals
    assert wait_for(lambda: a.key("link:ntv0:mtu").get("restores") == 1, 10), a.stop()
    scraped = lab.run(lab.ns_a, [sys.executable, "-c", "import urllib.request; print(urllib.request"
                                 ".urlopen('http://127.0.0.1:9463/metrics', timeout=5).read().decode())"])
    assert "nictune_drift" in scraped.stdout, scraped.stderr
    names = _imports_of_the_last_interpreter(a.stop())
    assert {"nictune.host.resident.daemon", "nictune.host.resident.metrics",
            "nictune.host.transaction.journal"} <= names
    assert not {n for n in names if n.split(".")[0] in NEVER_IMPORTED}


def test_without_netns_agent_run_execs_the_agent_too(tmp_path):
    # No desired state in a fresh state directory: it idles, writing nothing
    # but its status, in this namespace.
    state = tmp_path / "state"
    root = os.path.dirname(os.path.dirname(nictune_pkg.__file__))
    with open(tmp_path / "agent.log", "w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from nictune.cli.app import main; main()", "agent", "run",
             "--state-dir", str(state), "--metrics-address", ""],
            env=dict(os.environ, PYTHONPATH=root, PYTHONPROFILEIMPORTTIME="1"),
            stdout=log, stderr=subprocess.STDOUT)
        try:
            assert wait_for(lambda: (state / "agent-status.json").exists() or proc.poll() is not None)
            assert proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(10)
        log.seek(0)
        names = _imports_of_the_last_interpreter(log.read())
    assert "nictune.host.resident.daemon" in names
    assert not {n for n in names if n.split(".")[0] in NEVER_IMPORTED}


def test_a_drift_reported_by_netlink_is_put_back_without_waiting_for_the_poll(lab, agent):
    apply(lab, "restore")
    # The last --interval wins: no poll within the test; three drifts are no flapping here.
    a = agent("--interval", "3600", "--flap-limit", "10")
    for _ in range(3):  # one after the other, each right after the agent's own write
        must(lab, "ip", "link", "set", "ntv0", "mtu", "1500")
        assert wait_for(lambda: mtu(lab) == 9000, 10), a.stop()
    must(lab, "ethtool", "-K", "ntv0", "gro", "off")  # the ethtool monitor's event
    assert wait_for(lambda: gro(lab) == "on", 10), a.stop()
    time.sleep(1)  # the verify that the event of its own write asks for is over
    must(lab, "sysctl", "-qw", "net.ipv4.tcp_ecn=2")  # no event: left to the poll
    time.sleep(1)
    assert sysctl(lab, "net.ipv4.tcp_ecn") == "2"
