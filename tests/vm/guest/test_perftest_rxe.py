"""perftest over soft-RoCE (rdma_rxe in the test VM): ib_write_bw and
ib_send_lat run with the argv nictune.control.rollout.perftest builds, the traffic
class it derives from a profile and the GID index it derives from the host,
and their reports are read by its parsers.

Server and client share the one rxe device of the module (rxe loops traffic
between QPs of one device back inside the driver; lo is brought up for
their TCP exchange), each bounded by perftest.time_limit().  What the tools
used is read back independently of them: perftest prints its local GID in
the connection lines, compared here with sysfs; and the traffic class and
source GID index of every packet rxe builds are read from the kernel by an
fprobe on rxe_prepare() (drivers/infiniband/sw/rxe/rxe_net.c: prepare4()
writes av->grh.traffic_class into the IPv4 header's ToS), since loopback
traffic never reaches the veth where a capture could see it.  Each run's
output is printed (pytest -rA shows it): that is how tests/fixtures/perftest/
was recorded.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time

import pytest

from nictune.control.rollout import perftest
from nictune.host.machine import Host
from nictune.profile.loader import load_profile
from rxe import ipv4_mapped_gid, sh, sysfs_gid_table

TCLASS = 106  # DSCP 26 with ECT(0), the usual RoCE class
LISTEN_WAIT = 120.0
GUEST_SLOWDOWN = 4  # TCG: set-up takes far longer than on a real host


def perftest_gid(output: str) -> str:
    """The local GID perftest printed (PERF_GID_FMT, "GID: 00:00:...:198:18:00:01"),
    as sysfs writes it (8 groups of 4 hex digits)."""
    lines = [line for line in output.splitlines() if line.strip().startswith("GID:")]
    assert lines, output
    octets = lines[0].split("GID:", 1)[1].split(":")
    values = [int(o) for o in octets]  # perftest prints each byte in decimal
    assert len(values) == 16, lines[0]
    return ":".join(f"{values[i]:02x}{values[i + 1]:02x}" for i in range(0, 16, 2))


def listening(port: int) -> bool:
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return any(row[1].endswith(f":{port:04X}") and row[3] == "0A" for row in rows)


TRACING = "/sys/kernel/tracing"
PROBE = "nictune/rxe_prepare"


def _tracefs(name: str, text: str, flags: int = os.O_APPEND) -> None:
    """One write to a tracefs file.  Not open(..., "a"): Python seeks to the
    end first, which tracefs's seq files refuse with EINVAL."""
    try:
        fd = os.open(os.path.join(TRACING, name), os.O_WRONLY | flags)
        try:
            os.write(fd, (text + "\n").encode())
        finally:
            os.close(fd)
    except OSError as e:
        with open(os.path.join(TRACING, "error_log")) as log:
            raise AssertionError(f"{name} <- {text!r}: {e}: {log.read()[-1000:]}") from None


@contextlib.contextmanager
def packets_built():
    """The set of (traffic class, source GID index) of the packets rxe
    builds inside the block, as the kernel sees them: an fprobe event on
    rxe_prepare(av, pkt, skb) fetching av->grh through the module's BTF."""
    mounted = os.path.ismount(TRACING)
    if not mounted:
        sh("mount", "-t", "tracefs", "nodev", TRACING)
    seen: set = set()
    try:
        _tracefs("dynamic_events", f"f:{PROBE} rxe_prepare "
                 "tc=av->grh.traffic_class sgid=av->grh.sgid_index")
        try:
            _tracefs("trace", "", os.O_TRUNC)  # empties the buffer
            _tracefs(f"events/{PROBE}/enable", "1", os.O_TRUNC)
            yield seen
            _tracefs(f"events/{PROBE}/enable", "0", os.O_TRUNC)
            with open(os.path.join(TRACING, "trace")) as f:
                trace = f.read()
            # "... rxe_prepare: (rxe_prepare+0x4/0x1b0 [rdma_rxe]) tc=106 sgid=1"
            found = re.findall(r" rxe_prepare: \([^)]*\) tc=(\d+) sgid=(\d+)$", trace, re.M)
            assert found, f"no rxe_prepare event in the trace: {trace[-1500:]}"
            seen.update((int(tc), int(sgid)) for tc, sgid in found)
        finally:
            _tracefs(f"events/{PROBE}/enable", "0", os.O_TRUNC)
            _tracefs("dynamic_events", f"-:{PROBE}")
    finally:
        if not mounted:
            sh("umount", TRACING, check=False)


