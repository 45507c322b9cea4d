"""A "switch" namespace joined to a host namespace by a veth, running the
real LLDP daemons (test helper, not collected).

    switch ns  ntsw<N>:  swp1  <--veth-->  rail0  :host ns nthost<N>
      lldpd   system name, port id (ifname) and description, and the 802.3
              maximum frame size (a custom TLV: lldpd sends MFS only where
              the kernel reports one, which a veth does not)
      lldpad  ETS configuration and recommendation, PFC and APP TLVs,
              configured with lldptool

lldpad speaks 802.1Qaz only on a device with dcbnl (it asks DCB_CMD_GDCBX
first, and builds its APP TLV from the device's APP table, read with
DCB_CMD_IEEE_GET), and a veth has none.  So lldpad runs under the dcbnl
stand-in of tests/recorded (tools/nlshim.c): DCBX host + IEEE, sets
acknowledged, and IEEE_GET answering the switch's APP table, which
set_app() writes as the switch's ASIC would hold it.  Everything else is
the daemons' own: their TLVs, their timers, lldptool's configuration.

Each lldpad runs in a mount namespace of its own with a private /dev/shm
(it keeps its pid in /dev/shm/lldpad.state, which would be the machine's).
The abstract socket lldptool and nictune talk to is per network namespace.
close() stops every daemon (TERM, then KILL) and deletes both namespaces,
whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from recorded.tools import dcb_recorder as rec

DAEMONS = ("lldpd", "lldpcli", "lldpad", "lldptool")
DCBX_HOST_IEEE = 0x01 | 0x08  # DCB_CAP_DCBX_HOST | DCB_CAP_DCBX_VER_IEEE


def missing() -> str:
    """Why the lab cannot run here ("" when it can)."""
    for tool in DAEMONS:
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is not installed (scripts/setup installs lldpd and lldpad)"
    return rec.missing_tools() or ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class SwitchLab:
    def __init__(self, workdir: Path, shim: Path, tag: str = ""):
        tag = tag or str(os.getpid() % 100000)
        self.dir = workdir
        self.shim = shim
        self.switch_ns, self.host_ns = f"ntsw{tag}", f"nthost{tag}"
        self.procs: list = []
        self.lldpad_on_switch = False
        # lldpcli run as root drops to lldpd's user before it connects: the
        # sockets live in a directory that user may enter (pytest's is 0700).
        self.sockets = tempfile.mkdtemp(prefix="nt-lldp-")
        os.chmod(self.sockets, 0o755)
        self.lldpd_socket = f"{self.sockets}/switch-lldpd.sock"
        self.host_lldpd_socket = f"{self.sockets}/host-lldpd.sock"
        self.replies = {"switch": workdir / "switch-dcb", "host": workdir / "host-dcb"}
        for ns in (self.switch_ns, self.host_ns):
            _ip("netns", "add", ns)
        _ip("link", "add", f"ntv{tag}a", "type", "veth", "peer", "name", f"ntv{tag}b")
        _ip("link", "set", f"ntv{tag}a", "netns", self.switch_ns, "name", "swp1")
        _ip("link", "set", f"ntv{tag}b", "netns", self.host_ns, "name", "rail0")
        for ns, name, mtu in ((self.switch_ns, "swp1", "9216"), (self.host_ns, "rail0", "9000")):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", name, "mtu", mtu, "up")
        _ip("-n", self.switch_ns, "addr", "add", "198.18.240.1/30", "dev", "swp1")
        _ip("-n", self.host_ns, "addr", "add", "198.18.240.2/30", "dev", "rail0")
        for side in self.replies:
            self.set_app(side, [])

    # -- processes ----------------------------------------------------------------

    def _start(self, ns: str, argv: list, log: str, env=None) -> subprocess.Popen:
        out = open(self.dir / log, "w")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, **(env or {})), start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, ns: str, *argv: str, check: bool = True) -> str:
        done = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: {done.stdout}{done.stderr}")
        return done.stdout

    def _wait_for(self, what, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if what():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    # -- lldpd ------------------------------------------------------------------------

    def start_switch_lldpd(self, system_name: str = "leaf03", mfs: int = 9216) -> None:
        self.switch_lldpd = self._start(
            self.switch_ns, ["lldpd", "-d", "-u", self.lldpd_socket, "-I", "swp1", "-O", "/dev/null",
                             "-S", "nictune test switch"], "switch-lldpd.log")
        self._wait_for(lambda: os.path.exists(self.lldpd_socket))
        self.lldpcli("configure", "system", "hostname", system_name)
        self.lldpcli("configure", "lldp", "portidsubtype", "ifname")
        self.lldpcli("configure", "lldp", "tx-interval", "1")
        _ip("-n", self.switch_ns, "link", "set", "swp1", "alias", "to host rail0")
        self.set_mfs(mfs)

    def stop_switch_lldpd(self) -> None:
        os.killpg(self.switch_lldpd.pid, signal.SIGTERM)
        self.switch_lldpd.wait(10)

    def lldpcli(self, *args: str, sock: str = "") -> str:
        done = subprocess.run(["lldpcli", "-u", sock or self.lldpd_socket, *args], capture_output=True,
                              text=True, timeout=10)
        if done.returncode != 0:
            raise AssertionError(f"lldpcli {' '.join(args)}: {done.stderr}")
        return done.stdout

    def set_mfs(self, size: int) -> None:
        """The 802.3 Maximum Frame Size TLV lldpd sends, as a custom TLV."""
        self.lldpcli("unconfigure", "lldp", "custom-tlv", "oui", "00,12,0f", "subtype", "4")
        value = ",".join(f"{b:02x}" for b in size.to_bytes(2, "big"))
        self.lldpcli("configure", "lldp", "custom-tlv", "oui", "00,12,0f", "subtype", "4", "oui-info", value)

    def start_host_lldpd(self) -> None:
        """A receive-only lldpd on the host (nictune's lldpd source)."""
        self._start(self.host_ns, ["lldpd", "-d", "-r", "-u", self.host_lldpd_socket, "-I", "rail0",
                                   "-O", "/dev/null"], "host-lldpd.log")
        self._wait_for(lambda: os.path.exists(self.host_lldpd_socket))

    # -- lldpad -----------------------------------------------------------------------

    def set_app(self, side: str, apps: list) -> None:
        """The device APP table lldpad reads ((priority, selector, protocol),
        as lldptool's app=prio,sel,proto) and the DCBX mode it is told."""
        directory = self.replies[side]
        state = {"ets": {"willing": 0, "ets_cap": 8, "cbs": 0, "tc_tx_bw": [100] + [0] * 7,
                         "tc_rx_bw": [100] + [0] * 7, "tc_tsa": [2] + [0] * 7, "prio_tc": [0] * 8,
                         "tc_reco_bw": [0] * 8, "tc_reco_tsa": [0] * 8, "reco_prio_tc": [0] * 8},
                 "pfc": {"pfc_cap": 8, "pfc_en": 0, "mbc": 0, "delay": 0, "requests": [0] * 8,
                         "indications": [0] * 8},
                 "apps": [[sel, prio, proto] for prio, sel, proto in apps], "dcbx": DCBX_HOST_IEEE}
        name = "swp1" if side == "switch" else "rail0"
        rec.write_replies(directory, {
            f"{rec.RTM_GETDCB}-{rec.CMD_GDCBX}.bin": rec._message(rec.RTM_GETDCB, rec.CMD_GDCBX,
                                                           rec._nla(rec.ATTR_DCBX, bytes([DCBX_HOST_IEEE]))),
            f"{rec.RTM_GETDCB}-{rec.CMD_IEEE_GET}.bin": rec.ieee_get_reply(state, name),
            f"{rec.RTM_SETDCB}-{rec.CMD_IEEE_SET}.bin": rec.status_reply(rec.CMD_IEEE_SET, rec.ATTR_IEEE),
            f"{rec.RTM_SETDCB}-{rec.CMD_IEEE_DEL}.bin": rec.status_reply(rec.CMD_IEEE_DEL, rec.ATTR_IEEE),
        })

    def start_lldpad(self, side: str) -> None:
        ns = self.switch_ns if side == "switch" else self.host_ns
        conf = self.dir / f"{side}-lldpad.conf"
        script = (f"mount -t tmpfs nt-shm /dev/shm && exec lldpad -p -t -f {conf}")
        self._start(ns, ["unshare", "--mount", "sh", "-c", script], f"{side}-lldpad.log",
                    env={"LD_PRELOAD": str(self.shim), "NT_NLSHIM_REPLIES": str(self.replies[side]),
                         "NT_NLSHIM_LOG": str(self.dir / f"{side}-dcb.log")})
        self._wait_for(lambda: self.run(ns, "lldptool", "-p", check=False).strip() != "")
        ifname = "swp1" if side == "switch" else "rail0"
        self.lldpad_on_switch = self.lldpad_on_switch or side == "switch"
        self.run(ns, "lldptool", "-L", "-i", ifname, "adminStatus=" + ("rxtx" if side == "switch" else "rx"))

    def lldptool(self, *args: str) -> str:
        return self.run(self.switch_ns, "lldptool", *args)

    def configure_dcbx(self, pfc=(3,), up2tc="0:0,1:0,2:0,3:3,4:0,5:0,6:6,7:0",
                       tsa="0:ets,1:strict,2:strict,3:ets,4:strict,5:strict,6:strict,7:strict",
                       tcbw="50,0,0,50,0,0,0,0", willing: bool = False,
                       apps=((3, 5, 26), (6, 5, 48))) -> None:
        """ETS, PFC and APP on the switch port, with lldptool; then a fresh
        transmission (lldpad sends every 30 s, and at once after a change)."""
        yes = "yes" if willing else "no"
        self.lldptool("-T", "-i", "swp1", "-V", "ETS-CFG", "enableTx=yes", f"willing={yes}",
                      f"tsa={tsa}", f"up2tc={up2tc}", f"tcbw={tcbw}")
        self.lldptool("-T", "-i", "swp1", "-V", "ETS-REC", "enableTx=yes", f"tsa={tsa}", f"up2tc={up2tc}",
                      f"tcbw={tcbw}")
        self.lldptool("-T", "-i", "swp1", "-V", "PFC", "enableTx=yes", f"willing={yes}",
                      "enabled=" + (",".join(str(p) for p in pfc) or "none"))
        for prio, sel, proto in apps:
            self.lldptool("-T", "-i", "swp1", "-V", "APP", "enableTx=yes", f"app={prio},{sel},{proto}")
        self.set_app("switch", list(apps))
        self.kick()

    @contextlib.contextmanager
    def chatty(self, every: float = 0.7):
        """lldpad kicked every `every` seconds while the block runs: a
        switch whose DCBX frames keep coming, not one every 30 s."""
        stop = threading.Event()
        if not self.lldpad_on_switch:
            yield
            return

        def loop():
            while not stop.wait(every):
                self.kick()
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(10)

    def kick(self) -> None:
        """lldpad transmits now: every lldptool set is a local change, which
        it sends at its next tick (else it sends every 30 s)."""
        self.lldptool("-T", "-i", "swp1", "-V", "PFC", "enableTx=yes")

    # -- the end --------------------------------------------------------------------

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for ns in (self.switch_ns, self.host_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self.sockets, ignore_errors=True)
