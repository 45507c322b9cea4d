"""The effect of a profile change (control/review/change.py), the base plan on the
host (host/agent.py, request version 2), the base from git
(control/review/gitrev.py, in repositories the tests make) and lint on change.

Hosts are the recorded ConnectX-7 host on the fake kernel (tests/fakes.py,
labelled as such): the host side runs its real engine and knob families.
"""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from fakes import FakeHost
from nictune.control.review import change
from nictune.control.review.gitrev import GitRevError, checkout_free
from nictune.control.remote.request import build_request
from nictune.host import agent
from nictune.profile.lint import Finding
from nictune.profile.loader import load_profile, load_profile_text

P0, P1 = "enp23s0f0np0", "enp23s0f1np1"  # the ConnectX-7 ports of cx7-host

OLD = """\
nictune: 1
interfaces:
  rails:
    match: {driver: mlx5_core}
    mtu: 9000
    txqueuelen: 10000
    rings: {rx: 8192, tx: 8192}
"""
# mtu changes, txqueuelen only moves a line down, rings go, channels come.
NEW = """\
nictune: 1
interfaces:
  rails:
    # the rails now carry 4096-byte RoCE frames with room to spare
    match: {driver: mlx5_core}
    mtu: 8000
    txqueuelen: 10000
    channels: {combined: {min: 16}}
"""


def host_report(tmp_path, new_text=NEW, old_text=OLD, request=None):
    new = load_profile_text(new_text, "new.yaml")
    old = load_profile_text(old_text, "HEAD~1:new.yaml")
    host = FakeHost("cx7-host", tmp_path / "root")
    req = request or change.with_base(build_request("plan", new), old)
    req = dict(req, host="cx7", state_dir=str(tmp_path / "state"))
    return agent.run(req, host=host), host


def test_the_host_plans_both_profiles_and_the_effect_is_what_the_change_alters(tmp_path):
    report, host = host_report(tmp_path)
    assert host.kernel.writes == []  # a plan with a base writes nothing
    assert report["ok"] and report["base"]["error"] is None
    rows = {(r["key"]["target"], r["key"]["family"], r["key"]["name"]): r
            for r in change.host_effect(report)}
    for port in (P0, P1):
        mtu = rows.pop((port, "link", "mtu"))
        assert (mtu["change"], mtu["old"]["value"], mtu["new"]["value"]) == ("changed", 9000, 8000)
        assert (mtu["old"]["source"], mtu["new"]["source"]) == ("HEAD~1:new.yaml:5", "new.yaml:6")
        for name in ("rx", "tx"):
            ring = rows.pop((port, "rings", name))
            assert ring["change"] == "removed" and ring["new"] is None and ring["old"]["value"] == 8192
        ch = rows.pop((port, "channels", "combined"))
        assert ch["change"] == "added" and ch["old"] is None
        assert (ch["new"]["value"], ch["new"]["bound"]) == (16, "min")
    # txqueuelen moved a line, its value did not: no effect.
    assert rows == {}


def test_drift_is_the_distance_from_the_old_wanted_not_the_change(tmp_path):
    report, _ = host_report(tmp_path)
    drift = {(r["key"]["target"], r["key"]["name"]): r for r in change.host_drift(report)}
    # The recorded host runs MTU 1500: off the old wanted 9000 already.
    assert drift[(P0, "mtu")]["current"] == 1500
    assert drift[(P0, "mtu")]["wanted"]["value"] == 9000
    assert all(r["status"] in ("pending", "drift") for r in drift.values())
    # A change that alters nothing has no effect, yet the drift stays.
    same, _ = host_report(tmp_path / "same", OLD, OLD)
    assert change.host_effect(same) == []
    assert change.host_drift(same) == change.host_drift(report)


def test_identical_hosts_group_and_different_ones_do_not(tmp_path):
    report, _ = host_report(tmp_path)
    other, _ = host_report(tmp_path / "o", NEW.replace("8000", "7000"))
    hosts = [dict(report, host=f"gpu{i:04}") for i in range(50)] + [dict(other, host="odd")]
    doc = change.effect(hosts, {"ref": "HEAD~1", "commit": "0" * 40})
    assert [len(g["hosts"]) for g in doc["effect"]] == [50, 1]
    assert doc["effect"][1]["hosts"] == ["odd"]
    assert doc["summary"] == {"hosts": 51, "affected": 51, "groups": 2, "drifted": 51, "errors": 0}
    assert doc["nictune_change"] == 1


