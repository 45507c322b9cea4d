"""The gate's spec: the dataclasses a gate: section loads into, and load_gate(),
which refuses anything wrong with a ProfileError naming file, line and key."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from nictune.control.rollout.gate.schema import (DEFAULT_PERFTEST_PORT, DEFAULT_PORT, DEFAULT_STREAMS, GATE_SCHEMA,
                                         NCCL_PLACEHOLDERS, NOT_YET)
from nictune.host.errors import InvalidInput
from nictune.host.text import printable
from nictune.inventory.hostnames import host_name_problem
from nictune.profile.check import check, locate
from nictune.profile.errors import ProfileError, dotted
from nictune.profile.yamlpos import Parsed, Path

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")  # as control/rollout/hooks.py's


@dataclass
class Iperf3Spec:
    seconds: int = 5
    min_gbps: Optional[float] = None  # per pair and rail, all streams together; hosts may lower/raise it
    streams: int = DEFAULT_STREAMS    # TCP; UDP runs one stream at udp_gbps
    zerocopy: bool = False
    cpus: str = "numa"                # "numa", "any" or a taskset CPU list
    max_retransmits: Optional[int] = None
    udp_gbps: Optional[float] = None
    max_loss: Optional[float] = None  # percent


@dataclass
class IbWriteBwSpec:
    seconds: int = 5
    size: int = 65536
    min_gbps: Optional[float] = None
    tclass: Optional[int] = None     # None: the profile's, if it sets one
    port: int = DEFAULT_PERFTEST_PORT


@dataclass
class NcclTestsSpec:
    launcher: List[str] = field(default_factory=list)
    binary: str = "all_reduce_perf"
    gpus: int = 8
    min_bytes: int = 1 << 30
    max_bytes: int = 1 << 30
    step_factor: int = 2
    iterations: int = 20
    warmup: int = 5
    min_busbw: Optional[float] = None
    timeout: float = 300.0

    def test(self, hosts: int):
        """The nccltests.AllReducePerf of a run over `hosts` hosts: one rank
        per GPU under a launcher (as mpirun -np hosts*gpus ... -g 1, the
        nccl-tests README's multi-node example), else one process with
        every GPU of its host."""
        from nictune.control.rollout import nccltests

        return nccltests.AllReducePerf(
            min_bytes=self.min_bytes, max_bytes=self.max_bytes, step_factor=self.step_factor,
            gpus=1 if self.launcher else self.gpus, iterations=self.iterations, warmup=self.warmup,
            check=True, binary=self.binary)

    def argv(self, names: Sequence[str], addresses: Sequence[str], batch: int = 0,
             rollout: str = "") -> List[str]:
        """The launcher, its placeholders filled for these hosts (and the
        batch number and rollout name that the play's hooks see, for a
        reservation the hooks made), and all_reduce_perf's argv after it.  InvalidInput for a name or address
        that would read as an option or as several hosts ("," joins them)."""
        from nictune.control.rollout import nccltests
        from nictune.control.rollout.hooks import filled_argument

        for what, value in [("host name", n) for n in names] + [("address", a) for a in addresses]:
            if host_name_problem(value):
                raise InvalidInput(f"nccl-tests was not run: the {what} {printable(repr(value))[:80]} cannot go "
                                   "into the launcher's {hosts}/{addresses} (it starts with '-' or holds ',', "
                                   "blanks or control characters)")
        values = {"hosts": ",".join(names), "addresses": ",".join(addresses),
                  "np": str(len(names) * self.gpus), "gpus": str(self.gpus),
                  "batch": str(batch), "rollout": rollout}
        fill = [_TOKEN.sub(lambda m: {"{{": "{", "}}": "}"}.get(m.group()) or values[m.group(1)], arg)
                for arg in self.launcher]
        try:
            fill = [filled_argument(written, filled) for written, filled in zip(self.launcher, fill)]
        except ValueError as e:
            raise InvalidInput(f"nccl-tests was not run: {e}") from None
        return fill + nccltests.argv(self.test(len(names)))


def _launcher_problem(args: Sequence[str]) -> Optional[Tuple[int, str]]:
    """(index, why) of the first launcher argument with a brace that is not
    a placeholder, else None."""
    if args and args[0].startswith("-"):
        return 0, f"{printable(repr(args[0]))[:80]} is an option, not a program: the launcher starts with one"
    for i, arg in enumerate(args):
        for m in _TOKEN.finditer(arg):
            if m.group() in ("{{", "}}"):
                continue
            if m.group(1) is None:
                return i, (f"{printable(repr(arg))[:80]} has a lone {m.group()!r}; write {m.group() * 2} "
                           "for a literal brace")
            if m.group(1) not in NCCL_PLACEHOLDERS:
                return i, (f"{printable(repr(arg))[:80]} has the unknown placeholder "
                           f"{{{printable(m.group(1))[:40]}}}; the placeholders are {{hosts}}, {{addresses}}, "
                           "{np}, {gpus}, {batch} and {rollout} (write {{ and }} for literal braces)")
    return None


@dataclass
class GateSpec:
    rails: List[str]
    source: str                                  # "file:line" of gate:
    peers: Optional[str] = None
    timeout: Optional[float] = None
    port: int = DEFAULT_PORT
    iperf3: Optional[Iperf3Spec] = None
    ib_write_bw: Optional[IbWriteBwSpec] = None
    nccl_tests: Optional[NcclTestsSpec] = None
    counters: Dict[str, int] = field(default_factory=dict)
    baseline: Optional[str] = None               # resolved path
    max_regression: Optional[float] = None       # percent
    # Counters that must rise at least this much during the traffic (counters: min:).
    counters_min: Dict[str, int] = field(default_factory=dict)
    ipsec_offload: Optional[str] = None          # crypto / packet: SAs in use on the rails

    def run_timeout(self) -> float:
        seconds = max(self.iperf3.seconds if self.iperf3 else 0,
                      self.ib_write_bw.seconds if self.ib_write_bw else 0)
        return self.timeout if self.timeout is not None else seconds + 15


def _percent(text: str) -> float:
    return float(text[:-1])


def load_gate(parsed: Parsed, at: Path = (), base_dir: str = ".") -> GateSpec:
    """The gate: mapping at `at` in a parsed playbook; ProfileError naming
    file, line and key for anything wrong."""
    node: Any = parsed.doc
    for part in at:
        node = node[part]
    check(node, parsed.positions, parsed.plain, GATE_SCHEMA, prefix=at)

    def refuse(key: Path, message: str) -> ProfileError:
        return ProfileError(*locate(parsed.positions, at + key), dotted(at + key), message)

    for name in NOT_YET:
        if name in node:
            raise refuse((name,), f"{name} gates are not supported by this nictune yet; "
                                  "use iperf3: for now")
    if "iperf3" not in node and "ib_write_bw" not in node and "nccl_tests" not in node:
        raise refuse((), "a gate needs traffic to measure: add iperf3:, ib_write_bw: or nccl_tests: (counters "
                         "and baselines are read around it)")
    iperf3 = None
    if "iperf3" in node:
        raw = node["iperf3"]
        udp = raw.get("udp") or {}
        iperf3 = Iperf3Spec(seconds=raw.get("seconds", 5), min_gbps=raw.get("min_gbps"),
                            streams=raw.get("streams", DEFAULT_STREAMS), zerocopy=raw.get("zerocopy", False),
                            cpus=raw.get("cpus", "numa"),
                            max_retransmits=raw.get("max_retransmits"), udp_gbps=udp.get("gbps"),
                            max_loss=_percent(udp["max_loss"]) if udp else None)
    port = node.get("port", DEFAULT_PORT)
    if iperf3 is not None and port + iperf3.streams - 1 > 65535:
        # An iperf3 before 3.16 runs the streams as processes on ports port, port+1, ...
        raise refuse(("iperf3", "streams"), f"{iperf3.streams} streams from port {port} run past port 65535: "
                                            "give a lower port: or fewer streams")
    ib = None
    if "ib_write_bw" in node:
        raw = node["ib_write_bw"]
        ib = IbWriteBwSpec(seconds=raw.get("seconds", 5), size=raw.get("size", 65536),
                           min_gbps=raw.get("min_gbps"), tclass=raw.get("tclass"),
                           port=raw.get("port", DEFAULT_PERFTEST_PORT))
    nccl = _load_nccl_tests(node, refuse) if "nccl_tests" in node else None
    for name, tool in (("iperf3", iperf3), ("ib_write_bw", ib)):
        if tool is not None and "timeout" in node and node["timeout"] <= tool.seconds:
            raise refuse(("timeout",), f"{node['timeout']:g} s leaves no time for a {tool.seconds} s "
                                       f"{name} run: make it longer than {name}.seconds")
    if ("baseline" in node) != ("max_regression" in node):
        given, missing = ("baseline", "max_regression") if "baseline" in node else ("max_regression", "baseline")
        raise refuse((given,), f"{given} goes with {missing}: name both, or neither")
    baseline = node.get("baseline")
    if baseline is not None and not os.path.isabs(baseline):
        baseline = os.path.normpath(os.path.join(base_dir, baseline))
    file, line = locate(parsed.positions, at)
    return GateSpec(
        rails=list(node["rails"]), source=f"{file}:{line}", peers=node.get("peers"),
        timeout=node.get("timeout"), port=node.get("port", DEFAULT_PORT), iperf3=iperf3, ib_write_bw=ib,
        nccl_tests=nccl, counters=dict((node.get("counters") or {}).get("max") or {}), baseline=baseline,
        max_regression=_percent(node["max_regression"]) if "max_regression" in node else None,
        counters_min=dict((node.get("counters") or {}).get("min") or {}),
        ipsec_offload=node.get("ipsec_offload"))


def _load_nccl_tests(node: dict, refuse) -> NcclTestsSpec:
    from nictune.control.rollout import nccltests
    from nictune.host.errors import InvalidInput

    raw = node["nccl_tests"]
    bad = _launcher_problem(raw.get("launcher") or [])
    if bad:
        raise refuse(("nccl_tests", "launcher", bad[0]), bad[1])
    spec = NcclTestsSpec(
        launcher=list(raw.get("launcher") or []), binary=raw.get("binary", nccltests.BINARY),
        **{k: raw[k] for k in ("gpus", "min_bytes", "max_bytes", "step_factor", "iterations", "warmup",
                               "min_busbw") if k in raw},
        timeout=raw.get("timeout", node.get("timeout", 300.0)))
    if spec.min_bytes > spec.max_bytes:
        raise refuse(("nccl_tests", "min_bytes"), f"{spec.min_bytes} is above max_bytes {spec.max_bytes}")
    if spec.binary != nccltests.BINARY and not spec.binary.startswith("/"):
        raise refuse(("nccl_tests", "binary"), f"{printable(repr(spec.binary))[:200]} is not an absolute path: "
                                               f"give one ending in /{nccltests.BINARY}, or {nccltests.BINARY}")
    try:
        nccltests.argv(spec.test(1))
    except InvalidInput as e:
        raise refuse(("nccl_tests", "binary"), f"{e}: give an absolute path ending in "
                                               f"/{nccltests.BINARY}, or {nccltests.BINARY}") from None
    return spec


def load_play_gates(path: str) -> List[Optional[GateSpec]]:
    """Each play's gate (None for a play without one) of the playbook at path."""
    from nictune.profile import yamlpos

    parsed = yamlpos.parse_file(path, "playbook")
    if not isinstance(parsed.doc, list):
        raise ProfileError(path, None, "", "a playbook is a list of plays")
    base = os.path.dirname(path)
    return [load_gate(parsed, (i, "gate"), base) if isinstance(play, dict) and play.get("gate") is not None
            else None for i, play in enumerate(parsed.doc)]


def gate_of_play(play) -> Optional[GateSpec]:
    """The gate of a loaded playbook.Play, found again in its file by the
    play's "file:line" (the spec's errors need the lines)."""
    if getattr(play, "gate", None) is None:
        return None
    from nictune.profile import yamlpos

    file, _, line = play.source.rpartition(":")
    parsed = yamlpos.parse_file(file, "playbook")
    for i in range(len(parsed.doc)):
        if locate(parsed.positions, (i,)) == (file, int(line)) and isinstance(parsed.doc[i], dict):
            return load_gate(parsed, (i, "gate"), os.path.dirname(file))
    raise ProfileError(file, int(line), "gate", "the play is no longer in its file (changed meanwhile?)")
