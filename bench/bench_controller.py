"""Benchmark: what one host's probe audit costs the controller, in CPU and memory.

A probe audit's controller side (control/remote/ssh.py SshTarget._via_probe)
is an SSH session, then the verify replayed on the probe's answers
(probe.parse_answers, probe.verify: host/replay/probe_reads.py ProbedHost), then
hostreport.accept.  This bench tells them apart:

1. It starts --hosts fleet-lab hosts (nictune.lab.fleet, root needed),
   applies bench/fleet/profile.yaml on each with the agent, lets the agent
   learn the verify's questions and asks them with the probe, all inside
   each host's namespace: the hosts' real answers, recorded.
2. replay: a fresh process per version (taking turns with --baseline)
   replays the verifies REPLAYS times, the hosts in turn, each under another
   label, with only what every host answered alike shared
   (host/replay/decoded.py), and prints the CPU (time.process_time) per host
   of parse, verify and accept; then holds HOLD hosts' reports as the audit
   does and prints the peak RSS and the bytes held per report.
3. SSH: paramiko's share per host on the controller, against two lab
   hosts' sshd: connect and authenticate; that plus the probe's session;
   the whole SshTarget.run of a warm probe audit.
4. CLI: `nictune audit` of every lab host, the whole process: CPU per host
   and peak RSS.

    sudo .venv/bin/python bench/bench_controller.py [--hosts 8] [--replays 200] [--hold 1000]
        [--rounds 3] [--sessions 20] [--baseline DIR] [--profile] [--save FILE]
    .venv/bin/python bench/bench_controller.py --from FILE ...   (no root, no fleet: replay only)

--baseline DIR: another checkout (its src/ is put first on PYTHONPATH,
its .venv's Python used if it has one).  --profile: cProfile of the
replay and the SSH audit, top functions.  A bench, not a test: exit 0
even when a target is missed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROFILE = os.path.join(HERE, "fleet", "profile.yaml")
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"
TARGET_CPU_MS = 10.0
TARGET_PEAK_MB = 200.0


# -- recording one lab host's answers ------------------------------------------------

def _agent_in(ns: str, request: dict) -> dict:
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "nictune.host.agent"],
                         input=json.dumps(request).encode(), capture_output=True, check=True, timeout=120)
    return json.loads(out.stdout)


def record(fleet, state_dir: str) -> dict:
    """Each lab host's verify request, questions and probe answers."""
    return {"hosts": [_record_host(host, state_dir) for host in fleet.hosts]}


def _record_host(host, state_dir: str) -> dict:
    from nictune.control.remote import probe
    from nictune.control.remote.request import build_request
    from nictune.profile.loader import load_profile

    profile = load_profile(PROFILE)
    base = {"host": host.name, "state_dir": state_dir}
    applied = _agent_in(host.netns, dict(build_request("apply", profile), **base))
    if not applied.get("ok"):
        raise SystemExit(f"bench: the apply on {host.name} failed: {applied.get('error')}")
    request = dict(build_request("verify", profile), **base)
    learned = _agent_in(host.netns, dict(request, learn=True))
    questions = probe.checked_questions(learned.get("questions"))
    if questions is None:
        raise SystemExit(f"bench: the agent taught no questions: {learned.get('questions')}")
    out = subprocess.run(["ip", "netns", "exec", host.netns, SYSTEM_PYTHON, "-I", "-S", "-c", probe.PROBE],
                         input=probe.encode_questions(questions), capture_output=True, check=True,
                         timeout=60)
    return {"request": request, "questions": questions,
            "answers": base64.b64encode(out.stdout).decode(), "summary": learned.get("summary")}


# -- the replay, in a process of its own -----------------------------------------------

