"""Running the gate: the Gate of a play, called after each batch passed its
verify, and for_play(), which builds it over the fleet's SSH settings."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

from nictune.control.gate.baselines import compare, read_baseline
from nictune.control.gate.pairing import pair_up, rounds
from nictune.control.gate.parsers import (COUNTERS_SCRIPT, GIDS_SCRIPT, BadOutput, clean, parse_counters,
                                          parse_iperf3, parse_rail_address, rdma_endpoint)
from nictune.control.gate.rows import describe, fail, row
from nictune.control.gate.spec import GateSpec
from nictune.control.outcome import Outcome
from nictune.host.errors import TRAFFIC_GATE, NictuneError
from nictune.host.text import printable
from nictune.profile.errors import ProfileError


def answer(passed: bool, message: str, results: Optional[List[dict]] = None) -> dict:
    """A gate's answer: passed, its measurements, and the one result shape
    (ok as passed; a failure is an error of kind traffic-gate)."""
    outcome = Outcome(True, message) if passed else Outcome.failed(TRAFFIC_GATE, message)
    return {"passed": passed, "results": list(results or []), **outcome.fields()}


class Gate:
    """gate(number, hosts) -> answer(): {"passed", "message", "results":
    [rows]} and an Outcome's fields (control/outcome.py): the gate of one
    play, called after each batch passed its verify.

    hosts: the batch, inventory hosts (as the play sees them) or names;
    peers: the hosts of `peers:`; connect(host) -> a traffic.Session.  It
    remembers the hosts of batches that passed, to pair a later batch of
    one with.  `compare=False` (gate record) measures without judging
    against the baseline."""

    def __init__(self, spec: GateSpec, connect, peers: Sequence = (), compare: bool = True,
                 tclass: Optional[int] = None):
        self.spec, self.connect, self.compare = spec, connect, compare
        # ib_write_bw's traffic class: the gate's own, else the profile's (for_play).
        self.tclass = spec.ib_write_bw.tclass if spec.ib_write_bw and spec.ib_write_bw.tclass is not None \
            else tclass
        self.peers = list(peers)
        self.kept: List[str] = []
        self._hosts: Dict[str, Any] = {_name(h): h for h in self.peers}

    def __call__(self, number: int, hosts: Sequence) -> dict:
        try:
            result = self._run(number, hosts)
        except NictuneError as e:
            result = answer(False, f"batch {number}: the gate failed: {e}")
        except Exception as e:  # noqa: BLE001 - a gate that breaks must fail its batch, never pass it
            result = answer(False, f"batch {number}: the gate failed: internal error "
                                   f"{type(e).__name__}: {clean(str(e))}")
        if result["passed"]:
            self.kept += [_name(h) for h in hosts]
        return result

    def _run(self, number: int, hosts: Sequence) -> dict:
        for h in hosts:
            self._hosts.setdefault(_name(h), h)
        batch = [_name(h) for h in hosts]
        paired = self.spec.iperf3 is not None or self.spec.ib_write_bw is not None
        pairs = pair_up(batch, [_name(p) for p in self.peers], self.kept) if paired else []
        if paired and not pairs:
            return answer(False, f"batch {number}: the gate has nothing to measure "
                                 f"{batch[0] if batch else 'it'} against: name peers: in the play's gate "
                                 "(a batch of one with no host kept before it)")
        # nccl-tests runs on the batch's own hosts, never on peers.
        involved = list(dict.fromkeys([h for pair in pairs for h in pair]
                                      + (batch if self.spec.nccl_tests else [])))
        sessions: Dict[str, Any] = {}
        rows: List[dict] = []
        try:
            self._open(involved, sessions, rows)
            addresses = self._addresses(sessions, rows) if paired else {}
            if self.spec.ib_write_bw:
                addresses.update(self._rdma(sessions))
            before = self._counters(sessions, rows) if self.spec.counters else {}
            for rail in self.spec.rails if paired else []:
                for group in rounds(pairs):
                    for measured in _parallel(lambda p, rail=rail: self._measure(p, rail, sessions, addresses),
                                              group):
                        rows += measured
            if self.spec.nccl_tests:
                rows += self._nccl_tests(batch, sessions)
            if self.spec.counters:
                rows += self._counter_rows(before, self._counters(sessions, rows))
        finally:
            _parallel(lambda s: s.close(), list(sessions.values()))
        if self.compare and self.spec.baseline:
            self._compare(rows)
        failed = [r for r in rows if not r["passed"]]
        if failed:
            more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
            message = (f"batch {number}: the traffic gate failed: "
                       + "; ".join(describe(r) for r in failed[:5]) + more)
        else:
            message = f"batch {number}: the traffic gate passed ({len(rows)} checks)"
        return answer(not failed, message, rows)

    def _compare(self, rows: List[dict]) -> None:
        try:
            baseline = read_baseline(self.spec.baseline)
        except NictuneError as e:
            for r in rows:
                if r["tool"] != "counters" and r.get("figures"):
                    fail(r, str(e))
            return
        compare(rows, baseline, self.spec.max_regression or 0.0, self.spec.baseline)

    def _open(self, names: List[str], sessions: Dict[str, Any], rows: List[dict]) -> None:
        def one(name: str):
            try:
                return name, self.connect(self._hosts[name]), None
            except NictuneError as e:
                return name, None, str(e)
            except Exception as e:  # noqa: BLE001 - the other hosts' sessions must still be closed
                return name, None, f"cannot connect: {type(e).__name__}: {clean(str(e))}"

        for name, session, error in _parallel(one, names):
            if session is not None:
                sessions[name] = session
            else:
                r = row(name, None, "*", "ssh")
                fail(r, error)
                rows.append(r)

    def _addresses(self, sessions: Dict[str, Any], rows: List[dict]) -> Dict[Tuple[str, str], str]:
        def one(item):
            name, rail = item
            try:
                result = sessions[name].run(["ip", "-j", "addr", "show", "dev", rail], 10)
                if not result.ok:
                    raise BadOutput(f"no interface {rail} ({result.why()})")
                return item, parse_rail_address(result.stdout, rail), None
            except (BadOutput, NictuneError) as e:
                return item, None, str(e)

        out = {}
        items = [(n, rail) for n in sessions for rail in self.spec.rails]
        for (name, rail), address, error in _parallel(one, items):
            if address:
                out[(name, rail)] = address
            else:
                r = row(name, None, rail, "address")
                fail(r, error)
                rows.append(r)
        return out

    def _measure(self, pair: Tuple[str, str], rail: str, sessions, addresses) -> List[dict]:
        client, server = pair
        spec = self.spec.iperf3
        kinds = [] if spec is None else [("iperf3-tcp", False)] + ([("iperf3-udp", True)] if spec.udp_gbps else [])
        out = []
        for tool, udp in kinds:
            r = row(client, server, rail, tool)
            out.append(r)
            missing = [h for h in pair if h not in sessions or (h, rail) not in addresses]
            if missing:
                fail(r, f"not measured: {', '.join(missing)} not reachable or no address on {rail}")
                continue
            try:
                r["figures"] = self._iperf3(sessions, client, server, addresses, rail, udp)
            except (BadOutput, NictuneError) as e:
                fail(r, str(e))
                continue
            self._judge(r, udp)
        if self.spec.ib_write_bw:
            out.append(self._ib_write_bw(pair, rail, sessions, addresses))
        return out

    def _rdma(self, sessions) -> Dict[Tuple[str, str, str], Any]:
        """{(host, rail, "rdma"): (Endpoint, GID address) or why not}."""
        def one(item):
            name, rail = item
            try:
                result = sessions[name].run(["sh", "-c", GIDS_SCRIPT, "sh", rail], 20)
                if not result.ok:
                    return (name, rail, "rdma"), result.why()
                return (name, rail, "rdma"), rdma_endpoint(result.stdout, rail)
            except (BadOutput, NictuneError) as e:
                return (name, rail, "rdma"), str(e)

        return dict(_parallel(one, [(n, rail) for n in sessions for rail in self.spec.rails]))

    def _ib_write_bw(self, pair: Tuple[str, str], rail: str, sessions, found) -> dict:
        from nictune.control import perftest

        client, server = pair
        r = row(client, server, rail, "ib_write_bw")
        ends = [found.get((h, rail, "rdma")) for h in pair]
        why = [f"{h}: {e}" for h, e in zip(pair, ends) if not isinstance(e, tuple)]
        if why or (server, rail) not in found:
            fail(r, "not measured: " + ("; ".join(why) or f"{server} has no address on {rail}"))
            return r
        ib = self.spec.ib_write_bw
        test = perftest.Perftest("ib_write_bw", size=ib.size, duration=ib.seconds, tclass=self.tclass,
                                 tcp_port=ib.port)
        limit = self.spec.timeout if self.spec.timeout is not None else perftest.time_limit(test)
        (client_end, _), (server_end, _) = ends
        r["tclass"], r["gid_index"] = self.tclass, client_end.gid_index
        try:
            started = sessions[server].start(perftest.server_argv(test, server_end), limit + 5)
            try:
                # perftest says "Waiting for client to connect" once it
                # listens; through a pipe that line may sit in its buffer,
                # so a server still running after 2 s is taken as ready.
                started.wait_for("Waiting for client", 2.0)
                if started.chan.exit_status_ready():
                    raise BadOutput(f"the ib_write_bw server on {server} exited: {started.output() or 'no output'}")
                result = sessions[client].run(perftest.client_argv(test, client_end, found[(server, rail)]), limit)
            finally:
                started.stop()
            if result.timed_out:
                raise BadOutput(f"ib_write_bw on {client} did not finish within {limit:g} s")
            if not result.ok:
                raise BadOutput(result.why())
            report = perftest.parse_bw(result.stdout, "ib_write_bw")
        except (BadOutput, NictuneError) as e:
            fail(r, str(e))
            return r
        r["figures"] = {"gbps": report.average_gbps, "peak_gbps": report.peak_gbps}
        if report.gid_index is not None and report.gid_index != client_end.gid_index:
            fail(r, f"ib_write_bw used GID index {report.gid_index}, not {client_end.gid_index} as asked")
        if ib.min_gbps is not None and report.average_gbps < ib.min_gbps:
            fail(r, f"{report.average_gbps:.3g} Gbit/s, less than min_gbps {ib.min_gbps:g}")
        return r

    def _nccl_tests(self, batch: List[str], sessions) -> List[dict]:
        """all_reduce_perf over the batch: once, launched on its first host,
        with a launcher; else on each host by itself, at once."""
        runs = [batch] if self.spec.nccl_tests.launcher else [[h] for h in batch]
        return _parallel(lambda names: self._all_reduce(names, sessions), runs)

    def _all_reduce(self, names: List[str], sessions) -> dict:
        from nictune.control import nccltests

        spec, first = self.spec.nccl_tests, names[0]
        r = row(",".join(names), None, "*", "nccl-tests")
        missing = [h for h in names if h not in sessions]
        if missing:
            fail(r, f"not run: {', '.join(missing)} not reachable")
            return r
        try:
            addresses = [getattr(self._hosts.get(h), "address", None) or h for h in names]
            argv = spec.argv(names, addresses)
            result = sessions[first].run(argv, spec.timeout)
        except NictuneError as e:
            fail(r, str(e))
            return r
        if result.timed_out:
            fail(r, f"{argv[0]} on {first} did not finish within {spec.timeout:g} s and was killed"
                     f"{_tail(result)}")
            return r
        if not result.ok:
            fail(r, f"{argv[0]} on {first} exited {result.exit_code}{_tail(result)}")
            return r
        try:
            report = nccltests.parse_all_reduce(result.stdout)
        except NictuneError as e:
            fail(r, f"{e}{_tail(result)}")
            return r
        largest = max(report.rows, key=lambda x: x.size)
        r["figures"] = {"avg_busbw_gbytes": report.avg_busbw,
                        "largest_busbw_gbytes": largest.out_of_place.busbw,
                        "largest_bytes": largest.size}
        for why in nccltests.problems(report):
            fail(r, why)
        if spec.min_busbw is not None and report.avg_busbw < spec.min_busbw:
            fail(r, f"avg bus bandwidth {report.avg_busbw:g} GB/s, less than min_busbw {spec.min_busbw:g}")
        return r

    def _iperf3(self, sessions, client: str, server: str, addresses, rail: str, udp: bool) -> Dict[str, float]:
        spec, limit = self.spec.iperf3, self.spec.run_timeout()
        saddr, caddr, port = addresses[(server, rail)], addresses[(client, rail)], str(self.spec.port)
        started = sessions[server].start(["iperf3", "-s", "-1", "-B", saddr, "-p", port, "--forceflush"],
                                         limit + 5)
        try:
            if not started.wait_for("Server listening", min(10.0, limit)):
                raise BadOutput(f"the iperf3 server on {server} did not start: {started.output() or 'no output'}")
            argv = ["iperf3", "-c", saddr, "-B", caddr, "-p", port, "-t", str(spec.seconds),
                    "--connect-timeout", "5000", "--json"]
            if udp:
                argv += ["-u", "-b", f"{spec.udp_gbps:g}G"]
            result = sessions[client].run(argv, limit)
            if result.timed_out:
                raise BadOutput(f"iperf3 on {client} did not finish within {limit:g} s")
            try:
                return parse_iperf3(result.stdout, udp)
            except BadOutput as e:
                raise BadOutput(str(e) if result.ok or str(e).startswith("iperf3:") else result.why()) from None
        finally:
            started.stop()

    def _judge(self, r: dict, udp: bool) -> None:
        spec, f = self.spec.iperf3, r["figures"]
        if udp:
            if f["lost_percent"] > spec.max_loss:
                fail(r, f"lost {f['lost_percent']:g}% of datagrams, more than max_loss {spec.max_loss:g}%")
            return
        if spec.min_gbps is not None and f["gbps"] < spec.min_gbps:
            fail(r, f"{f['gbps']:.3g} Gbit/s, less than min_gbps {spec.min_gbps:g}")
        if spec.max_retransmits is not None:
            if "retransmits" not in f:
                fail(r, "iperf3 reported no retransmits to check max_retransmits against")
            elif f["retransmits"] > spec.max_retransmits:
                fail(r, f"{f['retransmits']} retransmits, more than max_retransmits {spec.max_retransmits}")

    def _counters(self, sessions, rows: List[dict]) -> Dict[Tuple[str, str], Any]:
        def one(item):
            name, rail = item
            try:
                result = sessions[name].run(["sh", "-c", COUNTERS_SCRIPT, "sh", rail], 20)
            except NictuneError as e:
                return item, str(e)
            if not result.ok:
                return item, result.why()
            return item, parse_counters(result.stdout)

        items = [(n, rail) for n in sessions for rail in self.spec.rails]
        return dict(_parallel(one, items))

    def _counter_rows(self, before, after) -> List[dict]:
        out = []
        for (name, rail), then in before.items():
            r = row(name, None, rail, "counters")
            now = after.get((name, rail))
            out.append(r)
            for source in (then, now):
                if not isinstance(source, dict):
                    fail(r, f"cannot read its counters: {source}")
            if not r["passed"]:
                continue
            for counter, limit in self.spec.counters.items():
                if counter not in then or counter not in now:
                    fail(r, f"{name} has no counter {counter} on {rail}")
                    continue
                rise = now[counter] - then[counter]
                if rise < 0:
                    fail(r, f"{counter} went down ({then[counter]} to {now[counter]}): reset during the traffic")
                    continue
                r["figures"][counter] = rise
                if rise > limit:
                    fail(r, f"{counter} rose by {rise} during the traffic, more than its limit {limit}")
        return out


def _tail(result, lines: int = 3) -> str:
    """The last lines a failed command printed (stderr, else stdout),
    control characters escaped, for a row's why."""
    text = result.stderr.strip() or result.stdout.strip()
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return (": " + " | ".join(printable(line)[:300] for line in tail)) if tail else ": no output"


