"""Outputs that reach jobs (host/knobs/jobenv.py): a Slurm TaskProlog, enroot's
environ.d and mounts.d, nictune's lines in /etc/environment.  Each goes
through the normal request path (agent.run: plan, apply, verify, rollback)
on real files under a Host root in tmp_path.

The TaskProlog is checked by running the script nictune writes with bash
and sh and reading its stdout as slurmstepd does (src/slurmd/slurmstepd/
task.c _proc_stdout, re-implemented here as the oracle: "export " then a
name up to '=', the value literally to the end of the line).  No Slurm
runs here.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from nictune.host import agent
from nictune.host.knobs import jobenv, ucx
from nictune.host.knobs.envfile import header_of
from nictune.host.machine import Host
from nictune.profile.errors import ProfileError
from nictune.profile.loader import load_profile_text

ENV = {"NCCL_IB_TC": 106, "UCX_IB_TRAFFIC_CLASS": 106, "NVSHMEM_IB_TRAFFIC_CLASS": 106,
       "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NVSHMEM_ENABLE_NIC_PE_MAPPING": True,
       "OMPI_MCA_pml": "ucx"}
WANT = {"NCCL_IB_TC": "106", "UCX_IB_TRAFFIC_CLASS": "106", "NVSHMEM_IB_TRAFFIC_CLASS": "106",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NVSHMEM_ENABLE_NIC_PE_MAPPING": "1",
        "OMPI_MCA_pml": "ucx"}


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    for d in ("etc/slurm", "etc/enroot/environ.d", "etc/enroot/mounts.d"):
        (r / d).mkdir(parents=True)
    return r


def run(root, command: str, host_doc: dict = None) -> dict:
    request = {"nictune_request": 1, "command": command, "state_dir": str(root.parent / "state")}
    if command != "rollback":
        doc = {"nictune": 1, "host": host_doc}
        request["profile"] = {"path": "p.yaml", "doc": doc, "sources": {}}
    report = agent.run(request, host=Host(str(root)))
    json.dumps(report)
    return report


def only_change(report: dict) -> dict:
    [change] = report["changes"]
    return change


def slurmstepd_exports(output: str) -> dict:
    """What slurmstepd sets from a TaskProlog's stdout (task.c _proc_stdout)."""
    env = {}
    for line in output.split("\n"):
        if line.startswith("export "):
            name, sep, value = line[len("export "):].lstrip().partition("=")
            assert sep, line
            env[name.rstrip()] = value
    return env


# -- the Slurm TaskProlog ---------------------------------------------------------------

def test_the_task_prolog_prints_the_exports_slurmstepd_sets(root):
    path = root / "etc/slurm/nictune-task-prolog.sh"
    report = run(root, "plan", {"slurm_task_prolog": {"env": ENV}})
    change = only_change(report)
    assert report["exit_code"] == 2 and change["key"]["name"] == "/etc/slurm/nictune-task-prolog.sh"
    assert "reaches every Slurm task on this node" in change["note"]
    assert "TaskProlog" in change["note"]
    assert run(root, "apply", {"slurm_task_prolog": {"env": ENV}})["exit_code"] == 0
    text = path.read_text()
    assert text.startswith("#!/bin/sh\n" + header_of("slurm_task_prolog"))
    # slurmstepd checks R_OK|X_OK and execve()s it as the job's user.
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    for shell in ("bash", "sh"):
        out = subprocess.run([shell, str(path)], capture_output=True, text=True, timeout=30,
                             env={"PATH": os.environ["PATH"]})
        assert out.returncode == 0 and out.stderr == ""
        assert slurmstepd_exports(out.stdout) == WANT, shell
        assert len(out.stdout.splitlines()) == len(WANT)  # nothing else printed
    # executed directly, as slurmstepd does (its "#!" line)
    out = subprocess.run([str(path)], capture_output=True, text=True, timeout=30)
    assert slurmstepd_exports(out.stdout) == WANT
    assert jobenv.task_prolog_exports(out.stdout) == WANT
    assert only_change(run(root, "verify", {"slurm_task_prolog": {"env": ENV}}))["status"] == "ok"
    assert run(root, "rollback")["exit_code"] == 0 and not path.exists()


