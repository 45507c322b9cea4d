"""Benchmark: what one host's probe audit costs the controller, in CPU and memory.

A probe audit's controller side (control/remote/ssh.py SshTarget._via_probe)
is an SSH session, then the verify replayed on the probe's answers
(probe.parse_answers, probe.verify: host/replay/probe_reads.py ProbedHost), then
hostreport.accept.  This bench tells the two apart:

1. It starts a fleet-lab host (nictune.lab.fleet, root needed), applies
   bench/fleet/profile.yaml there with the agent, lets the agent learn the
   verify's questions and asks them with the probe, all inside the host's
   namespace: one host's real answers, recorded.
2. replay: a fresh process (per version, taking turns with --baseline)
   replays that verify REPLAYS times, each under another host label, and
   prints the CPU (time.process_time) per host of parse, verify and accept;
   then holds HOLD hosts' reports as the audit does and prints the peak RSS
   and the bytes held per report (tracemalloc, on a sample).
3. ssh: paramiko's share per host on the controller, against the lab
   host's sshd: connect and authenticate; that plus the probe's session;
   and the whole SshTarget.run of a warm probe audit.

    sudo .venv/bin/python bench/bench_controller.py [--replays 200] [--hold 1000]
        [--rounds 3] [--sessions 20] [--baseline DIR] [--profile] [--save FILE]
    .venv/bin/python bench/bench_controller.py --from FILE ...   (no root, no fleet: replay only)

--baseline DIR: another checkout (its src/ is put first on PYTHONPATH,
its .venv's Python used if it has one); the replays of the two versions
take turns within each round.  --profile: cProfile of the replay, top
functions.  A bench, not a test: exit 0 even when a target is missed.
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
    """The verify request, its questions and one host's probe answers."""
    from nictune.control.remote import probe
    from nictune.control.remote.request import build_request
    from nictune.profile.loader import load_profile

    host = fleet.hosts[0]
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


def replay_main(path: str, replays: int, hold: int, profile: bool) -> None:
    """Runs in the measured version's process: prints one JSON line."""
    t_import = time.process_time()
    from nictune.control.remote import hostreport, probe
    t_import = time.process_time() - t_import

    with open(path) as f:
        rec = json.load(f)
    request, questions = rec["request"], rec["questions"]
    data = base64.b64decode(rec["answers"])

    def one(label: str, times=None) -> dict:
        t0 = time.process_time()
        answers = probe.parse_answers(data, questions)
        t1 = time.process_time()
        report = probe.verify(answers, request, label)
        t2 = time.process_time()
        report = hostreport.accept(report, label, request["command"])
        t3 = time.process_time()
        if times is not None:
            times.append((t1 - t0, t2 - t1, t3 - t2))
        return report

    first = time.process_time()
    report = one("host-0")  # the first host pays for the lazy imports
    first = time.process_time() - first
    if report["summary"] != rec["summary"]:
        raise SystemExit(f"bench: the replay says {report['summary']}, the agent {rec['summary']}")
    for i in range(3):
        one(f"warm-{i}")
    if profile:
        _profiled(lambda: [one(f"host-{i}") for i in range(replays)])
        return
    times: list = []
    for i in range(replays):
        one(f"host-{i}", times)
    parse, verify, accept = (sum(t[k] for t in times) / len(times) * 1000 for k in range(3))

    # What an audit holds: every host's report until the end.
    rss_before = _rss_mb()
    held = [one(f"held-{i}") for i in range(hold)]
    rss_held = _rss_mb()
    import tracemalloc

    sample = min(50, hold) or 1
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = [one(f"traced-{i}") for i in range(sample)]
    per_report = (tracemalloc.get_traced_memory()[0] - base) / sample
    replay_peak = (tracemalloc.get_traced_memory()[1] - base) / 1024 / 1024
    tracemalloc.stop()
    del held, kept
    print(json.dumps({"import_ms": t_import * 1000, "first_ms": first * 1000, "parse_ms": parse,
                      "verify_ms": verify, "accept_ms": accept, "total_ms": parse + verify + accept,
                      "rss_before_hold_mb": rss_before, "rss_peak_mb": rss_held,
                      "report_kb": per_report / 1024, "replay_peak_mb": replay_peak}))


def _profiled(work, threads: bool = False) -> None:
    """cProfile of work(), its top functions on stdout; threads: with the
    paramiko transports' own threads (where key exchange and packets go)."""
    import cProfile
    import pstats

    import paramiko

    prof = cProfile.Profile()
    others: list = []
    real_run = paramiko.Transport.run

    def profiled_run(transport):
        p = cProfile.Profile()
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