def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Replays:
    """The recorded hosts' answers, replayed in turn as the controller does
    after each host's probe session."""

    def __init__(self, path: str):
        from nictune.control.remote import hostreport, probe

        self.probe, self.hostreport = probe, hostreport
        with open(path) as f:
            self.hosts = json.load(f)["hosts"]
        for h in self.hosts:
            h["data"] = base64.b64decode(h["answers"])
        self.turn = 0
        self.times: list = []
        self._shared = lambda: None
        self._shared = self._shared_as_in_a_fleet()

    def one(self, label: str, timed: bool = False) -> dict:
        rec = self.hosts[self.turn % len(self.hosts)]
        self.turn += 1
        request = rec["request"]
        self._shared()
        t0 = time.process_time()
        answers = self.probe.parse_answers(rec["data"], rec["questions"])
        t1 = time.process_time()
        report = self.probe.verify(answers, request, label)
        t2 = time.process_time()
        report = self.hostreport.accept(report, label, request["command"])
        t3 = time.process_time()
        if timed:
            self.times.append((t1 - t0, t2 - t1, t3 - t2))
        if report["summary"] != rec["summary"]:
            raise SystemExit(f"bench: the replay says {report['summary']}, the agent {rec['summary']}")
        return report

    def _shared_as_in_a_fleet(self):
        def replay(i: int) -> None:
            self.turn = i
            self.one("learning what hosts share")

        restore = _shared_as_in_a_fleet(replay, len(self.hosts))
        self.turn = 0
        return restore


def _shared_as_in_a_fleet(replay, hosts: int):
    """What makes each replay cost what it would in a fleet of distinct
    hosts: before it, the shared decoded messages (host/replay/decoded.py)
    are those that every recorded host answered alike, never those only the
    host replayed before answered (its link dump...).  replay(i) replays
    host i.  A no-op for a version without the shared decoding."""
    try:
        from nictune.host.replay import decoded
    except ImportError:
        return lambda: None
    if hosts < 2:
        raise SystemExit("bench: --hosts 2 at least: what hosts answer alike is shared, the rest not")
    cache = decoded.SHARED
    seen = []
    for i in range(hosts):
        cache._items.clear()
        cache._seen.clear()
        replay(i)  # met once: decoded, not kept
        replay(i)  # met again: kept
        seen.append(set(cache._items))
    common = set.intersection(*seen)
    kept = [(k, v) for k, v in cache._items.items() if k in common]

    def restore() -> None:
        from collections import OrderedDict

        cache._items = OrderedDict(kept)
        cache._size = sum(len(v.data) for _, v in kept)
        cache._seen.clear()  # this host's own messages: met for the first time

    return restore


def replay_main(path: str, replays: int, hold: int, profile: bool) -> None:
    """Runs in the measured version's process: prints one JSON line."""
    t_import = time.process_time()
    from nictune.control.remote import hostreport, probe  # noqa: F401 - timed
    t_import = time.process_time() - t_import

    r = Replays(path)
    for i in range(3):
        r.one(f"warm-{i}")
    if profile:
        _profiled(lambda: [r.one(f"host-{i}") for i in range(replays)])
        return
    for i in range(replays):
        r.one(f"host-{i}", timed=True)
    parse, verify, accept = (sum(t[k] for t in r.times) / len(r.times) * 1000 for k in range(3))

    # What an audit holds: every host's report until the end.
    rss_before = _rss_mb()
    held = [r.one(f"held-{i}") for i in range(hold)]
    rss_held = _rss_mb()
    import tracemalloc

    sample = min(50, hold) or 1
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = [r.one(f"traced-{i}") for i in range(sample)]
    per_report = (tracemalloc.get_traced_memory()[0] - base) / sample
    replay_peak = (tracemalloc.get_traced_memory()[1] - base) / 1024 / 1024
    tracemalloc.stop()
    del held, kept
    print(json.dumps({"import_ms": t_import * 1000, "parse_ms": parse,
                      "verify_ms": verify, "accept_ms": accept, "total_ms": parse + verify + accept,
                      "rss_before_hold_mb": rss_before, "rss_peak_mb": rss_held,
                      "report_kb": per_report / 1024, "replay_peak_mb": replay_peak}))


def _profiled(work, threads: bool = False) -> None:
    """cProfile of work(), its top functions on stdout; threads: with the
    paramiko transports' own threads (where key exchange and packets go)."""
    import cProfile
    import pstats

    import paramiko

    prof = cProfile.Profile(time.process_time)  # CPU, not wall: the machine may be busy
    others: list = []
    real_run = paramiko.Transport.run

    def profiled_run(transport):
        p = cProfile.Profile(time.thread_time)
        others.append(p)
        p.runcall(real_run, transport)

    if threads:
        paramiko.Transport.run = profiled_run
    try:
        prof.enable()
        work()
        prof.disable()
    finally:
        paramiko.Transport.run = real_run
    time.sleep(0.5)  # the last transports' threads finish
    stats = pstats.Stats(prof, stream=sys.stdout)
    for p in others:
        stats.add(p)
    _by_package(stats)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)


