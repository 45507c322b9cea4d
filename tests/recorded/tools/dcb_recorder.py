"""Records what iproute2's `dcb` sends to dcbnl, for tests/recorded/dcb.

No device here implements DCB, and `dcb ets set` / `dcb pfc set` read the
current state (DCB_CMD_IEEE_GET) before they send anything.  So `dcb` runs
under nlshim.c (an LD_PRELOAD shim, compiled into a temp dir): the shim
logs every RTM_GETDCB/RTM_SETDCB message and answers it with the replies
written here, which are laid out the way the kernel's dcbnl_ieee_fill()
(net/dcb/dcbnl.c) lays them out.  Those replies are packed here with
struct, independently of nictune.host.transports.netlink.dcb, so the same bytes also test
nictune's decoder against `dcb -j ... show`.

    python tests/recorded/tools/dcb_recorder.py          # record, print a summary
    python tests/recorded/tools/dcb_recorder.py --write  # and rewrite tests/recorded/dcb/*.json

Set NT_DCB=/path/to/dcb to record with another `dcb` build: Debian 12's
iproute2 6.1 has no `dcb apptrust`, so apptrust-dscp-pcp.json and the
apptrust show of state-trust.json were recorded with iproute2 6.8.0 built
from source (`make SUBDIRS="lib dcb"`, needs libmnl-dev).  Rewriting keeps
recordings and shows the current dcb cannot make.  A test tool: never shipped.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
RECORDINGS = HERE.parent / "dcb"
IFNAME = "ens1f0np0"  # a ConnectX-7 port name; the shim never asks the kernel about it

RTM_GETDCB, RTM_SETDCB = 78, 79
CMD_IEEE_SET, CMD_IEEE_GET, CMD_GDCBX, CMD_SDCBX, CMD_IEEE_DEL = 20, 21, 22, 23, 27
ATTR_IFNAME, ATTR_IEEE, ATTR_DCBX = 1, 13, 14
IEEE_ETS, IEEE_PFC, IEEE_APP_TABLE, IEEE_MAXRATE = 1, 2, 3, 7
DCB_BUFFER, APP_TRUST_TABLE, REWR_TABLE = 10, 11, 12
APP_IEEE, APP_DCB = 1, 2  # entry attribute types: IEEE selectors / the PCP pseudo-selector
NLA_F_NESTED = 0x8000
SEL_DSCP, SEL_PCP = 5, 255

# --- the kernel's replies, packed by hand -----------------------------------


def _nla(kind: int, payload: bytes, flags: int = 0) -> bytes:
    head = struct.pack("=HH", 4 + len(payload), kind | flags)
    return head + payload + b"\0" * (-len(payload) % 4)


def _message(msg_type: int, cmd: int, attrs: bytes) -> bytes:
    # seq, pid and flags are filled in by the shim, as dcb_doit() does.
    body = struct.pack("=BBH", 0, cmd, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), msg_type, 0, 0, 0) + body


def _apps(entries) -> bytes:
    return b"".join(
        _nla(APP_DCB if sel == SEL_PCP else APP_IEEE, struct.pack("=BBH", sel, prio, proto))
        for sel, prio, proto in entries
    )


def ieee_get_reply(state: dict, ifname: str = IFNAME) -> bytes:
    """DCB_CMD_IEEE_GET's reply in dcbnl_ieee_fill() order.  The IEEE and
    APP_TABLE nests are started with nla_nest_start_noflag (no NLA_F_NESTED);
    REWR_TABLE and APP_TRUST_TABLE with nla_nest_start (flagged)."""
    ieee = b""
    if "ets" in state:
        e = state["ets"]
        fields = [e["willing"], e["ets_cap"], e["cbs"]]
        for name in ("tc_tx_bw", "tc_rx_bw", "tc_tsa", "prio_tc", "tc_reco_bw", "tc_reco_tsa", "reco_prio_tc"):
            fields += e[name]
        ieee += _nla(IEEE_ETS, struct.pack("=59B", *fields))
    if "maxrate" in state:
        ieee += _nla(IEEE_MAXRATE, struct.pack("=8Q", *state["maxrate"]))
    if "pfc" in state:
        p = state["pfc"]
        ieee += _nla(IEEE_PFC, struct.pack(
            "=BBBxH2x8Q8Q", p["pfc_cap"], p["pfc_en"], p["mbc"], p["delay"], *p["requests"], *p["indications"]
        ))
    if "buffer" in state:
        b = state["buffer"]
        ieee += _nla(DCB_BUFFER, struct.pack("=8B8II", *b["prio2buffer"], *b["buffer_size"], b["total_size"]))
    ieee += _nla(IEEE_APP_TABLE, _apps(state.get("apps", [])))
    ieee += _nla(REWR_TABLE, b"", NLA_F_NESTED)  # kernel 6.4+: always there, empty here
    if "trust" in state:
        entries = b"".join(_nla(APP_DCB if s == SEL_PCP else APP_IEEE, bytes([s])) for s in state["trust"])
        ieee += _nla(APP_TRUST_TABLE, entries, NLA_F_NESTED)
    attrs = _nla(ATTR_IFNAME, ifname.encode() + b"\0") + _nla(ATTR_IEEE, ieee)
    if "dcbx" in state:
        attrs += _nla(ATTR_DCBX, bytes([state["dcbx"]]))
    return _message(RTM_GETDCB, CMD_IEEE_GET, attrs)


def status_reply(cmd: int, attr: int, status: int = 0) -> bytes:
    """The RTM_SETDCB reply of IEEE_SET/IEEE_DEL/SDCBX: one u8 status
    (for IEEE_SET/DEL the driver's negative errno, as a u8)."""
    return _message(RTM_SETDCB, cmd, _nla(attr, bytes([status & 0xFF])))


# ConnectX-7-like state: all eight TCs, a configured ETS, PFC on for 0 and 4
# with pause counters, a 100 Gbit/s limit on TC 3, buffers, DSCP entries,
# DCBX host + CEE + IEEE.  mlx5 has no APP trust table.
STATES: Dict[str, dict] = {
    "mlx5": {
        "ets": {
            "willing": 0, "ets_cap": 8, "cbs": 0,
            "tc_tx_bw": [13, 12, 13, 12, 13, 12, 13, 12],
            "tc_rx_bw": [13, 12, 13, 12, 13, 12, 13, 12],
            "tc_tsa": [2, 2, 2, 2, 2, 2, 2, 2],
            "prio_tc": [1, 0, 2, 3, 4, 5, 6, 7],
            "tc_reco_bw": [0] * 8, "tc_reco_tsa": [0] * 8, "reco_prio_tc": [0] * 8,
        },
        "maxrate": [0, 0, 0, 100_000_000, 0, 0, 0, 0],
        "pfc": {
            "pfc_cap": 8, "pfc_en": 0x11, "mbc": 0, "delay": 0,
            "requests": [5, 0, 0, 0, 1_234_567_890_123, 0, 0, 0],
            "indications": [7, 0, 0, 0, 987_654_321, 0, 0, 0],
        },
        "buffer": {
            "prio2buffer": [0, 0, 0, 1, 0, 0, 0, 0],
            "buffer_size": [130_944, 130_944, 0, 0, 0, 0, 0, 0],
            "total_size": 1_048_576,
        },
        "apps": [[SEL_DSCP, 6, 48], [SEL_DSCP, 3, 26], [SEL_DSCP, 0, 0]],
        "dcbx": 0x0D,
    },
    # A switch-like port (sparx5/lan966x have dcbnl_getapptrust): PCP entries
    # (DCB_ATTR_DCB_APP), a trust order, no ETS/PFC getters, DCBX host+IEEE.
    "trust": {
        "apps": [[SEL_DSCP, 3, 26], [SEL_PCP, 5, 3], [SEL_PCP, 1, 9]],
        "trust": [SEL_DSCP, SEL_PCP],
        "dcbx": 0x09,
    },
}


def replies_for(state_name: str) -> Dict[str, bytes]:
    """File name (<nlmsg_type>-<cmd>.bin) -> reply, for the shim."""
    return {
        f"{RTM_GETDCB}-{CMD_IEEE_GET}.bin": ieee_get_reply(STATES[state_name]),
        f"{RTM_SETDCB}-{CMD_IEEE_SET}.bin": status_reply(CMD_IEEE_SET, ATTR_IEEE),
        f"{RTM_SETDCB}-{CMD_IEEE_DEL}.bin": status_reply(CMD_IEEE_DEL, ATTR_IEEE),
        f"{RTM_SETDCB}-{CMD_SDCBX}.bin": status_reply(CMD_SDCBX, ATTR_DCBX),
    }


# --- the cases ----------------------------------------------------------------

_IDENTITY = [f"{p}:{p}" for p in range(8)]
_MLNX_QOS_DSCP = [f"{d}:{d >> 3}" for d in range(64)]  # mlnx_qos --trust dscp default map

# "nictune" says which Dcb call makes the same request: set_ets/set_pfc start
# from the recorded state's ETS/PFC (as `dcb` does) and change the given fields.
CASES: List[dict] = [
    {
        "case": "ets-roce",
        "argv": ["ets", "set", "dev", IFNAME, "prio-tc", *_IDENTITY,
                 "tc-tsa", "all:strict", "0:ets", "3:ets", "tc-bw", "all:0", "0:50", "3:50"],
        "state": "mlx5",
        "nictune": {"method": "set_ets", "change": {
            "prio_tc": [0, 1, 2, 3, 4, 5, 6, 7],
            "tc_tsa": [2, 0, 0, 2, 0, 0, 0, 0],
            "tc_tx_bw": [50, 0, 0, 50, 0, 0, 0, 0]}},
    },
    {
        "case": "ets-strict",
        "argv": ["ets", "set", "dev", IFNAME, "tc-tsa", "all:strict", "tc-bw", "all:0", "prio-tc", *_IDENTITY],
        "state": "mlx5",
        "nictune": {"method": "set_ets", "change": {
            "tc_tsa": [0] * 8, "tc_tx_bw": [0] * 8, "prio_tc": [0, 1, 2, 3, 4, 5, 6, 7]}},
    },
    {
        "case": "pfc-prio3",
        "argv": ["pfc", "set", "dev", IFNAME, "prio-pfc", "all:off", "3:on"],
        "state": "mlx5",
        "nictune": {"method": "set_pfc", "change": {"pfc_en": 0x08}},
    },
    {
        "case": "pfc-prio3-delay",
        "argv": ["pfc", "set", "dev", IFNAME, "prio-pfc", "all:off", "3:on", "delay", "4096"],
        "state": "mlx5",
        "nictune": {"method": "set_pfc", "change": {"pfc_en": 0x08, "delay": 4096}},
    },
    {
        "case": "app-add-dscp",
        "argv": ["app", "add", "dev", IFNAME, "dscp-prio", "26:3", "48:6"],
        "state": "mlx5",
        "nictune": {"method": "add_apps", "apps": [[SEL_DSCP, 3, 26], [SEL_DSCP, 6, 48]]},
    },
    {
        "case": "app-del-dscp",
        "argv": ["app", "del", "dev", IFNAME, "dscp-prio", "26:3", "48:6"],
        "state": "mlx5",
        "nictune": {"method": "del_apps", "apps": [[SEL_DSCP, 3, 26], [SEL_DSCP, 6, 48]]},
    },
    {
        "case": "app-add-dscp-mlnx-qos-default",
        "argv": ["app", "add", "dev", IFNAME, "dscp-prio", *_MLNX_QOS_DSCP],
        "state": "mlx5",
        "nictune": {"method": "add_apps", "apps": [[SEL_DSCP, d >> 3, d] for d in range(64)]},
    },
    {
        "case": "apptrust-dscp-pcp",
        "argv": ["apptrust", "set", "dev", IFNAME, "order", "dscp", "pcp"],
        "state": "trust",
        "needs": "apptrust",
        "nictune": {"method": "set_trust", "selectors": [SEL_DSCP, SEL_PCP]},
    },
    {
        "case": "pfc-cable-length",
        "argv": ["pfc", "set", "dev", IFNAME, "delay", "100"],
        "state": "mlx5",
        "nictune": {"method": "set_pfc", "change": {"delay": 100}},
    },
    {
        "case": "buffer-prio3",
        "argv": ["buffer", "set", "dev", IFNAME, "prio-buffer", "all:0", "3:1",
                 "buffer-size", "all:0", "0:262144", "1:524288"],
        "state": "mlx5",
        "nictune": {"method": "set_buffer", "change": {
            "prio2buffer": [0, 0, 0, 1, 0, 0, 0, 0],
            "buffer_size": [262144, 524288, 0, 0, 0, 0, 0, 0]}},
    },
    {
        # What roce.dcbx: firmware sends to drivers other than mlx5 (mlx5
        # takes mode 0, which `dcb dcbx set` cannot send: it wants a flag).
        "case": "dcbx-lld-managed-ieee",
        "argv": ["dcbx", "set", "dev", IFNAME, "lld-managed", "ieee"],
        "state": "mlx5",
        "nictune": {"method": "set_dcbx", "mode": 0x0A},
    },
    {
        "case": "dcbx-host-ieee",
        "argv": ["dcbx", "set", "dev", IFNAME, "host", "ieee"],
        "state": "mlx5",
        "nictune": {"method": "set_dcbx", "mode": 0x09},
    },
]

# `dcb -j ... show` of each state: what iproute2 makes of the crafted reply
# (-s adds PFC's request/indication counters).
SHOWS: Dict[str, List[List[str]]] = {
    "mlx5": [["ets", "show", "dev", IFNAME], ["-s", "pfc", "show", "dev", IFNAME],
             ["maxrate", "show", "dev", IFNAME], ["app", "show", "dev", IFNAME],
             ["dcbx", "show", "dev", IFNAME], ["buffer", "show", "dev", IFNAME]],
    "trust": [["app", "show", "dev", IFNAME], ["dcbx", "show", "dev", IFNAME],
              ["apptrust", "show", "dev", IFNAME]],
}

# --- running dcb under the shim ---------------------------------------------


def dcb_path() -> Optional[str]:
    return os.environ.get("NT_DCB") or shutil.which("dcb")


def missing_tools() -> Optional[str]:
    """Why recording cannot run here, or None."""
    if dcb_path() is None:
        return "iproute2's dcb is not installed"
    if shutil.which("gcc") is None:
        return "gcc is not installed (needed to build the LD_PRELOAD shim)"
    return None


def build_shim(workdir: Path) -> Path:
    out = workdir / "nlshim.so"
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(out), str(HERE / "nlshim.c"), "-ldl"],
        check=True, capture_output=True, text=True,
    )
    return out


