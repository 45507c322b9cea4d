"""The audit of bench/fleet/profile.yaml as pyinfra at its fastest honest
form, for bench/bench_fleet.py: FACTS ONLY, no operations, run with --dry.
Per host one Sysctl fact for all six keys, one `ip -j link show rail0`
(MTU and operstate), one `ethtool -k rail0`, one `cat` of the NCCL file,
compared in Python (checks.py, shared with the ssh floor).  Each host
prints one line the bench reads: "BENCH-AUDIT <host> ok" or
"BENCH-AUDIT <host> drift <what>; <what>"."""

import json
import os
import sys

from pyinfra import host
from pyinfra.facts.server import Command, Sysctl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402

sysctls = host.get_fact(Sysctl, keys=list(checks.SYSCTLS))
link = json.loads(host.get_fact(Command, command=f"ip -j link show {checks.RAIL}") or "[{}]")[0]
features = host.get_fact(Command, command=f"ethtool -k {checks.RAIL}") or ""
# pyinfra's Command fact gives the output's lines joined by "\n", the last newline dropped.
nccl = (host.get_fact(Command, command=f"cat {checks.NCCL_PATH}") or "") + "\n"

found = checks.drifts(sysctls, str(link.get("mtu", "")), link.get("operstate", "").lower(), features, nccl)
print(f"BENCH-AUDIT {host.name} " + ("drift " + "; ".join(found) if found else "ok"), flush=True)
