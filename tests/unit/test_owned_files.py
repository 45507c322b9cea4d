"""Files nictune owns (host.nccl.path), issue 9 items 1-4, on real files
under a Host root in tmp_path: which paths a profile may name, whose file
it is, what a report may show of it, how it is written and rolled back,
and the temporary files an interrupted write leaves.

Reads of FIFOs, devices and symlinks by the agent process, the namespace's
own file under `ip netns exec`, and a crash while a bind-mounted file is
rewritten are tested against the real kernel in tests/netns/test_owned_files.py.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from typer.testing import CliRunner

from nictune.cli import host_cmds
from nictune.cli.app import app
from nictune.control.review import markdown
from nictune.control.review.audit_formats import junit
from nictune.control.remote.ssh import SshTarget
from nictune.host import agent, files
from nictune.host.errors import InvalidInput
from nictune.host.knobs.nccl import HEADER, NcclFamily
from nictune.host.machine import Host
from nictune.host.model import HOST, Key
from nictune.profile.errors import ProfileError
from nictune.profile.loader import load_profile, load_profile_text

SECRET = "NCCL_DEBUG=INFO\nROOT_PASSWORD=hunter2\n"  # a file nictune did not write


def no_source(*parts: str) -> str:
    return ""


@pytest.fixture
def root(tmp_path):
    """A Host root with an /etc."""
    (tmp_path / "root" / "etc").mkdir(parents=True)
    return tmp_path / "root"


def request(command: str, nccl: dict = None, sources: dict = None, **extra) -> dict:
    doc = {"nictune": 1, "host": {"nccl": {"env": {"NCCL_IB_TC": 106}, **(nccl or {})}}}
    return {"nictune_request": 1, "command": command, **extra,
            "profile": {"path": "p.yaml", "doc": doc, "sources": sources or {}}}


def run(root, command: str, nccl: dict = None, sources: dict = None, **extra) -> dict:
    req = request(command, nccl, sources, **extra) if command != "rollback" else \
        {"nictune_request": 1, "command": "rollback", **extra}
    report = agent.run(dict(req, state_dir=str(root.parent / "state")), host=Host(str(root)))
    json.dumps(report)  # what travels
    return report


def nccl_change(report: dict) -> dict:
    [change] = [c for c in report["changes"] if c["key"]["family"] == "nccl"]
    return change


# -- 1. which paths ------------------------------------------------------------------

# Paths a profile might name, not files of this machine: the host is rooted
# in the test's temporary directory and the refusal comes before any read
# (a home directory's file is spelt with join so that it does not read as
# a path this test depends on).
@pytest.mark.parametrize("path", ["/proc/self/environ", "/dev/null", "/sys/kernel/mm/ksm/run",
                                  "/run/nccl.conf", "/var/lib/nccl.conf",
                                  os.path.join("/root", ".nccl.conf"), "/tmp/nccl.conf"])
def test_a_path_outside_the_allowed_directories_is_refused_on_the_host(root, path):
    with pytest.raises(InvalidInput, match="host.nccl.path"):
        NcclFamily(Host(str(root))).expand(HOST, {"nccl": {"path": path, "env": {}}}, no_source)


@pytest.mark.parametrize("section, key", [
    ("path: /proc/self/environ", "host.nccl.path"),
    ("path: /dev/null", "host.nccl.path"),
    ("path: /sys/class/net/eth0/mtu", "host.nccl.path"),
    ("allowed_dirs: [/]", "host.nccl.allowed_dirs"),
    ("allowed_dirs: [/run/x]", "host.nccl.allowed_dirs"),
])
def test_validate_refuses_kernel_directories(section, key):
    with pytest.raises(ProfileError) as e:
        load_profile_text(f"nictune: 1\nhost:\n  nccl:\n    {section}\n", "p.yaml")
    assert e.value.line == 4 and e.value.keypath.startswith(key) and "outside /proc" in e.value.message


def test_a_profile_widens_the_directories(root):
    fam = NcclFamily(Host(str(root)))
    section = {"path": "/opt/nccl/nccl.conf", "env": {}}
    with pytest.raises(InvalidInput, match="allowed_dirs"):
        fam.expand(HOST, {"nccl": section}, no_source)
    [desired] = fam.expand(HOST, {"nccl": {**section, "allowed_dirs": ["/opt/nccl"]}}, no_source)
    assert desired.key.name == "/opt/nccl/nccl.conf"


@pytest.mark.parametrize("section", ["nccl", "ucx", "mpi", "nvshmem"])
@pytest.mark.parametrize("override", [{"adopt": True}, {"allowed_dirs": ["/opt/x"]},
                                      {"path": "/etc/nccl.conf"}, {"path": "/etc/profile.d/x.sh"}])
def test_an_inventory_cannot_widen_what_nictune_may_replace(tmp_path, override, section):
    # Not even a path: which files are written where is the profile's to say.
    profile = tmp_path / "p.yaml"
    profile.write_text("nictune: 1\nhost:\n  nccl: {env: {NCCL_IB_TC: 106}}\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(profile), [({"host": {section: override}}, "hosts.ini:7")])
    assert (e.value.file, e.value.line) == ("hosts.ini", 7)
    assert "cannot be set from an inventory" in e.value.message
    assert e.value.keypath == f"nictune.host.{section}.{next(iter(override))}"


def test_a_directory_that_resolves_elsewhere_is_refused(root):
    (root / "proc").mkdir()
    (root / "etc" / "nccl").symlink_to("../proc")
    report = run(root, "plan", {"path": "/etc/nccl/nccl.conf", "allowed_dirs": ["/etc/nccl"]})
    change = nccl_change(report)
    assert change["status"] == "unsupported" and "its directory is /proc" in change["note"]


# -- 1. whose file, what a report shows --------------------------------------------------

def test_a_file_nictune_did_not_write_is_refused_and_its_text_stays_on_the_host(root):
    (root / "etc" / "nccl.conf").write_text(SECRET)
    for command in ("plan", "apply"):
        report = run(root, command)
        change = nccl_change(report)
        assert change["status"] == "unsupported" and report["exit_code"] == 1
        assert change["before"] == f"<file not written by nictune: {len(SECRET)} bytes>"
        assert "host.nccl.adopt: true" in change["note"]
        assert "hunter2" not in json.dumps(report)
        assert "hunter2" not in junit({"command": command, "hosts": [report]})
    assert (root / "etc" / "nccl.conf").read_text() == SECRET


@pytest.mark.parametrize("on_unsupported", [None, "skip", "warn"])
def test_a_file_nictune_did_not_write_that_differs_is_drift_to_a_read_only_check(root, on_unsupported):
    # The host differs from the profile: verify (and so audit) says drift,
    # exit 2, whatever on_unsupported says of what apply cannot write; the
    # note says which variables the profile wants and that an apply needs
    # adopt: true, never what the file holds.
    (root / "etc" / "nccl.conf").write_text(SECRET)
    extra = {} if on_unsupported is None else {"on_unsupported": on_unsupported}
    req = request("verify")
    req["profile"]["doc"].update(extra)
    report = agent.run(dict(req, state_dir=str(root.parent / "state")), host=Host(str(root)))
    change = nccl_change(report)
    assert (report["exit_code"], change["status"], report["error"]) == (2, "drift", None), report
    assert change["before"] == f"<file not written by nictune: {len(SECRET)} bytes>"
    assert "host.nccl.adopt: true" in change["note"]
    assert "the profile wants NCCL_IB_TC=106; it sets 2 variables now" in change["note"]
    xml = junit({"command": "audit", "hosts": [report]})
    assert '<failure type="drift"' in xml and "<error" not in xml
    md = markdown.report({"command": "verify", "hosts": [report], "exit_code": 2}, "p.yaml")
    assert "1 drift" in md and "<file not written by nictune" in md
    assert "hunter2" not in json.dumps(report) + xml + md and "ROOT_PASSWORD" not in json.dumps(report)
    assert (root / "etc" / "nccl.conf").read_text() == SECRET


def test_the_user_may_ask_for_the_text(root):
    (root / "etc" / "nccl.conf").write_text(SECRET)
    assert nccl_change(run(root, "plan", show_file_content=True))["before"] == SECRET
    with pytest.raises(InvalidInput):
        agent._validated(request("plan", show_file_content="yes"))


def test_an_adopted_file_is_replaced_and_rolled_back_without_showing_it(root):
    path = root / "etc" / "nccl.conf"
    path.write_text(SECRET)
    report = run(root, "apply", {"adopt": True})
    change = nccl_change(report)
    assert report["exit_code"] == 0 and change["status"] == "applied"
    assert change["before"].startswith("<file not written by nictune") and "adopts" in change["note"]
    assert path.read_text().startswith(HEADER)
    # The host keeps the text, for rollback; the report does not carry it.
    journal = json.loads((root.parent / "state" / "journal.json").read_text())
    assert journal["changes"][0]["before"] == SECRET
    report = run(root, "rollback")
    assert report["exit_code"] == 0 and nccl_change(report)["status"] == "reverted"
    assert "hunter2" not in json.dumps(report)
    assert path.read_text() == SECRET


def test_the_same_variables_written_by_someone_else_are_as_wanted_and_left_alone(root):
    path = root / "etc" / "nccl.conf"
    path.write_text("NCCL_IB_TC=106\n")
    os.utime(path, (1, 1))
    for command in ("plan", "verify", "apply"):
        report = run(root, command)
        assert report["exit_code"] == 0 and nccl_change(report)["status"] == "ok", report
    assert path.read_text() == "NCCL_IB_TC=106\n" and path.stat().st_mtime == 1


def test_adopt_covers_only_a_path_its_own_file_names(root):
    # A child profile names the path (an inventory cannot, see above).
    (root / "opt" / "site").mkdir(parents=True)
    (root / "opt" / "site" / "nccl.conf").write_text(SECRET)
    nccl = {"path": "/opt/site/nccl.conf", "allowed_dirs": ["/opt/site"], "adopt": True}
    sources = {"host/nccl/path": "child.yaml:4", "host/nccl/adopt": "p.yaml:5"}
    report = run(root, "apply", nccl, sources)
    change = nccl_change(report)
    assert change["status"] == "unsupported" and "comes from child.yaml:4" in change["note"]
    assert (root / "opt" / "site" / "nccl.conf").read_text() == SECRET
    # Named in the profile that adopts it, it is adopted.
    sources["host/nccl/path"] = "p.yaml:4"
    assert run(root, "plan", nccl, sources)["exit_code"] == 2


def test_an_inventory_override_of_the_path_is_refused_before_anything_is_sent(tmp_path, monkeypatch):
    # The profile adopts /etc/nccl.conf; a host's inventory entry points the
    # file at /etc/shadow.  No host is sent anything.
    sent = {}
    monkeypatch.setattr(SshTarget, "run", lambda self, req: sent.setdefault(self.label, req) and {
        "host": self.label, "command": req["command"], "ok": True, "exit_code": 0, "changed": False,
        "summary": {}, "changes": [], "warnings": [], "error": None, "seconds": 0.0})
    profile = tmp_path / "p.yaml"
    profile.write_text("nictune: 1\nhost:\n  nccl:\n    adopt: true\n    env: {NCCL_IB_TC: 106}\n")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: 192.0.2.1\n"
                         "      nictune: {host: {nccl: {path: /etc/shadow}}}\n")
    result = CliRunner().invoke(app, ["plan", str(profile), "-i", str(inventory), "--json"])
    assert result.exit_code != 0 and sent == {}
    assert f"{inventory}:5" in result.output and "host.nccl.path cannot be set from an inventory" in result.output


def test_show_file_content_travels_in_local_and_fleet_requests(monkeypatch, tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("nictune: 1\nhost:\n  nccl: {env: {NCCL_IB_TC: 106}}\n")
    local = []

    class Target:
        label = "local"

        def run(self, req):
            local.append(req)
            return agent.report(agent.Outcome(req["command"]), "local", 0.0)

    monkeypatch.setattr(host_cmds, "target_for", lambda netns, state_dir: Target())
    CliRunner().invoke(app, ["plan", str(profile), "--show-file-content"])
    CliRunner().invoke(app, ["plan", str(profile)])
    assert [r.get("show_file_content") for r in local] == [True, None]

    fleet = []
    monkeypatch.setattr(SshTarget, "run", lambda self, req: fleet.append(req) or {
        "host": self.label, "command": req["command"], "ok": True, "exit_code": 0, "changed": False,
        "summary": {}, "changes": [], "warnings": [], "error": None, "seconds": 0.0})
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu01 ansible_host=192.0.2.1\n")
    CliRunner().invoke(app, ["audit", str(profile), "-i", str(inventory), "--show-file-content"])
    assert [r.get("show_file_content") for r in fleet] == [True]


# -- 1. type, mode and owner ---------------------------------------------------------------

def test_a_new_file_is_0644_and_rollback_removes_it(root):
    path = root / "etc" / "nccl.conf"
    assert run(root, "apply")["exit_code"] == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert run(root, "rollback")["exit_code"] == 0 and not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file another owner")
def test_apply_and_rollback_keep_mode_and_owner(root):
    path = root / "etc" / "nccl.conf"
    path.write_text(SECRET)
    os.chmod(path, 0o600)
    os.chown(path, 4242, 4343)
    assert run(root, "apply", {"adopt": True})["exit_code"] == 0
    st = path.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, 4242, 4343)
    assert run(root, "rollback")["exit_code"] == 0
    st = path.stat()
    assert path.read_text() == SECRET
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, 4242, 4343)


def test_rollback_says_so_when_the_file_became_a_symlink(root):
    path = root / "etc" / "nccl.conf"
    path.write_text(HEADER + "NCCL_IB_TC=1\n")
    assert run(root, "apply")["exit_code"] == 0
    target = root / "etc" / "elsewhere"
    target.write_text("precious\n")
    path.unlink()
    path.symlink_to("elsewhere")
    report = run(root, "rollback")
    change = nccl_change(report)
    assert report["exit_code"] == 4 and change["status"] == "revert-failed"
    assert "symbolic link" in change["note"]
    assert path.is_symlink() and target.read_text() == "precious\n"


# -- 2. the namespace's own file ----------------------------------------------------------

def test_in_a_namespace_the_file_under_etc_is_the_namespaces_own(root):
    host = Host(str(root))
    host.netns = "ntown1"
    fam = NcclFamily(host)
    [desired] = fam.expand(HOST, {"nccl": {"env": {"NCCL_IB_TC": 106}}}, no_source)
    assert fam.read([desired.key]) == {desired.key: None}
    assert fam.note(desired.key).startswith(
        "the namespace's own file /etc/netns/ntown1/nccl.conf, created; ip netns exec binds it "
        "over /etc/nccl.conf only where that file exists")
    fam.apply([(desired.key, desired.want.value)])
    assert (root / "etc" / "netns" / "ntown1" / "nccl.conf").read_text() == desired.want.value
    assert not (root / "etc" / "nccl.conf").exists()
    # A subdirectory would hide the host's whole /etc/sub in the namespace.
    sub = Key("nccl", HOST, "/etc/sub/nccl.conf")
    (root / "etc" / "sub").mkdir()
    assert "hide the host's /etc/sub" in fam.read([sub])[sub].reason


def test_a_request_for_a_namespace_the_agent_is_not_in_is_refused():
    with pytest.raises(InvalidInput, match="network namespace"):
        agent._validated(request("plan", netns="nt-not-here"))
    with pytest.raises(InvalidInput, match="invalid network namespace"):
        agent._validated(request("plan", netns="../x"))


# -- 3. reads that never end ----------------------------------------------------------------

def test_reads_refuse_what_is_not_a_regular_file_before_reading_it(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to("/dev/zero")
    (tmp_path / "big").write_bytes(b"x" * (files.MAX_OWNED_BYTES + 1))
    (tmp_path / "dir").mkdir()
    for name, why in (("fifo", "a FIFO"), ("link", "a symbolic link"), ("dir", "a directory"),
                      ("big", "larger than 1024 KiB")):
        with pytest.raises(files.UnsafeFile, match=why):
            files.read_owned(str(tmp_path / name), name)
    (tmp_path / "ok").write_bytes(b"x" * files.MAX_OWNED_BYTES)
    assert len(files.read_owned(str(tmp_path / "ok"), "ok")) == files.MAX_OWNED_BYTES


# -- 4. temporary files an interrupted write left ---------------------------------------------

def test_apply_and_rollback_remove_stale_temporary_files_only(root):
    etc = root / "etc"
    stale = [".nictune-999999999-abcdefgh", ".nictune-k3j4h5g6"]  # a dead writer; an older version
    for name in stale:
        (etc / name).write_text("half")
    kept = {".nictune-%d-live0001" % os.getpid(): "file", ".nictune-dir": "dir",
            ".nictune-link": "link", "nictune-other": "file"}
    (etc / "precious").write_text("keep\n")
    for name, kind in kept.items():
        if kind == "dir":
            (etc / name).mkdir()
        elif kind == "link":
            (etc / name).symlink_to("precious")
        else:
            (etc / name).write_text("x")
    report = run(root, "apply")
    assert report["exit_code"] == 0
    assert any(".nictune-999999999-abcdefgh" in w for w in report["warnings"])
    assert sorted(os.listdir(etc)) == sorted([*kept, "precious", "nccl.conf"])
    assert (etc / "precious").read_text() == "keep\n"

    # A rollback removes them too, even one that has nothing to write.
    (etc / stale[0]).write_text("half")
    assert run(root, "apply")["exit_code"] == 0  # nothing to write
    assert not (etc / stale[0]).exists()
    (etc / stale[0]).write_text("half")
    (etc / "nccl.conf").unlink()  # already back at "no file"
    report = run(root, "rollback")
    assert report["exit_code"] == 0 and not (etc / stale[0]).exists()


def test_a_file_nictune_did_not_write_stays_unsupported_when_the_host_cannot_take_the_profiles(root):
    # adopt: true would not make this host take it (a missing interface):
    # verify still says unsupported, naming both reasons.
    (root / "etc" / "nccl.conf").write_text(SECRET)
    req = request("verify")
    req["profile"]["doc"]["host"]["nccl"]["env"]["NCCL_SOCKET_IFNAME"] = "nt-missing0"
    report = agent.run(dict(req, state_dir=str(root.parent / "state")), host=Host(str(root)))
    change = nccl_change(report)
    assert (report["exit_code"], change["status"]) == (1, "unsupported"), report
    assert "host.nccl.adopt: true" in change["note"] and "nt-missing0" in change["note"]