def test_a_host_without_a_usable_base_is_an_error_not_an_empty_effect(tmp_path):
    report, _ = host_report(tmp_path)
    old_agent = {k: v for k, v in report.items() if k != "base"}
    lying = dict(report, host="liar", base={"changes": [{"key": "x"}]})
    doc = change.effect([dict(old_agent, host="old"), lying], {"file": "old.yaml"})
    assert doc["effect"] == [] and doc["summary"]["errors"] == 2
    assert {e["host"] for e in doc["errors"]} == {"old", "liar"}
    assert all(e["side"] == "base" for e in doc["errors"])


def test_a_host_new_in_the_change_wanted_nothing_before(tmp_path):
    new = load_profile_text(NEW, "new.yaml")
    report, _ = host_report(tmp_path, request=change.with_base(build_request("plan", new), None))
    assert {r["change"] for r in change.host_effect(report)} == {"added"}
    assert change.host_drift(report) == []


def test_the_agent_refuses_a_base_it_cannot_honour(tmp_path):
    new = load_profile_text(NEW, "new.yaml")
    base = {"path": "", "doc": {"nictune": 1}, "sources": {}}
    # Version 1 with a base: an agent must not silently drop it.
    v1 = dict(build_request("plan", new), base=base)
    report, _ = host_report(tmp_path, request=v1)
    assert report["error"]["kind"] == "invalid-input" and "base" not in report
    applied = dict(build_request("apply", new), nictune_request=2, base=base)
    report, host = host_report(tmp_path / "a", request=applied)
    assert report["error"]["kind"] == "invalid-input" and host.kernel.writes == []


def test_request_version_agrees_with_the_agent():
    from nictune import REQUEST_FORMAT

    assert agent.BASE_FORMAT == REQUEST_FORMAT + 1
    assert change.with_base({"nictune_request": 1}, None)["nictune_request"] == agent.BASE_FORMAT


# -- lint on change ---------------------------------------------------------------------

def test_lint_change_matches_findings_without_their_locations():
    f = lambda code, msg, *at: Finding(code, "warning", msg, at)  # noqa: E731
    old = [f("a", "same", "HEAD~1:p.yaml:3"), f("gone", "fixed one", "HEAD~1:p.yaml:9"),
           f("dup", "twice", "HEAD~1:p.yaml:1"), f("dup", "twice", "HEAD~1:p.yaml:2")]
    new = [f("a", "same", "p.yaml:4"), f("dup", "twice", "p.yaml:1"),
           f("new", "introduced one", "p.yaml:7")]
    out = change.lint_change(new, old)
    assert [x["code"] for x in out["introduced"]] == ["new"]
    assert [x["code"] for x in out["fixed"]] == ["gone", "dup"]  # one of the two dups went


def test_lint_change_on_real_profiles():
    from nictune.profile.lint import lint

    good = load_profile_text("nictune: 1\ninterfaces:\n  r:\n    match: {name: r0}\n    mtu: 9000\n",
                             "p.yaml")
    low = load_profile_text("nictune: 1\ninterfaces:\n  r:\n    match: {name: r0}\n    mtu: 1200\n",
                            "p.yaml")
    introduced = change.lint_change(lint(low), lint(good))
    assert introduced["introduced"] and not introduced["fixed"]
    assert change.lint_change(lint(good), lint(low))["fixed"] == introduced["introduced"]
    assert change.lint_change(lint(low), lint(low)) == {"introduced": [], "fixed": []}


# -- the base from git ---------------------------------------------------------------------

def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def make_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "profiles").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.invalid")
    git(repo, "config", "user.name", "t")
    (repo / "profiles" / "base.yaml").write_text("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 1\n")
    (repo / "profiles" / "rails.yaml").write_text("nictune: 1\nextends: base.yaml\n" + OLD[11:])
    os.symlink("/etc/hostname", repo / "profiles" / "outside")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    (repo / "profiles" / "base.yaml").write_text("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 2\n")
    (repo / "profiles" / "rails.yaml").write_text("nictune: 1\nextends: base.yaml\n" + NEW[11:])
    git(repo, "commit", "-qam", "two")
    return repo


def test_a_revision_is_read_from_git_objects_without_touching_the_work_tree(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "profiles" / "rails.yaml").write_text("nictune: 1\n# uncommitted\n" + NEW[11:])
    status = git(repo, "status", "--porcelain")
    target = str(repo / "profiles" / "rails.yaml")
    with checkout_free(target, "HEAD~1") as rev:
        assert rev.commit == git(repo, "rev-parse", "HEAD~1").strip()
        old = change.relabel(load_profile(rev.path_of(target)), rev.root, "HEAD~1")
        # extends resolved at the revision too: the old parent's value
        assert old.doc["host"]["sysctl"]["net.ipv4.tcp_ecn"] == 1
        assert old.doc["interfaces"]["rails"]["mtu"] == 9000
        assert old.sources["interfaces/rails/mtu"] == "HEAD~1:profiles/rails.yaml:6"
        assert old.sources["host/sysctl/net.ipv4.tcp_ecn"] == "HEAD~1:profiles/base.yaml:4"
        # a link out of the repository is not followed into this machine's files
        assert not os.path.lexists(os.path.join(rev.root, "profiles", "outside"))
        root = rev.root
    assert not os.path.exists(root)
    assert git(repo, "status", "--porcelain") == status
    assert "# uncommitted" in (repo / "profiles" / "rails.yaml").read_text()


