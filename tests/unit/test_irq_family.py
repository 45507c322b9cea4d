"""The irq family (knobs/irq.py) on a fake /proc and sysfs built from a real
mlx5 host's /proc/interrupts (tests/irq_tree.py, tests/fixtures/irq/SOURCE.md):
vectors resolved by name, the deterministic queue -> CPU assignment with its
profile line, apply/verify/rollback, managed IRQs, irqbalance, and the
resident agent writing placement again when a link comes back up."""

from __future__ import annotations

import errno
import os

import pytest

from fakes import FakeHost
from irq_tree import affinity, irq_state
from nictune.host.knobs import irq as irqmod
from nictune.host.transaction.engine import Engine
from nictune.profile.loader import load_profile_text

P0 = "enp23s0f0np0"
COMP = {q: irq for q, irq in enumerate((99, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119))}


def _profile(body: str, name: str = "irq.yaml"):
    return load_profile_text("nictune: 1\ninterfaces:\n  rail:\n"
                             f"    match: {{name: {P0}}}\n" + body, name)


def _host(tmp_path, **files):
    return FakeHost(irq_state(**files), tmp_path / "root")


def _rows(out, prefix="irq."):
    """The irq family's rows whose key starts with `prefix`, by the rest of the key."""
    return {c.key.name[len(prefix):] if prefix == "irq." else c.key.name: c for c in out.changes
            if c.key.family == "irq" and c.key.name.startswith(prefix)}


def test_the_recorded_interrupts_give_the_port_its_twelve_completion_vectors(tmp_path):
    host = _host(tmp_path)
    vectors = irqmod.IrqFamily(host).vectors(P0)
    assert len(vectors) == 12
    assert vectors["mlx5_comp0"] == (99, 0) and vectors["mlx5_comp11"] == (119, 11)
    assert not any("async" in name for name in vectors)  # the async EQ stays where it is
    other = irqmod.IrqFamily(host).vectors("enp23s0f1np1")
    assert other == {"mlx5_comp0": (102, 0)}  # by msi_irqs, not by the name's bus address


def test_cpulists_and_masks_read_and_write_as_the_kernel_prints_them():
    assert irqmod.parse_cpulist("8,0-3,2") == [0, 1, 2, 3, 8]
    assert irqmod.format_cpulist([8, 0, 1, 2, 3]) == "0-3,8"
    assert irqmod.parse_mask("00000000,0000000f") == [0, 1, 2, 3]
    assert irqmod.format_mask([0, 33]) == "00000002,00000001"
    with pytest.raises(irqmod.InvalidInput, match="irq.cpus.*low to high"):
        irqmod.parse_cpulist("9-3", "irq.cpus")


def test_a_plan_assigns_queue_i_to_cpu_i_of_the_set_and_cites_the_profile_line(tmp_path):
    host = _host(tmp_path)
    profile = _profile("    irq:\n      cpus: 6-11\n      xps: true\n")
    out = Engine(host, str(tmp_path / "s")).plan(profile.doc, profile.sources)
    assert out.error is None, out.error
    rows = _rows(out)
    assert len(rows) == 12
    for q in range(12):
        row = rows[f"mlx5_comp{q}"]
        assert row.after == str(6 + q % 6)
        assert row.before == str(q)
        assert row.status == ("ok" if q == 6 + q % 6 else "pending")
        assert row.source == "irq.yaml:6"
        assert f"queue {q} -> CPU {6 + q % 6} (cpus 6-11); IRQ {COMP[q]}" in row.note
    xps = _rows(out, "xps.")
    assert len(xps) == 12 and xps["xps.tx-7"].after == "7" and xps["xps.tx-7"].before == ""


def test_numa_spread_skips_housekeeping_cpus(tmp_path):
    host = _host(tmp_path, **{f"sys/class/net/{P0}/device/numa_node": "1\n",
                              f"sys/class/net/{P0}/device/local_cpulist": "4-11\n"})
    profile = _profile("    irq: {cpus: numa, count: 3, housekeeping: '4-5'}\n")
    out = Engine(host, str(tmp_path / "s")).plan(profile.doc, profile.sources)
    rows = _rows(out)
    assert [rows[f"mlx5_comp{q}"].after for q in range(6)] == ["6", "7", "8", "6", "7", "8"]
    assert "NUMA node 1 of enp23s0f0np0: 4-11, less housekeeping 4-5, first 3" in rows["mlx5_comp0"].note


