"""Fleet agreement: the values every host of a fabric must share.

A host can match its own profile and still break a job: NCCL hangs or
loses its lossless class when the nodes of one job disagree on the traffic
class, the MTU, the set of RDMA NICs or the GID (NVIDIA/nccl issues 1524,
2428, 1277, 718, 1333).  Different groups may have different profiles, so
no per-host check can see it.  This module compares, per fabric and per
value of MUST_MATCH, what the hosts' verify reports already say; it reads
nothing from a host itself (no second SSH pass: the probe, the resident
agent and snapshots give the same reports).

The table, MUST_MATCH: value name -> where the per-host report has it
(a Source) -> the failure a disagreement predicts.  Sources:

    env(family, VAR, default)  a variable of an owned file (nccl, ucx,
                               nvshmem): the file's text as read back
                               (`before`), parsed as the library parses
                               it; unset reads as the library's default
    rail(family, key)          a per-interface key (link mtu, dcb pfc ...)
                               as read back, over the host's rails
    fact(name)                 an interface fact of the verify report
                               (driver, firmware, link_speed_mbps), over
                               the host's rails
    roce_mtu()                 the RoCE active MTU each rail's MTU gives
                               (rdma.roce_mtu, the kernel's rule: sysfs has
                               no file for it)
    count(what)                how many rails / RDMA devices the host's
                               profile matched
    nccl_gid()                 the kind of GID NCCL will use on each rail
                               ("RoCE v2 IPv4"): the rail's roce_gids fact at
                               NCCL_IB_GID_INDEX, or, with it unset, whether
                               the rail has a GID of the version and family
                               NCCL selects (NCCL_IB_ROCE_VERSION_NUM,
                               NCCL_IB_ADDR_FAMILY)

A host's value over its rails is the rails' common value; rails that
differ among themselves give {"rails": [their distinct values]}, which
shows as "4200|9000 (rails differ)" and disagrees with a fabric whose
rails all say 9000.  An audit compares what the hosts have (`before`); a
change review (change_effect) what the base and the new profile want
(`after` of each side's plan).
A host whose report has no value for a row (its profile does not manage
that file or key, it was unreachable) takes no part in that row.

Fabrics come from the inventory: the hosts whose `nictune_fabric`
variable has the same value (set it in a group's vars to make the group a
fabric).  Hosts without it are not compared.  A profile may tune the set
(`agreement:`): `skip: [names]` leaves rows out for the hosts of that
profile, `env: {nccl: [VAR, ...]}` adds variables that must match.

The agreement document ("agreement" in the --json envelope), format 1:

    {"nictune_agreement": 1,
     "summary": {"fabrics", "compared", "disagreeing", "outlier_hosts"},
     "fabrics": [{"fabric", "hosts": N, "not_compared": [host, ...],
                  "values": [ROW, ...]}]}
    ROW: {"name", "agree": bool, "predicts": text,
          "majority": {"value", "shown", "count"},
          "outliers": [{"value", "shown", "hosts": [...]}],   # largest first
          "not_read": N}
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Dict, Iterable, List, Optional, Tuple

from nictune.host.facts.rdma import roce_mtu as _kernel_roce_mtu

AGREEMENT_FORMAT = 1
FABRIC_VARIABLE = "nictune_fabric"
HOST = "host"
READ = ("ok", "drift", "pending")  # statuses whose `before` is the host's value


@dataclass(frozen=True)
class Source:
    kind: str       # env | rail | fact | count
    family: str = ""
    name: str = ""
    default: Optional[str] = None  # env: the library's value when unset


def env(family: str, name: str, default: Optional[str] = None) -> Source:
    return Source("env", family, name, default)


def rail(family: str, name: str) -> Source:
    return Source("rail", family, name)


def fact(name: str) -> Source:
    return Source("fact", "", name)


def count(what: str) -> Source:
    return Source("count", "", what)


def roce_mtu() -> Source:
    return Source("roce_mtu", "link", "mtu")


def nccl_gid() -> Source:
    return Source("gid", "nccl", "roce_gids")


@dataclass(frozen=True)
class MustMatch:
    name: str
    source: Source
    predicts: str


_TC = ("their QPs use the peer's traffic class; collectives across them hang or lose PFC "
       "protection")
_GID = "their QPs pick GIDs of another type or address family: connections between them fail or hang"

# The declared set.  Where a row's failure comes from: NCCL's param.cc and
# net_ib.cc (the IB/RoCE variables), the RoCE v2 QoS chain (DSCP ->
# priority -> PFC/ETS), and the NCCL issues named in the docstring.
MUST_MATCH: Tuple[MustMatch, ...] = (
    MustMatch("NCCL_IB_TC", env("nccl", "NCCL_IB_TC", "0"), _TC),
    MustMatch("NCCL_IB_SL", env("nccl", "NCCL_IB_SL", "0"),
              "their QPs use another service level: on IB, another virtual lane; collectives hang"),
    MustMatch("NCCL_IB_GID_INDEX", env("nccl", "NCCL_IB_GID_INDEX", "(NCCL selects)"), _GID),
    MustMatch("NCCL_IB_ROCE_VERSION_NUM", env("nccl", "NCCL_IB_ROCE_VERSION_NUM", "2"), _GID),
    MustMatch("NCCL_IB_ADDR_FAMILY", env("nccl", "NCCL_IB_ADDR_FAMILY", "AF_INET"), _GID),
    MustMatch("nccl_gid", nccl_gid(), _GID),
    MustMatch("NCCL_IB_HCA", env("nccl", "NCCL_IB_HCA", "(all)"),
              "they use another set of RDMA NICs: ranks open a different number of rails and "
              "the rings do not line up (hang or a fraction of the bandwidth)"),
    MustMatch("NCCL_IB_QPS_PER_CONNECTION", env("nccl", "NCCL_IB_QPS_PER_CONNECTION", "1"),
              "the two ends of a connection expect different QP counts: the connection fails"),
    MustMatch("NCCL_IB_SPLIT_DATA_ON_QPS", env("nccl", "NCCL_IB_SPLIT_DATA_ON_QPS", "0"),
              "the two ends split data over QPs differently: transfers stall"),
    MustMatch("NCCL_PROTO", env("nccl", "NCCL_PROTO", "(all)"),
              "ranks choose different protocols for one collective: it hangs"),
    MustMatch("NCCL_ALGO", env("nccl", "NCCL_ALGO", "(all)"),
              "ranks choose different algorithms for one collective: it hangs"),
    MustMatch("NCCL_BUFFSIZE", env("nccl", "NCCL_BUFFSIZE", "4194304"),
              "the two ends of a connection size their buffers differently: corrupt data or a hang"),
    MustMatch("NCCL_CROSS_NIC", env("nccl", "NCCL_CROSS_NIC", "2"),
              "ranks pair rails differently: traffic crosses rails through the spine, or hangs"),
    MustMatch("UCX_IB_TRAFFIC_CLASS", env("ucx", "UCX_IB_TRAFFIC_CLASS", "(auto)"), _TC),
    MustMatch("UCX_IB_SL", env("ucx", "UCX_IB_SL", "0"),
              "their QPs use another service level: traffic between them takes another class"),
    MustMatch("UCX_IB_GID_INDEX", env("ucx", "UCX_IB_GID_INDEX", "(auto)"), _GID),
    MustMatch("NVSHMEM_IB_TRAFFIC_CLASS", env("nvshmem", "NVSHMEM_IB_TRAFFIC_CLASS", "0"), _TC),
    MustMatch("NVSHMEM_IB_SL", env("nvshmem", "NVSHMEM_IB_SL", "0"),
              "their QPs use another service level: traffic between them takes another class"),
    MustMatch("NVSHMEM_IB_GID_INDEX", env("nvshmem", "NVSHMEM_IB_GID_INDEX", "(auto)"), _GID),
    MustMatch("trust", rail("dcb", "trust"),
              "they classify RoCE by another header field: frames land on another priority, "
              "without PFC"),
    MustMatch("dscp_map", rail("dcb", "dscp_map"),
              "the same DSCP lands on another priority on them: RoCE loses PFC protection "
              "between them (drops, go-back-N retransmits)"),
    MustMatch("pfc", rail("dcb", "pfc"),
              "they pause other priorities: RoCE between them is lossy (drops, retransmits) "
              "or pause frames block traffic that should flow"),
    MustMatch("ets.prio_tc", rail("dcb", "ets.prio_tc"),
              "a priority goes to another traffic class: RoCE gets another share of the link"),
    MustMatch("ets.tc_bw", rail("dcb", "ets.tc_bw"),
              "their classes get other bandwidth shares: RoCE is starved on some hosts"),
    MustMatch("ets.tc_tsa", rail("dcb", "ets.tc_tsa"),
              "a class is strict on some hosts and ETS on others: RoCE starves other traffic "
              "or is starved"),
    MustMatch("cnp_dscp", rail("roce", "ecn.cnp_dscp"),
              "their congestion notifications travel in another class: DCQCN reacts late, "
              "or CNPs are dropped"),
    MustMatch("cnp_prio", rail("roce", "ecn.cnp_prio"),
              "their congestion notifications travel on another priority: DCQCN reacts late, "
              "or CNPs are dropped"),
    MustMatch("roce_mode", rail("roce", "mode"), _GID),
    MustMatch("roce_tos", rail("roce", "tos"),
              "RDMA-CM connections from them use another class: they lose PFC protection"),
    MustMatch("mtu", rail("link", "mtu"),
              "frames larger than the smaller MTU are dropped between them: NCCL hangs "
              "at the first large message"),
    MustMatch("roce_active_mtu", roce_mtu(),
              "their QPs negotiate another path MTU: RoCE between them runs at the smaller "
              "one, or fails to connect"),
    MustMatch("link_speed_mbps", fact("link_speed_mbps"),
              "a slower rail sets the pace of every collective that crosses it"),
    MustMatch("rails", count("rails"),
              "ranks open a different number of rails: NCCL's rings do not line up (a hang, "
              "or a fraction of the bandwidth)"),
    MustMatch("rdma_nics", count("rdma_nics"),
              "they expose a different number of RDMA NICs: NCCL builds different topologies "
              "and the job hangs at init or runs at a fraction of the bandwidth"),
    MustMatch("driver", fact("driver"),
              "another driver on some hosts: RoCE behaviour (PFC, ECN, MTU) differs across the fabric"),
    MustMatch("firmware", fact("firmware"),
              "another firmware on some hosts: congestion control and RoCE behaviour differ "
              "across the fabric"),
)

NAMES = tuple(row.name for row in MUST_MATCH)
ENV_FAMILIES = ("nccl", "ucx", "nvshmem")
_RAIL_KEYS = frozenset((r.source.family, r.source.name) for r in MUST_MATCH
                       if r.source.kind in ("rail", "roce_mtu"))


# -- a host's values -------------------------------------------------------------

_SCALARS = (str, int, float, type(None))  # bool apart: True must not be 1


def _ident(value):
    """What a value compares and hashes as: itself for a scalar, else its
    repr (a dict's items sorted: key order is no difference).  repr, not
    a recursive freeze: it runs in C, and 10,000 hosts of 8 rails make
    hundreds of thousands of values (bench/bench_agreement.py)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is bool:
        return ("bool", value)
    if kind is dict:
        return ("{}", repr(sorted(value.items(), key=lambda item: str(item[0]))))
    return ("[]", repr(value))


class Mixed(tuple):
    """A host whose rails differ among themselves: their distinct idents."""


def _over_rails(raws: list):
    """(ident, value) of the rails' values: their common one, or Mixed."""
    if not raws:
        return None
    first = raws[0]
    # == first: lists and dicts compare in C (a dict's key order aside);
    # one rail's ident then stands for them all.
    if raws.count(first) == len(raws):
        return _ident(first), first
    distinct = {}
    for raw in raws:
        distinct.setdefault(_ident(raw), raw)
    order = sorted(distinct, key=str)
    return Mixed(order), {"rails": [distinct[i] for i in order]}


@lru_cache(maxsize=None)
def _syntax(family: str):
    from nictune.host.knobs import load

    return load(family).syntax


@lru_cache(maxsize=1024)
def _parsed(family: str, text: str) -> dict:
    """A file's variables; a fleet's hosts mostly share a few texts, so each
    is parsed once.  Callers only read the dict."""
    return _syntax(family).parse(text)


class HostValues:
    """One host report, indexed once for every row."""

    def __init__(self, report: dict, side: str = "before"):
        self.rails: Dict[Tuple[str, str], list] = {}
        self.files: Dict[str, dict] = {}
        changes = report.get("changes") or ()
        # Comprehensions and one tuple lookup per change: this loop is
        # most of the time 10,000 hosts take (bench/bench_agreement.py).
        targets = {c["key"]["target"] for c in changes}
        targets.discard(HOST)
        rails = self.rails
        any_status = side != "before"
        for c in changes:
            key = c["key"]
            pair = (key["family"], key["name"])
            if pair in _RAIL_KEYS:
                if key["target"] != HOST and (any_status or c.get("status") in READ):
                    bucket = rails.get(pair)
                    if bucket is None:
                        rails[pair] = [c.get(side)]
                    else:
                        bucket.append(c.get(side))
            elif pair[0] in ENV_FAMILIES and key["target"] == HOST and (any_status or c.get("status") in READ):
                value = c.get(side)
                if isinstance(value, str):
                    self.files[pair[0]] = _parsed(pair[0], value)
        self.facts = [f for name, f in (report.get("facts") or {}).items()
                      if isinstance(f, dict) and (not targets or name in targets)]
        self.targets = targets

    def value(self, source: Source):
        """(ident, value) of the host for a row, or None when its report has none."""
        if source.kind == "env":
            env = self.files.get(source.family)
            if env is None:
                return None
            value = env.get(source.name, source.default)
            return value, value
        if source.kind == "rail":
            return _over_rails(self.rails.get((source.family, source.name), []))
        if source.kind == "fact":
            return _over_rails([f[source.name] for f in self.facts if source.name in f])
        if source.kind == "gid":
            return self._nccl_gid()
        if source.kind == "roce_mtu":
            mtus = [_roce_mtu(v) for v in self.rails.get((source.family, source.name), [])]
            return _over_rails([m for m in mtus if m is not None])
        if source.name == "rails":
            number = len(self.targets)
        else:
            number = len({f["rdma_device"] for f in self.facts if "rdma_device" in f})
        return (number, number) if number else None

    def _nccl_gid(self):
        env = self.files.get("nccl")
        if env is None:
            return None
        return _over_rails([_gid_used(env, f["roce_gids"]) for f in self.facts
                            if isinstance(f.get("roce_gids"), dict)])


def _roce_mtu(netdev_mtu):
    if isinstance(netdev_mtu, bool) or not isinstance(netdev_mtu, int):
        return None
    return _kernel_roce_mtu(netdev_mtu)


def _gid_used(env: dict, kinds: dict) -> str:
    """The kind of GID NCCL uses on a rail whose GIDs are `kinds`."""
    index = env.get("NCCL_IB_GID_INDEX")
    if index not in (None, "", "-1"):
        return kinds.get(str(index).strip(), f"no GID at index {index}")
    family = "IPv6" if env.get("NCCL_IB_ADDR_FAMILY") == "AF_INET6" else "IPv4"
    wanted = f"RoCE v{env.get('NCCL_IB_ROCE_VERSION_NUM') or '2'} {family}"
    return wanted if wanted in kinds.values() else f"no {wanted} GID"


# -- which rows a host takes part in -----------------------------------------------

@dataclass(frozen=True)
class Settings:
    """A profile's agreement: section: rows skipped, variables added."""
    skip: frozenset = frozenset()
    extra: Tuple[MustMatch, ...] = ()

    @classmethod
    def of_profile(cls, doc: Optional[dict]) -> "Settings":
        section = (doc or {}).get("agreement") or {}
        extra = tuple(MustMatch(name, env(family, name, "(unset)"),
                                f"{name} differs: the profile's agreement: names it as a value "
                                "every host of the fabric must share")
                      for family, names in sorted((section.get("env") or {}).items())
                      for name in names if name not in NAMES)
        return cls(frozenset(section.get("skip") or ()), extra)

    @cached_property
    def rows(self) -> List[MustMatch]:
        return [r for r in MUST_MATCH if r.name not in self.skip] + list(self.extra)


class Membership:
    """Which fabric each audited host is in, and its profile's Settings;
    filled by the fleet commands from the inventory (cli/fleet_cmds.py)."""

    def __init__(self):
        self.fabric: Dict[str, str] = {}
        self.settings: Dict[str, Settings] = {}

    def add(self, host: str, fabric: Optional[str], doc: Optional[dict] = None) -> None:
        if fabric is None:
            return
        self.fabric[host] = fabric
        self.settings[host] = Settings.of_profile(doc)

    def __bool__(self) -> bool:
        return bool(self.fabric)


def fabric_name(value) -> Optional[str]:
    """A nictune_fabric value as the fabric's name; None: no fabric.
    Raises ValueError for one that cannot name a fabric (a mapping, a list)."""
    if value is None or value == "":
        return None
    if isinstance(value, (dict, list)):
        raise ValueError("must be a fabric's name (text or a number), not a "
                         f"{'mapping' if isinstance(value, dict) else 'list'}")
    return str(value)


# -- the comparison ---------------------------------------------------------------

def shown(value) -> str:
    """A value as a person reads it."""
    if isinstance(value, dict) and set(value) == {"rails"}:
        return "|".join(shown(v) for v in value["rails"]) + " (rails differ)"
    if isinstance(value, list):
        return ",".join(shown(v) for v in value) or "[]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def agreement(reports: Iterable[dict], membership: Membership, side: str = "before") -> dict:
    """The agreement document of the reports of the members' hosts.
    side: "before" (what the hosts have: audit) or "after" (what a plan
    leaves them with)."""
    by_fabric: Dict[str, dict] = {}
    for report in reports:
        fabric = membership.fabric.get(report.get("host"))
        if fabric is not None:  # a host twice (two plays): its last report
            by_fabric.setdefault(fabric, {})[report["host"]] = report
    fabrics = [_fabric(name, list(by_fabric[name].values()), membership, side)
               for name in sorted(by_fabric)]
    disagreeing = [row for f in fabrics for row in f["values"] if not row["agree"]]
    outliers = {(f["fabric"], h) for f in fabrics for row in f["values"] if not row["agree"]
                for o in row["outliers"] for h in o["hosts"]}
    return {"nictune_agreement": AGREEMENT_FORMAT,
            "summary": {"fabrics": len(fabrics),
                        "compared": sum(len(f["values"]) for f in fabrics),
                        "disagreeing": len(disagreeing), "outlier_hosts": len(outliers)},
            "fabrics": fabrics}


def _fabric(name: str, reports: List[dict], membership: Membership, side: str) -> dict:
    # Host by host, each report indexed and let go: 10,000 indexes kept at
    # once cost twice the CPU (bench/bench_agreement.py; most likely the
    # garbage collector's passes over them).
    seen: Dict[str, Dict[object, List[str]]] = {}
    sample: Dict[object, object] = {}  # ident -> the first value that had it
    rows: Dict[str, MustMatch] = {}
    not_compared = []
    for report in reports:
        host = report["host"]
        if report.get("error") and not report.get("changes"):
            not_compared.append(host)
            continue
        values = HostValues(report, side)
        for row in membership.settings[host].rows:
            found = values.value(row.source)
            if found is None:
                continue
            ident, value = found
            by_ident = seen.get(row.name)
            if by_ident is None:
                seen[row.name] = by_ident = {}
                rows[row.name] = row
            hosts = by_ident.get(ident)
            if hosts is None:
                by_ident[ident] = [host]
                sample.setdefault(ident, value)
            else:
                hosts.append(host)
    compared = len(reports) - len(not_compared)
    out = [_row(rows[n], seen[n], sample, compared) for n in [r for r in NAMES if r in seen] +
           sorted(n for n in seen if n not in NAMES)]
    return {"fabric": name, "hosts": len(reports), "not_compared": not_compared,
            "values": out}


def _row(row: MustMatch, by_ident: Dict[object, List[str]], sample: dict, compared: int) -> dict:
    # Most hosts first; a tie goes to the value that reads first, so the
    # same reports always give the same majority.
    ranked = sorted(((sample[i], hosts) for i, hosts in by_ident.items()),
                    key=lambda item: (-len(item[1]), shown(item[0])))
    (value, hosts), rest = ranked[0], ranked[1:]
    read = sum(len(h) for _, h in ranked)
    return {"name": row.name, "agree": not rest, "predicts": row.predicts,
            "majority": {"value": value, "shown": shown(value), "count": len(hosts)},
            "outliers": [{"value": v, "shown": shown(v), "hosts": sorted(h)} for v, h in rest],
            "not_read": compared - read}


# -- words ------------------------------------------------------------------------------

def sentence(fabric: str, row: dict) -> str:
    """"NCCL_IB_TC 106 on 95 hosts, 0 on 5: their QPs use ..." for a
    disagreeing row."""
    major = row["majority"]
    parts = [f"{major['shown']} on {major['count']} host{'s' if major['count'] != 1 else ''}"]
    parts += [f"{o['shown']} on {len(o['hosts'])} ({_few(o['hosts'])})" for o in row["outliers"]]
    return f"fabric {fabric}: {row['name']} {', '.join(parts)}: {row['predicts']}"


def _few(hosts: List[str], limit: int = 5) -> str:
    more = f" and {len(hosts) - limit} more" if len(hosts) > limit else ""
    return ", ".join(hosts[:limit]) + more


def disagreements(doc: Optional[dict]) -> List[Tuple[str, dict]]:
    """(fabric, row) of every disagreeing row."""
    return [(f["fabric"], row) for f in (doc or {}).get("fabrics") or ()
            for row in f["values"] if not row["agree"]]


def text_lines(doc: Optional[dict]) -> List[str]:
    """The agreement for a terminal: a line per fabric, one per disagreement."""
    if not doc or not doc["fabrics"]:
        return []
    out = []
    for f in doc["fabrics"]:
        bad = [row for row in f["values"] if not row["agree"]]
        verdict = (f"{len(bad)} value(s) disagree" if bad else "every value agrees")
        skipped = f"; {len(f['not_compared'])} host(s) not compared" if f["not_compared"] else ""
        out.append(f"fabric {f['fabric']}: {f['hosts']} host(s), {len(f['values'])} value(s) "
                   f"compared, {verdict}{skipped}")
        out += ["  " + sentence(f["fabric"], row) for row in bad]
    return out


def outlier_hosts(doc: Optional[dict]) -> set:
    return {h for _, row in disagreements(doc) for o in row["outliers"] for h in o["hosts"]}


def newly_disagreeing(before: dict, after: dict) -> dict:
    """What a change does to the agreement: hosts that become outliers
    (and rows that start to disagree), hosts that stop being outliers."""
    was, will = _outlier_pairs(before), _outlier_pairs(after)
    return {"hosts": sorted({h for h, _ in will - was}),
            "rows": sorted({n for _, n in will - was}),
            "fixed_hosts": sorted({h for h, _ in was - will} - {h for h, _ in will})}


def change_effect(reports: List[dict], membership: Membership) -> dict:
    """A plan with a base (control/review/change.py): the fabric agreement
    of what the base profile wants and of what the new one wants, both
    from the hosts' plans (what the hosts will have once applied), and the
    hosts the change makes disagree.  Facts (firmware, speed) no profile
    changes, and a plan does not read them."""
    after = agreement(reports, membership, side="after")
    bases = [{"host": r["host"], "error": r.get("error"),
              "changes": (r.get("base") or {}).get("changes") or []} for r in reports]
    before = agreement(bases, membership, side="after")
    return {**newly_disagreeing(before, after), "after": after}


def change_line(effect: Optional[dict]) -> Optional[str]:
    """"This change makes 12 host(s) disagree with their fabric: ..." or None."""
    if not effect:
        return None
    made, fixed = effect["hosts"], effect["fixed_hosts"]
    if not made and not fixed:
        return "This change leaves every fabric's agreement as it was."
    parts = []
    if made:
        parts.append(f"This change makes {len(made)} host(s) disagree with their fabric "
                     f"({_few(made)}) on {', '.join(effect['rows'])}")
    if fixed:
        parts.append(f"{'it' if made else 'This change'} brings {len(fixed)} host(s) back into "
                     f"agreement ({_few(fixed)})")
    return "; ".join(parts) + "."


def _outlier_pairs(doc: dict) -> set:
    return {(h, f"{fabric}: {row['name']}") for fabric, row in disagreements(doc)
            for o in row["outliers"] for h in o["hosts"]}