def _name(host: Any) -> str:
    return host if isinstance(host, str) else host.name


def _parallel(work, items: list, workers: int = 32) -> list:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(work, items))


def for_play(play, spec: GateSpec, inventory, ssh_options, compare: bool = True) -> Gate:
    """The Gate of a play: its peers as the play sees them, SSH sessions
    with the fleet commands' own connection settings (fleet.ssh_host)."""
    from nictune.control import fleet, traffic

    peers = [play.host(h) for h in inventory.select(spec.peers)] if spec.peers else []
    if spec.peers and not peers:
        file, _, line = spec.source.rpartition(":")
        raise ProfileError(file, int(line) if line.isdigit() else None, "gate.peers",
                           f"{spec.peers!r} matches no host of the inventory")

    def connect(host):
        return traffic.Session(fleet.ssh_host(host), ssh_options)

    tclass = None
    if spec.ib_write_bw is not None and spec.ib_write_bw.tclass is None:
        from nictune.control import perftest
        from nictune.control.playbook import play_profile

        file, _, line = spec.source.rpartition(":")
        try:
            # The play's profile without inventory layers: one class for the gate.
            tclass, _ = perftest.traffic_class(play_profile(play).doc)
        except NictuneError as e:
            raise ProfileError(file, int(line) if line.isdigit() else None, "gate.ib_write_bw",
                               f"cannot tell the traffic class to measure with: {e}; give tclass:") from None
    return Gate(spec, connect, peers, compare, tclass)
