"""A real Slurm cluster on the fleet lab's namespace hosts, for tests.

Debian's own daemons, nothing faked: one munged (one key) and slurmctld
in the root namespace, the controller's side, listening on the fleet
bridge's address; one slurmd per namespace host (`slurmd -N <host>`),
each with its NodeName and NodeAddr (the host's 198.19.x.y on the
bridge), its own spool, pid, log and TmpFS under the test's directory.
The controller's commands (the play's hooks: scontrol, squeue) reach it
through SLURM_CONF; srun on a host reaches it over the bridge.

The nodes declare 8 GPUs as GRES (select/cons_tres) so that the shipped
launcher's --gpus-per-node runs as written: gres.conf names 8 character
devices made in the test's directory with /dev/null's numbers (there are
no GPUs here; Slurm only hands their indexes out as CUDA_VISIBLE_DEVICES).

Two things the arrangement needs, found by running it: slurmd is entered
into the host's network namespace only (nsenter --net), not through `ip
netns exec`, whose fresh /sys has no cgroup mounts and slurmd 22.05 will
not start without one; and TmpFS is per node (%n), because mpi/pmix makes
/tmp/spmix_appdir_<uid>_<job>.<step> on every node, and nodes sharing one
/tmp collide on it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, Iterator, List

import pytest

DAEMONS = ("slurmctld", "slurmd", "munged", "mungekey", "scontrol", "squeue", "sbatch", "srun", "scancel", "sinfo")
GPUS = 8
START_SECONDS = 30


@dataclass
class Slurm:
    dir: str
    conf: str
    env: Dict[str, str]
    nodes: List[str]
    processes: Dict[str, subprocess.Popen] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command on the controller's side."""
        result = subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=30)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {result.returncode}: {result.stdout}{result.stderr}")
        return result

    def reservations(self) -> str:
        """`scontrol show reservation`, one line each; "" when there is none."""
        out = self.run("scontrol", "-o", "show", "reservation").stdout.strip()
        return "" if out.startswith("No reservations") else out

    def node_states(self) -> Dict[str, str]:
        """Each node's state as the scheduler keeps it.  sinfo marks a node
        whose slurmd missed the controller's last ping with a trailing "*"
        (not responding): on a loaded 2-core machine a lab slurmd can, and
        that says nothing about draining or reservations, so it is left off."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return {name: state.rstrip("*") for name, state in (line.split() for line in out.splitlines())}

    def logs(self) -> str:
        """The daemons' logs' tails, for an assertion message."""
        paths = [os.path.join(self.dir, "slurmctld.log")] + [os.path.join(self.dir, n, "slurmd.log")
                                                                for n in self.nodes]
        return "\n".join(f"== {p}\n" + _tail(p) for p in paths if os.path.exists(p))


def _tail(path: str, lines: int = 15) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def require_slurm() -> None:
    """Skip (a failure under CI: tests/skips.py) without Slurm and munge."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not os.access(f"/usr/sbin/{d}", os.X_OK)]
    if missing:
        pytest.skip(f"needs Slurm and munge ({', '.join(missing)} missing: scripts/setup installs slurmctld, "
                    "slurmd, slurm-client, munge)")


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _conf(dir: str, controller: str, hosts, ctld_port: int, slurmd_port: int) -> str:
    lines = [
        "ClusterName=ntlab",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}({controller})",
        f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={dir}/munge.socket",
        f"StateSaveLocation={dir}/ctld", f"SlurmdSpoolDir={dir}/%n/spool", f"TmpFS={dir}/%n/tmp",
        f"SlurmctldPidFile={dir}/slurmctld.pid", f"SlurmdPidFile={dir}/%n/slurmd.pid",
        f"SlurmctldLogFile={dir}/slurmctld.log", f"SlurmdLogFile={dir}/%n/slurmd.log",
        "ProctrackType=proctrack/pgid", "TaskPlugin=task/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "GresTypes=gpu",
        "SchedulerType=sched/builtin", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "ReturnToService=2", "SlurmdParameters=config_overrides", "MailProg=/bin/true",
        "MinJobAge=5", "KillWait=2", "SlurmdTimeout=30", "MessageTimeout=5",
    ]
    # Twice as many CPUs as the gate's ranks: room beside another job, so
    # that only the play's wait, not a lack of CPUs, keeps the gate's step
    # from starting while that job runs.
    lines += [f"NodeName={h.name} NodeAddr={h.address} CPUs={2 * GPUS} RealMemory=1 Gres=gpu:{GPUS} State=UNKNOWN"
              for h in hosts]
    lines.append(f"PartitionName=lab Nodes={','.join(h.name for h in hosts)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _gres(dir: str) -> str:
    """8 character devices with /dev/null's numbers, named as GPUs."""
    os.makedirs(f"{dir}/dev", exist_ok=True)
    for i in range(GPUS):
        os.mknod(f"{dir}/dev/gpu{i}", 0o600 | 0o020000, os.makedev(1, 3))
    return f"Name=gpu File={dir}/dev/gpu[0-{GPUS - 1}]\n"


def _start(slurm: Slurm, name: str, argv: List[str]) -> None:
    out = open(os.path.join(slurm.dir, f"{name}.out"), "w")
    slurm.processes[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             env=slurm.env, start_new_session=True)
    out.close()


def _wait_idle(slurm: Slurm) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        for name, proc in slurm.processes.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited {proc.returncode}:\n{slurm.logs()}")
        result = slurm.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        states = dict(line.split() for line in result.stdout.splitlines()) if result.returncode == 0 else {}
        if sorted(states) == sorted(slurm.nodes) and set(states.values()) == {"idle"}:
            return
        time.sleep(0.3)
    raise AssertionError(f"the Slurm nodes did not come up idle within {START_SECONDS} s:\n{slurm.logs()}")


def _stop(slurm: Slurm) -> None:
    """slurmds first (they leave slurmstepd in the namespaces, which the
    fleet's removal kills), then slurmctld, then munged: each by its own
    process group, SIGTERM then SIGKILL."""
    order = [n for n in slurm.processes if n.startswith("slurmd-")] + ["slurmctld", "munged"]
    for name in (n for n in order if n in slurm.processes):
        proc = slurm.processes[name]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:
            proc.wait()


@contextmanager
def running_slurm(fleet, directory: str) -> Iterator[Slurm]:
    """Slurm over the fleet's sshd hosts, stopped on exit, pass or fail."""
    require_slurm()
    hosts = fleet.of_kind("sshd")
    with open(fleet.record) as f:
        record = json.load(f)
    controller = record["subnet"].rsplit(".", 1)[0] + ".1"  # the bridge's address (lab/fleet.py)
    dir = os.path.join(directory, "slurm")
    os.makedirs(f"{dir}/ctld", mode=0o700)
    for h in hosts:
        os.makedirs(f"{dir}/{h.name}/spool")
        os.makedirs(f"{dir}/{h.name}/tmp")
    conf = os.path.join(dir, "slurm.conf")
    with open(conf, "w") as f:
        f.write(_conf(dir, controller, hosts, _free_port(controller), _free_port(controller)))
    with open(os.path.join(dir, "gres.conf"), "w") as f:
        f.write(_gres(dir))
    env = {**os.environ, "SLURM_CONF": conf}
    slurm = Slurm(dir, conf, env, [h.name for h in hosts])
    try:
        subprocess.run(["mungekey", "--create", f"--keyfile={dir}/munge.key"], check=True, capture_output=True)
        _start(slurm, "munged", ["munged", "-F", "--force", f"--key-file={dir}/munge.key",
                                 f"--socket={dir}/munge.socket", f"--pid-file={dir}/munged.pid",
                                 f"--log-file={dir}/munged.log", f"--seed-file={dir}/munged.seed"])
        deadline = time.monotonic() + 10
        while not os.path.exists(f"{dir}/munge.socket") and time.monotonic() < deadline:
            time.sleep(0.05)
        _start(slurm, "slurmctld", ["slurmctld", "-D", "-i"])
        for h in hosts:
            _start(slurm, f"slurmd-{h.name}", ["nsenter", f"--net=/run/netns/{h.netns}", "slurmd", "-D",
                                                "-N", h.name])
        _wait_idle(slurm)
        yield slurm
    finally:
        _stop(slurm)
