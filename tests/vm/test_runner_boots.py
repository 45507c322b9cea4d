"""The runner's later boots (tests/vm/run.py boots()), without QEMU: a
guest that asks for another boot gets it, with NICTUNE_VM_BOOT=2 and only
the tests it named, even after another test failed; a boot that never
reported a status, or a guest that asks forever, stops it.
The real two-boot run is tests/vm/guest/test_resident_boot.py."""

from __future__ import annotations

import importlib.util
import os
import types

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("nictune_vm_run_boots", os.path.join(HERE, "run.py"))
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)

NODE = "tests/vm/guest/test_x.py::test_later"


def _runner(tmp_path, monkeypatch, guest):
    """boots() with boot() replaced by guest(number, script text, qemu argv)
    -> status; returns boots()'s answer and the calls."""
    calls = []

    def boot(argv, log_path, timeout):
        script = argv[argv.index("-append") + 1].split("nictune.cmd=")[1].split()[0]
        with open(script) as f:
            text = f.read()
        calls.append((text, argv, log_path))
        return guest(len(calls), text, argv), False

    monkeypatch.setattr(run, "boot", boot)
    keep = tmp_path / "keep"
    keep.mkdir()
    opts = types.SimpleNamespace(pytest_args=["-k", "mine"], memory="1G", cpus=2, timeout=5)
    answer = run.boots("k", "initrd", opts, {}, str(tmp_path), str(tmp_path), str(keep))
    return answer, calls, keep


def test_a_guest_that_asks_gets_a_second_boot_running_only_what_it_named(tmp_path, monkeypatch):
    def guest(number, text, argv):
        if number == 1:
            (tmp_path / "keep" / run.NEXT_BOOT).write_text(NODE + "\n")
        return 0

    (status, timed_out, log), calls, keep = _runner(tmp_path, monkeypatch, guest)
    assert (status, timed_out, len(calls)) == (0, False, 2)
    first, second = calls[0][0], calls[1][0]
    assert "export NICTUNE_VM_BOOT=1\n" in first and "tests/vm/guest -k mine" in first
    assert "export NICTUNE_VM_BOOT=2\n" in second and second.rstrip().endswith(f"--color=no {NODE}")
    assert "tests/vm/guest " not in second and "-k mine" not in second
    # Both boots see the same keep disk; the request is consumed.
    for _, argv, _ in calls:
        assert f"local,id=keep,path={keep}," in " ".join(argv)
        assert f"nictune.keep={run.GUEST_KEEP}" in argv[argv.index("-append") + 1]
    assert not (keep / run.NEXT_BOOT).exists()
    assert [os.path.basename(c[2]) for c in calls] == ["serial.log", "serial-2.log"] and log == calls[1][2]


def test_no_request_means_one_boot(tmp_path, monkeypatch):
    (status, _, _), calls, _ = _runner(tmp_path, monkeypatch, lambda n, t, a: 0)
    assert status == 0 and len(calls) == 1


def test_another_tests_failure_does_not_cancel_the_boot_asked_for(tmp_path, monkeypatch):
    def guest(number, text, argv):
        if number == 1:
            (tmp_path / "keep" / run.NEXT_BOOT).write_text(NODE + "\n")
        return 1 if number == 1 else 0

    (status, _, _), calls, _ = _runner(tmp_path, monkeypatch, guest)
    assert status == 1 and len(calls) == 2


def test_a_boot_that_never_reported_is_the_last(tmp_path, monkeypatch):
    def guest(number, text, argv):
        (tmp_path / "keep" / run.NEXT_BOOT).write_text(NODE + "\n")
        return None

    (status, _, _), calls, _ = _runner(tmp_path, monkeypatch, guest)
    assert status is None and len(calls) == 1


def test_a_guest_that_asks_forever_is_stopped(tmp_path, monkeypatch):
    def guest(number, text, argv):
        (tmp_path / "keep" / run.NEXT_BOOT).write_text(NODE + "\n")
        return 0

    (status, _, _), calls, _ = _runner(tmp_path, monkeypatch, guest)
    assert status == run.NOT_REACHED and len(calls) == run.MAX_BOOTS


def test_a_boot_may_ask_for_systemd_as_pid_1_for_the_next_one_only(tmp_path, monkeypatch):
    def guest(number, text, argv):
        if number == 1:
            (tmp_path / "keep" / run.NEXT_INIT).write_text("systemd\n")
        if number < 3:
            (tmp_path / "keep" / run.NEXT_BOOT).write_text(NODE + "\n")
        return 0

    (status, _, _), calls, keep = _runner(tmp_path, monkeypatch, guest)
    appends = [argv[argv.index("-append") + 1] for _, argv, _ in calls]
    assert status == 0 and ["nictune.init=systemd" in a for a in appends] == [False, True, False]
    assert not (keep / run.NEXT_INIT).exists()


def test_an_unknown_init_is_refused(tmp_path, monkeypatch):
    def guest(number, text, argv):
        (tmp_path / "keep" / run.NEXT_INIT).write_text("/bin/sh\n")
        (tmp_path / "keep" / run.NEXT_BOOT).write_text(NODE + "\n")
        return 0

    (status, _, _), calls, _ = _runner(tmp_path, monkeypatch, guest)
    assert status == run.NOT_REACHED and len(calls) == 1
