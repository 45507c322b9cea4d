"""What the agent imports on a host (issue 13): only the knob families a
request's profile uses, and no module that costs every run for nothing.

A verify of a profile that uses only link/sysctl/features/nccl runs the
agent as shipped (the zipapp's files, `python3 -I -S`, as control/remote/ssh.py
starts it) against this machine's own interfaces, and its sys.modules is
compared with what it may load: the interpreter's start-up, the stdlib
modules the agent needs (and what they import on this Python), and an
explicit list of nictune modules.  A change that drags logging, typing,
pyroute2 or an unused family back in fails here.
"""

from __future__ import annotations

import io
import json
import os
import pkgutil
import subprocess
import sys
import zipfile

import pytest

import nictune.host.knobs as knobs
from nictune.control.remote import agentzip
from nictune.control.remote.request import build_request
from nictune.host.knobs.base import Family
from nictune.profile.loader import load_profile_text

# What a verify of link/sysctl/features/nccl may import of nictune.
# (the rooms' package __init__ files, transaction/facts/transports, hold a
# docstring only)
NICTUNE_ALLOWED = {
    "nictune", "nictune.host", "nictune.host.agent", "nictune.host.errors", "nictune.host.model",
    "nictune.host.text", "nictune.host.validate", "nictune.host.machine", "nictune.host.files",
    "nictune.host.transaction", "nictune.host.transaction.journal",
    "nictune.host.transaction.engine", "nictune.host.transaction.aside",
    "nictune.host.facts", "nictune.host.facts.health", "nictune.host.facts.rdma",
    "nictune.host.facts.nicclass", "nictune.host.facts.ibauto",
    "nictune.host.transports", "nictune.host.transports.io",
    "nictune.host.knobs", "nictune.host.knobs.base", "nictune.host.knobs.sysctl",
    "nictune.host.knobs.link", "nictune.host.knobs.ethtool", "nictune.host.knobs.envfile",
    "nictune.host.knobs.nccl",
    "nictune.host.transports.netlink", "nictune.host.transports.netlink.errors",
    "nictune.host.transports.netlink._nlmsg", "nictune.host.transports.netlink.socket",
    "nictune.host.transports.netlink.genl", "nictune.host.transports.netlink.uapi",
    "nictune.host.transports.netlink.devlink", "nictune.host.transports.netlink.rtnl",
    "nictune.host.transports.netlink.names", "nictune.host.transports.netlink.ioctl",
    "nictune.host.transports.netlink.drvinfo", "nictune.host.transports.netlink.ethtool",
    "nictune.host.transports.netlink.sadinfo",
}
# The stdlib modules the agent imports itself; what they import in turn is
# measured on the running Python (it differs between versions).
# dataclasses (and the inspect it pulls in, ~10 ms) stays for now: the
# netlink handles' results are dataclasses, and host/replay/snapshot.py's
# snapshots encode them with dataclasses.fields().
STDLIB_ROOTS = ("__future__", "json", "dataclasses", "socket", "struct", "array", "select", "fcntl", "errno",
                "fnmatch", "contextlib", "time", "os", "re")
# Never on this path: what issue 13 cut, and what nothing here needs.
FORBIDDEN = ("logging", "typing", "pyroute2", "asyncio", "threading", "traceback", "ipaddress",
             "subprocess", "importlib.util", "nictune.host.transports.netlink._pyroute2",
             "nictune.host.transports.netlink.xfrm", "nictune.host.transports.netlink.inet", "nictune.host.facts.ipsec",
             "nictune.host.knobs.ovs", "nictune.host.knobs.ipsec", "nictune.host.knobs.macsec",
             "nictune.host.knobs.expect", "nictune.host.knobs.dcb", "nictune.host.knobs.roce")

PROFILE = """\
nictune: 1
host:
  sysctl: {{net.ipv4.tcp_ecn: 1, net.ipv4.tcp_mtu_probing: 1}}
  nccl:
    path: /etc/nccl.conf
    env: {{NCCL_DEBUG: WARN}}
interfaces:
  rails:
    match: {{name: "{name}"}}
    mtu: 9000
    features: {{gro: true}}
    sysctl: {{ipv4.arp_ignore: 1}}
"""


def _modules(code: str, *args: str, stdin: str = "") -> tuple:
    """(sys.modules after `code` ran in `python -I -S`, its stdout)."""
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, *args], input=stdin,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stderr.strip().splitlines()[-1])), proc.stdout


DUMP = "import sys, json\nsys.stderr.write(json.dumps(sorted(sys.modules)) + '\\n')\n"


def _an_interface() -> str:
    names = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    if not names:
        pytest.skip("no network interface but lo here")
    return names[0]