def run_pair(test: perftest.Perftest, end: perftest.Endpoint, address: str) -> tuple:
    """(server output, client output) of one run, each side killed once it
    outlives perftest.time_limit() (times GUEST_SLOWDOWN: emulated)."""
    if shutil.which(test.tool) is None:
        pytest.fail(f"{test.tool} is not installed: scripts/test-vm installs Debian's perftest")
    limit = perftest.time_limit(test) * GUEST_SLOWDOWN
    argvs = {"server": perftest.server_argv(test, end),
             "client": perftest.client_argv(test, end, address)}
    procs, outputs = {}, {}
    try:
        for side, argv in argvs.items():
            print(f"{side}: {argv}")
            procs[side] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)
            deadline = time.monotonic() + LISTEN_WAIT
            while side == "server" and not listening(test.tcp_port):
                assert procs[side].poll() is None, procs[side].communicate()
                assert time.monotonic() < deadline, f"{test.tool} server never listened"
                time.sleep(0.2)
        deadline = time.monotonic() + limit
        for side, proc in procs.items():
            try:
                outputs[side] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                outputs[side] = proc.communicate()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for side, (out, err) in outputs.items():
        print(f"--- {test.tool} {side} stdout (exit {procs[side].returncode}) ---\n{out}--- end ---")
        print(f"--- {test.tool} {side} stderr ---\n{err}--- end ---")
    codes = {side: proc.returncode for side, proc in procs.items()}
    assert codes == {"server": 0, "client": 0}, (codes, outputs)
    return outputs["server"][0], outputs["client"][0]


@pytest.fixture(scope="module")
def loopback():
    """lo up for the block: the tools' out-of-band TCP exchange goes to the
    rail's own address, which the guest (whose init leaves lo down) would
    never answer: the client's connect() hangs.  Put back as found."""
    with open("/sys/class/net/lo/operstate") as f:
        was_down = f.read().strip() == "down"
    if was_down:
        sh("ip", "link", "set", "lo", "up")
    try:
        yield
    finally:
        if was_down:
            sh("ip", "link", "set", "lo", "down", check=False)


@pytest.fixture(scope="module")
def rail(softroce, loopback, tmp_path_factory):
    """(Endpoint, address, traffic class) as nictune derives them: the
    endpoint from the host, the traffic class from a profile."""
    profile = tmp_path_factory.mktemp("perftest") / "rail.yaml"
    profile.write_text(
        "nictune: 1\n"
        "interfaces:\n"
        "  rail:\n"
        f"    match: {{name: {softroce.ifname}}}\n"
        f"    roce: {{mode: v2, tos: {TCLASS}}}\n"
        "host:\n"
        "  nccl:\n"
        f"    env: {{NCCL_IB_TC: {TCLASS}}}\n")
    tclass, where = perftest.traffic_class(load_profile(str(profile)).doc, "rail")
    assert (tclass, where) == (TCLASS, "host.nccl.env.NCCL_IB_TC")
    end, address = perftest.roce_endpoint(Host("/"), softroce.ifname)
    # The lowest RoCE v2 GID of the address, read from sysfs here.
    want = ipv4_mapped_gid(softroce.address)
    index = min(i for i, gid, kind, ndev in sysfs_gid_table(softroce.ibdev)
                if gid == want and kind == "RoCE v2" and ndev == softroce.ifname)
    assert (end, address) == (perftest.Endpoint(softroce.ibdev, 1, index), softroce.address)
    return end, address, tclass


def test_ib_write_bw_with_the_profiles_traffic_class_and_gid(softroce, rail):
    end, address, tclass = rail
    test = perftest.Perftest("ib_write_bw", size=65536, duration=2, tclass=tclass, tcp_port=18515)
    argv = perftest.client_argv(test, end, address)
    assert argv[argv.index("-x") + 1] == str(end.gid_index) and f"--tclass={tclass}" in argv
    with packets_built() as built:
        served, output = run_pair(test, end, address)
    # Every packet of both QPs (the writes and their ACKs) with the
    # profile's traffic class, from the GID nictune chose.
    assert built == {(tclass, end.gid_index)}, built

    result = perftest.parse_bw(output)
    assert result.average_gbps > 0 and result.peak_gbps >= 0 and result.msg_rate_mpps > 0, result
    assert result.size == 65536 and result.iterations > 0, result
    # The GID the tools used: their header's index, and the GID itself
    # against sysfs at the index nictune chose.
    # In duration mode (-D) the server reports as well.
    assert result.gid_index == perftest.parse_bw(served).gid_index == end.gid_index
    table = {i: gid for i, gid, _, _ in sysfs_gid_table(softroce.ibdev)}
    assert perftest_gid(output) == perftest_gid(served) == table[end.gid_index]


def test_ib_send_lat_with_the_profiles_traffic_class_and_gid(softroce, rail):
    end, address, tclass = rail
    test = perftest.Perftest("ib_send_lat", size=64, iterations=200, tclass=tclass, tcp_port=18516)
    with packets_built() as built:
        served, output = run_pair(test, end, address)
    assert built == {(tclass, end.gid_index)}, built
    result = perftest.parse_lat(output)
    assert result.iterations == 200 and result.size == 64, result
    assert 0 < result.t_min <= result.t_typical <= result.t_max, result
    assert 0 < result.t_avg and result.p99 <= result.p999 <= result.t_max, result
    assert result.gid_index == perftest.parse_lat(served).gid_index == end.gid_index
    table = {i: gid for i, gid, _, _ in sysfs_gid_table(softroce.ibdev)}
    assert perftest_gid(output) == perftest_gid(served) == table[end.gid_index]
