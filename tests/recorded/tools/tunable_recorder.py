"""Records what ethtool sends for --set-tunable / --get-tunable
pfc-prevention-tout, for tests/recorded/ethtool.

Tunables exist only as SIOCETHTOOL ioctls (ETHTOOL_GTUNABLE/STUNABLE), and
no device here has one, so ethtool runs under ioctlshim.c (an LD_PRELOAD
shim, compiled into a temp dir) that logs each struct ethtool_tunable the
tool hands the kernel and answers a GET with a chosen value.

    python tests/recorded/tools/tunable_recorder.py          # record, print
    python tests/recorded/tools/tunable_recorder.py --write  # and rewrite the JSON files

A test tool: never shipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
RECORDINGS = HERE.parent / "ethtool"
IFNAME = "ens1f0np0"  # a ConnectX-7 port name; the shim never asks the kernel about it

# "nictune": the Tunables call that makes the same request.  ethtool 6.1
# takes numbers only: 65535 is PFC_STORM_PREVENTION_AUTO, 0 DISABLE.
CASES: List[dict] = [
    {"case": "set-pfc-prevention-tout-100",
     "argv": ["--set-tunable", IFNAME, "pfc-prevention-tout", "100"],
     "nictune": {"method": "set", "value": 100}},
    {"case": "set-pfc-prevention-tout-auto",
     "argv": ["--set-tunable", IFNAME, "pfc-prevention-tout", "65535"],
     "nictune": {"method": "set", "value": 0xFFFF}},
    {"case": "set-pfc-prevention-tout-off",
     "argv": ["--set-tunable", IFNAME, "pfc-prevention-tout", "0"],
     "nictune": {"method": "set", "value": 0}},
    {"case": "get-pfc-prevention-tout",
     "argv": ["--get-tunable", IFNAME, "pfc-prevention-tout"],
     "reply_value": 100,
     "nictune": {"method": "get"}},
]


def ethtool_path() -> Optional[str]:
    return os.environ.get("NT_ETHTOOL") or shutil.which("ethtool") or (
        "/usr/sbin/ethtool" if os.path.exists("/usr/sbin/ethtool") else None)


def missing_tools() -> Optional[str]:
    if ethtool_path() is None:
        return "ethtool is not installed"
    if shutil.which("gcc") is None:
        return "gcc is not installed (needed to build the LD_PRELOAD shim)"
    return None


def build_shim(workdir: Path) -> Path:
    out = workdir / "ioctlshim.so"
    subprocess.run(["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(out),
                    str(HERE / "ioctlshim.c"), "-ldl"], check=True, capture_output=True, text=True)
    return out


def shim_env(shim: Path, log: Path, value: Optional[int] = None, fail: Optional[int] = None) -> dict:
    env = {**os.environ, "LANG": "C", "LC_ALL": "C", "LD_PRELOAD": str(shim), "NT_IOCTLSHIM_LOG": str(log)}
    env.pop("NT_IOCTLSHIM_VALUE", None)
    env.pop("NT_IOCTLSHIM_ERRNO", None)
    if value is not None:
        env["NT_IOCTLSHIM_VALUE"] = str(value)
    if fail is not None:
        env["NT_IOCTLSHIM_ERRNO"] = str(fail)
    return env


def read_log(log: Path) -> List[List[str]]:
    """[[ifname, hex], ...] in the order the ioctls were made."""
    return [line.split(" ", 1) for line in log.read_text().splitlines()] if log.exists() else []


def record_case(case: dict, shim: Path, workdir: Path) -> dict:
    log = workdir / "sent.hex"
    log.unlink(missing_ok=True)
    r = subprocess.run([ethtool_path(), *case["argv"]], env=shim_env(shim, log, case.get("reply_value")),
                       capture_output=True, text=True, check=False, timeout=10)
    if r.returncode != 0:
        raise RuntimeError(f"ethtool {' '.join(case['argv'])}: exit {r.returncode}: {r.stderr.strip()}")
    version = subprocess.run([ethtool_path(), "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "case": case["case"],
        "tool": version,
        "recorded_with": "tests/recorded/tools/ioctlshim.c answering SIOCETHTOOL",
        "argv": ["ethtool", *case["argv"]],
        "reply_value": case.get("reply_value"),
        "stdout": r.stdout,
        "nictune": case["nictune"],
        "sent": read_log(log),
    }


def main(argv: List[str]) -> int:
    import tempfile

    why = missing_tools()
    if why:
        print(f"cannot record: {why}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="nt-tunable-") as tmp:
        shim = build_shim(Path(tmp))
        outputs: Dict[str, dict] = {f"{c['case']}.json": record_case(c, shim, Path(tmp)) for c in CASES}
    for name, data in outputs.items():
        print(f"{name}: {len(data['sent'])} ioctl(s) {data['tool']}")
        if "--write" in argv:
            RECORDINGS.mkdir(exist_ok=True)
            (RECORDINGS / name).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