def test_apply_writes_every_vector_verify_reads_them_back_and_rollback_restores(tmp_path):
    host = _host(tmp_path)
    state = str(tmp_path / "s")
    profile = _profile("    irq: {cpus: '2-3', xps: true, rps: true}\n")
    out = Engine(host, state).apply(profile.doc, profile.sources, profile.path)
    assert out.error is None, out.error
    assert [affinity(host.root, COMP[q]) for q in range(4)] == ["2", "3", "2", "3"]
    assert affinity(host.root, 98) == "0-11"  # mlx5_async0: not a queue's
    with open(os.path.join(host.root, f"sys/class/net/{P0}/queues/tx-1/xps_cpus")) as f:
        assert f.read() == "00000008"
    with open(os.path.join(host.root, f"sys/class/net/{P0}/queues/rx-0/rps_cpus")) as f:
        assert f.read() == "0000000c"
    verified = Engine(host, state).plan(profile.doc, profile.sources, command="verify")
    assert {c.status for c in verified.changes if c.key.family == "irq"} == {"ok"}
    back = Engine(host, state).rollback()
    assert back.error is None, back.error
    assert [affinity(host.root, COMP[q]) for q in range(12)] == [str(q) for q in range(12)]


def test_a_cpu_list_naming_an_offline_cpu_is_refused_in_the_plan(tmp_path):
    host = _host(tmp_path)
    profile = _profile("    irq: {cpus: '10-13'}\n")
    out = Engine(host, str(tmp_path / "s")).plan(profile.doc, profile.sources)
    rows = _rows(out)
    assert rows["mlx5_comp2"].status == "unsupported" and "CPU 12 is not online" in rows["mlx5_comp2"].note


def test_a_kernel_managed_irq_is_reported_as_such_not_as_a_failure(tmp_path):
    host = _host(tmp_path, **{"sys/kernel/debug/irq/irqs/109":
                              "handler:  handle_edge_irq\ndstate:   0x3740a200\n"
                              "            IRQD_AFFINITY_SET\n            IRQD_AFFINITY_MANAGED\n"})
    profile = _profile("    irq: {cpus: '2-3'}\n")
    out = Engine(host, str(tmp_path / "s")).plan(profile.doc, profile.sources)
    rows = _rows(out)
    assert rows["mlx5_comp1"].status == "unsupported"
    assert "kernel-managed affinity (IRQD_AFFINITY_MANAGED)" in rows["mlx5_comp1"].note
    assert rows["mlx5_comp0"].status == "pending"


def test_irqbalance_is_found_and_the_plan_says_which_irqs_it_will_move(tmp_path):
    host = _host(tmp_path, **{
        "proc/4242/comm": "irqbalance\n",
        "proc/4242/cmdline": "/usr/sbin/irqbalance\0--foreground\0--banirq=99\0",
        "proc/4242/environ": "IRQBALANCE_BANNED_CPULIST=3\0PATH=/usr/bin\0",
        "proc/17/comm": "sshd\n"})
    profile = _profile("    irq: {cpus: '2-3'}\n")
    out = Engine(host, str(tmp_path / "s")).plan(profile.doc, profile.sources)
    rows = _rows(out)
    assert "irqbalance (pid 4242) leaves IRQ 99 alone (--banirq)" in rows["mlx5_comp0"].note
    assert ("irqbalance (pid 4242) will move IRQ 110 again: ban it: "
            'IRQBALANCE_ARGS="--banirq=110"') in rows["mlx5_comp2"].note
    assert "CPU 3 is in its banned CPU list" in rows["mlx5_comp1"].note


def test_no_irqbalance_no_word_about_it(tmp_path):
    host = _host(tmp_path)
    profile = _profile("    irq: {cpus: '2-3'}\n")
    out = Engine(host, str(tmp_path / "s")).plan(profile.doc, profile.sources)
    assert not any("irqbalance" in c.note for c in _rows(out).values())


def test_a_bad_cpulist_is_refused_naming_the_key(tmp_path):
    host = _host(tmp_path)
    profile = _profile("    irq:\n      cpus: '9-3'\n")
    with pytest.raises(irqmod.InvalidInput, match=r"^irq.yaml:6: invalid irq.cpus: '9-3'"):
        Engine(host, str(tmp_path / "s")).plan(profile.doc, profile.sources)


class _Events:
    """A link monitor's answer: its events, and the links it heard go down."""

    def __init__(self, events, downs=()):
        self.events = events
        self.downs = set(downs)

    def read(self):
        return self.events