def test_a_chain_of_links_never_leads_the_base_out_of_its_tree(tmp_path):
    """Each link alone points inside the revision; together they lead out:
    a/b -> ../d is root/d, so ../a/b/../../f is root/../f, a file beside
    the temporary tree.  Checked by real path once every link is made."""
    repo = make_repo(tmp_path)
    (repo / "d").mkdir()
    (repo / "d" / "keep").write_text("")
    (repo / "a").mkdir()
    os.symlink("../d", repo / "a" / "b")
    os.symlink("../a/b/../../nictune-secret.yaml", repo / "profiles" / "leak.yaml")
    os.symlink("base.yaml", repo / "profiles" / "alias.yaml")  # inside: kept
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "links")
    target = str(repo / "profiles" / "rails.yaml")
    with checkout_free(target, "HEAD") as rev:
        outside = os.path.join(os.path.dirname(rev.root), "nictune-secret.yaml")
        with open(outside, "w") as f:
            f.write("nictune: 1\nhost:\n  sysctl:\n    net.ipv4.tcp_ecn: 0\n")
        try:
            leak = os.path.join(rev.root, "profiles", "leak.yaml")
            assert not os.path.lexists(leak)
            assert rev.refused == {"profiles/leak.yaml": "../a/b/../../nictune-secret.yaml",
                                   "profiles/outside": "/etc/hostname"}
            assert os.path.realpath(os.path.join(rev.root, "a", "b")) == \
                os.path.realpath(os.path.join(rev.root, "d"))
            assert load_profile(os.path.join(rev.root, "profiles", "alias.yaml")).doc["host"]
            assert rev.refused_links() == (
                "--base HEAD: 2 symbolic link(s) lead outside the repository and are left out "
                "of the base: profiles/leak.yaml -> ../a/b/../../nictune-secret.yaml, "
                "profiles/outside -> /etc/hostname")
            # A profile reached through a left-out link: said so, not "does not exist".
            with pytest.raises(GitRevError, match=r"profiles/leak.yaml at HEAD is reached through "
                               r"the symbolic link profiles/leak.yaml -> \.\./a/b/\.\./\.\./"
                               r"nictune-secret.yaml, which leads outside the repository"):
                rev.has(str(repo / "profiles" / "leak.yaml"))
        finally:
            os.unlink(outside)


def test_a_hand_made_tree_never_writes_through_its_own_links(tmp_path, monkeypatch):
    """A tree made with git mktree may hold a link "c" and a file "c/x":
    written through the link, the file would land where it leads.  Files
    are written before any link, so the link is the one left out."""
    repo = make_repo(tmp_path)

    def hashed(data: str) -> str:
        return subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=data,
                              check=True, capture_output=True, text=True).stdout.strip()

    def mktree(lines: str) -> str:
        return subprocess.run(["git", "-C", str(repo), "mktree"], input=lines, check=True,
                              capture_output=True, text=True).stdout.strip()
    blob = hashed("nictune: 1\n")
    keep = mktree(f"100644 blob {blob}\tkeep\n")
    inner = mktree(f"100644 blob {blob}\tx.yaml\n")
    profiles = mktree(f"100644 blob {blob}\tp.yaml\n")
    tree = mktree(f"040000 tree {keep}\td\n120000 blob {hashed('d')}\tc\n"
                  f"040000 tree {inner}\tc\n040000 tree {profiles}\tprofiles\n")
    commit = git(repo, "commit-tree", tree, "-m", "hand-made").strip()
    with checkout_free(str(repo / "profiles" / "rails.yaml"), commit) as rev:
        assert os.path.isdir(os.path.join(rev.root, "c")) and not os.path.islink(
            os.path.join(rev.root, "c"))
        assert not os.path.exists(os.path.join(rev.root, "d", "x.yaml"))
        assert "c/x.yaml" in rev.files and "c" not in rev.files

    # A link made inside a link that leads out (through a chain) would be
    # made out there: its directory is checked by real path first.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp" / "nictune-out").mkdir(parents=True)
    a = mktree(f"120000 blob {hashed('../d')}\tb\n")
    c = mktree(f"120000 blob {hashed('x')}\tevil\n")
    tree = mktree(f"040000 tree {a}\ta\n120000 blob {hashed('a/b/../../nictune-out')}\tc\n"
                  f"040000 tree {c}\tc\n040000 tree {keep}\td\n040000 tree {profiles}\tprofiles\n")
    commit = git(repo, "commit-tree", tree, "-m", "links in links").strip()
    with checkout_free(str(repo / "profiles" / "rails.yaml"), commit) as rev:
        assert os.listdir(tmp_path / "tmp" / "nictune-out") == []
        assert rev.refused == {"c": "a/b/../../nictune-out", "c/evil": "x"}


