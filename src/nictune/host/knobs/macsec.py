"""MACsec links on an interface: create (or adopt) a macsec link, its TX SA
and its RX SCs/SAs from key files, and its offload mode.

    interfaces:
      rail0:
        match: {driver: mlx5_core}
        macsec:
          name: ms0                 # the macsec link (default: <if>-ms)
          cipher: gcm-aes-256       # gcm-aes-128 (default) | gcm-aes-256
          icv_len: 16               # 8..16 (default 16)
          encrypt: true             # default true
          port: 1                   # our SCI's port (SCI = the link's MAC + port)
          offload: mac              # off | phy | mac
          tx_sa: {an: 0, pn: 1, key_file: /etc/nictune/keys/ms0-tx}
          rx:
            - {address: "02:00:00:00:00:02", port: 1,
               sa: {an: 0, pn: 1, key_file: /etc/nictune/keys/ms0-rx}}

Keys: target the matched interface (the link's parent), name
"<link>/<what>" (the link's name in the key, so that a rollback, which
has no profile, knows which link), values as text so plans show them whole:
  <link>/link      "<name> <cipher> icv <n> encrypt on|off port <p>"; None when absent
  <link>/offload   off | phy | mac
  <link>/tx_sa     "an <n> key <fingerprint>"
  <link>/rx.<sci>  "an <n> key <fingerprint>"   (sci: 16 hex digits, MAC then port)
The fingerprint is keyfile.fingerprint(): the first 8 hex digits of the
SHA-256 of the key file's content, so a rotation shows as a change and no
key byte is ever in a plan, diff, report or journal.  The kernel never
returns keys; nictune tells which key an SA has from its KEYID, which it
sets to the 4 fingerprint bytes, then b"nictune", then zeros
(_keyid()).  PNs are written, never compared (they advance with traffic).

Created or adopted.  A macsec link with the wanted name that exists on the
interface and carries an SA whose KEYID is not nictune's -- or no SA at
all -- was made by someone else, in practice an MKA daemon (wpa_supplicant
with macsec_policy, which installs SAs as MKA negotiates them, KEYID =
the MKA key identifier): it is adopted, and only its offload mode is set
and verified.  The kernel changes a link's offload only while the link is
down and has no SC/SA (drivers/net/macsec.c macsec_update_offload: EBUSY),
so for an MKA link the plan says to set it in wpa_supplicant.conf
(macsec_offload=) too.

Writes, for a link nictune makes: RTM_NEWLINK with the offload mode in it
(IFLA_MACSEC_OFFLOAD: it cannot change once SAs exist), then ADD_TXSA,
ADD_RXSC + ADD_RXSA per peer, then the link up.  Keys are read from their
files at write time (and refused if the fingerprint is not the planned
one), handed to netlink/macsec.py, and wiped.  A rollback deletes a link
nictune made (its SAs go with it) and puts an adopted link's offload mode
back; a key rotation cannot be undone (the old key is not kept, by
design) and is reported as revert-failed.

What each NIC class offers (torvalds/linux drivers/net/ethernet/):
  mlx5_core  mellanox/mlx5/core/en_accel/macsec.c (mlx5e_macsec_ops,
             offload mac; ConnectX-6 Dx and later, ConnectX-7)
  mana       microsoft/mana: no macsec_ops; only software MACsec (off).
"""

from __future__ import annotations

from typing import Optional

from nictune.host.transports import keyfile

from nictune.host.facts import nicclass
from nictune.host.errors import InvalidInput
from nictune.host.knobs.base import Family
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.validate import ABS_PATH, IFNAME, MAC, NOT_NORMALISED

CIPHERS = ("gcm-aes-128", "gcm-aes-256")
OFFLOADS = ("off", "phy", "mac")
SCI = r"^[0-9a-fA-F]{16}$"
MARK = b"nictune"
DEFAULTS = {"cipher": "gcm-aes-128", "icv_len": 16, "encrypt": True, "port": 1}
LINK_FIELDS = ("name", "cipher", "icv_len", "encrypt", "port")


