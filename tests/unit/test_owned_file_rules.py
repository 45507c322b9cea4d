"""Who decides which files the owned-file families (NCCL, UCX, Open MPI,
NVSHMEM) write where, and what may be in them: only a profile names a
path; each family writes its own conventional path or below a directory
the profile lists, never where a shell, the dynamic loader, cron, sudo or
systemd read (also through symlinks, on the host); each file's header
names its family and no family takes another's; values are what the
reader and a shell sourcing the file both take literally.

On real files under a Host root in tmp_path; the same attacks against the
real /etc (through an overlay) are in tests/netns/test_owned_file_attacks.py,
and tests/unit/test_owned_file_fuzz.py fuzzes values, names and paths.
"""

from __future__ import annotations

import json

import pytest
import yaml

from nictune.control.rollout.playbook import load_playbook, play_profile
from nictune.host import agent
from nictune.host.errors import InvalidInput
from nictune.host.knobs.envfile import LEGACY_HEADER, SHEBANG, header_of, writer_of
from nictune.host.knobs.mpi import McaSyntax
from nictune.host.knobs.nccl import NcclFamily
from nictune.host.knobs.ucx import UcxSyntax
from nictune.host.machine import Host
from nictune.host.model import HOST
from nictune.profile.errors import ProfileError
from nictune.profile.loader import load_profile, load_profile_text

SECTIONS = {"nccl": "env", "ucx": "env", "mpi": "params", "nvshmem": "env",
            "slurm_task_prolog": "env", "enroot_environ": "env", "enroot_mounts": "mounts",
            "environment": "env"}
VALUES = {"nccl": {"NCCL_IB_TC": 106}, "ucx": {"UCX_IB_SL": 3}, "mpi": {"pml": "ucx"},
          "nvshmem": {"NVSHMEM_IB_SL": 3}, "slurm_task_prolog": {"UCX_IB_SL": 3},
          "enroot_environ": {"UCX_IB_SL": 3}, "enroot_mounts": {"/etc/nccl.conf": "/etc/nccl.conf"},
          "environment": {"UCX_IB_SL": 3}}
DEFAULTS = {"nccl": "/etc/nccl.conf", "ucx": "/etc/ucx/ucx.conf",
            "mpi": "/etc/openmpi/openmpi-mca-params.conf", "nvshmem": "/etc/profile.d/nvshmem.sh",
            "slurm_task_prolog": "/etc/slurm/nictune-task-prolog.sh",
            "enroot_environ": "/etc/enroot/environ.d/90-nictune.env",
            "enroot_mounts": "/etc/enroot/mounts.d/90-nictune.fstab", "environment": "/etc/environment"}


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    for d in ("etc/ucx", "etc/openmpi", "etc/profile.d", "etc/cron.d", "opt/site", "etc/slurm",
              "etc/enroot/environ.d", "etc/enroot/mounts.d"):
        (r / d).mkdir(parents=True)
    return r


def run(root, command: str, section: str, extra: dict = None, values: dict = None) -> dict:
    doc = {"nictune": 1, "host": {section: {SECTIONS[section]: values or VALUES[section], **(extra or {})}}}
    request = {"nictune_request": 1, "command": command, "state_dir": str(root.parent / "state"),
               "profile": {"path": "p.yaml", "doc": doc, "sources": {}}}
    report = agent.run(request, host=Host(str(root)))
    json.dumps(report)
    return report


def profile_error(text: str) -> ProfileError:
    with pytest.raises(ProfileError) as e:
        load_profile_text(text, "p.yaml")
    return e.value


# -- an inventory or a play never decides where files go ---------------------------------

def test_the_loader_knows_every_owned_file_family():
    from nictune.host.knobs import REGISTERED
    from nictune.host.knobs.envfile import OwnedFileFamily
    from nictune.profile.loader import FILE_POLICY

    owned = {f.section for f in REGISTERED if issubclass(f, OwnedFileFamily)}
    assert owned == set(SECTIONS) == {keys[1] for keys in FILE_POLICY}

@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("nictune: 1\nhost:\n  nccl:\n    path: /opt/site/nccl.conf\n"
                    "    allowed_dirs: [/opt/site]\n    env: {NCCL_IB_TC: 106}\n")
    return path


@pytest.mark.parametrize("layer, key", [
    ({"host": {"nccl": {"drop": ["path"]}}}, "host.nccl.path"),           # back to /etc/nccl.conf
    ({"host": {"nccl": {"replace": True, "env": {"NCCL_IB_TC": 1}}}}, "host.nccl.path"),
    ({"host": {"replace": True, "nccl": {"env": {"NCCL_IB_TC": 1}}}}, "host.nccl.path"),
    ({"host": {"nccl": {"allowed_dirs": ["/opt/site"]}}}, "host.nccl.allowed_dirs"),  # even the same
])
def test_an_inventory_cannot_drop_or_replace_what_the_profile_says_of_files(profile, layer, key):
    with pytest.raises(ProfileError) as e:
        load_profile(str(profile), [(layer, "hosts.yml:9")])
    assert (e.value.file, e.value.line) == ("hosts.yml", 9)
    assert e.value.keypath == "nictune." + key and "from an inventory" in e.value.message


