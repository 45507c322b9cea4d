"""Fuzzer of the owned files' values, names and paths (seeded, a few
seconds): hostile values and names through each family's syntax, and
hostile paths and allowed directories (with '..', '//', symlinks, unicode,
newlines, NULs) through the path rules and through real writes under a
Host root in tmp_path.  It asserts 0 tracebacks, 0 dangerous paths
accepted (a file written where a shell, the loader, cron, sudo or systemd
read, in the kernel's directories, outside the host's root or outside the
directories the profile allows) and 0 values a sourcing shell would run:
every file a family renders is sourced by the real sh (and bash, if there)
with `set -a`, in an empty environment, beside a canary file the hostile
values try to create, and must export exactly what the family's parse()
reads.  Run with -s to see the counts.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import pytest

from nictune.host.errors import NictuneError
from nictune.host.knobs.envfile import value_text
from nictune.host.knobs.mpi import MpiFamily
from nictune.host.knobs.nccl import NcclFamily
from nictune.host.knobs.nvshmem import NvshmemFamily
from nictune.host.knobs.ucx import UcxFamily
from nictune.host.machine import Host
from nictune.host.model import HOST, Unsupported
from nictune.host.validate import (KERNEL_DIRS, check_owned_dir, check_owned_path, reader_of,
                                   within)

SEED = 21
FAMILIES = (NcclFamily, UcxFamily, MpiFamily, NvshmemFamily)
PREFIX = {"nccl": "NCCL_", "ucx": "UCX_", "mpi": "", "nvshmem": "NVSHMEM_"}
KEY = {"nccl": "env", "ucx": "env", "mpi": "params", "nvshmem": "env"}


def _pieces(canary: str) -> list:
    return [f"$(touch {canary})", f"`touch {canary}`", f";touch {canary}", f"|touch {canary}",
            f"&touch {canary}", f"&&touch {canary}", f"\ntouch {canary}", f"\rtouch {canary}",
            f">{canary}", f"$(>{canary})", "$(id)", "${IFS}", "$HOME", "~", "~root", "'", '"', "\\",
            " ", "\t", "#", "*", "?", "[a]", "{a,b}", "!", "<", ">", "\x00", "\u00e9", "\u2028",
            "\ufeff", "\x1b[31m", "=", ":", ",", "^", "%", "@", "+", "-", ".", "/", "_", "abc",
            "123", "mlx5_0:1", "=eth0", "^lo", "0x1f", ""]


def _name(rng: random.Random, family: str) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_" if family != "mpi" else "abcdefghijklmnopqrstuvwxyz0123456789_"
    name = PREFIX[family] + "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
    if rng.random() < 0.3:  # hostile
        bad = rng.choice(["-", " ", "=", ";", "$(id)", "\n", "\x00", "\u00e9", ".", "`", "'", "a", "Z"])
        at = rng.randint(0, len(name))
        name = name[:at] + bad + name[at:]
    if family == "mpi" and rng.random() < 0.1:
        name = rng.choice(["touch", "reboot", "rm", "sh"])  # valid names that are commands too
    return name


def _value(rng: random.Random, pieces: list):
    if rng.random() < 0.05:
        return rng.choice([True, False, 0, -1, 2 ** 40])
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 5)))


def _shells() -> list:
    found = [shutil.which("sh"), shutil.which("bash")]
    return [s for s in found if s]


def _sourced(shell: str, path: str, cwd: str) -> dict:
    """What a shell that sources the file exports (set -a), in an empty
    environment whose PATH would find touch."""
    out = subprocess.run([shell, "-c", f"set -a; . {path}; env -0"], cwd=cwd, capture_output=True,
                         timeout=30, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, (shell, out.stderr[-500:])
    pairs = (item.split(b"=", 1) for item in out.stdout.split(b"\0") if b"=" in item)
    return {n.decode(): v.decode() for n, v in pairs}


def test_values_and_names_never_make_a_sourcing_shell_run_anything(tmp_path):
    if not _shells():
        pytest.skip("needs sh")
    rng = random.Random(SEED)
    canary = str(tmp_path / "canary")
    pieces = _pieces(canary)
    counts = {"tried": 0, "accepted": 0, "refused": 0, "tracebacks": 0, "executed": 0, "not literal": 0}
    tracebacks = []
    for family in FAMILIES:
        syntax, name = family.syntax, family.name
        batch = {}
        for _ in range(700):
            pair = _name(rng, name), _value(rng, pieces)
            counts["tried"] += 1
            try:
                syntax.render(dict([pair]))
            except NictuneError:
                counts["refused"] += 1
                continue
            except Exception as e:  # noqa: BLE001 - what the fuzzer counts
                counts["tracebacks"] += 1
                tracebacks.append((name, pair, repr(e)))
                continue
            counts["accepted"] += 1
            batch[pair[0]] = pair[1]
        assert len(batch) >= 20, (name, len(batch))  # the fuzzer tests something
        text = syntax.render(batch)
        path = tmp_path / f"{name}.conf"
        path.write_text(text)
        for shell in _shells():
            assert subprocess.run([shell, "-n", str(path)]).returncode == 0
            exported = _sourced(shell, str(path), str(tmp_path))
            if os.path.exists(canary):
                counts["executed"] += 1
                os.unlink(canary)
            parsed = syntax.parse(text)
            for n, v in batch.items():
                if not (exported.get(n) == parsed.get(n) == value_text(v)):
                    counts["not literal"] += 1
    print(f"owned-file values: {counts}")
    assert counts["tried"] == 4 * 700
    assert counts["tracebacks"] == 0, tracebacks[:5]
    assert counts["executed"] == 0 and counts["not literal"] == 0
    assert counts["refused"] >= 1000 and counts["accepted"] >= 400


SEGMENTS = ["etc", "profile.d", "cron.d", "cron.daily", "crontab", "ld.so.preload", "ld.so.conf.d",
            "sudoers.d", "sudoers", "systemd", "system", "opt", "site", "nccl.conf", "ucx", "ucx.conf",
            "openmpi", "..", ".", "", "x", "root", "home", "usr", "local", "lib", "bin", "tmp", "proc",
            "sys", "dev", "run", "netns", "l1", "l2", "l3", "l4", "l5", "\u00e9", "a b", "a\nb", "a\x00b",
            "rc.local", "init.d", "environment", "security", "pam.d", "nvshmem.sh", "bashrc", "ssh"]
DIRS = ["/opt/site", "/etc/site", "/opt/site/l1", "/opt/site/l5", "/etc", "/etc/cron.d",
        "/usr/local/etc", "/opt", "/opt/site/../..", "/etc/profile.d", "/opt//site", "/opt/site/"]


def _path(rng: random.Random) -> str:
    path = "/".join(rng.choice(SEGMENTS) for _ in range(rng.randint(1, 5)))
    lead = rng.choice(["/", "/", "/", "//", "", "/opt/site/", "/etc/site/"])
    return lead + path + rng.choice(["", "", "", "/"])


def _host_root(tmp_path) -> str:
    """A host whose allowed directories hold symlinks into where readers
    are: relative ones inside the root, absolute ones to a directory
    outside it (never this machine's /etc)."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    for d in ("etc/profile.d", "etc/cron.d", "etc/ucx", "etc/openmpi", "etc/site", "opt/site", "proc",
              "usr/local/etc"):
        (root / d).mkdir(parents=True)
    outside.mkdir()
    (root / "opt/site/l1").symlink_to("../../etc/cron.d")
    (root / "opt/site/l2").symlink_to("../../etc/profile.d")
    (root / "opt/site/l3").symlink_to("../../proc")
    (root / "etc/site/l4").symlink_to("../cron.d")
    (root / "opt/site/l5").symlink_to(outside)
    return str(root)