@pytest.mark.parametrize("env, word", [
    ({"LD_PRELOAD": "/tmp/x.so"}, "LD_PRELOAD"),
    ({"PATH": "/tmp"}, "PATH"),
    ({"NCCL_IB_TC": "106'; touch /tmp/owned; '"}, "NCCL_IB_TC"),
    ({"NCCL_DEBUG": "$(id)"}, "NCCL_DEBUG"),
    ({"UCX_TLS": "rc sm"}, "UCX_TLS"),
])
def test_names_and_values_a_shell_or_every_job_would_take_are_refused(root, env, word):
    text = "nictune: 1\nhost:\n  slurm_task_prolog:\n    env:\n" + "".join(
        f"      {name}: {json.dumps(value)}\n" for name, value in env.items())
    with pytest.raises(ProfileError) as e:
        load_profile_text(text, "jobs.yaml")
    assert "jobs.yaml" in str(e.value) and word in str(e.value)
    # and a request that did not come through the schema is refused on the host
    report = run(root, "apply", {"slurm_task_prolog": {"env": env}})
    assert report["exit_code"] != 0 and "slurm_task_prolog" in json.dumps(report)
    assert not (root / "etc/slurm/nictune-task-prolog.sh").exists()


def test_a_task_prolog_the_site_wrote_is_not_replaced(root):
    path = root / "etc/slurm/nictune-task-prolog.sh"
    path.write_text("#!/bin/sh\necho 'export SITE_TOKEN=hunter2'\n")
    report = run(root, "apply", {"slurm_task_prolog": {"env": ENV}})
    assert only_change(report)["status"] == "unsupported"
    assert "hunter2" not in json.dumps(report)
    assert path.read_text() == "#!/bin/sh\necho 'export SITE_TOKEN=hunter2'\n"


# -- enroot ---------------------------------------------------------------------------

def test_enroot_environ_and_the_mount_of_the_nccl_file(root):
    doc = {"enroot_environ": {"env": ENV},
           "enroot_mounts": {"mounts": {"/etc/nccl.conf": "/etc/nccl.conf"}}}
    report = run(root, "plan", doc)
    notes = {c["key"]["family"]: c["note"] for c in report["changes"]}
    assert set(notes) == {"enroot_environ", "enroot_mounts"}
    assert "every enroot container" in notes["enroot_environ"] and "pyxis" in notes["enroot_environ"]
    assert "binds these host files into every enroot container" in notes["enroot_mounts"]
    assert run(root, "apply", doc)["exit_code"] == 0
    environ = (root / "etc/enroot/environ.d/90-nictune.env").read_text()
    assert environ == header_of("enroot_environ") + "".join(f"{n}={v}\n" for n, v in WANT.items())
    fstab = (root / "etc/enroot/mounts.d/90-nictune.fstab").read_text()
    # enroot's own options for host files (conf/mounts/20-config.fstab), and nofail
    assert fstab == header_of("enroot_mounts") + (
        "/etc/nccl.conf /etc/nccl.conf none x-create=file,bind,ro,nosuid,nodev,noexec,nofail\n")
    assert run(root, "verify", doc)["exit_code"] == 0
    assert run(root, "rollback")["exit_code"] == 0
    assert os.listdir(root / "etc/enroot/environ.d") == os.listdir(root / "etc/enroot/mounts.d") == []


@pytest.mark.parametrize("mounts", [{"/etc/nccl.conf": "/etc/nccl conf"},
                                    {"relative": "/etc/nccl.conf"},
                                    {"/etc/a,b": "/etc/nccl.conf"}])
