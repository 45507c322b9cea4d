"""The audit of bench/fleet/profile.yaml as a pyinfra deploy of OPERATIONS,
for bench/bench_fleet.py; run with --dry.  Sysctls and the NCCL file are
pyinfra operations (server.sysctl, one per key, and files.put: each reads
its facts and plans nothing when the host is as wanted).  The link (MTU,
operstate) and the offloads have no pyinfra operation: a Command fact reads
them, and a drift plans a server.shell that would fix it, so it shows as a
change like the others.  The facts-only form, faster, is
audit_facts_deploy.py."""

import os
import sys
from io import StringIO

from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import files, server

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402

RAIL = checks.RAIL
link = host.get_fact(Command, command=f"cat /sys/class/net/{RAIL}/mtu /sys/class/net/{RAIL}/operstate")
if link.split() != [checks.MTU, checks.OPERSTATE]:
    server.shell(name=f"{RAIL} link", commands=[f"ip link set {RAIL} mtu {checks.MTU} up"])

for key, value in checks.SYSCTLS.items():
    server.sysctl(name=f"sysctl {key}", key=key, value=int(value))

features = host.get_fact(Command, command=f"/usr/sbin/ethtool -k {RAIL}").splitlines()
if any(f"{name}: on" not in features for name in checks.FEATURES):
    server.shell(name=f"{RAIL} offloads", commands=[f"/usr/sbin/ethtool -K {RAIL} gro on gso on rx on "
                                                    "rx-udp-gro-forwarding on"])

files.put(name="NCCL file", src=StringIO(checks.NCCL), dest=checks.NCCL_PATH)
