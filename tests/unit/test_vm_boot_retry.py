"""tests/vm/run.py boots a guest again, once, when its kernel panicked
before the guest's command started (a fault of the emulator, no test's);
a panic after the command started, or a boot that just stopped, is
reported as it is."""

from __future__ import annotations

import importlib.util
from pathlib import Path

RUN = Path(__file__).resolve().parent.parent / "vm" / "run.py"


def runner():
    spec = importlib.util.spec_from_file_location("nictune_vm_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PANIC = ("[    1.89] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n"
         "[    1.89]  kernel_init_freeable+0x31b/0x460\n"
         "[    1.89] Kernel panic - not syncing: Fatal exception in interrupt\n")


def test_a_panic_before_the_command_is_booted_again_and_others_are_not(tmp_path):
    run = runner()
    cases = {
        "early": (PANIC, True),
        "after": (run.STARTED + "pytest\n" + PANIC, False),
        "silent": ("[    0.00] Linux version 6.12\n", False),
    }
    assert not run.panicked_before_its_command(str(tmp_path / "no-such-log"))
    assert len(cases) == 3
    for name, (text, expected) in cases.items():
        log = tmp_path / name
        log.write_text(text)
        assert run.panicked_before_its_command(str(log)) is expected, name
