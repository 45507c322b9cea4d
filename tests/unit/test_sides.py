"""The host side (what will ship to targets as the agent) imports nothing
from the controller side, nor any dependency a target does not have."""

from __future__ import annotations

import json
import os
import subprocess
import sys

AGENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "agent")
HOST_SIDE = ("nictune.agent", "nictune.engine", "nictune.journal", "nictune.host",
             "nictune.knobs", "nictune.netlink.rtnl", "nictune.netlink.ethtool",
             "nictune.netlink.ethtool_ioctl", "nictune.netlink.drvinfo",
             "nictune.rdma", "nictune.nicclass", "nictune.knobs.dcb", "nictune.knobs.roce",
             "nictune.netlink.dcb", "nictune.watchdog")
FORBIDDEN = ("yaml", "jsonschema", "typer", "rich", "click", "paramiko", "pydantic",
             "asyncio", "nictune.cli", "nictune.profile", "nictune.control",
             "nictune.inventory")


def test_host_side_imports_only_what_a_target_has():
    code = (f"import sys, json\nfor m in {HOST_SIDE!r}: __import__(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=AGENT))
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    bad = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert bad == []
    assert "pyroute2.netlink" in loaded  # message classes only, see netlink/_pyroute2.py
