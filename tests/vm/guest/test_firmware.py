"""The firmware family's devlink path on a real kernel: netdevsim's
driverinit params (max_macs, u32, 32 by default; test1, bool, true by
default: drivers/net/netdevsim/dev.c nsim_devlink_params) through generic
netlink, read back with `devlink -j dev param show`, and their running
values in netdevsim's debugfs (nsim_dev_debugfs_init: max_macs, test1),
which change only at `devlink dev reload` (nsim_dev_reload_up ->
nsim_devlink_param_load_driverinit_values).

plan (pending) -> apply (stored, not running: pending-reset, naming the
reload) -> a second apply writes nothing -> `devlink dev reload`, the
operator's hook -> verify ok -> rollback puts the stored values back
(devlink shows them), while the running ones stay until the next reload.
"""

from __future__ import annotations

import contextlib
import json
import os

from nictune_cli import changes, nictune
from rxe import sh

DEBUGFS = "/sys/kernel/debug"


@contextlib.contextmanager
def debugfs():
    mounted = os.path.isdir(os.path.join(DEBUGFS, "netdevsim"))
    if not mounted:
        sh("mount", "-t", "debugfs", "debugfs", DEBUGFS)
    try:
        yield
    finally:
        if not mounted:
            sh("umount", DEBUGFS, check=False)


def stored(handle: str, name: str):
    shown = json.loads(sh("devlink", "-j", "dev", "param", "show", handle, "name", name).stdout)
    (param,) = shown["param"][handle]
    (value,) = [v["value"] for v in param["values"] if v["cmode"] == "driverinit"]
    return value


def running(handle: str, name: str) -> str:
    with open(os.path.join(DEBUGFS, "netdevsim", handle.split("/")[1], name)) as f:
        return f.read().strip()


def test_driverinit_params_are_stored_then_run_after_reload_and_roll_back(pf, tmp_path):
    handle, ifname = pf
    path = tmp_path / "fw.yaml"
    path.write_text(f"""\
nictune: 1
interfaces:
  nsim:
    match: {{name: {ifname}}}
    firmware:
      params: {{max_macs: 16, test1: false}}
""")
    state = ["--state-dir", str(tmp_path / "state")]
    with debugfs():
        assert (stored(handle, "max_macs"), running(handle, "max_macs")) == (32, "32")
        code, report, _ = nictune("plan", str(path), *state)
        assert code == 2, report
        planned = changes(report)[(handle, "firmware", "param.max_macs")]
        assert (planned["before"], planned["after"], planned["status"]) == (32, 16, "pending")
        assert "running now: 32" in planned["note"]

        code, report, _ = nictune("apply", str(path), *state)
        assert code == 0, report
        assert (stored(handle, "max_macs"), stored(handle, "test1")) == (16, False)
        assert (running(handle, "max_macs"), running(handle, "test1")) == ("32", "Y")

        code, report, _ = nictune("verify", str(path), *state)
        assert code == 2, report
        for key in ("param.max_macs", "param.test1"):
            staged = changes(report)[(handle, "firmware", key)]
            assert staged["status"] == "pending-reset", staged
            assert f"devlink dev reload {handle}" in staged["note"]
        code, report, _ = nictune("apply", str(path), *state)  # nothing to write again
        assert {c["status"] for c in changes(report).values()} == {"pending-reset"}, report

        sh("devlink", "dev", "reload", handle)  # what the operator's hook does
        assert running(handle, "max_macs") == "16"
        # The reload made the port's netdev again: it may have another name.
        (ifname,) = os.listdir(f"/sys/bus/netdevsim/devices/{handle.split('/')[1]}/net")
        path.write_text(path.read_text().replace(f"name: {pf[1]}}}", f"name: {ifname}}}"))
        code, report, _ = nictune("verify", str(path), *state)
        assert code == 0 and {c["status"] for c in changes(report).values()} == {"ok"}, report

        code, report, _ = nictune("rollback", *state)
        assert code == 0, report
        assert (stored(handle, "max_macs"), stored(handle, "test1")) == (32, True)
        assert running(handle, "max_macs") == "16"  # until the next reload