def _keyid(fp: str) -> bytes:
    return bytes.fromhex(fp) + MARK


def _fp_of(keyid_hex: str) -> Optional[str]:
    """The fingerprint a nictune KEYID carries, or None (not nictune's)."""
    raw = bytes.fromhex(keyid_hex or "")
    if len(raw) == 16 and raw[4:4 + len(MARK)] == MARK and not any(raw[4 + len(MARK):]):
        return raw[:4].hex()
    return None


def link_text(name, cipher, icv_len, encrypt, port) -> str:
    return f"{name} {cipher} icv {icv_len} encrypt {'on' if encrypt else 'off'} port {port}"


def sa_text(an: int, keyid_hex: Optional[str] = None, fp: Optional[str] = None) -> str:
    fp = fp or _fp_of(keyid_hex or "")
    return f"an {an} key {fp}" if fp else f"an {an} keyid {keyid_hex} (not set by nictune)"


def split_name(name: str):
    """"ms0/rx.0200000000020001" -> ("ms0", "rx.0200000000020001")."""
    link, _, what = name.partition("/")
    return link, what


def default_name(target: str) -> str:
    return (target[:12] + "-ms")


def _macsec(host):
    return host.macsec()


class MacsecFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rail:
    match: {name: eth0}
    macsec:
      name: ms0
      cipher: gcm-aes-128
      offload: mac
      tx_sa: {an: 0, pn: 1, key_file: /etc/nictune/keys/ms0-tx}
      rx:
        - {address: "02:00:00:00:00:02", port: 1, sa: {an: 0, key_file: /etc/nictune/keys/ms0-rx}}
