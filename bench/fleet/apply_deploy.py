"""The apply of bench/fleet/apply_profile.yaml as pyinfra at its fastest
honest form, for `bench/bench_fleet.py --apply` (run without --dry): the
facts it needs, then one operation.  Per host one Sysctl fact for all six
keys (server.sysctl would read a fact per key: six round trips) and one
Command fact for rail0's MTU and offloads; then, if anything differs, one
server.shell that sets exactly what differs (`sysctl -w`, `ip link set`,
`ethtool -K`).  pyinfra reads nothing back after it: the bench's own
read-back checks the hosts."""

import os
import sys

from pyinfra import host
from pyinfra.facts.server import Command, Sysctl
from pyinfra.operations import server

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402

RAIL = checks.RAIL
sysctls = host.get_fact(Sysctl, keys=list(checks.SYSCTLS))
mtu, _, ethtool_k = (host.get_fact(Command, command=f"cat /sys/class/net/{RAIL}/mtu && ethtool -k {RAIL}")
                     or "").partition("\n")
features = checks.features_on(ethtool_k)

commands = []
wrong = [f"{key}={value}" for key, value in checks.SYSCTLS.items() if str(sysctls.get(key, "")) != value]
if wrong:
    commands.append("sysctl -qw " + " ".join(wrong))
if mtu.strip() != checks.MTU:
    commands.append(f"ip link set {RAIL} mtu {checks.MTU}")
off = [flag for name, flag in zip(checks.FEATURES, checks.FEATURE_FLAGS) if features.get(name) != "on"]
if off:
    commands.append(f"ethtool -K {RAIL} " + " ".join(f"{flag} on" for flag in off))
if commands:
    server.shell(name=f"sysctls, {RAIL} MTU and offloads", commands=commands)
