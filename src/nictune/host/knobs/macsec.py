"""MACsec links on an interface.  The shipped way: an MKA daemon
(wpa_supplicant -D macsec_linux, macsec_policy=1) owns the keys and the
SAs and makes the link; nictune sets and verifies the link's offload mode
and checks its settings, and never writes an SA:

    interfaces:
      rail0:
        match: {driver: mlx5_core}
        macsec:
          keys: mka                 # the link is the MKA daemon's
          name: macsec0             # optional: the one macsec link on the interface
          offload: mac              # wpa_supplicant.conf macsec_offload=2 (2.11 onwards); set while down
          cipher: gcm-aes-128       # checked: wpa_supplicant's macsec_csindex
          encrypt: true             # checked: macsec_integ_only=0
          validate: strict          # checked

Keys of an MKA link: <link>/keys ("mka": no SA carries nictune's KEYID),
<link>/cipher, /icv_len, /encrypt, /validate (only those the profile gives)
are compared and never written (checked_only: a difference is drift, to
be fixed in wpa_supplicant.conf); <link>/offload is written while the link
is down (before the daemon brings it up), and only compared once it is up
(the kernel refuses the change then: EBUSY).

Static keys (a lab feature): nictune makes the link, its TX SA and its RX
SCs/SAs from key files.  A static key is installed again on every re-apply
(the resident agent at boot, rollback then apply), and AES-GCM must never
see one (SCI, PN) twice under a key, so static keys need an
extended-packet-number cipher (64-bit PN; a 32-bit PN lasts minutes at 400
Gb/s) and nictune keeps a PN high-water mark per key in the state
directory (macsec-pn.json, keyed by the key's fingerprint, never the
key): a TX SA starts above the mark, and every install raises the mark by
PN_LEASE beyond its first PN, since traffic moves the PN on between two
read-backs and an unclean reboot loses what the next read-back would have
recorded; every read (plan, verify, the agent, the read a rollback starts
with) records the PNs the kernel reports.  Plans warn about static keys.

    interfaces:
      rail0:
        match: {driver: mlx5_core}
        macsec:
          name: ms0                 # the macsec link (default: <if>-ms)
          cipher: gcm-aes-xpn-256   # static keys: gcm-aes-xpn-128 | gcm-aes-xpn-256
          icv_len: 16               # 8..16 (default 16)
          encrypt: true             # default true
          port: 1                   # our SCI's port (SCI = the link's MAC + port)
          offload: mac              # off | phy | mac (mlx5: mac only)
          tx_sa: {an: 0, pn: 1, ssci: 1, salt: 0123456789abcdef01234567,
                  key_file: /etc/nictune/keys/ms0-tx}
          rx:
            - {address: "02:00:00:00:00:02", port: 1,
               sa: {an: 0, ssci: 2, salt: 76543210fedcba9876543210,
                    key_file: /etc/nictune/keys/ms0-rx}}

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
(_keyid()).  PNs are never compared (they advance with traffic), only
recorded as high-water marks.

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
  mlx5_core  mellanox/mlx5/core/en_accel/macsec.c (macsec_offload_ops,
             mlx5e_macsec_build_netdev): offload mac only,
             ConnectX-7 onwards (not ConnectX-6 Dx); offload phy is
             refused (nicclass.MLX5_MACSEC_PHY)
  mana       microsoft/mana: no macsec_ops; only software MACsec (off).
"""

from __future__ import annotations

from typing import Optional

from nictune.host.transports import keyfile
from nictune.host.transaction.pnmarks import PN_MARKS, load_marks, raise_mark, save_marks  # noqa: F401

from nictune.host.facts import nicclass
from nictune.host.errors import InvalidInput, NictuneError
from nictune.host.knobs.base import Family
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.validate import ABS_PATH, IFNAME, MAC, NOT_NORMALISED

CIPHERS = ("gcm-aes-128", "gcm-aes-256", "gcm-aes-xpn-128", "gcm-aes-xpn-256")
XPN_CIPHERS = ("gcm-aes-xpn-128", "gcm-aes-xpn-256")
KEYS = ("static", "mka")
VALIDATE = ("disabled", "check", "strict")
SALT = r"^[0-9a-fA-F]{24}$"
# The MKA link's settings nictune compares and never writes.
MKA_CHECKED = ("keys", "cipher", "icv_len", "encrypt", "validate")
MKA_PLACEHOLDER = "macsec"  # the key's link name while the MKA daemon has made none
# How far past its first PN an install moves a static key's mark: traffic the
# next read-back may never see (an unclean reboot).  2**48 PNs are 98 days of
# 1500-byte frames at 400 Gb/s, and leave 65536 installs in an XPN key's PNs.
PN_LEASE = 1 << 48
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