"""
    name = "macsec"
    position = 97
    position_note = ("after the parent's device settings, before link (MTU and admin state stay "
                     "last): the kernel lowers a macsec link's MTU with its parent's, never "
                     "raises it; a rollback deletes the link after the parent's MTU went back")
    # A plan reads the SAs' key files (their fingerprints), and a snapshot
    # holds only the key files its show read: none.
    offline_plan = "the SAs' key files are not in a snapshot"
    sections = ("macsec",)
    settings = ("macsec.name", "macsec.cipher", "macsec.icv_len", "macsec.encrypt",
                "macsec.port", "macsec.offload", "macsec.tx_sa.an", "macsec.tx_sa.pn",
                "macsec.tx_sa.key_file", "macsec.rx")

    @classmethod
    def schema(cls, s):
        sa = s.section("A static SA: association number, first packet number, key file.", {
            "an": {**s.integer(0, 3), "description": "Association number, 0 to 3."},
            "pn": {**s.integer(1, s.U32), "description": "First packet number (default 1)."},
            "key_file": {**s.text(ABS_PATH, 256), "not": {"pattern": NOT_NORMALISED},
                         "description": "File with the key in hex: a regular file owned by "
                                        "root, mode 0600, with no symbolic link on its path. "
                                        "Plans show its fingerprint."},
        }, required=["an", "key_file"])
        rx = s.section("A peer: its SCI (or address and port) and its SA.", {
            "sci": {**s.text(SCI, 16, words="16 hex digits"),
                    "description": "The peer's SCI: its MAC then its port, in hex."},
            "address": {**s.text(MAC, 17), "description": "The peer's MAC (with port)."},
            "port": {**s.integer(1, 65535), "description": "The peer's port (with address)."},
            "sa": sa,
        }, required=["sa"])
        return {"entry": {"macsec": s.section(
            "A MACsec link on this interface (ip link add link <if> <name> type macsec), with "
            "static SAs from key files; an existing link nictune did not make (an MKA daemon's) "
            "only gets its offload mode.", {
                "name": {**s.text(IFNAME, 15), "description": "Name of the macsec link."},
                "cipher": {"enum": list(CIPHERS), "description": "Cipher suite."},
                "icv_len": {**s.integer(8, 16), "description": "ICV length in bytes."},
                "encrypt": {"type": "boolean", "description": "Encrypt (else integrity only)."},
                "port": {**s.integer(1, 65535), "description": "Port of this end's SCI."},
                "offload": {"enum": list(OFFLOADS),
                            "description": "Where MACsec runs: off (software), phy or mac."},
                "tx_sa": sa,
                "rx": {"type": "array", "items": rx, "maxItems": 64,
                       "description": "The peers this end receives from."},
            }, title="MACsec")}}

    @classmethod
    def nic_support(cls, driver, setting):
        nic = nicclass.for_driver(driver)
        why = nic.why_not.get("macsec_offload") if nic else None
        if why and setting == "macsec.offload":
            return f"not supported by {driver}: {why} (only offload: off)"
        if driver == "mlx5_core" and setting == "macsec.offload":
            return "offload mac (mlx5e_macsec_ops), ConnectX-6 Dx and later"
        return None

    def __init__(self, host):
        super().__init__(host)
        self._want: dict = {}     # target -> the expanded section (paths, pns, names)
        self._adopted: dict = {}  # target -> link name, for links nictune leaves to MKA

    # -- expand ------------------------------------------------------------------
    def _state(self):
        """(links by name, secys by ifindex) of the namespace."""
        with _macsec(self.host) as m:
            links = {ln.name: ln for ln in m.links()}
            secys = m.secys() if links else {}
        return links, secys

    def expand(self, target, sections, source):
        sec = sections["macsec"]
        name = sec.get("name") or default_name(target)
        cipher = sec.get("cipher", DEFAULTS["cipher"])
        length = 32 if cipher == "gcm-aes-256" else 16

        def fingerprint(path, where):
            try:
                key, fp = self.host.io.key_load(path)  # keyfile.check, through the port
                keyfile.wipe(key)
                return fp
            except InvalidInput as e:
                raise InvalidInput(f"{source('macsec', *where)}: macsec.{'.'.join(where)}: {e}")

        def sa(node, where):
            fp = fingerprint(node["key_file"], where + ("key_file",))
            return sa_text(node["an"], fp=fp), {"path": node["key_file"],
                                                   "pn": node.get("pn", 1), "an": node["an"],
                                                   "fp": fp, "length": length}

        existing = self._existing(target, name)
        offload = [Desired(Key(self.name, target, f"{name}/offload"), Want(sec["offload"]),
                           source("macsec", "offload"))] if "offload" in sec else []
        if existing is not None and not existing:
            self._adopted[target] = name  # an MKA daemon's link: offload only
            return offload
        link = {"name": name, **{k: sec.get(k, DEFAULTS[k]) for k in LINK_FIELDS[1:]}}
        out = [Desired(Key(self.name, target, f"{name}/link"), Want(link_text(**link)),
                       source("macsec"))] + offload
        plan = {"link": link, "offload": sec.get("offload"), "tx": None, "rx": {}}
        if "tx_sa" in sec:
            value, plan["tx"] = sa(sec["tx_sa"], ("tx_sa",))
            out.append(Desired(Key(self.name, target, f"{name}/tx_sa"), Want(value),
                               source("macsec", "tx_sa")))
        for i, peer in enumerate(sec.get("rx") or ()):
            sci = self._sci(peer, source("macsec", "rx", str(i)))
            value, plan["rx"][sci] = sa(peer["sa"], ("rx", str(i), "sa"))
            out.append(Desired(Key(self.name, target, f"{name}/rx.{sci}"), Want(value),
                               source("macsec", "rx")))
        self._want[target] = plan
        return out

    @staticmethod
    def _sci(peer: dict, where: str) -> str:
        if "sci" in peer and ("address" in peer or "port" in peer):
            raise InvalidInput(f"{where}: macsec.rx: give sci, or address and port, not both")
        if "sci" in peer:
            return peer["sci"].lower()
        if "address" not in peer or "port" not in peer:
            raise InvalidInput(f"{where}: macsec.rx: a peer needs sci, or address and port")
        return peer["address"].replace(":", "").lower() + f"{peer['port']:04x}"

    def _existing(self, target: str, name: str) -> Optional[bool]:
        """None: no link `name` on target; True: nictune's; False: someone
        else's (an MKA daemon's)."""
        try:
            links, secys = self._state()
        except OSError:
            return None
        link = links.get(name)
        parent = self._index(target)
        if link is None or parent is None or link.link != parent:
            return None
        secy = secys.get(link.index)
        if secy is None:
            return False
        ids = [s.keyid for s in secy.tx_sas] + [s.keyid for sc in secy.rx_scs for s in sc.sas]
        return bool(ids) and all(_fp_of(k) for k in ids)

    def _index(self, ifname: str) -> Optional[int]:
        return next((i.index for i in self.host.interfaces() if i.name == ifname), None)

    # -- read ----------------------------------------------------------------------
    def read(self, keys):
        links, secys = self._state()
        out: dict = {}
        for k in keys:
            name, what = split_name(k.name)
            link = links.get(name)
            parent = self._index(k.target)
            if link is not None and link.link != parent:
                out[k] = Unsupported(f"{name} exists on another interface (ifindex {link.link})")
                continue
            if link is None:
                out[k] = None
                continue
            secy = secys.get(link.index)
            if what == "offload":
                out[k] = link.offload if link.offload is not None else (
                    secy.offload if secy else None)
            elif what == "link":
                out[k] = link_text(link.name, link.cipher, link.icv_len, link.encrypt, link.port)
            elif what == "tx_sa":
                sa = next((s for s in (secy.tx_sas if secy else []) if s.active), None)
                out[k] = None if sa is None else sa_text(sa.an, sa.keyid)
            elif what.startswith("rx."):
                sc = next((c for c in (secy.rx_scs if secy else []) if c.sci == what[3:]), None)
                sa = next((s for s in (sc.sas if sc else []) if s.active), None)
                out[k] = None if sa is None else sa_text(sa.an, sa.keyid)
        return out

    def check(self, key, want):
        if split_name(key.name)[1] == "offload" and want.value != "off":
            why = self.nic_support(self.driver_of(key.target), "macsec.offload")
            if why and why.startswith("not supported"):
                return why
        return None

    def note(self, key):
        if key.target in self._adopted:
            return (f"{self._adopted[key.target]} was not made by nictune (an MKA daemon's, "
                    "e.g. wpa_supplicant): only its offload mode is managed; the kernel changes "
                    "it only while the link is down with no SA, so set macsec_offload in "
                    "wpa_supplicant.conf as well")
        plan = self._want.get(key.target) or {}
        what = split_name(key.name)[1]
        if what == "tx_sa" and plan.get("tx"):
            return f"key from {plan['tx']['path']} (fingerprint shown), first PN {plan['tx']['pn']}"
        if what.startswith("rx.") and what[3:] in plan.get("rx", {}):
            p = plan["rx"][what[3:]]
            return f"key from {p['path']} (fingerprint shown), first PN {p['pn']}"
        if what == "link":
            return "creates the macsec link; a rollback deletes it with its SAs"
        return ""

    # -- write ---------------------------------------------------------------------
    def apply(self, items):
        by_target: dict = {}
        for key, value in items:
            by_target.setdefault(key.target, {})[split_name(key.name)[1]] = value
        with _macsec(self.host) as m:
            for target, values in by_target.items():
                self._apply_one(m, target, values)
        self.host.forget(facts=True)  # a link came

    def _apply_one(self, m, target: str, values: dict) -> None:
        from nictune.host.transports.netlink.macsec import KEY_LENGTHS, sci_bytes

        if target in self._adopted:
            if "offload" in values:
                link = {ln.name: ln for ln in m.links()}[self._adopted[target]]
                m.set_offload(link.index, values["offload"])
            return
        plan = self._want[target]
        want = plan["link"]
        links = {ln.name: ln for ln in m.links()}
        if "link" in values:
            if want["name"] in links:
                raise InvalidInput(f"{want['name']} exists with another configuration "
                                   f"({links[want['name']].cipher}, port "
                                   f"{links[want['name']].port}); nictune does not rebuild a "
                                   "live MACsec link: delete it or change the profile")
            parent = self._index(target)
            mac = next((i.mac for i in self.host.interfaces() if i.name == target), None)
            if parent is None or mac is None:
                raise InvalidInput(f"{target}: no such interface (or no MAC) to put MACsec on")
            m.add_link(parent, want["name"], sci=sci_bytes(mac, want["port"]),
                       encrypt=want["encrypt"], offload=plan["offload"],
                       cipher=want["cipher"], icv_len=want["icv_len"])
            links = {ln.name: ln for ln in m.links()}
        elif "offload" in values:
            m.set_offload(links[want["name"]].index, values["offload"])
        index = links[want["name"]].index
        need = KEY_LENGTHS[want["cipher"]]
        if "tx_sa" in values and plan["tx"]:
            self._add_sa(m, index, plan["tx"], need, None)
        for sci, p in plan["rx"].items():
            if f"rx.{sci}" not in values:
                continue
            secy = m.secys().get(index)
            if secy is None or not any(c.sci == sci for c in secy.rx_scs):
                m.add_rxsc(index, bytes.fromhex(sci))
            self._add_sa(m, index, p, need, bytes.fromhex(sci))
        m.set_up(index)

    def _add_sa(self, m, index: int, p: dict, length: int, rx_sci: Optional[bytes]) -> None:
        key, fp = self.host.io.key_load(p["path"], length=length)
        try:
            if fp != p["fp"]:
                raise InvalidInput(f"key file {p['path']} changed since the plan (fingerprint "
                                   f"{fp}, planned {p['fp']}); plan again")
            m.add_sa(index, p["an"], p["pn"], _keyid(fp), key, rx_sci=rx_sci)
        finally:
            keyfile.wipe(key)

    def revert(self, items):
        by_link: dict = {}
        for key, before in items:
            name, what = split_name(key.name)
            by_link.setdefault(name, {})[what] = before
        with _macsec(self.host) as m:
            links = {ln.name: ln for ln in m.links()}
            for name, befores in by_link.items():
                link = links.get(name)
                if link is None:
                    continue
                # A link whose key was absent before was made by nictune (an
                # adopted link never has a link key): it goes, SAs and all.
                if "link" in befores and befores["link"] is None:
                    m.del_link(link.index)  # nictune made it: its SAs go with it
                    continue
                if "offload" in befores and befores["offload"] is not None:
                    m.set_offload(link.index, befores["offload"])
                rotated = [n for n, b in befores.items() if n != "offload" and b is not None]
                if rotated:
                    raise InvalidInput(f"{name}: {', '.join(sorted(rotated))}: the previous key "
                                       "is not kept (by design), so it cannot be put back")
        self.host.forget(facts=True)

    # -- show ----------------------------------------------------------------------
    def show(self, target):
        try:
            links, _ = self._state()
        except OSError:
            return {}
        parent = self._index(target)
        mine = [ln for ln in links.values() if parent is not None and ln.link == parent]
        if not mine:
            return {}
        ln = mine[0]
        out = {"name": ln.name, "cipher": ln.cipher, "icv_len": ln.icv_len,
               "encrypt": ln.encrypt, "port": ln.port, "offload": ln.offload}
        return {"macsec": {k: v for k, v in out.items() if v is not None}}