def test_a_verify_of_link_sysctl_features_nccl_imports_only_what_it_needs(tmp_path):
    name = _an_interface()
    shipped = tmp_path / "agent"
    zipfile.ZipFile(io.BytesIO(agentzip.build().data)).extractall(shipped)
    profile = load_profile_text(PROFILE.format(name=name), "pin.yaml")
    request = dict(build_request("verify", profile), state_dir=str(tmp_path / "state"))
    code = ("import sys\nsys.dont_write_bytecode = True\nsys.path.insert(0, sys.argv[1])\n"
            "from nictune.host.agent import main\nmain()\n" + DUMP)
    loaded, out = _modules(code, str(shipped), stdin=json.dumps(request) + "\n")
    report = json.loads(out)
    families = {c["key"]["family"] for c in report["changes"]}
    assert report["error"] is None and {"sysctl", "nccl", "link", "features"} <= families

    startup, _ = _modules(DUMP)
    needed, _ = _modules("import " + ", ".join(STDLIB_ROOTS) + "\n" + DUMP)
    forbidden = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert forbidden == []
    ours = {m for m in loaded if m == "nictune" or m.startswith("nictune.")}
    assert ours - NICTUNE_ALLOWED == set()
    assert loaded - ours - startup - needed == set()


def test_the_catalog_names_every_family_as_its_class_does():
    found = {}
    for info in pkgutil.iter_modules(knobs.__path__):
        module = __import__(f"nictune.host.knobs.{info.name}", fromlist=["_"])
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, Family) and value.name
                    and value.__module__ == module.__name__):
                found[value.name] = value
    assert set(found) == set(knobs.CATALOG)
    for name, (module, cls, sections, host_sections) in knobs.CATALOG.items():
        family = knobs.load(name)
        assert family is found[name]
        assert (family.__module__, family.__name__) == (f"nictune.host.knobs.{module}", cls)
        assert (family.sections, family.host_sections) == (sections, host_sections)
    assert [f.name for f in knobs.REGISTERED] == list(knobs.CATALOG)
    assert [f.name for f in knobs.FAMILIES] == [
        f.name for f in sorted(knobs.REGISTERED, key=lambda f: f.position)]


def test_a_profile_loads_the_families_of_its_sections_only():
    doc = {"host": {"sysctl": {}, "nccl": {}},
           "interfaces": {"a": {"match": {}, "mtu": 9000, "features": {}},
                          "b": {"match": {}, "roce": {}}}}
    assert knobs.families_for(doc) == ["link", "features", "sysctl", "roce", "dcb", "tunable", "nccl"]
    assert knobs.families_for({"nictune": 1}) == []


def test_the_engine_imports_no_family_until_a_profile_names_it():
    agent_dir = os.path.dirname(os.path.dirname(os.path.dirname(knobs.__path__[0])))
    loaded, _ = _modules("import sys\nsys.path.insert(0, sys.argv[1])\nimport nictune.host.transaction.engine\n"
                         + DUMP, agent_dir)
    # aside.py reads sysctl's SPREAD table: that family comes with the engine.
    assert sorted(m for m in loaded if m.startswith("nictune.host.knobs.")) == [
        "nictune.host.knobs.base", "nictune.host.knobs.sysctl"]


def test_a_plan_or_apply_imports_no_health_facts():
    # Only verify and show report health (facts/health.py, rdma.py): the
    # engine imports them for those, not for every run of the agent.
    agent_dir = os.path.dirname(os.path.dirname(os.path.dirname(knobs.__path__[0])))
    loaded, _ = _modules("import sys\nsys.path.insert(0, sys.argv[1])\nimport nictune.host.transaction.engine\n"
                         + DUMP, agent_dir)
    assert "nictune.host.transaction.engine" in loaded
    assert {"nictune.host.facts.health", "nictune.host.facts.rdma"} & loaded == set()


def test_the_catalog_is_derived_from_the_registry_and_the_classes():
    """REGISTRY is the one list a family is registered in; CATALOG (what the
    agent reads to import only the families at hand) and the owned-file
    sections are what `python -m nictune.profile.catalog` derives from it
    and the classes, never a second hand-kept copy."""
    from nictune.host.knobs.envfile import OwnedFileFamily
    from nictune.profile import catalog, check, loader

    assert len(knobs.REGISTRY) >= 20
    assert [f"{c.__module__.rpartition('.')[2]}.{c.__name__}" for c in knobs.REGISTERED] == \
        list(knobs.REGISTRY)
    assert catalog.written() == knobs.derived_catalog(), \
        "CATALOG is stale: run python -m nictune.profile.catalog"
    owned = [f for f in knobs.REGISTERED if issubclass(f, OwnedFileFamily)]
    assert owned and check.OWNED_SECTIONS == tuple(s for f in owned for s in f.host_sections)
    assert {path[1] for path in loader.FILE_POLICY} == set(check.OWNED_SECTIONS)
