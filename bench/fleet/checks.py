"""The 13 checks of bench/fleet/profile.yaml as plain data, for the audits
that compare in Python (audit_facts_deploy.py, ssh_floor.py) and for the
playbook and operations deploy to mirror.  Keep in step with profile.yaml."""

RAIL = "rail0"
SYSCTLS = {
    "net.ipv4.tcp_ecn": "1",
    "net.ipv4.tcp_mtu_probing": "1",
    "net.ipv4.tcp_slow_start_after_idle": "0",
    f"net.ipv4.conf.{RAIL}.arp_ignore": "1",
    f"net.ipv4.conf.{RAIL}.arp_announce": "2",
    f"net.ipv4.conf.{RAIL}.rp_filter": "2",
}
MTU = "9000"
OPERSTATE = "up"
# `ethtool -k` names of the profile's gro, gso, rx, rx-udp-gro-forwarding.
FEATURES = ("generic-receive-offload", "generic-segmentation-offload", "rx-checksumming",
            "rx-udp-gro-forwarding")
NCCL_PATH = "/etc/nccl.conf"
# What nictune renders from the profile's nccl.env: its header, then
# NAME=VALUE lines in profile order.  The header names the family since
# the owned-files work; older versions (a --baseline) wrote the legacy one,
# which nictune still takes as its own: either is as wanted.
NCCL_HEADERS = ("# Managed by nictune (nccl): edit the profile, not this file.\n",
                "# Managed by nictune: edit the profile, not this file.\n")
NCCL_BODY = (
    "NCCL_DEBUG=WARN\n"
    "NCCL_IB_TIMEOUT=22\n"
    "NCCL_SOCKET_IFNAME==rail0,rail1\n"
)
NCCL = NCCL_HEADERS[0] + NCCL_BODY


def drifts(sysctls: dict, mtu: str, operstate: str, ethtool_k: str, nccl: str) -> list:
    """What differs from the profile, one entry per kind of check (as the
    other tools group them: sysctls, link, offloads, NCCL file)."""
    out = []
    bad = sorted(k for k, v in SYSCTLS.items() if str(sysctls.get(k, "")).strip() != v)
    if bad:
        out.append("sysctl " + ",".join(bad))
    if mtu.strip() != MTU or operstate.strip() != OPERSTATE:
        out.append(f"{RAIL} link mtu={mtu.strip()} operstate={operstate.strip()}")
    features = {}
    for line in ethtool_k.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep:
            features[name] = value.split()[0] if value.split() else ""
    off = [f for f in FEATURES if features.get(f) != "on"]
    if off:
        out.append(f"{RAIL} offloads " + ",".join(off))
    if nccl not in (header + NCCL_BODY for header in NCCL_HEADERS):
        out.append("NCCL file")
    return out


# --- the fleet apply (bench_fleet.py --apply, apply_profile.yaml) -----------
# `ethtool -K` names of FEATURES, in the same order.
FEATURE_FLAGS = ("gro", "gso", "rx", "rx-udp-gro-forwarding")
# The drifted state every apply run starts from: each of the apply
# profile's eleven settings off its wanted value (put there by a plain ssh
# script and checked before each run).
DRIFTED_SYSCTLS = {
    "net.ipv4.tcp_ecn": "2",
    "net.ipv4.tcp_mtu_probing": "0",
    "net.ipv4.tcp_slow_start_after_idle": "1",
    f"net.ipv4.conf.{RAIL}.arp_ignore": "0",
    f"net.ipv4.conf.{RAIL}.arp_announce": "0",
    f"net.ipv4.conf.{RAIL}.rp_filter": "0",
}
DRIFTED_MTU = "1500"
DRIFT_SCRIPT = " && ".join([
    "sysctl -qw " + " ".join(f"{k}={v}" for k, v in DRIFTED_SYSCTLS.items()),
    f"ip link set {RAIL} mtu {DRIFTED_MTU}",
    f"ethtool -K {RAIL} " + " ".join(f"{flag} off" for flag in FEATURE_FLAGS),
])
# The apply's physical floor (bench_fleet.py --apply, tool ssh-apply): the
# eleven wanted values set blind, as fast as a shell can, in one plain ssh
# session that then reads them back (ssh_floor.py --apply).
WANT_SCRIPT = " && ".join([
    "sysctl -qw " + " ".join(f"{k}={v}" for k, v in SYSCTLS.items()),
    f"ip link set {RAIL} mtu {MTU}",
    f"ethtool -K {RAIL} " + " ".join(f"{flag} on" for flag in FEATURE_FLAGS),
])
# What drifts() says of a host in that state (its NCCL file untouched).
DRIFTED = ["sysctl " + ",".join(sorted(SYSCTLS)), f"{RAIL} link mtu={DRIFTED_MTU} operstate={OPERSTATE}",
           f"{RAIL} offloads " + ",".join(FEATURES)]


def features_on(ethtool_k: str) -> dict:
    """{feature: "on"/"off"} from `ethtool -k` output."""
    out = {}
    for line in ethtool_k.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep and value.split():
            out[name] = value.split()[0]
    return out