def test_a_mount_line_that_is_not_one_plain_path_each_way_is_refused(mounts):
    text = "nictune: 1\nhost:\n  enroot_mounts:\n    mounts:\n" + "".join(
        f"      {json.dumps(k)}: {json.dumps(v)}\n" for k, v in mounts.items())
    with pytest.raises(ProfileError):
        load_profile_text(text, "mounts.yaml")


@pytest.mark.parametrize("source, target, word", [
    ("/etc/shadow", "/etc/shadow", "nictune never binds /etc/shadow"),
    ("/etc/ssh/ssh_host_ed25519_key", "/k", "nictune never binds"),
    ("/proc/self/environ", "/x", "the kernel's"),
    ("/etc/nccl.conf", "/dev/x", "the kernel's"),
])
def test_the_hosts_secrets_and_the_kernels_files_are_never_bound_into_containers(
        root, source, target, word):
    report = run(root, "apply", {"enroot_mounts": {"mounts": {target: source}}})
    assert report["exit_code"] != 0 and word in json.dumps(report)
    assert os.listdir(root / "etc/enroot/mounts.d") == []


def test_auto_is_refused_where_a_job_would_read_the_word(root):
    report = run(root, "plan", {"enroot_environ": {"env": {"NCCL_IB_GID_INDEX": "auto"}}})
    assert report["exit_code"] != 0
    assert "NCCL_IB_GID_INDEX: auto is resolved only in the libraries' own files" in json.dumps(report)


# -- /etc/environment: nictune's lines only -------------------------------------------------

SYSTEM = 'PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"\nSITE_TOKEN=hunter2\n'


def pam_env(text: str) -> dict:
    """/etc/environment as pam_env reads it: KEY=VALUE lines, '#' comments,
    the last assignment of a name wins."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            env[name] = value.strip('"')
    return env


def test_etc_environment_gets_a_block_and_keeps_the_systems_lines(root):
    path = root / "etc/environment"
    path.write_text(SYSTEM)
    doc = {"environment": {"env": ENV}}
    report = run(root, "plan", doc)
    change = only_change(report)
    assert "`ssh host command`" in change["note"] and "mpirun" in change["note"]
    assert "hunter2" not in json.dumps(report) and "PATH" not in json.dumps(report)
    report = run(root, "apply", doc)
    assert report["exit_code"] == 0 and "hunter2" not in json.dumps(report)
    text = path.read_text()
    assert text.startswith(SYSTEM)  # the system's lines, byte for byte, first
    assert text[len(SYSTEM):].startswith(header_of("environment"))
    assert text.endswith(jobenv.END_LINE)
    assert pam_env(text) == {**pam_env(SYSTEM), **WANT}
    assert only_change(run(root, "verify", doc))["status"] == "ok"
    # a rollback takes the block away, and nothing else
    assert run(root, "rollback")["exit_code"] == 0 and path.read_text() == SYSTEM
    assert run(root, "apply", doc)["exit_code"] == 0
    # a change rewrites the block only
    changed = {"environment": {"env": {**ENV, "NCCL_IB_TC": 98}}}
    assert run(root, "apply", changed)["exit_code"] == 0
    text = path.read_text()
    assert text.startswith(SYSTEM) and text.count(header_of("environment")) == 1
    assert pam_env(text)["NCCL_IB_TC"] == "98"
    # lines someone adds after nictune's stay, and the block moves to the end
    path.write_text(path.read_text() + "EDITOR=vi\n")
    assert run(root, "apply", {"environment": {"env": ENV}})["exit_code"] == 0
    assert pam_env(path.read_text())["EDITOR"] == "vi" and path.read_text().endswith(jobenv.END_LINE)
    # the rollback puts the block back as it was before, the added line stays
    assert run(root, "rollback")["exit_code"] == 0
    text = path.read_text()
    assert text.startswith(SYSTEM + "EDITOR=vi\n") and pam_env(text)["NCCL_IB_TC"] == "98"


def test_etc_environment_absent_is_created_and_removed_again(root):
    path = root / "etc/environment"
    assert run(root, "apply", {"environment": {"env": {"UCX_IB_TRAFFIC_CLASS": 106}}})["exit_code"] == 0
    assert path.read_text() == header_of("environment") + "UCX_IB_TRAFFIC_CLASS=106\n" + jobenv.END_LINE
    assert run(root, "rollback")["exit_code"] == 0 and not path.exists()


def test_in_a_namespace_its_own_environment_file_would_hide_the_hosts(root):
    # ip netns exec binds /etc/netns/NS/environment over the whole of
    # /etc/environment: creating it hides the system's lines (PATH...) from
    # the namespace's programs, which only adopt: true may do.
    from nictune.host.knobs.jobenv import EnvironmentFamily
    from nictune.host.model import HOST

    (root / "etc/environment").write_text(SYSTEM)
    host = Host(str(root))
    host.netns = "ntenv1"
    fam = EnvironmentFamily(host)
    [desired] = fam.expand(HOST, {"environment": {"env": {"NCCL_IB_TC": 106}}}, lambda *p: "")
    assert fam.read([desired.key]) == {desired.key: None}
    problem = fam.check(desired.key, desired.want)
    assert "would hide the host's /etc/environment" in problem and "adopt: true" in problem
    assert "hunter2" not in problem


def test_show_prints_only_nictunes_lines_of_etc_environment(root):
    (root / "etc/environment").write_text(SYSTEM)
    assert run(root, "apply", {"environment": {"env": {"NCCL_IB_TC": 106}}})["exit_code"] == 0
    report = agent.run({"nictune_request": 1, "command": "show"}, host=Host(str(root)))
    assert report["profile"]["host"]["environment"] == {"path": "/etc/environment",
                                                        "env": {"NCCL_IB_TC": 106}}
    assert "hunter2" not in json.dumps(report)


# -- lint: the variables jobs get must agree with the RoCE class --------------------------

LINTED = """\
nictune: 1
interfaces:
  rail:
    match: {name: "ens*np0"}
    roce: {mode: v2, tos: 106, trust: dscp, dscp_map: {"26": 3}, pfc: [3]}