def _dangerous(root: str, file: str, own: str, allowed: list) -> str:
    """Why a file written at `file` (under root) is where it must not be, or ""."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(file)
    rel = "/" + os.path.relpath(real, real_root)
    if rel.startswith("/.."):
        return f"outside the root: {real}"
    if any(within(rel, d) for d in KERNEL_DIRS):
        return f"in the kernel's directories: {rel}"
    if rel == own:
        return ""
    if reader_of(rel):
        return f"where readers are: {rel}"
    dirs = ["/" + os.path.relpath(os.path.realpath(os.path.join(root, d.lstrip("/"))), real_root) for d in allowed]
    if not any(within(os.path.dirname(rel), d) for d in dirs):
        return f"outside the allowed directories: {rel}"
    return ""


def test_paths_are_never_accepted_where_readers_are(tmp_path):
    rng = random.Random(SEED)
    root = _host_root(tmp_path)
    counts = {"tried": 0, "refused by the rules": 0, "refused on the host": 0, "written": 0,
              "tracebacks": 0, "dangerous": 0}
    problems = []
    for _ in range(1500):
        family = rng.choice(FAMILIES)
        path = _path(rng) if rng.random() < 0.9 else family.default_path
        dirs = rng.sample(DIRS, rng.randint(0, 3))
        counts["tried"] += 1
        section = {"path": path, "allowed_dirs": dirs, KEY[family.name]: {}}
        try:
            written = _write(root, family, section)
        except NictuneError:
            counts["refused by the rules"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - what the fuzzer counts
            counts["tracebacks"] += 1
            problems.append((path, dirs, repr(e)))
            continue
        if written is None:
            counts["refused on the host"] += 1
            continue
        counts["written"] += 1
        lexical = [check_owned_dir(d, "dir") for d in dirs]
        assert check_owned_path(path, family.default_path, lexical, "path") == path
        why = _dangerous(root, written, family.default_path, lexical)
        if why:
            counts["dangerous"] += 1
            problems.append((family.name, path, dirs, why))
    print(f"owned-file paths: {counts}")
    assert counts["tried"] == 1500
    assert counts["tracebacks"] == 0 and counts["dangerous"] == 0, problems[:5]
    # It reached every stage: refusals by the rules and on the host, and writes.
    assert counts["refused by the rules"] >= 1000
    assert counts["refused on the host"] >= 5 and counts["written"] >= 20


def _write(root: str, family, section: dict):
    """Plan and apply one section as the agent does; the file written, or
    None when the host refused it (Unsupported, or a check's problem)."""
    fam = family(Host(root))
    [desired] = fam.expand(HOST, {family.name: section}, lambda *parts: "")
    current = fam.read([desired.key])[desired.key]
    if isinstance(current, Unsupported) or fam.check(desired.key, desired.want):
        return None
    fam.apply([(desired.key, desired.want.value)])
    return fam._place(desired.key).file
