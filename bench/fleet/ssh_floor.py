"""The physical floor of a fleet audit, for bench/bench_fleet.py: one plain
OpenSSH `ssh` per host (curve25519-sha256, no connection sharing), running
one shell script that prints the values of the 13 checks of
bench/fleet/profile.yaml, compared here with checks.py.  At most FORKS
sessions at once (a thread pool, as the other tools' forks).

    python ssh_floor.py [--apply] SSH_CONFIG FORKS HOST...

With --apply, the floor of a fleet apply (bench_fleet.py --apply): the same
session first sets the apply profile's eleven values (checks.WANT_SCRIPT),
then reads them back as above.

Prints one line per host, "BENCH-AUDIT <host> ok" or "... drift <what>;
<what>" or "... error <why>"; exit 0, 2 when a host drifted, 1 when one
failed."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# Run with -I: the script's folder is not on the path, and PYTHONPYCACHEPREFIX
# is ignored, so no bytecode is written into the clone either.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import checks  # noqa: E402

SEP = "@@nictune-bench@@"
SCRIPT = " && ".join([
    "cat " + " ".join("/proc/sys/" + key.replace(".", "/") for key in checks.SYSCTLS),
    f"cat /sys/class/net/{checks.RAIL}/mtu /sys/class/net/{checks.RAIL}/operstate",
    f"echo {SEP}", f"ethtool -k {checks.RAIL}", f"echo {SEP}", f"cat {checks.NCCL_PATH}",
])
SSH_OPTIONS = ["-o", "KexAlgorithms=curve25519-sha256", "-o", "ControlMaster=no", "-o", "ControlPath=none",
               "-o", "BatchMode=yes"]


def audit(config: str, name: str, first: str = "") -> str:
    proc = subprocess.run(["ssh", "-F", config, *SSH_OPTIONS, name, first + SCRIPT], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    parts = proc.stdout.split(SEP + "\n")
    if proc.returncode != 0 or len(parts) != 3:
        return f"error exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
    values = parts[0].split()
    if len(values) != len(checks.SYSCTLS) + 2:
        return f"error unexpected output {parts[0]!r}"
    sysctls = dict(zip(checks.SYSCTLS, values))
    found = checks.drifts(sysctls, values[-2], values[-1], parts[1], parts[2])
    return "drift " + "; ".join(found) if found else "ok"


def main() -> int:
    args = sys.argv[1:]
    first = checks.WANT_SCRIPT + " && " if args[:1] == ["--apply"] else ""
    args = args[1:] if first else args
    config, forks, names = args[0], int(args[1]), args[2:]
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(names)))) as pool:
        results = list(pool.map(lambda name: audit(config, name, first), names))
    for name, result in zip(names, results):
        print(f"BENCH-AUDIT {name} {result}")
    if any(r.startswith("error") for r in results):
        return 1
    return 2 if any(r.startswith("drift") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
