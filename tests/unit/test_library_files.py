"""UCX's ucx.conf, Open MPI's openmpi-mca-params.conf and NVSHMEM's
profile.d file (issue 11 item 12): owned as NCCL's file is, on real files
under a Host root in tmp_path (the rules they share are tested for NCCL in
test_owned_files.py and test_adoption.py; here each file's own syntax,
its `auto` values, and one full cycle per file).

Each syntax is checked against its real reader where one is installed:
ucx_info (UCX), ompi_info (Open MPI), sh (the profile.d file); without
them those tests skip.  The namespace side is in
tests/netns/test_library_files.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml
from fakes import FakeHost, load_state

from nictune.host import agent
from nictune.host.errors import InvalidInput
from nictune.host.knobs.envfile import header_of
from nictune.host.knobs.mpi import McaSyntax
from nictune.host.knobs.nccl import AutoUnresolved
from nictune.host.knobs.nvshmem import NvshmemFamily, ShellSyntax
from nictune.host.knobs.ucx import UcxFamily, UcxSyntax
from nictune.host.machine import Host
from nictune.host.model import HOST
from nictune.profile.errors import ProfileError
from nictune.profile.loader import load_profile_text

UCX, MCA, SHELL = UcxSyntax(), McaSyntax(), ShellSyntax()

# section, values key, default path, a profile's values, the file nictune writes
CASES = {
    "ucx": ("env", "/etc/ucx/ucx.conf", {"UCX_IB_TRAFFIC_CLASS": 106, "UCX_TLS": "rc,sm,self"},
            "UCX_IB_TRAFFIC_CLASS=106\nUCX_TLS=rc,sm,self\n"),
    "mpi": ("params", "/etc/openmpi/openmpi-mca-params.conf",
            {"btl_tcp_if_include": "rail0", "mca_base_env_list": "UCX_IB_TRAFFIC_CLASS=106"},
            "btl_tcp_if_include=rail0\nmca_base_env_list=UCX_IB_TRAFFIC_CLASS=106\n"),
    "nvshmem": ("env", "/etc/profile.d/nvshmem.sh",
                {"NVSHMEM_IB_TRAFFIC_CLASS": 106, "NVSHMEM_ENABLE_NIC_PE_MAPPING": True},
                "export NVSHMEM_IB_TRAFFIC_CLASS='106'\nexport NVSHMEM_ENABLE_NIC_PE_MAPPING='1'\n"),
}


def rail_state() -> dict:
    """The recorded ConnectX-7 host with both rails up (as test_roce_knobs.py builds it)."""
    state = load_state("cx7-host")
    state["tree"] = "mlx5-host"
    state["links"] = [dict(link, up=True) for link in state["links"]]
    return state


def no_source(*parts: str) -> str:
    return ""


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    for d in ("etc/ucx", "etc/openmpi", "etc/profile.d"):
        (r / d).mkdir(parents=True)
    return r


def run(root, command: str, section: str = None, values: dict = None, **extra) -> dict:
    request = {"nictune_request": 1, "command": command, "state_dir": str(root.parent / "state"), **extra}
    if command != "rollback":
        key = CASES[section][0]
        doc = {"nictune": 1, "host": {section: {key: values, **extra.pop("section_extra", {})}}}
        request = {**request, "profile": {"path": "p.yaml", "doc": doc, "sources": {}}}
    report = agent.run(request, host=Host(str(root)))
    json.dumps(report)
    return report


def only_change(report: dict) -> dict:
    [change] = report["changes"]
    return change


# -- each file through plan, apply, verify, rollback --------------------------------------------

@pytest.mark.parametrize("section", sorted(CASES))
def test_each_file_is_written_verified_and_rolled_back(root, section):
    key, path, values, body = CASES[section]
    file = root / path.lstrip("/")
    report = run(root, "plan", section, values)
    change = only_change(report)
    assert report["exit_code"] == 2 and change["key"] == {"family": section, "target": HOST, "name": path}
    assert change["after"] == header_of(section) + body and change["before"] is None
    assert run(root, "apply", section, values)["exit_code"] == 0
    assert file.read_text() == header_of(section) + body
    assert only_change(run(root, "verify", section, values))["status"] == "ok"
    report = run(root, "rollback")
    assert report["exit_code"] == 0 and only_change(report)["status"] == "reverted"
    assert not file.exists()


@pytest.mark.parametrize("section", sorted(CASES))
def test_someone_elses_file_is_refused_adopted_and_restored_without_leaving_the_host(root, section):
    key, path, values, body = CASES[section]
    file = root / path.lstrip("/")
    foreign = {"ucx": "UCX_TLS=tcp\nUCX_SECRET_TOKEN=hunter2\n",
               "mpi": "pml = ob1\nsecret_param = hunter2\n",
               "nvshmem": "export NVSHMEM_BOOTSTRAP_PLUGIN='hunter2'\n"}[section]
    file.write_text(foreign)
    report = run(root, "apply", section, values)
    change = only_change(report)
    assert change["status"] == "unsupported" and f"host.{section}.adopt: true" in change["note"]
    assert change["before"] == f"<file not written by nictune: {len(foreign)} bytes>"
    assert "hunter2" not in json.dumps(report) and file.read_text() == foreign

    report = run(root, "apply", section, values, section_extra={"adopt": True})
    assert report["exit_code"] == 0 and "hunter2" not in json.dumps(report)
    assert file.read_text() == header_of(section) + body
    assert run(root, "rollback")["exit_code"] == 0 and file.read_text() == foreign


@pytest.mark.parametrize("section, text", [
    ("ucx", "# site tuning\nUCX_TLS = rc,sm,self ; what the site runs\nUCX_IB_TRAFFIC_CLASS:106\n"),
    ("mpi", "/* site */\nmca_base_env_list=UCX_IB_TRAFFIC_CLASS=106\n# x\nbtl_tcp_if_include   =   rail0\n"),
    ("nvshmem", "# site\nexport NVSHMEM_ENABLE_NIC_PE_MAPPING=1\nexport NVSHMEM_IB_TRAFFIC_CLASS=\"106\"\n"),
])
def test_someone_elses_file_with_the_same_settings_is_left_alone(root, section, text):
    key, path, values, body = CASES[section]
    file = root / path.lstrip("/")
    file.write_text(text)
    for command in ("plan", "apply", "verify"):
        report = run(root, command, section, values)
        assert (report["exit_code"], only_change(report)["status"]) == (0, "ok"), report
    assert file.read_text() == text


@pytest.mark.parametrize("section", sorted(CASES))
def test_show_prints_a_section_that_verifies_clean(root, tmp_path, section):
    key, path, values, body = CASES[section]
    (root / path.lstrip("/")).write_text(header_of(section) + body)
    report = agent.run({"nictune_request": 1, "command": "show"}, host=Host(str(root)))
    shown = {"nictune": 1, "host": {section: report["profile"]["host"][section]}}
    doc = load_profile_text(yaml.safe_dump(shown), "shown.yaml").doc
    assert doc["host"][section][key] == {n: (int(v) if isinstance(v, bool) else v) for n, v in values.items()}
    request = {"nictune_request": 1, "command": "verify", "state_dir": str(tmp_path / "s"),
               "profile": {"path": "shown.yaml", "doc": doc, "sources": {}}}
    assert agent.run(request, host=Host(str(root)))["exit_code"] == 0


@pytest.mark.parametrize("section, body, note", [
    ("ucx", "UCX_IB_TRAFFIC_CLASS=0\nUCX_TLS=rc,sm,self\n", "variables: UCX_IB_TRAFFIC_CLASS 0 -> 106"),
    ("mpi", "btl_tcp_if_include = rail1\n", "variables: btl_tcp_if_include rail1 -> rail0, "
                                            "+mca_base_env_list=UCX_IB_TRAFFIC_CLASS=106"),
    ("nvshmem", "export NVSHMEM_IB_TRAFFIC_CLASS='106'\nexport NVSHMEM_DEBUG='INFO'\n",
     "variables: +NVSHMEM_ENABLE_NIC_PE_MAPPING=1, -NVSHMEM_DEBUG"),
])
def test_a_rewrite_names_the_variables_that_change(root, section, body, note):
    key, path, values, _ = CASES[section]
    (root / path.lstrip("/")).write_text(header_of(section) + body)
    change = only_change(run(root, "plan", section, values))
    assert change["status"] == "pending" and change["note"].endswith(note)


# -- auto ---------------------------------------------------------------------------------

def test_ucx_and_nvshmem_auto_resolve_from_the_rdma_ports(tmp_path):
    host = FakeHost(rail_state(), tmp_path / "root")
    os.makedirs(host.path("etc/ucx"), exist_ok=True)
    [d] = UcxFamily(host).expand(HOST, {"ucx": {"env": {
        "UCX_NET_DEVICES": "auto", "UCX_IB_GID_INDEX": "auto", "UCX_IB_TRAFFIC_CLASS": 106}}}, no_source)
    assert d.want.value == header_of("ucx") + "UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1\nUCX_IB_GID_INDEX=3\nUCX_IB_TRAFFIC_CLASS=106\n"
    fam = NvshmemFamily(host)
    [d] = fam.expand(HOST, {"nvshmem": {"env": {"NVSHMEM_HCA_LIST": "auto", "NVSHMEM_IB_GID_INDEX": "auto"}}},
                     no_source)
    assert d.want.value == header_of("nvshmem") + ("export NVSHMEM_HCA_LIST='mlx5_0:1,mlx5_1:1'\n"
                                     "export NVSHMEM_IB_GID_INDEX='3'\n")
    note = fam.note(d.key)
    assert note.startswith("auto: mlx5_0 port 1 GID 3 (RoCE v2, 198.18.0.1)")
    assert "only with NVSHMEM_ENABLE_NIC_PE_MAPPING: 1" in note and "not by services" in note


def test_an_auto_this_host_cannot_resolve_names_the_librarys_variable(tmp_path):
    host = Host(str(tmp_path))  # no RDMA device
    (tmp_path / "etc" / "ucx").mkdir(parents=True)
    fam = UcxFamily(host)
    [d] = fam.expand(HOST, {"ucx": {"env": {"UCX_NET_DEVICES": "auto"}}}, no_source)
    reason = fam.read([d.key])[d.key].reason
    assert reason.startswith("UCX_NET_DEVICES: auto found no RoCE port here") and "NCCL" not in reason
    with pytest.raises(AutoUnresolved):
        NvshmemFamily(host).resolve({"NVSHMEM_IB_GID_INDEX": "auto"})


# -- what a profile may say --------------------------------------------------------------

@pytest.mark.parametrize("section, values, where", [
    ("ucx", {"UCX_TLS": "rc ; x"}, "host.ucx.env"),
    ("ucx", {"UCX_TLS": " rc"}, "host.ucx.env"),
    ("ucx", {"UCX_TLS": "x" * 129}, "host.ucx.env"),
    ("ucx", {"NCCL_IB_TC": 106}, "host.ucx.env"),
    ("mpi", {"OMPI_MCA_pml": "ucx"}, "host.mpi.params"),
    ("mpi", {"pml": "ucx\nbtl = self"}, "host.mpi.params"),
    ("nvshmem", {"NVSHMEM_DEBUG": "$(reboot)"}, "host.nvshmem.env"),
    ("nvshmem", {"NVSHMEM_DEBUG": "INFO; reboot"}, "host.nvshmem.env"),
    ("nvshmem", {"NVSHMEM_DEBUG": "it's"}, "host.nvshmem.env"),
    ("nvshmem", {"NVSHMEM_DEBUG": "`id`"}, "host.nvshmem.env"),
    ("nvshmem", {"LD_PRELOAD": "/x.so"}, "host.nvshmem.env"),
])
def test_bad_names_and_values_are_refused_with_their_key(section, values, where):
    key = CASES[section][0]
    with pytest.raises(ProfileError) as e:
        load_profile_text(yaml.safe_dump({"nictune": 1, "host": {section: {key: values}}}), "p.yaml")
    assert e.value.keypath.startswith(where)


@pytest.mark.parametrize("syntax, env", [
    (UCX, {"UCX_TLS": "a;b"}), (UCX, {"UCX_NET_DEVICES": "m" * 180}),
    (MCA, {"pml": "a\nb"}), (MCA, {"OMPI_MCA_pml": "ucx"}),
    (SHELL, {"NVSHMEM_X": "a'b"}), (SHELL, {"NVSHMEM_X": "a b"}), (SHELL, {"NVSHMEM_X": "$HOME"}),
])
def test_the_host_refuses_them_again_before_writing(syntax, env):
    with pytest.raises(InvalidInput):
        syntax.render(env)


# -- each syntax as its reader reads it --------------------------------------------------------

def test_ucx_parse_follows_inih():
    text = ("\ufeffUCX_A = 1 ; comment\nUCX_B:two words\n; c\n# c\nUCX_C=x;y\nUCX_A=3\n"
            "UCX_D=first\n  continued\n[Grace Hopper]\nCPU model=Grace\nUCX_A=9\n")
    assert UCX.parse(text) == {"UCX_A": "3", "UCX_B": "two words", "UCX_C": "x;y", "UCX_D": "continued",
                               "[Grace Hopper] CPU model": "Grace", "[Grace Hopper] UCX_A": "9"}


def test_mca_parse_follows_keyval_lex():
    text = ("# c\n// c\n/* a\n b = 1\n*/\nname=value with  spaces  \n  x_y = 1\nx_y = 2\n"
            "--mca pml ucx\n")
    assert MCA.parse(text) == {"name": "value with  spaces", "x_y": "2",
                               "(line 9, not name = value)": "--mca pml ucx"}


def test_shell_parse_reads_exports_only():
    text = ("# c\nexport NVSHMEM_A='1'\nexport NVSHMEM_B=\"x\"\nexport NVSHMEM_C=y\nNVSHMEM_D=1\n"
            "export NVSHMEM_E=\"$(id)\"\nexport NVSHMEM_A=2\n")
    assert SHELL.parse(text) == {"NVSHMEM_A": "2", "NVSHMEM_B": "x", "NVSHMEM_C": "y",
                                 "(line 5, not an export nictune reads)": "NVSHMEM_D=1",
                                 "(line 6, not an export nictune reads)": 'export NVSHMEM_E="$(id)"'}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def test_ucx_info_reads_what_parse_reads(tmp_path):
    ucx_info = _tool("ucx_info")
    text = (header_of("ucx") + "UCX_IB_TRAFFIC_CLASS : 106 ; comment\nUCX_NET_DEVICES=mlx5_9:1\n"
            "UCX_IB_SL=1\nUCX_IB_SL=3\n")
    (tmp_path / "ucx.conf").write_text(text)
    out = subprocess.run([ucx_info, "-c"], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "UCX_CONFIG_DIR": str(tmp_path),
                              "HOME": str(tmp_path)}).stdout
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    parsed = UCX.parse(text)
    assert parsed == {"UCX_IB_TRAFFIC_CLASS": "106", "UCX_NET_DEVICES": "mlx5_9:1", "UCX_IB_SL": "3"}
    assert seen["UCX_NET_DEVICES"] == parsed["UCX_NET_DEVICES"]
    assert seen["UCX_RC_VERBS_TRAFFIC_CLASS"] == seen["UCX_UD_MLX5_TRAFFIC_CLASS"] == "106"
    assert seen["UCX_RC_VERBS_SL"] == "3"


def test_ompi_info_reads_what_parse_reads(tmp_path):
    ompi_info = _tool("ompi_info")
    body = MCA.render({"btl_tcp_if_include": "rail0", "mca_base_env_list": "UCX_IB_TRAFFIC_CLASS=106"})
    path = tmp_path / "openmpi-mca-params.conf"
    path.write_text(body + "/* x\n btl_tcp_if_include = no */\n")
    env = dict(os.environ, OMPI_MCA_mca_base_param_files=str(path))
    seen = {}
    for framework, component in (("btl", "tcp"), ("mca", "base")):
        out = subprocess.run([ompi_info, "--param", framework, component, "--level", "9", "--parsable"],
                             capture_output=True, text=True, check=True, env=env).stdout
        for line in out.splitlines():
            parts = line.split(":", 6)
            if len(parts) == 7 and parts[5] == "value":
                seen[parts[4]] = parts[6]
    assert {n: seen[n] for n in MCA.parse(path.read_text())} == {
        "btl_tcp_if_include": "rail0", "mca_base_env_list": "UCX_IB_TRAFFIC_CLASS=106"}


def test_sh_exports_what_parse_reads(tmp_path):
    sh = _tool("sh")
    values = {"NVSHMEM_HCA_LIST": "^mlx5_2:1,mlx5_3:1", "NVSHMEM_IB_TRAFFIC_CLASS": 106,
              "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "=eth0", "NVSHMEM_SYMMETRIC_SIZE": "3.1M",
              "NVSHMEM_IB_ADDR_RANGE": "::/0", "NVSHMEM_DISABLE_NVLS": True}
    path = tmp_path / "nvshmem.sh"
    path.write_text(SHELL.render(values))
    out = subprocess.run([sh, "-c", f". {path} && env"], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"]}).stdout
    exported = {n: v for n, v in (line.split("=", 1) for line in out.splitlines() if "=" in line)
                if n.startswith("NVSHMEM_")}
    assert exported == SHELL.parse(path.read_text()) == {
        n: str(int(v) if isinstance(v, bool) else v) for n, v in values.items()}


def test_debians_own_mca_file_is_adopted_by_show_then_verify(root, tmp_path):
    # The file Debian's openmpi package ships (settings of its own, no
    # nictune header), where the package is installed: ompi_info reads
    # what parse reads, and show gives a profile under which it is as wanted.
    shipped = "/etc/openmpi/openmpi-mca-params.conf"
    ompi_info = _tool("ompi_info")
    if not os.path.isfile(shipped):
        pytest.skip(f"no {shipped} here")
    text = open(shipped).read()
    (root / "etc/openmpi/openmpi-mca-params.conf").write_text(text)
    params = MCA.parse(text)
    assert params and not any(n.startswith("(line") for n in params)
    out = subprocess.run([ompi_info, "--all", "--level", "9", "--parsable"], capture_output=True,
                         text=True, env=dict(os.environ, OMPI_MCA_mca_base_param_files=shipped)).stdout
    seen = {}
    for line in out.splitlines():
        parts = line.split(":", 6)
        if len(parts) == 7 and parts[5] == "value" and parts[4] in params:
            seen[parts[4]] = parts[6]
    assert seen == params
    report = agent.run({"nictune_request": 1, "command": "show"}, host=Host(str(root)))
    doc = load_profile_text(yaml.safe_dump({"nictune": 1, "host": {"mpi": report["profile"]["host"]["mpi"]}}),
                            "shown.yaml").doc
    request = {"nictune_request": 1, "command": "verify", "state_dir": str(tmp_path / "s"),
               "profile": {"path": "shown.yaml", "doc": doc, "sources": {}}}
    report = agent.run(request, host=Host(str(root)))
    assert report["exit_code"] == 0 and only_change(report)["status"] == "ok"