# wpa_supplicant.conf's word for each checked setting of an MKA link.
MKA_CONF = {"keys": "macsec_policy=1 with mka_cak/mka_ckn", "cipher": "macsec_csindex",
            "icv_len": "the cipher suite's", "encrypt": "macsec_integ_only",
            "validate": "macsec_replay_protect and the driver's default, strict"}


def _xpn_of(node: dict, source, where: tuple) -> Optional[tuple]:
    """(ssci, salt bytes) of an SA on an XPN link (the kernel refuses an
    XPN SA without both: macsec_add_txsa/macsec_add_rxsa)."""
    if "ssci" not in node or "salt" not in node:
        raise InvalidInput(f"{source('macsec', *where)}: macsec.{'.'.join(where)}: an SA of an "
                           "XPN cipher needs ssci and salt")
    return node["ssci"], bytes.fromhex(node["salt"])


def _value_of(what: str, link, secy):
    """What key `<link>/<what>` reads on this link and SecY."""
    if what == "offload":
        return link.offload if link.offload is not None else (secy.offload if secy else None)
    if what == "link":
        return link_text(link.name, link.cipher, link.icv_len, link.encrypt, link.port)
    if what == "keys":
        sas = (secy.tx_sas + [sa for sc in secy.rx_scs for sa in sc.sas]) if secy else []
        return "static (nictune)" if any(_fp_of(sa.keyid) for sa in sas) else "mka"
    if what in ("cipher", "icv_len", "encrypt"):
        return getattr(link, what)
    if what == "validate":
        return secy.validate if secy else None
    if what == "tx_sa":
        sa = next((s for s in (secy.tx_sas if secy else []) if s.active), None)
        return None if sa is None else sa_text(sa.an, sa.keyid)
    if what.startswith("rx."):
        sc = next((c for c in (secy.rx_scs if secy else []) if c.sci == what[3:]), None)
        sa = next((s for s in (sc.sas if sc else []) if s.active), None)
        return None if sa is None else sa_text(sa.an, sa.keyid)
    return None


# -- PN high-water marks: {fingerprint: {"tx": pn, "rx": pn}} in the state directory --


def first_pn(marks: dict, fp: str, direction: str, lowest: int) -> int:
    """Where an install of key `fp` starts: TX above everything the key may
    have sent; RX at the lowest PN the peer may still send."""
    mark = marks.get(fp, {}).get(direction, 0)
    return max(lowest, mark + 1 if direction == "tx" else mark)


class MacsecFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rail:
    match: {name: eth0}
    macsec:
      keys: mka
      name: macsec0
      offload: mac
      cipher: gcm-aes-128
      encrypt: true
      validate: strict
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
    settings = ("macsec.keys", "macsec.name", "macsec.cipher", "macsec.icv_len", "macsec.encrypt",
                "macsec.validate", "macsec.port", "macsec.offload", "macsec.tx_sa.an",
                "macsec.tx_sa.pn", "macsec.tx_sa.ssci", "macsec.tx_sa.salt",
                "macsec.tx_sa.key_file", "macsec.rx")

    @classmethod
    def schema(cls, s):
        sa = s.section("A static SA: association number, first packet number, key file; on an "
                       "XPN link also SSCI and salt.", {
            "an": {**s.integer(0, 3), "description": "Association number, 0 to 3."},
            "pn": {**s.integer(1, s.U64_MAX),
                   "description": "Lowest first packet number (default 1); nictune starts "
                                  "above the key's high-water mark."},
            "ssci": {**s.integer(0, s.U32),
                     "description": "Short SCI of the SA (XPN ciphers only, required there)."},
            "salt": {**s.text(SALT, 24, words="24 hex digits"),
                     "description": "The 96-bit salt (XPN ciphers only, required there)."},
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
            "A MACsec link on this interface.  keys: mka (the shipped way): an MKA daemon "
            "(wpa_supplicant) owns the link, its keys and SAs; nictune sets its offload mode and "
            "checks its settings.  keys: static (a lab feature): nictune makes the link and its "
            "SAs from key files, with an XPN cipher and a PN high-water mark per key.", {
                "keys": {"enum": list(KEYS),
                         "description": "mka: the MKA daemon's link (no tx_sa, rx or port); "
                                        "static (default): SAs from key files."},
                "name": {**s.text(IFNAME, 15), "description": "Name of the macsec link."},
                "cipher": {"enum": list(CIPHERS),
                           "description": "Cipher suite; static keys need an XPN one."},
                "icv_len": {**s.integer(8, 16), "description": "ICV length in bytes."},
                "encrypt": {"type": "boolean", "description": "Encrypt (else integrity only)."},
                "validate": {"enum": list(VALIDATE),
                             "description": "Frame validation (checked on an MKA link)."},
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
        if nicclass.macsec_offload_refused(driver, "phy") and setting == "macsec.offload":
            return ("offload mac only (macsec_offload_ops), ConnectX-7 onwards; offload phy is "
                    "refused")
        return None

    @staticmethod
    def offload_refused(driver, mode) -> Optional[str]:
        """Why `driver` refuses MACsec offload `mode` (nicclass's rule, which
        lint and the test fakes ask too), or None."""
        found = nicclass.macsec_offload_refused(driver, mode)
        return f"not supported by {driver}: {found.why} ({found.source})" if found else None

    def __init__(self, host):
        super().__init__(host)
        self._want: dict = {}     # target -> the expanded section (paths, pns, names)
        self._adopted: dict = {}  # target -> link name, for links nictune leaves to MKA
        self._mka: dict = {}      # target -> link name, for keys: mka entries
        self._static: list = []   # (target, link) with static keys, for the plan's warning
        self._up: dict = {}       # link name -> up, as read saw it
        self._missing: set = set()  # keys: mka targets with no macsec link yet

    # -- expand ------------------------------------------------------------------
    def _state(self):
        """(links by name, secys by ifindex) of the namespace."""
        with _macsec(self.host) as m:
            links = {ln.name: ln for ln in m.links()}
            secys = m.secys() if links else {}
        return links, secys

    def expand(self, target, sections, source):
        sec = sections["macsec"]
        if sec.get("keys") == "mka":
            return self._expand_mka(target, sec, source)
        if "validate" in sec:
            raise InvalidInput(f"{source('macsec', 'validate')}: macsec.validate: checked on an "
                               "MKA link (keys: mka) only; a link nictune makes validates strict")
        name = sec.get("name") or default_name(target)
        cipher = sec.get("cipher", DEFAULTS["cipher"])
        length = 32 if cipher.endswith("256") else 16
        xpn = cipher in XPN_CIPHERS
        if ("tx_sa" in sec or sec.get("rx")) and not xpn:
            raise InvalidInput(
                f"{source('macsec', 'cipher')}: macsec.cipher: static keys need an "
                f"extended-packet-number cipher (gcm-aes-xpn-128 or gcm-aes-xpn-256), not {cipher}: "
                "a re-install of a 32-bit-PN key repeats AES-GCM nonces, and its PNs run out in "
                "minutes at 400 Gb/s; better, let an MKA daemon own the keys (keys: mka)")

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
                                                   "fp": fp, "length": length,
                                                   "xpn": _xpn_of(node, source, where)}

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
        if plan["tx"] or plan["rx"]:
            self._static.append((target, name))
        self._want[target] = plan
        return out

    def _expand_mka(self, target, sec, source):
        """keys: mka: the offload mode (written) and the settings the profile
        gives (compared only); never a link or an SA."""
        for field in ("tx_sa", "rx", "port"):
            if field in sec:
                raise InvalidInput(f"{source('macsec', field)}: macsec.{field}: with keys: mka "
                                   "the MKA daemon owns the SAs and the SCI; remove it")
        name = sec.get("name") or self._mka_link(target, source)
        if name is None:  # the daemon has made none yet: reported, never made here
            self._missing.add(target)
            name = MKA_PLACEHOLDER
        self._mka[target] = name
        self._adopted[target] = name
        out = [Desired(Key(self.name, target, f"{name}/keys"), Want("mka"), source("macsec", "keys"))]
        for field in MKA_CHECKED[1:]:
            if field in sec:
                out.append(Desired(Key(self.name, target, f"{name}/{field}"), Want(sec[field]),
                                   source("macsec", field)))
        if "offload" in sec:
            out.append(Desired(Key(self.name, target, f"{name}/offload"), Want(sec["offload"]),
                               source("macsec", "offload")))
        return out

    def _mka_link(self, target: str, source) -> Optional[str]:
        """The one macsec link on target (the MKA daemon names it: macsec0...)."""
        try:
            links, _ = self._state()
        except OSError:
            return None
        parent = self._index(target)
        mine = sorted(ln.name for ln in links.values() if parent is not None and ln.link == parent)
        if len(mine) > 1:
            raise InvalidInput(f"{source('macsec', 'keys')}: macsec: {target} has macsec links "
                               f"{', '.join(mine)}: name the MKA daemon's with macsec.name")
        return mine[0] if mine else None

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
        self._record_marks(secys)
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
            self._up[name] = link.up
            out[k] = _value_of(what, link, secys.get(link.index))
        return out

    def _record_marks(self, secys: dict) -> None:
        """Every PN the kernel reports for an SA with nictune's KEYID raises
        its key's mark (best effort: a plan as another user still plans)."""
        seen: dict = {}
        for secy in secys.values():
            for sa in secy.tx_sas:
                if _fp_of(sa.keyid) and sa.pn:
                    raise_mark(seen, _fp_of(sa.keyid), "tx", sa.pn - 1 + PN_LEASE)
            for sc in secy.rx_scs:
                for sa in sc.sas:
                    if _fp_of(sa.keyid) and sa.pn:
                        raise_mark(seen, _fp_of(sa.keyid), "rx", sa.pn)
        if seen and self.state_dir:
            try:
                save_marks(self.state_dir, seen)
            except (OSError, NictuneError):
                pass

    def checked_only(self, key):
        name, what = split_name(key.name)
        if key.target not in self._mka:
            return False
        # drivers/net/macsec.c macsec_update_offload: EBUSY while the link
        # runs, and an MKA link runs once the daemon has it: then only
        # wpa_supplicant.conf (macsec_offload, 2.11 onwards) can change it.
        return what in MKA_CHECKED or (what == "offload" and self._up.get(name, False))

    def check(self, key, want):
        what = split_name(key.name)[1]
        if key.target in self._missing:
            return (f"no macsec link on {key.target}: the MKA daemon makes it (wpa_supplicant "
                    "-D macsec_linux with macsec_policy=1); start it, then apply again")
        if what == "offload" and want.value != "off":
            why = self.nic_support(self.driver_of(key.target), "macsec.offload")
            if why and why.startswith("not supported"):
                return why
            return self.offload_refused(self.driver_of(key.target), want.value)
        return None

    def warnings(self):
        return [f"{target}: {link} uses static MACsec keys (a lab feature): the same key is "
                "installed again on every re-apply (the agent at boot, rollback then apply), "
                "so its PNs start above the high-water mark nictune keeps in "
                f"{self.state_dir or 'the state directory'}/{PN_MARKS}; losing that file, or "
                "installing the key from another state directory or host, repeats AES-GCM "
                "nonces and exposes the key. Use keys: mka (wpa_supplicant owns the keys)"
                for target, link in self._static]

    def note(self, key):
        what = split_name(key.name)[1]
        if key.target in self._mka and what == "offload" and self.checked_only(key):
            return ("the MKA daemon's link is up, and the kernel changes a macsec link's offload "
                    "only while it is down (drivers/net/macsec.c macsec_update_offload: EBUSY): "
                    "compared, never written; set macsec_offload in wpa_supplicant.conf "
                    "(0 off, 1 phy, 2 mac; wpa_supplicant 2.11 onwards)")
        if key.target in self._mka and what in MKA_CHECKED:
            return (f"the MKA daemon's link: compared, never written; set it in "
                    f"wpa_supplicant.conf ({MKA_CONF.get(what, 'its network block')})")
        if key.target in self._adopted:
            return (f"{self._adopted[key.target]} was not made by nictune (an MKA daemon's, "
                    "e.g. wpa_supplicant): only its offload mode is managed; the kernel changes "
                    "it only while the link is down with no SA, so set macsec_offload in "
                    "wpa_supplicant.conf as well")
        plan = self._want.get(key.target) or {}
        if what == "tx_sa" and plan.get("tx"):
            return (f"key from {plan['tx']['path']} (fingerprint shown); its first PN is above "
                    f"the key's high-water mark (at least {plan['tx']['pn']})")
        if what.startswith("rx.") and what[3:] in plan.get("rx", {}):
            p = plan["rx"][what[3:]]
            return (f"key from {p['path']} (fingerprint shown); lowest PN accepted: the key's "
                    f"mark (at least {p['pn']})")
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
        pn = self._reserve_pn(p, "tx" if rx_sci is None else "rx")
        key, fp = self.host.io.key_load(p["path"], length=length)
        try:
            if fp != p["fp"]:
                raise InvalidInput(f"key file {p['path']} changed since the plan (fingerprint "
                                   f"{fp}, planned {p['fp']}); plan again")
            m.add_sa(index, p["an"], pn, _keyid(fp), key, rx_sci=rx_sci, xpn=p.get("xpn"))
        finally:
            keyfile.wipe(key)

    def _reserve_pn(self, p: dict, direction: str) -> int:
        """The SA's first PN, above the key's mark, with the new mark stored
        before the key reaches the kernel (a crash after the write must not
        let the next install start lower)."""
        if not self.state_dir:
            raise InvalidInput("static MACsec keys need a state directory for their PN marks")
        pn = first_pn(load_marks(self.state_dir), p["fp"], direction, p["pn"])
        if pn > 0xFFFFFFFFFFFFFFFF - PN_LEASE:
            raise InvalidInput(f"key {p['fp']} ({p['path']}) has used its PNs: rotate the key")
        reach = pn - 1 + PN_LEASE if direction == "tx" else pn
        save_marks(self.state_dir, {p["fp"]: {direction: reach}})
        return pn

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
