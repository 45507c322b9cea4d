"""Running the gate: the Gate of a play, called after each batch passed its
verify, and for_play(), which builds it over the fleet's SSH settings."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from nictune.control.rollout.gate.baselines import compare, read_baseline
from nictune.control.rollout.gate.counters import counter_rows, read_counters
from nictune.control.rollout.gate.ib_write_bw import measure_ib_write_bw, rdma_endpoints
from nictune.control.rollout.gate.ipsec import ipsec_rows, read_sas
from nictune.control.rollout.gate.iperf3 import Floors, host_floors, measure_iperf3, rail_facts
from nictune.control.rollout.gate.nccl import run_nccl_tests
from nictune.control.rollout.gate.pairing import pair_up, rounds
from nictune.control.rollout.gate.parallel import parallel
from nictune.control.rollout.gate.parsers import BadOutput, clean, parse_rail_address, rail_addresses
from nictune.control.rollout.gate.rows import describe, fail, row
from nictune.control.rollout.gate.spec import GateSpec
from nictune.control.outcome import Outcome
from nictune.host.errors import TRAFFIC_GATE, NictuneError
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
    against the baseline.  rollout_name: the rollout's {rollout}, as its
    hooks see it (playbook.rollout_id), for the nccl-tests launcher."""

    def __init__(self, spec: GateSpec, connect, peers: Sequence = (), compare: bool = True,
                 tclass: Optional[int] = None, rollout_name: str = ""):
        self.spec, self.connect, self.compare = spec, connect, compare
        self.rollout_name = rollout_name
        # ib_write_bw's traffic class: the gate's own, else the profile's (for_play).
        self.tclass = spec.ib_write_bw.tclass if spec.ib_write_bw and spec.ib_write_bw.tclass is not None \
            else tclass
        self.peers = list(peers)
        self.kept: List[str] = []
        self.floors: Floors = {}
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
            if self.spec.iperf3:
                addresses.update(rail_facts(self.spec, sessions))
                self.floors = host_floors([self._hosts[n] for n in sessions])
            if self.spec.ib_write_bw:
                addresses.update(rdma_endpoints(self.spec, sessions))
            counting = self.spec.counters or self.spec.counters_min
            before = read_counters(self.spec, sessions) if counting else {}
            sas_before = read_sas(sessions) if self.spec.ipsec_offload else {}
            for rail in self.spec.rails if paired else []:
                for group in rounds(pairs):
                    for measured in parallel(lambda p, rail=rail: self._measure(p, rail, sessions, addresses), group):
                        rows += measured
            if self.spec.nccl_tests:
                rows += run_nccl_tests(self.spec, self._hosts, batch, sessions, number, self.rollout_name)
            if counting:
                rows += counter_rows(self.spec, before, read_counters(self.spec, sessions))
            if self.spec.ipsec_offload:
                rows += ipsec_rows(self.spec.ipsec_offload, self.spec.rails, sas_before, read_sas(sessions),
                                   self._rail_addresses(sessions))
        finally:
            parallel(lambda s: s.close(), list(sessions.values()))
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

    def _measure(self, pair: Tuple[str, str], rail: str, sessions, addresses) -> List[dict]:
        """A pair's measurements on a rail: iperf3, then ib_write_bw."""
        out = measure_iperf3(self.spec, pair, rail, sessions, addresses, self.floors)
        if self.spec.ib_write_bw:
            out.append(measure_ib_write_bw(self.spec, self.tclass, pair, rail, sessions, addresses))
        return out

    def _open(self, names: List[str], sessions: Dict[str, Any], rows: List[dict]) -> None:
        def one(name: str):
            try:
                return name, self.connect(self._hosts[name]), None
            except NictuneError as e:
                return name, None, str(e)
            except Exception as e:  # noqa: BLE001 - the other hosts' sessions must still be closed
                return name, None, f"cannot connect: {type(e).__name__}: {clean(str(e))}"

        for name, session, error in parallel(one, names):
            if session is not None:
                sessions[name] = session
            else:
                r = row(name, None, "*", "ssh")
                fail(r, error)
                rows.append(r)

    def _rail_addresses(self, sessions: Dict[str, Any]) -> Dict[Tuple[str, str], set]:
        """{(host, rail): every address of the rail} (the IPsec check's: an SA
        of one of them that is not offloaded to the rail is at fault)."""
        def one(item):
            name, rail = item
            try:
                result = sessions[name].run(["ip", "-j", "addr", "show", "dev", rail], 10)
                return item, rail_addresses(result.stdout, rail) if result.ok else set()
            except (BadOutput, NictuneError):
                return item, set()

        return dict(parallel(one, [(n, rail) for n in sessions for rail in self.spec.rails]))

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
        for (name, rail), address, error in parallel(one, items):
            if address:
                out[(name, rail)] = address
            else:
                r = row(name, None, rail, "address")
                fail(r, error)
                rows.append(r)
        return out


def _name(host: Any) -> str:
    return host if isinstance(host, str) else host.name


def for_play(play, spec: GateSpec, inventory, ssh_options, compare: bool = True, rollout_name: str = "") -> Gate:
    """The Gate of a play: its peers as the play sees them, SSH sessions
    with the fleet commands' own connection settings (fleet.ssh_host)."""
    from nictune.control.remote import fleet
    from nictune.control.rollout import traffic

    peers = [play.host(h) for h in inventory.select(spec.peers)] if spec.peers else []
    if spec.peers and not peers:
        file, _, line = spec.source.rpartition(":")
        raise ProfileError(file, int(line) if line.isdigit() else None, "gate.peers",
                           f"{spec.peers!r} matches no host of the inventory")

    def connect(host):
        return traffic.Session(fleet.ssh_host(host), ssh_options)

    tclass = None
    if spec.ib_write_bw is not None and spec.ib_write_bw.tclass is None:
        from nictune.control.rollout import perftest

        file, _, line = spec.source.rpartition(":")
        try:
            # The play's profile without inventory layers: one class for the gate.
            tclass, _ = perftest.traffic_class(play.profile().doc)
        except NictuneError as e:
            raise ProfileError(file, int(line) if line.isdigit() else None, "gate.ib_write_bw",
                               f"cannot tell the traffic class to measure with: {e}; give tclass:") from None
    return Gate(spec, connect, peers, compare, tclass, rollout_name)