@pytest.mark.parametrize("ref, words", [("--output=/tmp/x", "not a git revision"),
                                         ("no-such-branch", "no such revision")])
def test_bad_revisions_are_refused_in_words(tmp_path, ref, words):
    repo = make_repo(tmp_path)
    with pytest.raises(GitRevError, match=words):
        checkout_free(str(repo / "profiles" / "rails.yaml"), ref)


def test_a_profile_outside_git_asks_for_base_file(tmp_path):
    (tmp_path / "p.yaml").write_text(OLD)
    with pytest.raises(GitRevError, match="--base-file"):
        checkout_free(str(tmp_path / "p.yaml"), "HEAD")


def test_a_side_whose_plan_stopped_is_an_error_not_every_key_added_or_removed(tmp_path):
    # Two entries set one MTU two ways: the host refuses the new profile whole.
    conflict = NEW + "  again:\n    match: {driver: mlx5_core}\n    mtu: 7000\n"
    report, _ = host_report(tmp_path, conflict)
    assert report["error"]["kind"] == "conflict" and report["changes"] == []
    doc = change.effect([report], {"file": "old.yaml"})
    assert doc["effect"] == [] and [(e["side"], e["kind"]) for e in doc["errors"]] == [
        ("new", "conflict")]
    # The base planned: the host's drift from it is still shown.
    assert doc["drift"][0]["hosts"] == ["cx7"]


FUZZ_SEED = int(os.environ.get("NICTUNE_FUZZ_SEED", "20261204"))
LINK_TARGETS = ["..", "../..", "a", "b/..", "a/b/../..", "../out", "c/../../out", "d", "./a",
                "b/c/../../..", "a/b/c", "../../..", "/tmp", "x", "../d", "a/b/../../out"]


def test_hand_made_trees_of_links_never_lead_the_base_out(tmp_path, monkeypatch):
    """Fuzz: 80 seeded trees made with git mktree (links to every kind of
    place, links inside links, a name given twice as link, file and
    directory): each is written without an exception, every link left in
    the base leads inside it by its real path, and nothing is made beside
    the temporary tree."""
    import random

    repo = make_repo(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp" / "out").mkdir(parents=True)

    def run(*args, data=None) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], input=data, check=True,
                              capture_output=True, text=True).stdout.strip()
    blob = run("hash-object", "-w", "--stdin", data="nictune: 1\n")
    rng = random.Random(FUZZ_SEED)

    def tree(depth: int) -> str:
        lines = {}
        for _ in range(rng.randint(1, 4)):
            name, roll = rng.choice("abcdx"), rng.random()
            if roll < 0.45:
                link = run("hash-object", "-w", "--stdin", data=rng.choice(LINK_TARGETS))
                lines[name + "l"] = f"120000 blob {link}\t{name}"
            elif roll < 0.65 or depth > 2:
                lines[name + "f"] = f"100644 blob {blob}\t{name}"
            else:
                lines[name + "t"] = f"040000 tree {tree(depth + 1)}\t{name}"
        return run("mktree", data="".join(line + "\n" for line in
                                          sorted(lines.values(), key=lambda t: t.split("\t")[1])))
    kept = refused = 0
    for i in range(80):
        commit = run("commit-tree", tree(0), "-m", str(i))
        with checkout_free(str(repo / "profiles" / "rails.yaml"), commit) as rev:
            top = os.path.realpath(rev.root)
            for here, dirs, files in os.walk(rev.root):
                for name in dirs + files:
                    path = os.path.join(here, name)
                    if os.path.islink(path):
                        real = os.path.realpath(path)
                        assert real == top or real.startswith(top + os.sep), (i, path, real)
                        kept += 1
            refused += len(rev.refused)
        assert os.listdir(tmp_path / "tmp" / "out") == [] and os.listdir(tmp_path / "tmp") == ["out"]
    print(f"\nbase fuzz: 80 hand-made trees (seed {FUZZ_SEED}), {kept} links kept, {refused} refused")
    assert kept >= 20 and refused >= 20, (kept, refused)