def test_the_resident_agent_writes_placement_again_when_a_link_comes_back_up(tmp_path, monkeypatch):
    from nictune.host.resident import daemon

    host = _host(tmp_path)
    state = str(tmp_path / "s")
    profile = _profile("    irq: {cpus: '2-3'}\n")
    assert Engine(host, state).apply(profile.doc, profile.sources, profile.path).error is None
    monkeypatch.setattr(daemon, "boot_time", lambda: 0.0)
    agent = daemon.Resident(state, log=lambda line: None, listen=False)
    agent.host = host
    agent.learn_links()
    agent.cycle([], due=False)  # takes the desired state up (on_drift: report)
    index = host.kernel.links[P0].index
    host.kernel.links[P0].up = False
    agent.cycle([_Events([("new", index, P0)])], due=False)
    # The driver's open puts its own placement back.
    with open(os.path.join(host.root, "proc/irq/109/smp_affinity_list"), "w") as f:
        f.write("1\n")
    host.kernel.links[P0].up = True
    agent.cycle([_Events([("new", index, P0)])], due=False)
    assert affinity(host.root, 109) == "3"
    assert agent.status["last_reapply"]["reason"] == f"link up: {P0}"
    # An affinity changed by hand while the link stays up is only reported.
    with open(os.path.join(host.root, "proc/irq/110/smp_affinity_list"), "w") as f:
        f.write("5\n")
    agent.cycle([_Events([("new", index, P0)])], due=True)
    assert affinity(host.root, 110) == "5"
    assert agent.status["keys"][f"irq:{P0}:irq.mlx5_comp2"]["drifted"]


def test_a_down_and_an_up_heard_in_one_turn_are_a_link_come_up(tmp_path, monkeypatch):
    from nictune.host.resident import daemon

    host = _host(tmp_path)
    state = str(tmp_path / "s")
    profile = _profile("    irq: {cpus: '2-3'}\n")
    assert Engine(host, state).apply(profile.doc, profile.sources, profile.path).error is None
    monkeypatch.setattr(daemon, "boot_time", lambda: 0.0)
    agent = daemon.Resident(state, log=lambda line: None, listen=False)
    agent.host = host
    agent.learn_links()
    agent.cycle([], due=False)
    with open(os.path.join(host.root, "proc/irq/111/smp_affinity_list"), "w") as f:
        f.write("0-11\n")
    index = host.kernel.links[P0].index
    monitor = _Events([("new", index, P0), ("new", index, P0)], downs=[P0])
    agent.cycle([monitor], due=False)
    assert affinity(host.root, 111) == "3" and monitor.downs == set()


def test_link_events_say_which_links_went_down():
    import struct

    from nictune.host.resident import daemon

    def newlink(index: int, flags: int, name: bytes) -> bytes:
        attr = struct.pack("=HH", 4 + len(name) + 1, 3) + name + b"\0"
        attr += b"\0" * (-len(attr) % 4)
        body = struct.pack("=BxHiII", 0, 1, index, flags, 0) + attr
        return struct.pack("=IHHII", 16 + len(body), daemon.RTM_NEWLINK, 0, 0, 0) + body

    downs: set = set()
    events = daemon.parse_link_events(newlink(7, 0, b"rail0") + newlink(8, 1, b"rail1"), downs)
    assert [e[2] for e in events] == ["rail0", "rail1"] and downs == {"rail0"}


def test_an_eio_on_the_write_is_reported_as_a_kernel_managed_irq_and_nothing_stays_half_written(
        tmp_path, monkeypatch):
    host = _host(tmp_path)
    write = host.io.write_text

    def managed(path, text):  # the kernel's answer for IRQ 109 (irq_can_set_affinity_usr)
        if path.endswith("/proc/irq/109/smp_affinity_list"):
            raise OSError(errno.EIO, "Input/output error")
        write(path, text)

    monkeypatch.setattr(host.io, "write_text", managed)
    profile = _profile("    irq: {cpus: '2-3'}\n")
    out = Engine(host, str(tmp_path / "s")).apply(profile.doc, profile.sources, profile.path)
    assert out.error is not None
    assert "IRQ 109 (mlx5_comp1) has kernel-managed affinity" in out.error["message"]
    assert [affinity(host.root, COMP[q]) for q in range(12)] == [str(q) for q in range(12)]


def test_irqbalance_options_are_read_from_its_command_line_and_environment():
    found = irqmod.irqbalance_options(
        ["/usr/sbin/irqbalance", "--foreground", "-i", "45", "--banirq=46", "--hintpolicy=exact",
         "-l", "/usr/local/bin/irq-policy", ""], {"IRQBALANCE_BANNED_CPUS": "00000003"})
    assert found == {"banned_irqs": {45, 46}, "policy_script": "/usr/local/bin/irq-policy",
                     "banned_cpus": [0, 1], "hint_policy": "exact"}
