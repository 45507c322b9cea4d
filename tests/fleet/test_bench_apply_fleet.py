"""The fleet apply bench's own pieces on two real fleet hosts
(bench/bench_fleet.py --apply): the plain ssh drift script leaves exactly
the drifted state the bench checks for, and nictune's profile
(apply_profile.yaml) and the Ansible playbook (apply.yml, real
ansible-core) each bring the hosts back to the same wanted state, read back
from the kernel inside each namespace, never through a tool under test.
(pyinfra is installed by the bench only, with --install: its deploy runs
there, checked by the same read-back.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from nictune.lab.fleet import run_in

pytestmark = pytest.mark.netns
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = os.path.join(ROOT, "bench", "fleet")
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
NICTUNE = os.path.join(os.path.dirname(sys.executable), "nictune")


def _checks():
    spec = importlib.util.spec_from_file_location("bench_fleet_checks", os.path.join(FILES, "checks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = _checks()


def state(host) -> list:
    """checks.drifts() of the host as its kernel says (the NCCL file, which
    the apply profile leaves alone, taken as wanted)."""
    sysctls = {key: run_in(host, ["cat", "/proc/sys/" + key.replace(".", "/")]).stdout.strip()
               for key in checks.SYSCTLS}
    link = json.loads(run_in(host, ["ip", "-j", "link", "show", checks.RAIL]).stdout)[0]
    ethtool = run_in(host, ["ethtool", "-k", checks.RAIL]).stdout
    return checks.drifts(sysctls, str(link["mtu"]), link["operstate"].lower(), ethtool, checks.NCCL)


def drift(pair) -> None:
    for h in pair.hosts:
        subprocess.run(["ssh", "-F", pair.ssh_config, "-o", "BatchMode=yes", h.name, checks.DRIFT_SCRIPT],
                       check=True, capture_output=True, timeout=60)
    assert [state(h) for h in pair.hosts] == [checks.DRIFTED] * 2


def test_nictune_apply_of_the_bench_profile_undoes_the_drift_script(pair):
    assert len(checks.DRIFTED) == 3 and len(pair.hosts) == 2
    drift(pair)
    r = subprocess.run([NICTUNE, "apply", os.path.join(FILES, "apply_profile.yaml"), "-i", pair.inventory,
                        "--confirm-timeout", "0", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert [h["ok"] for h in report["hosts"]] == [True, True]
    assert [state(h) for h in pair.hosts] == [[], []]


def test_the_bench_playbook_undoes_the_drift_script_and_then_changes_nothing(pair, tmp_path):
    drift(pair)
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"), "ANSIBLE_HOME": str(tmp_path / "ansible-home")}
    argv = [PLAYBOOK, "-i", pair.inventory, os.path.join(FILES, "apply.yml"), "--limit", "fleet"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:]
    assert [state(h) for h in pair.hosts] == [[], []]
    assert r.stdout.count("changed=3 ") == 2  # sysctls, MTU, offloads on each host
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and again.stdout.count("changed=0 ") == 2, again.stdout[-3000:]
