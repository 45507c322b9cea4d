"""RoCE settings outside dcbnl: the RDMA-CM defaults and ECN/DCQCN.

mode, tos: rdma_cm configfs, /sys/kernel/config/rdma_cm/<dev>/ports/<port>/
default_roce_{mode,tos}, for the RDMA device whose port carries the
interface (roce.rdma_device: auto) or the one named.  They only affect
RDMA-CM users that set no ToS themselves (NCCL sets its own: NCCL_IB_TC).

verbs_tos: the MLNX_OFED / DOCA-OFED mlx5_ib global traffic class,
/sys/class/infiniband/<dev>/tc/<port>/traffic_class (main_ext.c
traffic_class_store/show, init_tc_sysfs): the ToS every RoCE QP of the port
gets whatever its user asked for, so verbs users that set none (UCX, MPI,
storage) leave DSCP 0.  It reads "Global tclass=N" when set and nothing
otherwise; writing -1 unsets it.  Upstream mlx5_ib has no tc/ directory.

ecn.*: the MLNX_OFED / DOCA-OFED driver's /sys/class/net/<if>/ecn/roce_np
and roce_rp (per-priority enables, CNP DSCP and 802.1p priority, DCQCN
parameters).  Upstream drivers have no such directory; the keys are then
unsupported with the reason, and parameters are only ever the file names
the driver exposes.  The files are writable on a PF only (a VF's are read
only, a representor's are its PF's: nicclass.ecn_port_unsupported), which
plan says before anything is written.
"""

from __future__ import annotations

import os

from nictune.host.facts import nicclass

from nictune.host.facts import rdma
from nictune.host.knobs.base import Family, quietly, read_quietly, read_tree
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.validate import ECN_PARAM, IBDEV, check

PRIOS = 8
MODES = {"v1": rdma.ROCE_V1, "v2": rdma.ROCE_V2}
MODE_NAMES = {v: k for k, v in MODES.items()}
CM_FILES = {"mode": "default_roce_mode", "tos": "default_roce_tos"}
PORT_KEYS = (*CM_FILES, "verbs_tos")  # keys that live on the RDMA device's port
VERBS_TOS_UNSET = "-1"  # tclass_parse_tclass takes it: no global traffic class
NO_TC_SYSFS = ("needs MLNX_OFED/DOCA-OFED mlx5_ib, whose /sys/class/infiniband/<dev>/tc/<port>/"
               "traffic_class it is (main_ext.c init_tc_sysfs); upstream RDMA drivers have none: "
               "there, RDMA-CM users take roce.tos and NCCL NCCL_IB_TC")
# ecn.<name> -> (directory, file) under /sys/class/net/<if>/ecn
ECN_FILES = {"cnp_dscp": ("roce_np", "cnp_dscp"), "cnp_prio": ("roce_np", "cnp_802p_prio")}


def check_param(name: object) -> str:
    return check(ECN_PARAM, name, "ECN parameter name")


class RoceFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    roce:
      rdma_device: auto
      mode: v2
      tos: 106
      ecn: {np: [3], rp: [3], cnp_dscp: 48, cnp_prio: 6}