def test_an_inventory_still_sets_the_variables(profile):
    loaded = load_profile(str(profile), [({"host": {"nccl": {"env": {"NCCL_IB_TC": 7}}}}, "hosts.yml:9")])
    assert loaded.doc["host"]["nccl"]["path"] == "/opt/site/nccl.conf"
    assert loaded.doc["host"]["nccl"]["env"] == {"NCCL_IB_TC": 7}


@pytest.mark.parametrize("key, value", [("path", "/etc/profile.d/x.sh"), ("adopt", "true"),
                                        ("allowed_dirs", "[/opt/x]")])
def test_a_plays_vars_cannot_say_where_files_go(tmp_path, key, value):
    (tmp_path / "p.yaml").write_text("nictune: 1\nhost:\n  nccl: {env: {NCCL_IB_TC: 106}}\n")
    book = tmp_path / "site.yml"
    book.write_text("- hosts: all\n  profile: p.yaml\n  vars:\n    nictune:\n      host:\n"
                    f"        nccl:\n          {key}: {value}\n")
    (play,) = load_playbook(str(book))
    with pytest.raises(ProfileError) as e:
        play_profile(play)
    assert (e.value.file, e.value.line) == (str(book), 7)
    assert e.value.keypath == f"vars.nictune.host.nccl.{key}" and "from a play's vars" in e.value.message


# -- each family's own path, or a directory the profile lists ---------------------------------

@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_each_family_writes_its_own_path_without_allowed_dirs(root, section):
    assert run(root, "apply", section)["exit_code"] == 0
    text = (root / DEFAULTS[section].lstrip("/")).read_text()
    # the header first (after the "#!" line of a file that is executed)
    assert writer_of(text) == section
    assert text.startswith((header_of(section), SHEBANG + header_of(section)))


@pytest.mark.parametrize("section", sorted(SECTIONS))
@pytest.mark.parametrize("path, allowed, why", [
    ("/etc/x.conf", [], "the profile lists no allowed_dirs"),
    ("/etc/profile.d/x.sh", [], "/etc/profile.d: login and interactive shells"),
    ("/etc/ld.so.preload", [], "/etc/ld.so...: the dynamic loader"),
    ("/etc/ld.so.conf.d/x.conf", [], "/etc/ld.so...: the dynamic loader"),
    ("/etc/cron.d/x", [], "/etc/cron...: cron"),
    ("/etc/crontab", [], "/etc/cron...: cron"),
    ("/etc/sudoers", [], "/etc/sudo...: sudo"),
    ("/etc/sudoers.d/x", [], "/etc/sudo...: sudo"),
    ("/etc/systemd/system/x.service", [], "/etc/systemd: systemd"),
    ("/etc/environment", [], "/etc/environment: login"),
    ("/etc/security/limits.conf", [], "/etc/security: sudo, PAM"),
    ("/etc/pam.d/sshd", [], "/etc/pam.d: sudo, PAM"),
    ("/etc/init.d/x", [], "/etc/init.d: systemd, init"),
    ("/etc/rc.local", [], "/etc/rc...: systemd, init"),
    ("/etc/bash.bashrc", [], "/etc/bash...: login"),
    ("/etc/profile", [], "/etc/profile: login"),
    ("/etc/ssh/sshd_config", [], "/etc/ssh: sudo, PAM, polkit or sshd"),
    ("/etc/modprobe.d/x.conf", [], "/etc/modprobe...: systemd"),
    ("/etc/udev/rules.d/x.rules", [], "/etc/udev: systemd"),
    ("/etc/sysctl.d/x.conf", [], "/etc/sysctl...: systemd"),
    ("/etc/netns/x/nccl.conf", [], "/etc/netns: systemd"),
    ("/root/.bashrc", ["/root"], "/root: login"),
    ("/opt/site/x.conf", [], "the profile lists no allowed_dirs"),
    ("/etc/x/../cron.d/x", ["/etc/x"], "must be absolute and normalised"),
    ("/etc//cron.d/x", ["/etc/x"], "invalid host."),
])
def test_other_paths_are_refused_on_the_host(root, section, path, allowed, why):
    report = run(root, "apply", section, {"path": path, "allowed_dirs": allowed})
    if path == DEFAULTS[section]:  # the one exception: a family's own path (/etc/environment)
        assert report["exit_code"] == 0, report
        return
    assert report["exit_code"] == 1 and report["changes"] == []
    assert why in report["error"]["message"] and f"host.{section}." in report["error"]["message"]
    assert not (root / "etc" / "cron.d" / "x").exists() and not (root / "etc" / "ld.so.preload").exists()