def dcb_version() -> str:
    r = subprocess.run([dcb_path(), "-V"], capture_output=True, text=True, check=False)
    return r.stdout.strip()


def dcb_supports(obj: str) -> bool:
    r = subprocess.run([dcb_path(), obj, "help"], capture_output=True, text=True, check=False)
    return f"dcb {obj}" in (r.stdout + r.stderr)


@dataclass
class Run:
    sent: List[bytes]
    stdout: str
    stderr: str
    returncode: int


def shim_env(shim: Path, log: Path, replies: Path) -> dict:
    return {**os.environ, "LANG": "C", "LC_ALL": "C", "LD_PRELOAD": str(shim),
            "NT_NLSHIM_LOG": str(log), "NT_NLSHIM_REPLIES": str(replies)}


def write_replies(directory: Path, replies: Dict[str, bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in replies.items():
        (directory / name).write_bytes(data)


def run_dcb(args: List[str], state: str, shim: Path, workdir: Path,
            replies: Optional[Dict[str, bytes]] = None) -> Run:
    """`dcb args` under the shim, answered with `replies` (by default what
    replies_for(state) crafts now)."""
    directory = workdir / f"replies-{state}"
    write_replies(directory, replies_for(state) if replies is None else replies)
    log = workdir / "sent.hex"
    log.unlink(missing_ok=True)
    r = subprocess.run([dcb_path(), *args], env=shim_env(shim, log, directory),
                       capture_output=True, text=True, check=False, timeout=10)
    sent = [bytes.fromhex(line) for line in log.read_text().split()] if log.exists() else []
    return Run(sent, r.stdout, r.stderr, r.returncode)


def normalised(message: bytes) -> bytes:
    """A message with nlmsg_seq and nlmsg_pid zeroed (dcb uses time(NULL) as seq)."""
    return message[:8] + bytes(8) + message[16:]


def record_case(case: dict, shim: Path, workdir: Path) -> dict:
    run = run_dcb(case["argv"], case["state"], shim, workdir)
    if run.returncode != 0 or not run.sent:
        raise RuntimeError(f"dcb {' '.join(case['argv'])}: exit {run.returncode}: {run.stderr.strip()}")
    return {
        "case": case["case"],
        "tool": dcb_version(),
        "recorded_with": "tests/recorded/tools/nlshim.c answering as dcbnl; seq and pid zeroed",
        "argv": ["dcb", *case["argv"]],
        "state": case["state"],
        "nictune": case["nictune"],
        "sent": [normalised(m).hex() for m in run.sent],
    }


def run_shows(state: str, shim: Path, workdir: Path,
              replies: Optional[Dict[str, bytes]] = None) -> List[Tuple[str, List[str], Run]]:
    """`dcb -j ... show` of each of SHOWS[state] whose object this dcb has:
    (object, dcb arguments, run), answered as run_dcb() answers."""
    runs = []
    for args in SHOWS[state]:
        obj = [a for a in args if not a.startswith("-")][0]
        if dcb_supports(obj):
            runs.append((obj, ["-j", *args], run_dcb(["-j", *args], state, shim, workdir, replies)))
    return runs


def record_state(name: str, shim: Path, workdir: Path) -> dict:
    shows = {}
    for obj, args, run in run_shows(name, shim, workdir):
        if run.returncode != 0:
            raise RuntimeError(f"dcb {' '.join(args)}: exit {run.returncode}: {run.stderr.strip()}")
        shows[obj] = {"tool": dcb_version(), "argv": ["dcb", *args],
                      "json": json.loads(run.stdout), "stderr": run.stderr}
    return {
        "state": name,
        "tool": dcb_version(),
        "how": "crafted after dcbnl_ieee_fill() in net/dcb/dcbnl.c (kernel 6.18 layout) "
               "by tests/recorded/tools/dcb_recorder.py",
        "spec": STATES[name],
        "ieee_get_reply": ieee_get_reply(STATES[name]).hex(),
        "dcb_show": shows,
    }


def _dump(data: dict) -> str:
    """One key per line, each sent message on its own line: diffable."""
    lines = []
    for key, value in data.items():
        if key == "sent":
            inner = ",\n".join(f"  {json.dumps(m)}" for m in value)
            lines.append(f' "sent": [\n{inner}\n ]')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv: List[str]) -> int:
    import tempfile

    why = missing_tools()
    if why:
        print(f"cannot record: {why}", file=sys.stderr)
        return 1
    write = "--write" in argv
    with tempfile.TemporaryDirectory(prefix="nt-dcb-") as tmp:
        work = Path(tmp)
        shim = build_shim(work)
        outputs = {}
        for name in STATES:
            outputs[f"state-{name}.json"] = record_state(name, shim, work)
        for case in CASES:
            if case.get("needs") and not dcb_supports(case["needs"]):
                print(f"skip {case['case']}: {dcb_version()} has no 'dcb {case['needs']}'")
                continue
            outputs[f"{case['case']}.json"] = record_case(case, shim, work)
    for name, data in outputs.items():
        print(f"{name}: {len(data.get('sent', []))} message(s) {data['tool']}")
        old = RECORDINGS / name
        if "dcb_show" in data and old.exists():
            # Keep shows this dcb cannot make (apptrust before iproute2 6.2).
            kept = json.loads(old.read_text())["dcb_show"]
            data["dcb_show"] = {**{k: v for k, v in kept.items() if k not in data["dcb_show"]}, **data["dcb_show"]}
        if write:
            (RECORDINGS / name).write_text(_dump(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
