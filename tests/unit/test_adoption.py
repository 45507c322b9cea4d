"""Adoption of an NCCL file (issue 11 item 8): nictune compares the
variables NCCL reads, not text, so a file an image or a human wrote with
the profile's variables is as wanted, and so is nictune's own file with
its lines reordered or commented; `nictune show` on a host gives a profile
that verifies clean on hosts like it; a plan that rewrites a file names
the variables that change, without sending the text of a file nictune did
not write.

The image files are Azure's HPC images' own /etc/nccl.conf (azhpc-images),
from the real-world reference directory (tests/real_world.py): a CI run
fails without them.  Each is read back here with a parser of its own (the
loop below), never through nictune's.
"""

from __future__ import annotations

import json

import pytest
import yaml

from nictune.host import agent
from nictune.host.knobs.nccl import HEADER
from nictune.host.machine import Host
from nictune.profile.loader import load_profile_text
from real_world import REAL_WORLD, require


def azhpc_files() -> list:
    return sorted(require(REAL_WORLD / "nccl").glob("azhpc-nccl.conf.*"))


def variables(text: str) -> dict:
    """NAME=VALUE lines as NCCL's setEnvFile takes them (the first wins)."""
    out: dict = {}
    for line in text.splitlines():
        if line and line[0] != "#" and "=" in line:
            name, value = line.split("=", 1)
            out.setdefault(name, value)
    return out


def host_with(tmp_path, name: str, text) -> Host:
    root = tmp_path / name
    (root / "etc").mkdir(parents=True)
    if text is not None:
        (root / "etc" / "nccl.conf").write_text(text)
    return Host(str(root))


def run(host: Host, command: str, doc: dict = None, **extra) -> dict:
    request = {"nictune_request": 1, "command": command, **extra,
               "state_dir": host.root + "-state"}
    if doc is not None:
        request["profile"] = {"path": "p.yaml", "doc": doc, "sources": {}}
    report = agent.run(request, host=host)
    json.dumps(report)  # what travels
    return report


def nccl_changes(report: dict) -> list:
    return [c for c in report["changes"] if c["key"]["family"] == "nccl"]


def profile_of(env: dict, **nccl) -> dict:
    return {"nictune": 1, "host": {"nccl": {"env": env, **nccl}}}


def shown_profile(host: Host) -> dict:
    """What `nictune show` prints, loaded as the CLI loads a profile file."""
    report = run(host, "show")
    assert report["exit_code"] == 0, report
    return load_profile_text(yaml.safe_dump(report["profile"], sort_keys=False), "shown.yaml").doc


# -- an image's file with the same variables -------------------------------------------------

def test_every_azhpc_image_file_is_as_wanted_when_the_profile_says_the_same(tmp_path):
    files = azhpc_files()
    assert len(files) >= 6
    for path in files:
        text = path.read_text()
        host = host_with(tmp_path, path.name, text)
        doc = load_profile_text(yaml.safe_dump(profile_of(variables(text))), path.name).doc
        for command in ("plan", "verify", "apply"):
            report = run(host, command, doc)
            [change] = nccl_changes(report)
            assert (report["exit_code"], change["status"]) == (0, "ok"), (path.name, report)
        assert (tmp_path / path.name / "etc" / "nccl.conf").read_text() == text  # untouched


def test_show_then_verify_of_identical_hosts_reports_no_drift(tmp_path):
    files = azhpc_files()
    assert len(files) >= 6
    for path in files:
        text = path.read_text()
        doc = shown_profile(host_with(tmp_path, "shown-" + path.name, text))
        assert doc["host"]["nccl"]["env"] == variables(text) | {
            n: int(v) for n, v in variables(text).items() if v.isdigit()}
        for twin in ("a", "b"):
            report = run(host_with(tmp_path, f"{twin}-{path.name}", text), "verify", doc)
            # The rest of what show printed (this machine's links) must verify too.
            assert report["exit_code"] == 0 and set(report["summary"]) == {"ok"}, (path.name, report)
            assert [c["status"] for c in nccl_changes(report)] == ["ok"]


def test_show_prints_numbers_a_profile_takes_and_keeps_text_that_is_not_a_canonical_number(tmp_path):
    # NCCL_IB_GID_INDEX is an integer in the schema: shown as text "3", the
    # printed profile would not load.  "07" stays text: 7 would render as 7.
    text = "NCCL_IB_GID_INDEX=3\nNCCL_IB_TC=106\nNCCL_IB_SL=07\nNCCL_IB_HCA==mlx5_0:1\n"
    doc = shown_profile(host_with(tmp_path, "src", text))
    assert doc["host"]["nccl"]["env"] == {"NCCL_IB_GID_INDEX": 3, "NCCL_IB_TC": 106,
                                          "NCCL_IB_SL": "07", "NCCL_IB_HCA": "=mlx5_0:1"}
    assert run(host_with(tmp_path, "twin", text), "verify", doc)["exit_code"] == 0