@pytest.mark.parametrize("path, allowed, why", [
    ("/etc/profile.d/nvshmem.sh", [], "login and interactive shells"),  # NVSHMEM's, not NCCL's
    ("/etc/cron.d/x", ["/etc/cron.d"], "never writes below '/etc/cron.d'"),
    ("/etc/x.conf", ["/etc"], "a whole system tree"),
    ("/opt/x.conf", ["/opt"], "a whole system tree"),
    ("/usr/lib/x/nccl.conf", ["/usr/lib/x"], "the dynamic loader"),
])
def test_the_profile_says_it_at_load_time_with_file_and_line(path, allowed, why):
    e = profile_error(yaml.safe_dump({"nictune": 1, "host": {"nccl": {"path": path, "allowed_dirs": allowed}}}))
    assert why in e.message and e.keypath.startswith("host.nccl.") and e.line


def test_two_families_never_share_a_path():
    section = "    path: /opt/site/x.conf\n    allowed_dirs: [/opt/site]\n"
    e = profile_error(f"nictune: 1\nhost:\n  nccl:\n{section}  ucx:\n{section}")
    assert e.message == "/opt/site/x.conf is host.nccl's file too: each family needs a file of its own"
    assert (e.line, e.keypath) == (7, "host.ucx.path")


def test_a_directory_the_profile_lists_may_hold_the_file(root):
    report = run(root, "apply", "ucx", {"path": "/opt/site/ucx.conf", "allowed_dirs": ["/opt/site"]})
    assert report["exit_code"] == 0
    assert (root / "opt/site/ucx.conf").read_text() == header_of("ucx") + "UCX_IB_SL=3\n"


@pytest.mark.parametrize("link, path, allowed, resolved", [
    ("opt/site/d", "/opt/site/d/x.conf", ["/opt/site"], "/etc/cron.d/x.conf"),  # a symlinked subdirectory
    ("opt/cron", "/opt/cron/x.conf", ["/opt/cron"], "/etc/cron.d/x.conf"),      # the listed directory itself
])
def test_a_listed_directory_that_resolves_where_readers_are_is_refused(root, link, path, allowed, resolved):
    (root / link).symlink_to(root / "etc" / "cron.d")
    report = run(root, "apply", "nccl", {"path": path, "allowed_dirs": allowed})
    [change] = report["changes"]
    assert change["status"] == "unsupported" and report["exit_code"] == 1
    assert f"resolves to {resolved}, where nictune never writes (/etc/cron...: cron" in change["note"]
    assert list((root / "etc" / "cron.d").iterdir()) == []


def test_a_conventional_path_whose_directory_is_a_symlink_is_refused(root):
    (root / "etc" / "ucx").rmdir()
    (root / "etc" / "ucx").symlink_to("profile.d")
    [change] = run(root, "apply", "ucx")["changes"]
    assert change["status"] == "unsupported"
    assert "resolves to /etc/profile.d/ucx.conf, where nictune never writes" in change["note"]
    assert not (root / "etc" / "profile.d" / "ucx.conf").exists()


# -- whose file: headers name the family -------------------------------------------------------

def test_a_family_never_takes_another_familys_file_even_with_adopt(root):
    path = root / "opt/site/x.conf"
    path.write_text(header_of("nvshmem") + "export NVSHMEM_IB_SL='3'\n")
    report = run(root, "apply", "nccl", {"path": "/opt/site/x.conf", "allowed_dirs": ["/opt/site"],
                                          "adopt": True})
    [change] = report["changes"]
    assert change["status"] == "unsupported" and report["exit_code"] == 1
    assert "written by nictune's nvshmem family" in change["note"] and "adopt or not" in change["note"]
    assert path.read_text() == header_of("nvshmem") + "export NVSHMEM_IB_SL='3'\n"


# The families that wrote files before headers named them (the others never did).
LEGACY_SECTIONS = ("nccl", "ucx", "mpi", "nvshmem")


@pytest.mark.parametrize("section", LEGACY_SECTIONS)
def test_a_legacy_file_at_the_familys_own_path_with_its_own_settings_is_its_own(root, section):
    body = {"nccl": "NCCL_IB_TC=1\n", "ucx": "UCX_IB_SL=1\n", "mpi": "pml = ob1\n",
            "nvshmem": "export NVSHMEM_IB_SL='1'\n"}[section]
    path = root / DEFAULTS[section].lstrip("/")
    path.write_text(LEGACY_HEADER + body)
    report = run(root, "apply", section)
    assert report["exit_code"] == 0, report
    assert path.read_text().startswith(header_of(section))