host:
  nccl:
    env: {NCCL_IB_TC: 106}
  enroot_environ:
    env: {UCX_IB_TRAFFIC_CLASS: 106, NCCL_IB_TC: 106}
"""


def test_lint_checks_the_traffic_class_jobs_get_against_the_roce_class():
    from nictune.profile.lint import lint

    good = lint(load_profile_text(LINTED, "jobs.yaml"))
    assert not [f for f in good if f.code == "traffic-class-mismatch"]
    text = LINTED.replace("{UCX_IB_TRAFFIC_CLASS: 106, NCCL_IB_TC: 106}",
                          "{UCX_IB_TRAFFIC_CLASS: 106, NCCL_IB_TC: 98}")
    bad = [f for f in lint(load_profile_text(text, "jobs.yaml")) if f.code == "traffic-class-mismatch"]
    assert len(bad) == 1 and bad[0].severity == "error"
    assert "NCCL_IB_TC (host.enroot_environ) is 98" in bad[0].message
    assert "jobs.yaml:10" in bad[0].locations  # the env line of host.enroot_environ


# -- what the docs say ------------------------------------------------------------------

def test_ucx_docstring_gives_ucxs_own_default_traffic_class():
    # UCX_IB_TRAFFIC_CLASS=auto is 106 on RoCE v2 (src/uct/ib/base/ib_iface.c,
    # UCT_IB_DEFAULT_ROCEV2_DSCP in ib_device.h), 0 elsewhere.
    doc = " ".join(ucx.__doc__.split())
    assert "rides traffic class 0" not in doc
    assert "UCT_IB_DEFAULT_ROCEV2_DSCP" in doc and "106" in doc