# -- nictune's own file, edited without changing what NCCL reads -----------------------------

@pytest.mark.parametrize("text", [
    HEADER + "NCCL_IB_HCA==mlx5_0:1\nNCCL_IB_TC=106\n",                 # lines reordered
    HEADER + "# rails only\nNCCL_IB_TC=106\n\nNCCL_IB_HCA==mlx5_0:1\n",  # a comment, a blank line
    "NCCL_IB_TC=106\nNCCL_IB_HCA==mlx5_0:1\nNCCL_IB_TC=7\n",             # no header; NCCL takes the first
])
def test_the_same_variables_in_another_text_are_as_wanted(tmp_path, text):
    host = host_with(tmp_path, "h", text)
    doc = profile_of({"NCCL_IB_TC": 106, "NCCL_IB_HCA": "=mlx5_0:1"})
    for command in ("plan", "verify"):
        report = run(host, command, doc)
        [change] = nccl_changes(report)
        assert (report["exit_code"], change["status"]) == (0, "ok"), report
        assert change["note"] == "sets the profile's variables already; its text is left as it is"


@pytest.mark.parametrize("text", [
    HEADER + "NCCL_IB_TC=106\nNCCL_IB_HCA==mlx5_0:1\r\n",  # NCCL before 2.30 keeps the '\r'
    HEADER + "NCCL_IB_TC=106 \nNCCL_IB_HCA==mlx5_0:1\n",   # NCCL trims nothing
    HEADER + "#NCCL_IB_TC=106\nNCCL_IB_HCA==mlx5_0:1\n",   # a comment sets nothing
    HEADER + "NCCL_IB_TC=106\nNCCL_IB_HCA==mlx5_0:1\nNCCL_DEBUG=INFO\n",
])
def test_a_variable_nccl_reads_differently_is_drift(tmp_path, text):
    report = run(host_with(tmp_path, "h", text), "verify",
                 profile_of({"NCCL_IB_TC": 106, "NCCL_IB_HCA": "=mlx5_0:1"}))
    assert report["exit_code"] == 2 and nccl_changes(report)[0]["status"] == "drift"


# -- what a plan shows of a rewrite -------------------------------------------------------------

def test_a_rewrite_of_nictunes_file_names_each_variable_that_changes(tmp_path):
    host = host_with(tmp_path, "h", HEADER + "NCCL_IB_TC=0\nNCCL_DEBUG=INFO\nNCCL_IB_SL=3\n")
    report = run(host, "plan", profile_of({"NCCL_IB_TC": 106, "NCCL_IB_SL": 3, "NCCL_IB_HCA": "=mlx5_0"}))
    [change] = nccl_changes(report)
    assert change["status"] == "pending"
    assert change["note"] == "variables: NCCL_IB_TC 0 -> 106, +NCCL_IB_HCA==mlx5_0, -NCCL_DEBUG"


def test_a_rewrite_of_someone_elses_file_names_only_the_profiles_side(tmp_path):
    secret = "NCCL_IB_TC=0\nNCCL_NET_PLUGIN=hunter2\n"
    host = host_with(tmp_path, "h", secret)
    doc = profile_of({"NCCL_IB_TC": 106}, adopt=True)
    report = run(host, "plan", doc)
    [change] = nccl_changes(report)
    assert change["status"] == "pending"
    assert change["note"].endswith(
        "would replace it whole, setting NCCL_IB_TC=106; it sets 2 variables now, which and how "
        "stays on the host (--show-file-content shows its text)")
    assert "hunter2" not in json.dumps(report) and "NCCL_NET_PLUGIN" not in json.dumps(report)
    assert "hunter2" in json.dumps(run(host, "plan", doc, show_file_content=True))


def test_cuda_names_are_taken_and_other_names_refused():
    load_profile_text(yaml.safe_dump(profile_of({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})), "p.yaml")
    for name in ("LD_PRELOAD", "PATH", "nccl_debug"):
        with pytest.raises(Exception, match="host.nccl.env"):
            load_profile_text(yaml.safe_dump(profile_of({name: "x"})), "p.yaml")