@pytest.mark.parametrize("where, text, why", [
    # NCCL's legacy-headed file at NVSHMEM's path: not NVSHMEM's settings.
    ("/etc/profile.d/nvshmem.sh", LEGACY_HEADER + "NCCL_IB_TC=106\n", "settings this family never writes"),
    ("/etc/profile.d/nvshmem.sh", LEGACY_HEADER + "export NVSHMEM_X='1'\nid\n", "settings this family never writes"),
])
def test_a_legacy_file_with_other_settings_needs_adopt(root, where, text, why):
    path = root / where.lstrip("/")
    path.write_text(text)
    [change] = run(root, "apply", "nvshmem")["changes"]
    assert change["status"] == "unsupported" and why in change["note"]
    assert "host.nvshmem.adopt: true" in change["note"] and path.read_text() == text


def test_a_legacy_file_elsewhere_needs_adopt(root):
    path = root / "opt/site/nccl.conf"
    path.write_text(LEGACY_HEADER + "NCCL_IB_TC=1\n")
    extra = {"path": "/opt/site/nccl.conf", "allowed_dirs": ["/opt/site"]}
    [change] = run(root, "apply", "nccl", extra)["changes"]
    assert change["status"] == "unsupported" and "counts as nccl's only at /etc/nccl.conf" in change["note"]
    assert run(root, "apply", "nccl", {**extra, "adopt": True})["exit_code"] == 0
    assert path.read_text() == header_of("nccl") + "NCCL_IB_TC=106\n"


# -- values a reader or a shell would not take literally ------------------------------------------

HOSTILE = ["$(touch /tmp/x)", "`id`", "a;id", "a b", "a'b", 'a"b', "a\\b", "a|b", "a&b", "a>b",
           "a<b", "(a)", "${HOME}", "$HOME", "~root", "a#b", "*", "a?", "[a]", "{a,b}", "!x",
           "a\nNCCL_X=1", "a\rb", "a\x00b", "\u00e9", "a\tb"]


@pytest.mark.parametrize("section", ["nccl", "ucx", "mpi"])
@pytest.mark.parametrize("value", HOSTILE)
def test_values_are_refused_at_load_and_on_the_host(section, value):
    name = next(iter(VALUES[section]))
    e = profile_error(yaml.safe_dump({"nictune": 1, "host": {section: {SECTIONS[section]: {name: value}}}}))
    assert e.keypath == f"host.{section}.{SECTIONS[section]}.{name}"
    syntax = NcclFamily.syntax if section == "nccl" else UcxSyntax() if section == "ucx" else McaSyntax()
    with pytest.raises(InvalidInput):
        syntax.render({name: value})


@pytest.mark.parametrize("name", ["touch", "reboot", "a-b", "A", "a b", "a=b", "a.b", "1a", "a\n",
                                  "\u00e9t\u00e9", ""])
def test_mpi_names_are_shell_identifiers_and_lines_only_assign(name):
    rendered = McaSyntax().render({"pml": "ucx", "btl_tcp_if_include": "rail0"})
    assert rendered.splitlines()[1:] == ["pml=ucx", "btl_tcp_if_include=rail0"]
    if name in ("touch", "reboot"):  # valid parameter names: written as assignments, never `touch = x`
        assert McaSyntax().render({name: "x"}).endswith(f"\n{name}=x\n")
        return
    with pytest.raises(InvalidInput):
        McaSyntax().render({name: "x"})


def test_a_request_with_a_bad_value_names_the_key_and_where_it_came_from(root):
    request = {"nictune_request": 1, "command": "apply", "state_dir": str(root.parent / "state"),
               "profile": {"path": "p.yaml", "sources": {"host/nccl/env": "hosts.ini:4"}, "doc": {
                   "nictune": 1, "host": {"nccl": {"env": {"NCCL_SOCKET_IFNAME": "$(id)"}}}}}}
    report = agent.run(request, host=Host(str(root)))
    assert report["exit_code"] == 1 and report["changes"] == []
    assert report["error"]["message"] == ("host.nccl.env (hosts.ini:4): invalid value of "
                                          "NCCL_SOCKET_IFNAME: '$(id)'")
    assert not (root / "etc" / "nccl.conf").exists()


def test_the_directories_too_broad_or_where_readers_are_are_refused_on_the_host(root):
    fam = NcclFamily(Host(str(root)))
    for allowed in (["/etc"], ["/usr/local"], ["/etc/cron.d"], ["/etc/profile.d"]):
        with pytest.raises(InvalidInput, match="host.nccl.allowed_dirs"):
            fam.expand(HOST, {"nccl": {"env": {}, "allowed_dirs": allowed,
                                       "path": allowed[0] + "/nccl.conf"}}, lambda *parts: "")
