"""A real ovsdb-server for a test (Debian's openvswitch-switch tools), on a
database made from the packaged vswitch schema, listening only on a unix
socket in the test's directory, killed when the test ends whatever
happened.  Used by tests/ovs and tests/netns/test_offline_plans.py.

Without the OVS tools a test skips, loudly; under CI (CI=true) that skip
is a failure (tests/skips.py decides), so that CI never passes having
tested nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

# Installed with openvswitch-switch, or taken out of that package by
# scripts/setup (installing it would start OVS on the host).
SCHEMA = next((p for p in ("/usr/share/openvswitch/vswitch.ovsschema",
                           str(Path(__file__).resolve().parents[1] / ".venv/share/openvswitch/vswitch.ovsschema"))
               if os.path.exists(p)), "/usr/share/openvswitch/vswitch.ovsschema")
TOOLS = ("ovsdb-tool", "ovsdb-server", "ovsdb-client")
# Another key of other_config, as a DPDK host has it: never touched.
OTHER = {"dpdk-extra": "-a 0000:3b:00.0 --huge-unlink"}


def missing() -> str:
    gone = [t for t in TOOLS if shutil.which(t) is None]
    if not os.path.exists(SCHEMA):
        gone.append(SCHEMA)
    return ", ".join(gone)


class Ovsdb:
    def __init__(self, directory):
        self.dir = directory
        self.sock = str(directory / "db.sock")

    def client(self, *args: str) -> str:
        return subprocess.run(["ovsdb-client", *args], check=True, capture_output=True,
                              text=True, timeout=20).stdout

    def transact(self, *ops: dict) -> list:
        return json.loads(self.client("transact", f"unix:{self.sock}",
                                      json.dumps(["Open_vSwitch", *ops])))

    def other_config(self) -> dict:
        """The root row's other_config, as ovsdb-client dumps it."""
        dump = json.loads(self.client("-f", "json", "dump", f"unix:{self.sock}",
                                      "Open_vSwitch", "Open_vSwitch", "other_config"))
        ((cell,),) = dump["data"]
        assert cell[0] == "map"
        return dict(cell[1])

    def set_other(self, **pairs) -> None:
        """Set keys of other_config by hand (another operator)."""
        self.transact({"op": "mutate", "table": "Open_vSwitch", "where": [],
                       "mutations": [["other_config", "delete", ["set", sorted(pairs)]],
                                     ["other_config", "insert", ["map", sorted(pairs.items())]]]})


def require_tools() -> None:
    """Skip without the OVS tools (a failure under CI, tests/skips.py: scripts/setup installs them)."""
    why = missing()
    if why:
        pytest.skip(f"OVS tools missing ({why}): scripts/setup installs openvswitch-switch; "
                    "the host.ovs tests did not run")


@contextlib.contextmanager
def running_ovsdb(tmp_path):
    require_tools()
    db = Ovsdb(tmp_path)
    subprocess.run(["ovsdb-tool", "create", str(tmp_path / "conf.db"), SCHEMA], check=True,
                   capture_output=True, timeout=20)
    server = subprocess.Popen(
        ["ovsdb-server", str(tmp_path / "conf.db"), f"--remote=punix:{db.sock}",
         f"--unixctl={tmp_path / 'ctl'}", "--no-chdir", f"--log-file={tmp_path / 'log'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(db.sock):
            assert server.poll() is None, "ovsdb-server exited: " + (tmp_path / "log").read_text()
            assert time.monotonic() < deadline, "ovsdb-server did not open its socket"
            time.sleep(0.05)
        # The root row, as `ovs-vsctl init` makes it, with a key of someone else's.
        db.transact({"op": "insert", "table": "Open_vSwitch",
                     "row": {"other_config": ["map", sorted(OTHER.items())]}})
        yield db
    finally:
        server.kill()
        server.wait(timeout=20)
