"""UCX's, Open MPI's and NVSHMEM's files in a network namespace, through the
CLI (issue 11 item 12): plan, apply, verify and rollback write the
namespace's own /etc/netns/NAME/... file, and what the library reads there
is read back by the library itself (ucx_info, ompi_info) or by sh, run in
the namespace with `ip netns exec`, never through nictune.  Needs root and
iproute2; each reader's test skips without it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from nictune.cli.app import app

pytestmark = pytest.mark.netns


@pytest.fixture
def netns():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2")
    name = f"nt{secrets.token_hex(3)}l"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    made: list = []  # empty host directories the test creates for the namespace to bind over
    try:
        yield name, made
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        for path in made:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)


def cli(ns: str, state, *args: str) -> tuple:
    result = CliRunner().invoke(app, [*args, "--netns", ns, "--state-dir", str(state), "--json"])
    return result.exit_code, json.loads(result.stdout)["hosts"][0]


def in_ns(ns: str, argv: list, **env) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "env", "-i", f"PATH={os.environ['PATH']}",
                           *(f"{k}={v}" for k, v in env.items()), *argv],
                          capture_output=True, text=True, check=True).stdout


def ucx_reads(ns, conf):
    out = in_ns(ns, [shutil.which("ucx_info"), "-c"], UCX_CONFIG_DIR=os.path.dirname(conf), HOME="/nonexistent")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)["UCX_RC_VERBS_TRAFFIC_CLASS"]


def ompi_reads(ns, conf):
    out = in_ns(ns, [shutil.which("ompi_info"), "--param", "btl", "tcp", "--level", "9", "--parsable"],
                OMPI_MCA_mca_base_param_files=conf)
    return next(line.rsplit(":", 1)[1] for line in out.splitlines()
                if line.startswith("mca:btl:tcp:param:btl_tcp_if_include:value:"))


def sh_reads(ns, conf):
    out = in_ns(ns, ["sh", "-c", f"! [ -e {conf} ] || . {conf}; echo \"$NVSHMEM_IB_TRAFFIC_CLASS\""])
    return out.strip()


# section, values key, a file name (UCX reads only files named ucx.conf),
# the wanted values, the reader, what the reader sees without the file and with it
CASES = {
    "ucx": ("env", "ucx.conf", {"UCX_IB_TRAFFIC_CLASS": 106}, "ucx_info", ucx_reads, "auto", "106"),
    "mpi": ("params", "mca-params.conf", {"btl_tcp_if_include": "rail0"}, "ompi_info", ompi_reads, "", "rail0"),
    "nvshmem": ("env", "nvshmem.sh", {"NVSHMEM_IB_TRAFFIC_CLASS": 106}, "sh", sh_reads, "", "106"),
}


@pytest.mark.parametrize("section", sorted(CASES))
def test_plan_apply_verify_rollback_in_a_namespace(netns, tmp_path, section):
    ns, made = netns
    key, name, values, tool, reads, before, after = CASES[section]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    # A directory of the profile's (a file directly in /etc is NCCL's alone):
    # the namespace's twin of it, which ip netns exec binds over the host's
    # (only where that exists), is made as a user would, once.
    directory = f"/etc/{ns}d"
    conf, own = f"{directory}/{name}", f"/etc/netns/{ns}/{ns}d/{name}"
    os.mkdir(directory)
    made.append(directory)
    os.makedirs(os.path.dirname(own))
    profile = tmp_path / "p.yaml"
    profile.write_text(json.dumps({"nictune": 1, "host": {section: {
        "path": conf, "allowed_dirs": [directory], key: values}}}))
    state = tmp_path / "state"

    code, host = cli(ns, state, "plan", str(profile))
    [change] = host["changes"]
    assert code == 2 and f"the namespace's own file {own}, created" in change["note"], change
    assert reads(ns, conf) == before and not os.path.exists(own)

    code, host = cli(ns, state, "apply", str(profile))
    assert code == 0, host
    assert reads(ns, conf) == after
    assert os.listdir(directory) == []  # the host's own directory is untouched

    code, host = cli(ns, state, "verify", str(profile))
    assert code == 0 and host["changes"][0]["status"] == "ok"

    code, host = cli(ns, state, "rollback")
    assert code == 0 and host["changes"][0]["status"] == "reverted"
    assert not os.path.exists(own) and reads(ns, conf) == before


def test_the_default_ucx_path_would_hide_the_hosts_directory_and_is_refused(netns, tmp_path):
    # /etc/netns/NS/ucx would be bound over the host's whole /etc/ucx.
    ns, _ = netns
    profile = tmp_path / "p.yaml"
    profile.write_text(json.dumps({"nictune": 1, "host": {"ucx": {"env": {"UCX_IB_TRAFFIC_CLASS": 106}}}}))
    code, host = cli(ns, tmp_path / "state", "apply", str(profile))
    [change] = host["changes"]
    assert code == 1 and change["status"] == "unsupported"
    assert change["note"] == (f"directory /etc/netns/{ns}/ucx does not exist: creating it would hide "
                              "the host's /etc/ucx in the namespace; create it yourself")
    assert not os.path.exists(f"/etc/netns/{ns}")