def run_replay(version: str, checkout: str, path: str, args) -> dict:
    env = dict(os.environ)
    python = sys.executable
    if checkout != ROOT:
        env["PYTHONPATH"] = os.path.join(checkout, "src")
        own = os.path.join(checkout, ".venv", "bin", "python")
        python = own if os.path.exists(own) else python
    argv = [python, os.path.abspath(__file__), "--replay-only", path, "--replays", str(args.replays),
            "--hold", str(args.hold)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"bench: the {version} replay failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- SSH: paramiko's share ----------------------------------------------------------------

def ssh_costs(fleet, sessions: int, probe_cache: str, questions: dict, profile: bool = False) -> dict:
    """CPU per host, in ms, of connect+auth, of that plus the probe's
    session (its answers only), and of a whole warm SshTarget.run."""
    from nictune.control.remote import probe
    from nictune.control.remote import ssh
    from nictune.control.remote.fleet import jobs_for, Profiles
    from nictune.inventory import load_inventory

    hosts = load_inventory(fleet.inventory).select(None, limit=fleet.hosts[0].name)
    options = ssh.SshOptions(probe_cache=probe_cache, ssh_config=fleet.ssh_config)
    job = jobs_for("verify", hosts, Profiles(PROFILE), options)[0]
    if job.error:
        raise SystemExit(f"bench: {job.error}")
    first = job.target.run(job.request)  # learns the questions
    again = job.target.run(job.request)
    if again.get("via") != "probe":
        raise SystemExit(f"bench: the second audit was not the probe's: {again.get('via')} {first.get('error')}")
    sh = job.target.host

    def connect_only():
        client, hops = ssh._open(sh, options)
        client.close()

    def probe_session():
        client, hops = ssh._open(sh, options)
        try:
            chan = client.get_transport().open_session()
            chan.exec_command(probe.remote_command(sh.python, sudo=False))
            chan.sendall(probe.encode_questions(questions))
            chan.shutdown_write()
            while chan.recv(1 << 20):
                pass
            chan.recv_exit_status()
            chan.close()
        finally:
            client.close()

    out = {}
    if profile:
        _profiled(lambda: [job.target.run(job.request) for _ in range(sessions)], threads=True)
        return out
    for name, fn in (("connect_auth_ms", connect_only), ("probe_session_ms", probe_session),
                     ("whole_audit_ms", lambda: job.target.run(job.request))):
        fn()
        t = time.process_time()
        for _ in range(sessions):
            fn()
        out[name] = (time.process_time() - t) / sessions * 1000
    return out


# -- main ---------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=200, help="verifies replayed per version and round")
    ap.add_argument("--hold", type=int, default=1000, help="hosts' reports held, as an audit of that many")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=20, help="SSH sessions timed per measure (0: none)")
    ap.add_argument("--baseline", help="another checkout to compare, turn about")
    ap.add_argument("--profile", action="store_true", help="cProfile of the replay (this checkout)")
    ap.add_argument("--save", help="keep the recorded answers in FILE")
    ap.add_argument("--from", dest="source", help="replay answers recorded with --save (no fleet)")
    ap.add_argument("--replay-only", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay_only:
        replay_main(args.replay_only, args.replays, args.hold, False)
        return 0
    print("command: " + " ".join([os.path.relpath(sys.executable)] + sys.argv))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = tempfile.mkdtemp(prefix="bench-controller-")
    fleet = None
    try:
        path = os.path.join(work, "answers.json")
        ssh = {}
        if args.source:
            shutil.copy(args.source, path)
        else:
            if os.geteuid() != 0:
                raise SystemExit("bench: recording a lab host's answers needs root (or --from FILE)")
            from nictune.lab import fleet as fleetlab

            fleet = fleetlab.up(1, os.path.join(work, "fleet"), prefix="ntcb" + secrets.token_hex(2))
            rec = record(fleet, "/var/lib/nictune")
            with open(path, "w") as f:
                json.dump(rec, f)
            if args.save:
                shutil.copy(path, args.save)
            if args.sessions:
                ssh = ssh_costs(fleet, args.sessions, os.path.join(work, "probe-cache"),
                                rec["questions"], args.profile)
        if args.profile:
            replay_main(path, args.replays, 0, True)
            return 0
        versions = [("this", ROOT)] + ([("baseline", os.path.abspath(args.baseline))] if args.baseline else [])
        results = {v: [] for v, _ in versions}
        for _ in range(args.rounds):
            for version, checkout in versions:
                results[version].append(run_replay(version, checkout, path, args))
        _print(results, ssh, args)
        return 0
    finally:
        if fleet is not None:
            from nictune.lab import fleet as fleetlab

            fleetlab.down(fleet.record)
        shutil.rmtree(work, ignore_errors=True)


def _print(results: dict, ssh: dict, args) -> None:
    keys = ("import_ms", "first_ms", "parse_ms", "verify_ms", "accept_ms", "total_ms",
            "report_kb", "replay_peak_mb", "rss_before_hold_mb", "rss_peak_mb")
    print(f"\nreplay of one lab host's probe answers (bench/fleet/profile.yaml), medians of "
          f"{args.rounds} rounds of {args.replays} replays; {args.hold} reports held")
    print(f"{'':22}" + "".join(f"{v:>12}" for v in results))
    for k in keys:
        print(f"{k:22}" + "".join(f"{statistics.median(r[k] for r in rs):12.2f}" for rs in results.values()))
    if len(results) == 2:
        this, base = (statistics.median(r["total_ms"] for r in rs) for rs in results.values())
        print(f"{'total this/baseline':22}{this / base:12.2f}")
    if ssh:
        print("\nSSH on the controller (paramiko), CPU ms per host, "
              f"{args.sessions} sessions each against one lab sshd")
        for k, v in ssh.items():
            print(f"  {k:22}{v:8.2f}")
    this = statistics.median(r["total_ms"] for r in results["this"])
    peak = statistics.median(r["rss_peak_mb"] for r in results["this"])
    print(f"\ntarget: replay+accept CPU <= {TARGET_CPU_MS:g} ms per host: {this:.2f} ms; "
          f"with SSH {this + ssh.get('probe_session_ms', 0):.2f} ms" if ssh else
          f"\ntarget: replay+accept CPU <= {TARGET_CPU_MS:g} ms per host: {this:.2f} ms")
    print(f"peak RSS with {args.hold} reports held: {peak:.1f} MB (target <= {TARGET_PEAK_MB:g} MB "
          "for a whole audit, SSH sessions included)")


if __name__ == "__main__":
    sys.exit(main())