# Calls that wait (their time is wall, not CPU): left out of the sums.
_WAITS = ("recv", "acquire", "select", "poll", "sleep", "connect", "wait")


def _by_package(stats) -> None:
    """Own time by package, waits left out: where the CPU goes."""
    sums: dict = {}
    for (file, _, name), (_, _, tottime, _, _) in stats.stats.items():
        if file == "~" and any(w in name for w in _WAITS):
            continue
        if "site-packages/" in file:
            group = file.split("site-packages/")[1].split("/")[0]
        elif "/src/nictune/" in file:
            group = "nictune/" + file.split("/src/nictune/")[1].split("/")[0]
        elif file == "~":
            group = "builtins: " + name.split(" of ")[-1][:40]
        else:
            group = "stdlib " + os.path.basename(file)
        sums[group] = sums.get(group, 0) + tottime
    print("own time by package, s (waits left out):")
    for group, t in sorted(sums.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {t:8.3f}  {group}")


def version_env(version: str, checkout: str, work: str) -> tuple:
    """(python, environment) that run checkout's code, with its bytecode
    cached in the bench's temp dir (a user's second run: both versions
    alike, whatever __pycache__ the checkouts hold)."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=os.path.join(work, f"pycache-{version}"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    python = sys.executable
    if checkout != ROOT:
        env["PYTHONPATH"] = os.path.join(checkout, "src")
        own = os.path.join(checkout, ".venv", "bin", "python")
        python = own if os.path.exists(own) else python
    return python, env


def run_version(version: str, checkout: str, argv: list, work: str) -> dict:
    """This script's --replay-only or --ssh-only in checkout's code."""
    python, env = version_env(version, checkout, work)
    out = subprocess.run([python, os.path.abspath(__file__)] + argv, capture_output=True, text=True,
                         env=env, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"bench: the {version} run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- SSH: paramiko's share ----------------------------------------------------------------

def ssh_main(path: str, profile: bool) -> None:
    """Runs in the measured version's process: CPU per host, in ms, of
    connect+auth, of that plus the probe's session (its answers only), and
    of a whole warm SshTarget.run (prints one JSON line)."""
    from nictune.control.remote import probe
    from nictune.control.remote import ssh
    from nictune.control.remote.fleet import jobs_for, Profiles
    from nictune.inventory import load_inventory

    with open(path) as f:
        lab = json.load(f)
    sessions = lab["sessions"]
    hosts = load_inventory(lab["inventory"]).select(None, limit=",".join(lab["hosts"]))
    options = ssh.SshOptions(probe_cache=lab["probe_cache"], ssh_config=lab["ssh_config"])
    jobs = jobs_for("verify", hosts, Profiles(PROFILE), options)
    for job in jobs:
        if job.error:
            raise SystemExit(f"bench: {job.error}")
        first = job.target.run(job.request)  # learns the questions
        again = job.target.run(job.request)
        if again.get("via") != "probe":
            raise SystemExit(f"bench: the second audit was not the probe's: {again.get('via')} {first.get('error')}")
    shared = _shared_as_in_a_fleet(lambda i: jobs[i].target.run(jobs[i].request), len(jobs))
    turn = [0]

    def whole_audit():
        job = jobs[turn[0] % len(jobs)]
        turn[0] += 1
        shared()
        job.target.run(job.request)

    job = jobs[0]
    sh = job.target.host

    def connect_only():
        client, hops = ssh._open(sh, options)
        client.close()

    def probe_session():
        client, hops = ssh._open(sh, options)
        try:
            chan = client.get_transport().open_session()
            chan.exec_command(probe.remote_command(sh.python, sudo=False))
            chan.sendall(probe.encode_questions(lab["questions"]))
            chan.shutdown_write()
            while chan.recv(1 << 20):
                pass
            chan.recv_exit_status()
            chan.close()
        finally:
            client.close()

    failed = [0]

    def again(fn) -> None:
        # A loaded lab's sshd now and then drops a connection at once: the
        # session is made again (and counted: its CPU is in the figure).
        try:
            fn()
        except Exception:  # noqa: BLE001 - whatever the transport raised
            failed[0] += 1
            fn()

    if profile:
        _profiled(lambda: [whole_audit() for _ in range(sessions)], threads=True)
        return
    out = {}
    for name, fn in (("connect_auth_ms", connect_only), ("probe_session_ms", probe_session),
                     ("whole_audit_ms", whole_audit)):
        fn()
        t = time.process_time()
        for _ in range(sessions):
            again(fn)
        out[name] = (time.process_time() - t) / sessions * 1000
    out["sessions_failed"] = failed[0]
    print(json.dumps(out))


def _lab_file(work: str, fleet, answers: str, sessions: int, version: str) -> str:
    with open(answers) as f:
        rec = json.load(f)
    path = os.path.join(work, f"lab-{version}.json")
    with open(path, "w") as f:
        json.dump({"inventory": fleet.inventory, "ssh_config": fleet.ssh_config,
                   "hosts": [h.name for h in fleet.hosts[:2]],
                   "questions": rec["hosts"][0]["questions"], "sessions": sessions,
                   "probe_cache": os.path.join(work, f"probe-cache-{version}")}, f)
    return path


# -- the whole CLI audit ------------------------------------------------------------------

# Runs the CLI as its console script does (cli/app.py main), and notes the
# process's own CPU (every thread's) and peak RSS as it leaves.
_CLI = """
import os, resource, sys
path = sys.argv.pop(1)
from nictune.cli.app import run
sys.argv[0] = "nictune"
code = run()
sys.stdout.flush()
u = resource.getrusage(resource.RUSAGE_SELF)
with open(path, "w") as f:
    f.write("%f %f" % (u.ru_utime + u.ru_stime, u.ru_maxrss / 1024))
os._exit(code)
"""


def cli_audit(version: str, checkout: str, fleet, work: str, learn: bool = False) -> dict:
    """`nictune audit PROFILE -i INVENTORY --forks 50 --json` of every lab
    host, in a process of its own running checkout's code: its CPU per host
    and peak RSS.  learn: the first audit, which teaches the probe its
    questions (its figures are not the probe's)."""
    python, env = version_env(version, checkout, work)
    env["XDG_CACHE_HOME"] = os.path.join(work, f"xdg-{version}")
    note = os.path.join(work, f"rusage-{version}")
    argv = [python, "-c", _CLI, note, "audit", PROFILE, "-i", fleet.inventory, "--forks", "50", "--json"]
    out = subprocess.run(argv, capture_output=True, env=env, timeout=1800)
    try:
        report = json.loads(out.stdout)
    except ValueError:
        raise SystemExit(f"bench: the {version} audit gave no report: {out.stderr.decode()[-2000:]}") from None
    vias = {h.get("via") for h in report["hosts"]}
    want = {"zipapp"} if learn else {"probe"}
    if vias != want or len(report["hosts"]) != len(fleet.hosts):
        raise SystemExit(f"bench: the {version} audit went {vias}, not {want}: {out.stderr.decode()[-1000:]}")
    with open(note) as f:
        cpu, rss = (float(x) for x in f.read().split())
    return {"cli_cpu_per_host_ms": cpu / len(fleet.hosts) * 1000, "cli_peak_rss_mb": rss}


# -- main ---------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8, help="lab hosts whose answers are replayed in turn")
    ap.add_argument("--replays", type=int, default=200, help="verifies replayed per version and round")
    ap.add_argument("--hold", type=int, default=1000, help="hosts' reports held, as an audit of that many")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=20, help="SSH sessions timed per measure (0: none)")
    ap.add_argument("--baseline", help="another checkout to compare, turn about")
    ap.add_argument("--profile", action="store_true", help="cProfile of the replay and the SSH audit (this checkout)")
    ap.add_argument("--save", help="keep the recorded answers in FILE")
    ap.add_argument("--from", dest="source", help="replay answers recorded with --save (no fleet)")
    ap.add_argument("--replay-only", help=argparse.SUPPRESS)
    ap.add_argument("--ssh-only", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay_only:
        replay_main(args.replay_only, args.replays, args.hold, args.profile)
        return 0
    if args.ssh_only:
        ssh_main(args.ssh_only, args.profile)
        return 0
    print("command: " + " ".join([os.path.relpath(sys.executable)] + sys.argv))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = tempfile.mkdtemp(prefix="bench-controller-")
    fleet = None
    try:
        fleet, path = _answers(args, work)
        versions = [("this", ROOT)] + ([("baseline", os.path.abspath(args.baseline))] if args.baseline else [])
        if args.profile:
            replay_main(path, args.replays, 0, True)
            if fleet is not None and args.sessions:
                ssh_main(_lab_file(work, fleet, path, args.sessions, "this"), True)
            return 0
        results = {v: [] for v, _ in versions}
        ssh = {v: [] for v, _ in versions}
        cli = {v: [] for v, _ in versions}
        if fleet is not None:
            for version, checkout in versions:
                cli_audit(version, checkout, fleet, work, learn=True)
        replay = ["--replay-only", path, "--replays", str(args.replays), "--hold", str(args.hold)]
        for _ in range(args.rounds):
            for version, checkout in versions:
                results[version].append(run_version(version, checkout, replay, work))
                if fleet is not None and args.sessions:
                    lab = _lab_file(work, fleet, path, args.sessions, version)
                    ssh[version].append(run_version(version, checkout, ["--ssh-only", lab], work))
                if fleet is not None:
                    cli[version].append(cli_audit(version, checkout, fleet, work))
        _print(results, ssh, cli, args)
        return 0
    finally:
        if fleet is not None:
            from nictune.lab import fleet as fleetlab

            fleetlab.down(fleet.record)
        shutil.rmtree(work, ignore_errors=True)


def _answers(args, work: str) -> tuple:
    """(the lab fleet or None, the recorded answers' file)."""
    path = os.path.join(work, "answers.json")
    if args.source:
        shutil.copy(args.source, path)
        return None, path
    if os.geteuid() != 0:
        raise SystemExit("bench: recording lab hosts' answers needs root (or --from FILE)")
    from nictune.lab import fleet as fleetlab

    fleet = fleetlab.up(args.hosts, os.path.join(work, "fleet"), prefix="ntcb" + secrets.token_hex(2))
    try:
        with open(path, "w") as f:
            json.dump(record(fleet, "/var/lib/nictune"), f)
    except BaseException:
        fleetlab.down(fleet.record)
        raise
    if args.save:
        shutil.copy(path, args.save)
    return fleet, path


def _print(results: dict, ssh: dict, cli: dict, args) -> None:
    keys = ("import_ms", "parse_ms", "verify_ms", "accept_ms", "total_ms",
            "report_kb", "replay_peak_mb", "rss_before_hold_mb", "rss_peak_mb")
    print(f"\nreplay of the lab hosts' probe answers in turn (bench/fleet/profile.yaml), CPU ms per host, "
          f"medians of {args.rounds} rounds of {args.replays} replays; {args.hold} reports held")
    _rows(results, keys)
    if any(ssh.values()):
        print(f"\nSSH audit of one lab host on the controller (paramiko + replay), CPU ms per host, "
              f"medians of {args.rounds} rounds of {args.sessions} sessions")
        _rows(ssh, ("connect_auth_ms", "probe_session_ms", "whole_audit_ms", "sessions_failed"))
    if any(cli.values()):
        print(f"\nnictune audit of the {args.hosts} lab hosts (probe, --forks 50), the whole process: "
              f"medians of {args.rounds} rounds")
        _rows(cli, ("cli_cpu_per_host_ms", "cli_peak_rss_mb"))
    this = statistics.median(r["total_ms"] for r in results["this"])
    peak = statistics.median(r["rss_peak_mb"] for r in results["this"])
    whole = statistics.median(r["whole_audit_ms"] for r in ssh["this"]) if ssh.get("this") else None
    print(f"\ntarget: controller CPU <= {TARGET_CPU_MS:g} ms per host: replay+accept {this:.2f} ms"
          + (f", whole audit with SSH {whole:.2f} ms" if whole is not None else ""))
    print(f"peak RSS with {args.hold} reports held: {peak:.1f} MB (target <= {TARGET_PEAK_MB:g} MB "
          "for a whole audit, SSH sessions included)")


def _rows(results: dict, keys: tuple) -> None:
    print(f"{'':22}" + "".join(f"{v:>12}" for v in results))
    for k in keys:
        print(f"{k:22}" + "".join(f"{statistics.median(r[k] for r in rs):12.2f}" for rs in results.values()))
    if len(results) == 2:
        k = keys[0] if keys[0].startswith("cli") else "total_ms" if "total_ms" in keys else "whole_audit_ms"
        this, base = (statistics.median(r[k] for r in rs) for rs in results.values())
        print(f"{k + ' this/baseline':22}{this / base:12.2f}")


if __name__ == "__main__":
    sys.exit(main())
