"""Fuzz: hostile host names through inventory load, hooks and the launcher.

1,000 generated names (one fixed seed): leading dashes and option shapes
(-oProxyCommand=...), commas, blanks, control and format characters,
non-ASCII text, very long names, "=", "@", ":" and bracket forms, each
mixed with ordinary words.  Each name goes into a JSON inventory, an INI
host line and a comma-separated host list; what loads goes through the
hooks' placeholders ({host}, {hosts}) and the nccl-tests launcher's
({hosts}, {addresses}).  The raw names also go to the hooks directly
(defence in depth, as if an inventory check were bypassed), and a sample
of batches runs real hook processes that record the argv they get.

Asserted: no exception but an InventoryError (one paragraph) at load and
a ValueError/NictuneError at substitution; no argument a placeholder
filled starts with "-"; {hosts} splits on "," into exactly the batch's
hosts; every loaded name is one a command line can take.  Counts are
printed (pytest -s) and checked, so the run cannot test nothing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import traceback

import pytest

from nictune.control.rollout import hooks as hooklib
from nictune.control.rollout.gate import NcclTestsSpec
from nictune.host.errors import NictuneError
from nictune.inventory import InventoryError, load_inventory
from nictune.inventory.hostnames import host_name_problem

SEED = int(os.environ.get("NICTUNE_FUZZ_SEED", "20261204"))
NAMES = 1000
CASE_BOUND = 5   # seconds one name may take before it counts as a hang
RUN_EVERY = 100  # one name in RUN_EVERY runs real hook processes (a python each)

HOSTILE = ["-", "--", "-o", "-oProxyCommand=touch${IFS}/tmp/nt-fuzz", "--help", ",", ", ", " ", "\t", "\n",
           "\r", "\x00", "\x01", "\x1b[31m", "\x7f", "\x85", "\u00a0", "\u2028", "\u200b", "\u202e", "\ufeff",
           "=", "@", ":", "::", "[1:3]", "[a:c]", "[", "]", "#", ";", "'", '"', "\\", "{host}", "{", "}", "$(id)",
           "`id`", "*", "?", "~", "!", "&", "%", "/", "..", "ü", "中文", "gpü", "🙂", "\udcff"]
WORDS = ["gpu01", "node", "web-1", "198.18.0.1", "2001:db8::1", "root@h", "a=b", "x.example.net", "n_1"]


def hostile_name(rng: random.Random) -> str:
    if rng.random() < 0.03:
        return rng.choice(["a", "-", ","]) * rng.choice((256, 5000, 70000))  # very long
    parts = [rng.choice(HOSTILE if rng.random() < 0.6 else WORDS) for _ in range(rng.randint(1, 4))]
    return "".join(parts)


def _alarm(signum, frame):
    raise TimeoutError("hang")


class Tally:
    def __init__(self):
        self.counts = {"names": 0, "loaded": 0, "refused at load": 0, "hook argvs": 0, "refused by hooks": 0,
                       "launcher argvs": 0, "refused by the launcher": 0, "hook processes": 0,
                       "options from a placeholder": 0, "split hosts": 0, "bad loaded names": 0}

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] += n


def sources(tmp_path, i: int, name: str):
    """(what, inventory path or text) for each way the name can be written."""
    as_json = tmp_path / f"inv-{i}.json"
    as_json.write_text(json.dumps({"g": {"hosts": {name: None, "ok1": None}}}), errors="surrogatepass")
    as_ini = tmp_path / f"inv-{i}.ini"
    as_ini.write_text(f"ok1\n[g]\n{name} a=1\n", errors="surrogatepass")
    yield "json", str(as_json)
    yield "ini", str(as_ini)
    if name.strip() and not os.path.exists(name):
        yield "host list", f"ok1,{name},"


def check_substitution(names, tally: Tally) -> None:
    """Every argv the hooks and the launcher would build for this batch."""
    per_host = hooklib.Hook("before_batch", ("ssh", "{host}", "true"), "fuzz:1", True)
    once = hooklib.Hook("before_batch", ("scontrol", "update", "nodename={hosts}"), "fuzz:2", False)
    for hook in (per_host, once):
        try:
            argvs = hooklib.commands(hook, 1, names)
        except ValueError as e:
            assert "\n" not in str(e)
            tally.add("refused by hooks")
            continue
        for argv, _host in argvs:
            tally.add("hook argvs")
            if argv[1].startswith("-"):
                tally.add("options from a placeholder")
            if hook is once and argv[2][len("nodename="):].split(",") != list(names):
                tally.add("split hosts")
    spec = NcclTestsSpec(launcher=["mpirun", "-H", "{hosts}", "{addresses}"],
                         binary="/opt/nccl-tests/build/all_reduce_perf", gpus=1)
    try:
        argv = spec.argv(names, names)
    except NictuneError as e:
        assert "\n" not in str(e)
        tally.add("refused by the launcher")
        return
    tally.add("launcher argvs")
    if argv[3].startswith("-"):
        tally.add("options from a placeholder")
    if argv[2].split(",") != list(names):
        tally.add("split hosts")


RECORDER = "import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')"


def run_real_hook(tmp_path, names, tally: Tally) -> None:
    log = tmp_path / "argv.log"
    hooks = hooklib.Hooks(before_batch=(
        hooklib.Hook("before_batch", (sys.executable, "-c", RECORDER, str(log), "{host}"), "fuzz:3", True),),
        timeout=30)
    results, failed = hooklib.run_hooks(hooks, "before_batch", 1, names)
    if failed is not None and failed["exit_code"] is None:
        assert failed["error"]["message"].startswith("was not run: ") and not log.exists()
        tally.add("refused by hooks")
        return
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    assert [s[0] for s in seen] == list(names), (seen, names)
    tally.add("hook processes", len(results))


def test_hostile_host_names_never_reach_argv_as_options_or_several_hosts(tmp_path):
    rng = random.Random(SEED)
    tally = Tally()
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(NAMES):
            name = hostile_name(rng)
            tally.add("names")
            for what, source in sources(tmp_path, i, name):
                signal.alarm(CASE_BOUND)
                try:
                    inv = load_inventory(source)
                    loaded = list(inv.hosts)
                    tally.add("loaded")
                    tally.add("bad loaded names", sum(1 for n in loaded if host_name_problem(n)))
                    check_substitution(loaded, tally)
                    if i % RUN_EVERY == 0 and what == "json":
                        run_real_hook(tmp_path, loaded, tally)
                except InventoryError as e:
                    assert str(e) and "\n" not in str(e), (what, name)
                    tally.add("refused at load")
                except TimeoutError:
                    pytest.fail(f"name {i} ({what}) took over {CASE_BOUND} s: {name[:200]!r}")
                except Exception as e:  # noqa: BLE001 - the finding
                    pytest.fail(f"name {i} ({what}) {name[:200]!r} raised {type(e).__name__}: {e}\n"
                                f"{traceback.format_exc()}")
                finally:
                    signal.alarm(0)
            # The hooks' own check, as if the inventory's had been bypassed.
            check_substitution(["ok1", name], tally)
            if i % RUN_EVERY == 1:
                run_real_hook(tmp_path, ["ok1", name], tally)
    finally:
        signal.signal(signal.SIGALRM, old)
    counts = tally.counts
    print(f"\nfuzz: {NAMES} hostile host names (seed {SEED}): {counts}")
    assert counts["names"] == NAMES
    assert counts["options from a placeholder"] == 0 and counts["split hosts"] == 0, counts
    assert counts["bad loaded names"] == 0, counts
    # Both sides exercised: names that load and go into argv, and refusals at every layer.
    assert counts["loaded"] >= 1200 and counts["refused at load"] >= 800, counts
    assert counts["hook argvs"] >= 5000 and counts["refused by hooks"] >= 600, counts
    assert counts["launcher argvs"] >= 1500 and counts["refused by the launcher"] >= 300, counts
    assert counts["hook processes"] >= 15, counts