"""
    name = "roce"
    position = 90
    position_note = ("after dcb: ECN enables are per priority, and the priority a DSCP lands on "
                     "is set by the DCB map")
    sections = ("roce",)
    settings = ("roce.rdma_device", "roce.mode", "roce.tos", "roce.verbs_tos", "roce.ecn.np", "roce.ecn.rp",
                "roce.ecn.cnp_dscp", "roce.ecn.cnp_prio", "roce.ecn.params")

    @classmethod
    def plan_reads(cls, host) -> None:
        """Each interface's ECN tree and RDMA port; every RDMA device's
        ports, link layers, GID tables, traffic class and rdma_cm defaults
        (read through a configfs directory that exists while it is held:
        made and removed again, as a plan does)."""
        for iface in host.interfaces():
            ecn = host.path("sys/class/net", iface.name, "ecn")
            if host.io.isdir(ecn):
                read_tree(host, ecn)
            rdma.port_of(host, iface.name)
        for dev in rdma.devices(host):
            host.io.realpath(host.path(rdma.IB_CLASS, dev, "device"))
            for port in rdma.ports(host, dev):
                rdma.link_layer(host, dev, port)
                rdma.gids(host, dev, port)
                read_quietly(host, host.path(rdma.IB_CLASS, dev, "tc", str(port), "traffic_class"))
            if host.io.isdir(host.path(rdma.CM_CONFIGFS)):
                quietly(lambda: _read_cm_tree(host, dev))

    @classmethod
    def schema(cls, s):
        ecn = s.section(
            "ECN/DCQCN, where the driver exposes /sys/class/net/<if>/ecn (MLNX_OFED/DOCA-OFED).", {
                "np": s.prio_list("Priorities where the NIC is ECN notification point (sends CNPs)."),
                "rp": s.prio_list("Priorities where the NIC is reaction point (DCQCN rate control)."),
                "cnp_dscp": {**s.integer(0, 63), "description": "DSCP of CNPs (0-63)."},
                "cnp_prio": {**s.integer(0, 7), "description": "802.1p priority of CNPs (0-7)."},
                "params": s.mapping(
                    "Other DCQCN parameters, by the names the driver exposes, such as rpg_ai_rate.",
                    s.text(ECN_PARAM, 64),
                    {"anyOf": [s.integer(0, s.U32), s.bound(s.integer(0, s.U32))]}, 64),
            })
        return {"entry": {"roce": s.section(
            "RoCE v2 QoS and RDMA-CM defaults of the interface's RDMA device.", {
                "rdma_device": {
                    "anyOf": [{"const": "auto"}, s.text(IBDEV, 64)],
                    "description": "The RDMA device: auto (the device whose port carries this interface) or a name such as mlx5_0.",
                },
                "mode": {"enum": list(MODES), "description": "RDMA-CM default RoCE mode (configfs default_roce_mode)."},
                "tos": {**s.integer(0, 255), "description": "RDMA-CM default ToS byte (configfs default_roce_tos); DSCP = tos >> 2."},
                "verbs_tos": {**s.integer(0, 255), "description":
                              "ToS byte for every RoCE QP of the port, verbs users included (MLNX_OFED mlx5_ib tc/<port>/traffic_class)."},
                "ecn": ecn,
            }, title="RoCE settings")}}

    @classmethod
    def nic_support(cls, driver, setting):
        nic = nicclass.for_driver(driver)
        if nic is None:
            return None
        if setting.startswith("roce.ecn."):
            return "needs /sys/class/net/<if>/ecn, and " + nic.why_not["ecn"]
        if setting == "roce.verbs_tos":
            return NO_TC_SYSFS if nic.driver == "mlx5_core" else f"not supported by {nic.driver}: {NO_TC_SYSFS}"
        if setting in ("roce.mode", "roce.tos") and nic.roce_ports:
            return "RoCE v2 on port " + ", ".join(str(p) for p in nic.roce_ports) + " only"
        return None

    def __init__(self, host):
        super().__init__(host)
        self._rdma_device: dict = {}  # ifname -> "auto" or a device name
        self._ports: dict = {}        # ifname -> (device, port) or Unsupported, last read

    # -- profile -> keys ---------------------------------------------------
    def expand(self, target, sections, source):
        roce = sections.get("roce") or {}
        self._rdma_device[target] = roce.get("rdma_device", "auto")
        out = []
        for name in ("mode", "tos", "verbs_tos"):
            if name in roce:
                out.append(Desired(Key(self.name, target, name), Want(roce[name]), source("roce", name)))
        ecn = roce.get("ecn") or {}
        for name in ("np", "rp"):
            if name in ecn:
                out.append(Desired(Key(self.name, target, f"ecn.{name}"), Want(sorted(set(ecn[name]))),
                                   source("roce", "ecn", name)))
        for name in ("cnp_dscp", "cnp_prio"):
            if name in ecn:
                out.append(Desired(Key(self.name, target, f"ecn.{name}"), Want(ecn[name]),
                                   source("roce", "ecn", name)))
        for name, value in (ecn.get("params") or {}).items():
            out.append(Desired(Key(self.name, target, f"ecn.{check_param(name)}"), Want.parse(value),
                               source("roce", "ecn", "params", name)))
        return out

    # -- where each key lives -------------------------------------------------
    def _port(self, ifname: str):
        """(device, port) of the interface's RoCE port, or Unsupported."""
        choice = self._rdma_device.get(ifname, "auto")
        if choice == "auto":
            found = rdma.port_of(self.host, ifname)
            if found is None:
                return Unsupported(f"no RDMA device carries {ifname} (no GID of any "
                                   "/sys/class/infiniband device names it, and none sits on its "
                                   "PCI device): is the RDMA driver loaded?")
        else:
            device = rdma.check_ibdev(choice)
            ports = rdma.ports(self.host, device)
            if not ports:
                return Unsupported(f"no RDMA device {device} on this host")
            found = (device, ports[0])
        reason = nicclass.roce_port_unsupported(self.driver_of(ifname), found[1])
        return Unsupported(reason) if reason else found

    def _ecn_path(self, key: Key) -> str:
        ecn = self.host.path("sys/class/net", key.target, "ecn")
        name = key.name[len("ecn."):]
        if name in ("np", "rp"):
            return os.path.join(ecn, f"roce_{name}", "enable")
        if name in ECN_FILES:
            return os.path.join(ecn, *ECN_FILES[name])
        check_param(name)
        for side in ("roce_rp", "roce_np"):
            path = os.path.join(ecn, side, name)
            if self.host.io.isfile(path):
                return path
        return os.path.join(ecn, "roce_rp", name)

    # -- host -> values ----------------------------------------------------
    def read(self, keys):
        out = {}
        cm_keys: dict = {}  # (device, port) -> [key]
        # Finding a port walks every RDMA device: once per interface.
        for target in {k.target for k in keys if k.name in PORT_KEYS}:
            self._ports[target] = self._port(target)
        for key in keys:
            if key.name == "verbs_tos":
                port = self._ports[key.target]
                out[key] = port if isinstance(port, Unsupported) else self._read_verbs_tos(*port)
            elif key.name in CM_FILES:
                port = self._ports[key.target]
                if isinstance(port, Unsupported):
                    out[key] = port
                else:
                    cm_keys.setdefault(port, []).append(key)
            else:
                out[key] = self._read_ecn(key)
        for (device, port), mine in cm_keys.items():
            out.update(self._read_cm(device, port, mine))
        return out

    def _read_cm(self, device: str, port: int, keys: list) -> dict:
        try:
            with rdma.cm_device(self.host, device) as path:
                values = {}
                for key in keys:
                    text = self.host.io.read_text(
                        os.path.join(path, "ports", str(port), CM_FILES[key.name])).strip()
                    values[key] = MODE_NAMES.get(text, text) if key.name == "mode" else int(text, 0)
                return values
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            return {key: Unsupported(f"cannot read rdma_cm {device} port {port}: {reason}")
                    for key in keys}

    def _tc_path(self, device: str, port: int) -> str:
        return self.host.path("sys/class/infiniband", device, "tc", str(port), "traffic_class")

    def _read_verbs_tos(self, device: str, port: int):
        """The port's global traffic class, None when none is set."""
        try:
            text = self.host.io.read_text(self._tc_path(device, port))
        except FileNotFoundError:
            return Unsupported(f"no {device}/tc/{port}/traffic_class: {NO_TC_SYSFS}")
        except OSError as e:
            return Unsupported(f"cannot read {device} traffic_class: {e}")
        # Per-address rules (dst_ip=...,tclass=N) follow on their own lines;
        # nictune sets only the global one.
        for line in text.splitlines():
            if line.startswith("Global tclass="):
                return int(line.split("=", 1)[1])
        return None

    def _read_ecn(self, key: Key):
        driver = self.driver_of(key.target)
        iface = next((i for i in self.host.interfaces() if i.name == key.target), None)
        reason = nicclass.ecn_port_unsupported(driver, iface)
        if reason:
            return Unsupported(reason)
        if not self.host.io.isdir(self.host.path("sys/class/net", key.target, "ecn")):
            return Unsupported(nicclass.ecn_unsupported(self.driver_of(key.target)))
        path = self._ecn_path(key)
        try:
            if key.name in ("ecn.np", "ecn.rp"):
                enabled = []
                for p in range(PRIOS):
                    if self.host.io.read_text(os.path.join(path, str(p))).strip() == "1":
                            enabled.append(p)
                return enabled
            return int(self.host.io.read_text(path).strip(), 0)
        except FileNotFoundError:
            return Unsupported(f"the driver exposes no ECN setting {key.name[4:]} "
                               f"(no {os.path.relpath(path, self.host.path('sys/class/net', key.target))})")
        except (OSError, ValueError) as e:
            return Unsupported(f"cannot read {key.name}: {e}")

    def note(self, key: Key) -> str:
        port = self._ports.get(key.target)
        if key.name in CM_FILES and isinstance(port, tuple):
            return f"rdma_cm {port[0]} port {port[1]}: RDMA-CM users only; NCCL uses NCCL_IB_TC"
        if key.name == "verbs_tos" and isinstance(port, tuple):
            return f"{port[0]} port {port[1]}: overrides the ToS of every RoCE QP there, NCCL's too"
        return ""

    # -- writes ------------------------------------------------------------
    def apply(self, items):
        cm: dict = {}
        for key, value in items:
            if key.name in PORT_KEYS:
                port = self._ports.get(key.target) or self._port(key.target)
                if isinstance(port, Unsupported):
                    raise OSError(f"{key.target}: {port.reason}")
                if key.name == "verbs_tos":
                    _write(self.host.io, self._tc_path(*port), VERBS_TOS_UNSET if value is None else str(int(value)))
                else:
                    cm.setdefault(port, []).append((key, value))
            elif key.name in ("ecn.np", "ecn.rp"):
                path = self._ecn_path(key)
                for p in range(PRIOS):
                    _write_if_differs(self.host.io, os.path.join(path, str(p)), "1" if p in value else "0")
            else:
                _write(self.host.io, self._ecn_path(key), str(int(value)))
        for (device, port), writes in cm.items():
            with rdma.cm_device(self.host, device) as path:
                for key, value in writes:
                    text = MODES[value] if key.name == "mode" else str(int(value))
                    _write(self.host.io, os.path.join(path, "ports", str(port), CM_FILES[key.name]), text)


def _write(io, path: str, text: str) -> None:
    try:
        io.write_text(path, text)
    except OSError as e:
        raise OSError(e.errno, f"{path}={text}: {e.strerror}") from None


def _write_if_differs(io, path: str, text: str) -> None:
    if io.read_text(path).strip() == text:
        return
    _write(io, path, text)


def _read_cm_tree(host, device: str) -> None:
    with rdma.cm_device(host, device) as path:
        read_tree(host, os.path.join(path, "ports"))
