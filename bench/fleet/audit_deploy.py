"""The audit of bench/fleet/profile.yaml as a pyinfra deploy, for
bench/bench_fleet.py; run with --dry.  Sysctls and the NCCL file are
pyinfra operations (server.sysctl, files.put: each reads its facts and
plans nothing when the host is as wanted).  MTU and GRO have no pyinfra
operation: a Command fact reads them, and a drift plans a server.shell
that would fix it, so it shows as a change like the others."""

from io import StringIO

from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import files, server

RAILS = ("rail0", "rail1")
SYSCTLS = {
    "net.ipv4.tcp_ecn": 1,
    "net.ipv4.tcp_mtu_probing": 1,
    "net.ipv4.tcp_slow_start_after_idle": 0,
    "net.ipv4.conf.rail0.arp_ignore": 1,
    "net.ipv4.conf.rail1.arp_ignore": 1,
}
# What nictune renders from the profile's nccl.env.
NCCL = (
    "# Managed by nictune: edit the profile, not this file.\n"
    "NCCL_DEBUG=WARN\n"
    "NCCL_IB_TIMEOUT=22\n"
    "NCCL_SOCKET_IFNAME==rail0,rail1\n"
)

mtus = host.get_fact(Command, command="cat " + " ".join(f"/sys/class/net/{r}/mtu" for r in RAILS))
if mtus.split() != ["9000"] * len(RAILS):
    server.shell(name="rail MTU", commands=[f"ip link set {r} mtu 9000" for r in RAILS])

for key, value in SYSCTLS.items():
    server.sysctl(name=f"sysctl {key}", key=key, value=value)

for rail in RAILS:
    features = host.get_fact(Command, command=f"/usr/sbin/ethtool -k {rail}")
    if "generic-receive-offload: on" not in features.splitlines():
        server.shell(name=f"{rail} GRO", commands=[f"/usr/sbin/ethtool -K {rail} gro on"])

files.put(name="NCCL file", src=StringIO(NCCL), dest="/etc/nccl.conf")
