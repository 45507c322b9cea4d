"""Static IPsec SAs and policies on an interface, from key files, for lab
links and back-to-back rails (no IKE): what `ip xfrm state add ... offload
dev X dir out|in` and `ip xfrm policy add ... tmpl ...` would install,
written over NETLINK_XFRM (netlink/xfrm.py), never through argv.

Labs only: SAs are refused unless the section says `lab: true` (lint says
so too).  Nothing rekeys a static SA, and every re-install of the same key
(rollback then apply, the resident agent at boot, a changed setting)
starts its sequence numbers -- AES-GCM's nonces -- from 1 again, which
gives the authentication key away (LAB_WHY).  In production an IKE daemon
(strongSwan hw_offload, libreswan nic-offload) installs the SAs and
`expect: ipsec_offload` verifies them.  Even in a lab every SA gets what
IKE daemons give theirs: an anti-replay window (32..256 packets, default
128, in XFRMA_REPLAY_ESN_VAL), ESN (default on; netdevsim cannot offload
it: nicclass.ipsec_sa_refused), and soft/hard packet lifetimes (default
3e9/4e9, before the 32-bit sequence space and NIST SP 800-38D's conservative 2^32
invocations of one GCM key), optionally byte ones.  They are in the SA's
value ("... replay 128 esn lifetime packets 3000000000/4000000000"), so an
SA installed without them reads as changed and is replaced.

    interfaces:
      rail0:
        match: {name: eth0}
        ipsec:
          lab: true
          sas:
            - {src: 198.18.0.1, dst: 198.18.0.2, spi: 0x1001, reqid: 1,
               mode: transport, icv: 128, key_file: /etc/nictune/keys/rail0-out,
               offload: crypto, dir: out}
          policies:
            - {src: 198.18.0.1/32, dst: 198.18.0.2/32, dir: out,
               tmpl: {src: 198.18.0.1, dst: 198.18.0.2, mode: transport, reqid: 1}}

The smallest complete shape: ESP only, AEAD rfc4106(gcm(aes)) only (the
one algorithm the offloading drivers share: mlx5 and netdevsim take
nothing else), ICV 64/96/128 bits, key file of 20, 28 or 36 bytes (an
AES-128/192/256 key then the 4-byte salt, as `ip xfrm ... aead` takes it).
Offload none | crypto | packet, always to the entry's interface; `dir`
(out | in) is required when offloaded (the driver needs it).  A policy's
`offload: packet` offloads the policy too, which packet offload needs.

Keys (target: the matched interface):
  sa <dst> esp 0x<spi>        "<src> > <dst> reqid <r> <mode> rfc4106(gcm(aes))
                               <key bits> icv <n> offload <none|crypto dir X|...>
                               replay <w> esn|no-esn lifetime packets <s>/<h>
                               [bytes <s>/<h>]"
  policy <src> > <dst> dir <d> "tmpl <src> > <dst> esp <mode> reqid <r>
                               priority <p> offload none|packet"
The key never appears in a value: the plan's note names the key file and
its fingerprint (keyfile.py), and the kernel's copy of the key is never
read back (netlink/xfrm.py decodes no key).  So a new key in the same key
file is not seen as a change: in IPsec a new key is a new SA, with a new
SPI -- change the spi with the key.

Which SAs are nictune's: the reqid.  nictune installs its SAs and its
policies' templates with reqid REQID_BASE + the profile's reqid (1..65535;
REQID_BASE = 0x6e740000, "nt" in the high half), a block IKE daemons do not
allocate from (strongSwan counts up from 1, libreswan from 16384 in steps
of 8).  An SA with the same (dst, spi, esp) -- the kernel's identity of an
SA -- or a policy with the same selector and direction whose reqid is
outside the block is someone else's (an IKE daemon's, or one added by
hand): it reads as Unsupported and is never replaced nor deleted.  A
rollback deletes an SA or policy only when the journal says it was absent
before the apply AND its reqid is still nictune's; one of nictune's whose
parameters changed is deleted and added again by apply, and cannot be put
back by a rollback (the old key is not kept, by design): revert-failed,
and so is a policy of nictune's changed in place (kept simple: delete it
and apply the old profile).

`nictune show` lists no `ipsec:` section: a profile's SA needs its key
file, which the kernel does not know (expect: ipsec_offload and the health
facts ipsec_sa_offloaded / _software show where SAs run).

What each NIC class offers: host/facts/ipsec.py (mlx5_core crypto and packet,
mana none; netdevsim, the VM tier's, crypto).
"""

from __future__ import annotations

from typing import Optional

from nictune.host.transports import keyfile
from nictune.host.errors import InvalidInput
from nictune.host.facts.ipsec import OFFLOAD_MODES, support_note
from nictune.host.knobs.base import Family
from nictune.host.model import Desired, Key, Unsupported, Want
from nictune.host.validate import ABS_PATH, NOT_NORMALISED

REQID_BASE = 0x6E740000
AEAD = "rfc4106(gcm(aes))"
ICVS = (64, 96, 128)
KEY_LENGTHS = (20, 28, 36)  # AES-128/192/256 key + 4-byte salt
OFFLOADS = ("none", "crypto", "packet")
MODES = ("transport", "tunnel")
ADDRESS = r"^[0-9A-Fa-f:.]{2,39}$"
PREFIX = r"^[0-9A-Fa-f:.]{2,39}(/[0-9]{1,3})?$"
SPI_MIN = 0x100  # 1..255 are reserved (RFC 4303)
# Anti-replay windows in packets: the sizes mlx5 packet offload takes for an
# inbound SA (en_accel/ipsec.c mlx5e_xfrm_validate_state), so a profile that
# moves to packet offload keeps its window.
REPLAY_WINDOWS = (32, 64, 128, 256)
DEFAULT_WINDOW = 128
# Packet lifetimes: the SA is deleted (hard) before 2^32 packets -- the
# 32-bit sequence space of an SA without ESN, and the conservative line of
# NIST SP 800-38D section 8.3 (2^32 invocations of one AES-GCM key when its
# IVs are not built deterministically); at the soft limit the kernel tells
# key managers (XFRM_MSG_EXPIRE), which for a static SA nobody hears.
DEFAULT_SOFT_PACKETS = 3_000_000_000
DEFAULT_HARD_PACKETS = 4_000_000_000
SEQ32_MAX = 0xFFFFFFFF
XFRM_INF_VALUE = 0xFFFFFFFFFFFFFFFF  # netlink/xfrm.py XFRM_INF, without importing pyroute2
LIMIT_MAX = XFRM_INF_VALUE - 1  # XFRM_INF itself means no limit
LAB_WHY = ("nothing rekeys a static SA, and every re-install of the same key (a rollback "
           "then an apply, the resident agent at boot, a changed setting) starts its "
           "sequence numbers, and so AES-GCM's nonces, again from 1: the same nonce under "
           "the same key reveals the authentication key")


def nictune_reqid(kernel_reqid: int) -> Optional[int]:
    """The profile reqid of a kernel reqid in nictune's block, else None."""
    low = kernel_reqid - REQID_BASE
    return low if 1 <= low <= 0xFFFF else None


def sa_name(dst: str, spi: int) -> str:
    return f"sa {dst} esp 0x{spi:08x}"


def policy_name(src: str, dst: str, direction: str) -> str:
    return f"policy {src} > {dst} dir {direction}"


def _reqid_text(kernel_reqid: int) -> str:
    mine = nictune_reqid(kernel_reqid)
    return f"reqid {mine}" if mine is not None else f"reqid 0x{kernel_reqid:x} (not nictune's)"


def sa_text(src, dst, reqid_text, mode, alg, key_bits, icv, offload, replay=None) -> str:
    text = (f"{src} > {dst} {reqid_text} {mode} {alg} {key_bits} bits icv {icv} "
            f"offload {offload}")
    return f"{text} {replay}" if replay else text


def _limit(value: int) -> str:
    return "inf" if value == XFRM_INF_VALUE else str(value)


def replay_text(window: int, esn: bool, limits) -> str:
    """"replay 128 esn lifetime packets 3000000000/4000000000": the
    anti-replay window, ESN, and the soft/hard limits (bytes only when set)."""
    text = (f"replay {window} {'esn' if esn else 'no-esn'} lifetime packets "
            f"{_limit(limits.soft_packets)}/{_limit(limits.hard_packets)}")
    if (limits.soft_bytes, limits.hard_bytes) != (XFRM_INF_VALUE, XFRM_INF_VALUE):
        text += f" bytes {_limit(limits.soft_bytes)}/{_limit(limits.hard_bytes)}"
    return text



def policy_text(tmpl_src, tmpl_dst, reqid_text, mode, priority, offload) -> str:
    return (f"tmpl {tmpl_src} > {tmpl_dst} esp {mode} {reqid_text} priority {priority} "
            f"offload {offload}")


def _xfrm(host):
    return host.xfrm()


class IpsecFamily(Family):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rail:
    match: {name: eth2}
    ipsec:
      sas:
        - {src: 198.18.0.1, dst: 198.18.0.2, spi: 0x1001, reqid: 1,
           key_file: /etc/nictune/keys/rail0-out, offload: crypto, dir: out}
      policies:
        - {src: 198.18.0.1/32, dst: 198.18.0.2/32, dir: out,
           tmpl: {src: 198.18.0.1, dst: 198.18.0.2, reqid: 1}}
"""
    name = "ipsec"
    position = 96
    position_note = ("after the device's features (esp-hw-offload must be on before an SA is "
                     "offloaded to it), before link admin state; a rollback deletes the "
                     "policies, then the SAs")
    # A plan reads the xfrm SA table and the SAs' key files, which a
    # recorded show does not read.
    offline_plan = "the xfrm SA table and the SAs' key files are not in a snapshot"
    sections = ("ipsec",)
    settings = ("ipsec.lab", "ipsec.sas", "ipsec.policies")

    @classmethod
    def schema(cls, s):
        address = {**s.text(ADDRESS, 39, words="an IPv4 or IPv6 address"),
                   "description": "An IPv4 or IPv6 address."}
        prefix = {**s.text(PREFIX, 43, words="an IPv4 or IPv6 address or prefix"),
                  "description": "An address or prefix (address/len); a bare address is /32 "
                                 "or /128."}
        reqid = {**s.integer(1, 65535),
                 "description": "Request id, 1 to 65535 (installed as 0x6e740000 + reqid: "
                                "the block marks nictune's SAs)."}
        mode = {"enum": list(MODES), "description": "transport (default) or tunnel."}
        sa = s.section("A static ESP SA from a key file.", {
            "src": address, "dst": address,
            "proto": {"enum": ["esp"], "description": "esp (the only one)."},
            "spi": {**s.integer(SPI_MIN, s.U32), "description": "SPI, 256 to 4294967295."},
            "reqid": reqid, "mode": mode,
            "aead": {"enum": [AEAD], "description": "AEAD algorithm (the only one)."},
            "icv": {"enum": list(ICVS), "description": "ICV length in bits (default 128)."},
            "key_file": {**s.text(ABS_PATH, 256), "not": {"pattern": NOT_NORMALISED},
                         "description": "File with the key then the 4-byte salt in hex (20, "
                                        "28 or 36 bytes): a regular file owned by root, mode "
                                        "0600, with no symbolic link on its path. Plans show "
                                        "its fingerprint."},
            "offload": {"enum": list(OFFLOADS),
                        "description": "none (software), crypto or packet offload to this "
                                       "interface (default none)."},
            "dir": {"enum": ["out", "in"],
                    "description": "Direction of the SA; required when offloaded."},
            "replay_window": {"enum": list(REPLAY_WINDOWS),
                              "description": "Anti-replay window in packets (default "
                                             f"{DEFAULT_WINDOW}; the sizes mlx5 packet offload "
                                             "takes)."},
            "esn": {"type": "boolean",
                    "description": "64-bit extended sequence numbers (default true; false for "
                                   "a device that cannot offload ESN, such as netdevsim: "
                                   "then the hard packet limit is at most 4294967295)."},
            "lifetime": s.section(
                "Soft and hard limits: at the hard one the kernel deletes the SA (its traffic "
                "stops: nothing rekeys a static SA), at the soft one it only tells key "
                "managers.", {
                    "soft_packets": {**s.integer(1, LIMIT_MAX),
                                     "description": f"Default {DEFAULT_SOFT_PACKETS}."},
                    "hard_packets": {**s.integer(1, LIMIT_MAX),
                                     "description": f"Default {DEFAULT_HARD_PACKETS}: before "
                                                    "2^32, the 32-bit sequence space and NIST "
                                                    "SP 800-38D's conservative bound for one "
                                                    "AES-GCM key."},
                    "soft_bytes": {**s.integer(1, LIMIT_MAX),
                                   "description": "Default none."},
                    "hard_bytes": {**s.integer(1, LIMIT_MAX),
                                   "description": "Default none."},
                }),
        }, required=["src", "dst", "spi", "reqid", "key_file"])
        policy = s.section("A policy sending (out) or accepting (in, fwd) traffic through "
                           "nictune's SA.", {
                               "src": prefix, "dst": prefix,
                               "dir": {"enum": ["out", "in", "fwd"], "description": "Direction."},
                               "priority": {**s.integer(0, s.U32),
                                            "description": "Priority (default 0)."},
                               "offload": {"enum": ["none", "packet"],
                                           "description": "packet: offload the policy to this "
                                                          "interface (packet offload needs it)."},
                               "tmpl": s.section("The SA the traffic goes through.", {
                                   "src": address, "dst": address,
                                   "proto": {"enum": ["esp"], "description": "esp."},
                                   "mode": mode, "reqid": reqid,
                               }, required=["src", "dst", "reqid"]),
                           }, required=["src", "dst", "dir", "tmpl"])
        return {"entry": {"ipsec": s.section(
            "Static IPsec SAs and policies (no IKE), for lab links and back-to-back rails: "
            "installed from key files over NETLINK_XFRM, optionally offloaded to this "
            "interface; an SA or policy nictune did not install is never touched. Static "
            "SAs need lab: true (nothing rekeys them); in production let an IKE daemon "
            "install the SAs and check them with expect: ipsec_offload.", {
                "lab": {"type": "boolean",
                        "description": "true: this is a lab, where static SAs are allowed "
                                       "(refused without it: " + LAB_WHY + ")."},
                "sas": {"type": "array", "items": sa, "maxItems": 64,
                        "description": "The SAs (ip xfrm state add)."},
                "policies": {"type": "array", "items": policy, "maxItems": 64,
                             "description": "The policies (ip xfrm policy add)."},
            }, title="IPsec", minProperties=1)}}

    @classmethod
    def nic_support(cls, driver, setting):
        return support_note(driver) if setting == "ipsec.sas" else None

    def __init__(self, host):
        super().__init__(host)
        self._sas: dict = {}       # Key -> the SA's plan (addresses, key file, fingerprint)
        self._policies: dict = {}  # Key -> the policy's plan

    # -- expand ------------------------------------------------------------------
    def expand(self, target, sections, source):
        sec = sections["ipsec"]
        out = []
        if sec.get("sas") and sec.get("lab") is not True:
            raise InvalidInput(
                f"{source('ipsec', 'sas') or source('ipsec')}: ipsec.sas: static SAs are "
                f"refused outside a lab: {LAB_WHY}. Let an IKE daemon (strongSwan with "
                "hw_offload, libreswan with nic-offload) install the SAs and check them with "
                "expect: {ipsec_offload: {if_present: crypto}}; on a lab link, set "
                "ipsec.lab: true")
        for i, sa in enumerate(sec.get("sas") or ()):
            where = source("ipsec", "sas", str(i))
            plan = self._sa_plan(sa, where, f"ipsec.sas[{i}]",
                                 source("ipsec", "sas", str(i), "key_file") or where)
            key = Key(self.name, target, sa_name(plan["dst"], plan["spi"]))
            if key in self._sas:
                raise InvalidInput(f"{where}: ipsec.sas[{i}]: a second SA to {plan['dst']} "
                                   f"with spi 0x{plan['spi']:08x}")
            self._sas[key] = plan
            out.append(Desired(key, Want(plan["text"]), where))
        for i, pol in enumerate(sec.get("policies") or ()):
            where = source("ipsec", "policies", str(i))
            plan = self._policy_plan(pol, where, f"ipsec.policies[{i}]")
            key = Key(self.name, target, policy_name(plan["src"], plan["dst"], plan["dir"]))
            if key in self._policies:
                raise InvalidInput(f"{where}: ipsec.policies[{i}]: a second policy "
                                   f"{plan['src']} > {plan['dst']} dir {plan['dir']}")
            self._policies[key] = plan
            out.append(Desired(key, Want(plan["text"]), where))
        return out

    @staticmethod
    def _addresses(where: str, path: str, *texts, prefix: bool = False) -> list:
        import ipaddress  # only profiles with an ipsec: section pay for it

        out = []
        try:
            for t in texts:
                out.append(str(ipaddress.ip_network(t, strict=True)) if prefix
                           else str(ipaddress.ip_address(t)))
            if len({ipaddress.ip_network(t, strict=False).version for t in out}) != 1:
                raise ValueError("one IPv4 and one IPv6 address: both must be of one family")
        except ValueError as e:
            raise InvalidInput(f"{where}: {path}: {e}") from None
        return out

    def _sa_plan(self, sa: dict, where: str, path: str, key_where: str) -> dict:
        src, dst = self._addresses(where, path, sa["src"], sa["dst"])
        offload = sa.get("offload", "none")
        if offload != "none" and "dir" not in sa:
            raise InvalidInput(f"{where}: {path}: an offloaded SA needs dir: out or in")
        try:
            key, fp = self.host.io.key_load(sa["key_file"])
        except InvalidInput as e:
            raise InvalidInput(f"{key_where}: {path}.key_file: {e}") from None
        length = len(key)
        keyfile.wipe(key)
        if length not in KEY_LENGTHS:
            raise InvalidInput(f"{key_where}: {path}.key_file: key file {sa['key_file']} holds "
                               f"{length} bytes; {AEAD} takes 20, 28 or 36 (an AES-128, -192 "
                               "or -256 key, then the 4-byte salt)")
        mode, icv = sa.get("mode", "transport"), sa.get("icv", 128)
        shown = "none" if offload == "none" else f"{offload} dir {sa['dir']}"
        window, esn = sa.get("replay_window", DEFAULT_WINDOW), sa.get("esn", True)
        limits = self._limits(sa.get("lifetime") or {}, esn, where, path)
        return {"src": src, "dst": dst, "spi": sa["spi"], "reqid": sa["reqid"], "mode": mode,
                "icv": icv, "offload": offload, "dir": sa.get("dir"), "path": sa["key_file"],
                "fp": fp, "length": length, "window": window, "esn": esn, "limits": limits,
                "text": sa_text(src, dst, f"reqid {sa['reqid']}", mode, AEAD, length * 8, icv,
                                shown, replay_text(window, esn, limits))}

    @staticmethod
    def _limits(lifetime: dict, esn: bool, where: str, path: str):
        from nictune.host.transports.netlink.xfrm import Limits

        limits = Limits(soft_bytes=lifetime.get("soft_bytes", XFRM_INF_VALUE),
                        hard_bytes=lifetime.get("hard_bytes", XFRM_INF_VALUE),
                        soft_packets=lifetime.get("soft_packets", DEFAULT_SOFT_PACKETS),
                        hard_packets=lifetime.get("hard_packets", DEFAULT_HARD_PACKETS))
        for kind in ("packets", "bytes"):
            soft, hard = getattr(limits, "soft_" + kind), getattr(limits, "hard_" + kind)
            if hard != XFRM_INF_VALUE and soft >= hard:
                # The xfrm stack takes it; mlx5 packet offload refuses it.
                raise InvalidInput(f"{where}: {path}.lifetime: soft_{kind} {_limit(soft)} is "
                                   f"not below hard_{kind} {hard} (mlx5 packet offload "
                                   "refuses that: give a soft limit below the hard one)")
        if not esn and limits.hard_packets > SEQ32_MAX:
            raise InvalidInput(f"{where}: {path}.lifetime.hard_packets: {limits.hard_packets} "
                               f"is past the 32-bit sequence space ({SEQ32_MAX}) of an SA "
                               "without ESN, whose traffic would stop with EOVERFLOW first")
        return limits

    def _policy_plan(self, pol: dict, where: str, path: str) -> dict:
        src, dst = self._addresses(where, path, pol["src"], pol["dst"], prefix=True)
        t = pol["tmpl"]
        tsrc, tdst = self._addresses(where, path + ".tmpl", t["src"], t["dst"])
        self._addresses(where, path, src, tsrc, prefix=True)
        mode, priority = t.get("mode", "transport"), pol.get("priority", 0)
        offload = pol.get("offload", "none")
        return {"src": src, "dst": dst, "dir": pol["dir"], "priority": priority,
                "offload": offload, "tmpl": {"src": tsrc, "dst": tdst, "mode": mode,
                                             "reqid": t["reqid"]},
                "text": policy_text(tsrc, tdst, f"reqid {t['reqid']}", mode, priority,
                                    offload)}

    # -- read ----------------------------------------------------------------------
    def _index(self, ifname: str) -> Optional[int]:
        return next((i.index for i in self.host.interfaces() if i.name == ifname), None)

    def _names(self) -> dict:
        return {i.index: i.name for i in self.host.interfaces()}

    def read(self, keys):
        with _xfrm(self.host) as x:
            sas = {(sa.dst, sa.spi): sa for sa in x.sas() if sa.proto == "esp"}
            policies = {policy_name(p.src, p.dst, p.dir): p for p in x.policies()}
        names = self._names()
        out: dict = {}
        for k in keys:
            if k in self._sas:
                p = self._sas[k]
                out[k] = self._sa_value(sas.get((p["dst"], p["spi"])), k.target, names)
            elif k in self._policies:
                out[k] = self._policy_value(policies.get(k.name), k.target, names)
            else:  # a rollback's key: read from the kernel alone
                out[k] = self._value_of(k, sas, policies, names)
        return out

    def _value_of(self, k: Key, sas: dict, policies: dict, names: dict):
        if k.name.startswith("policy "):
            return self._policy_value(policies.get(k.name), k.target, names)
        _sa, dst, _esp, spi = k.name.split(" ")
        return self._sa_value(sas.get((dst, int(spi, 16))), k.target, names)

    @staticmethod
    def _offload_text(off, target: str, names: dict, direction: Optional[str]) -> str:
        if off is None:
            return "none"
        where = names.get(off.ifindex, f"ifindex {off.ifindex}")
        text = f"{off.mode} dir {direction}"
        return text if where == target else f"{text} on {where}"

    def _sa_value(self, sa, target: str, names: dict):
        if sa is None:
            return None
        if nictune_reqid(sa.reqid) is None:
            return Unsupported(f"SA {sa.label()} exists and was not installed by nictune "
                               f"(reqid 0x{sa.reqid:x}: an IKE daemon's, or added by hand); "
                               "nictune neither replaces nor deletes it")
        alg = next((a for a in sa.algs if a.kind == "aead"), None)
        name, bits, icv = (alg.name, alg.key_bits, alg.icv_bits) if alg else (
            "+".join(a.name for a in sa.algs) or "no-aead", 0, 0)
        return sa_text(sa.src, sa.dst, _reqid_text(sa.reqid), sa.mode, name, bits, icv,
                       self._offload_text(sa.offload, target, names, sa.dir),
                       replay_text(sa.replay_window, sa.esn, sa.limits))

    def _policy_value(self, pol, target: str, names: dict):
        if pol is None:
            return None
        if not pol.templates or any(nictune_reqid(t.reqid) is None for t in pol.templates):
            return Unsupported(f"{pol.label()} exists and was not installed by nictune (its "
                               "template's reqid is not in nictune's block: an IKE daemon's, "
                               "or added by hand); nictune neither replaces nor deletes it")
        t = pol.templates[0]
        off = "none"
        if pol.offload is not None:
            where = names.get(pol.offload.ifindex, f"ifindex {pol.offload.ifindex}")
            off = ("packet" if pol.offload.packet else "crypto") + (
                "" if where == target else f" on {where}")
        return policy_text(t.src, t.dst, _reqid_text(t.reqid), t.mode, pol.priority, off)

    def check(self, key, want):
        from nictune.host.facts.nicclass import ipsec_sa_refused

        plan = self._sas.get(key)
        if plan and plan["offload"] != "none":
            driver = self.driver_of(key.target)
            refused = ipsec_sa_refused(driver, plan["offload"], plan["esn"])
            if refused is not None:
                return f"not supported by {driver}: {refused.why} ({refused.source})"
            modes = OFFLOAD_MODES.get(driver)
            if modes is not None and plan["offload"] not in modes:
                return support_note(driver) if not modes else (
                    f"not supported by {driver}: {plan['offload']} offload (it offers "
                    f"{' and '.join(modes)})")
        return None

    def note(self, key):
        if key in self._sas:
            p = self._sas[key]
            return (f"key from {p['path']} (fingerprint {p['fp']}); installed with reqid "
                    f"0x{REQID_BASE + p['reqid']:x}; a rollback deletes it; a static SA, for "
                    "labs: nothing rekeys it, and installing this key again restarts its "
                    "AES-GCM nonces (change the key and the SPI together)")
        if key in self._policies:
            return "a rollback deletes it"
        return ""

    # -- write ---------------------------------------------------------------------
    def apply(self, items):
        sas = [(k, v) for k, v in items if k in self._sas]
        policies = [(k, v) for k, v in items if k in self._policies]
        with _xfrm(self.host) as x:
            current = {(sa.dst, sa.spi): sa for sa in x.sas() if sa.proto == "esp"}
            for key, _value in sas:
                self._add_sa(x, key, current)
            existing = {policy_name(p.src, p.dst, p.dir): p for p in x.policies()}
            for key, _value in policies:
                self._add_policy(x, key, existing.get(key.name))

    def _add_sa(self, x, key: Key, current: dict) -> None:
        from nictune.host.transports.netlink.xfrm import newsa_message

        p = self._sas[key]
        old = current.get((p["dst"], p["spi"]))
        if old is not None:
            if nictune_reqid(old.reqid) is None:  # not ours: never replaced
                raise InvalidInput(f"SA {old.label()} was not installed by nictune (reqid "
                                   f"0x{old.reqid:x}); refused")
            x.del_sa(old.src, old.dst, old.spi)
        offload = None
        if p["offload"] != "none":
            index = self._index(key.target)
            if index is None:
                raise InvalidInput(f"{key.target}: no such interface to offload IPsec to")
            offload = (index, p["dir"], p["offload"] == "packet")
        raw, fp = self.host.io.key_load(p["path"], length=p["length"])
        try:
            if fp != p["fp"]:
                raise InvalidInput(f"key file {p['path']} changed since the plan (fingerprint "
                                   f"{fp}, planned {p['fp']}); plan again")
            msg = newsa_message(p["src"], p["dst"], p["spi"], REQID_BASE + p["reqid"],
                                p["mode"], AEAD, p["icv"], raw, offload,
                                replay_window=p["window"], esn=p["esn"], limits=p["limits"])
            x.add_sa(msg)
        finally:
            keyfile.wipe(raw)

    def _add_policy(self, x, key: Key, old) -> None:
        from nictune.host.transports.netlink.xfrm import newpolicy_message, template_bytes

        p = self._policies[key]
        if old is not None:
            if not old.templates or any(nictune_reqid(t.reqid) is None for t in old.templates):
                raise InvalidInput(f"{old.label()} was not installed by nictune; refused")
            x.del_policy(p["src"], p["dst"], p["dir"])
        t = p["tmpl"]
        index = None
        if p["offload"] == "packet":
            index = self._index(key.target)
            if index is None:
                raise InvalidInput(f"{key.target}: no such interface to offload IPsec to")
        x.add_policy(newpolicy_message(
            p["src"], p["dst"], p["dir"],
            [template_bytes(t["src"], t["dst"], REQID_BASE + t["reqid"], t["mode"])],
            priority=p["priority"], offload=index))

    def revert(self, items):
        # Policies first (they point at the SAs), then SAs.
        ordered = sorted(items, key=lambda kv: not kv[0].name.startswith("policy "))
        failed = []
        with _xfrm(self.host) as x:
            sas = {(sa.dst, sa.spi): sa for sa in x.sas() if sa.proto == "esp"}
            policies = {policy_name(p.src, p.dst, p.dir): p for p in x.policies()}
            for key, before in ordered:
                if before is not None:
                    failed.append(key.name)
                    continue
                if key.name.startswith("policy "):
                    pol = policies.get(key.name)
                    if pol is not None and pol.templates and all(
                            nictune_reqid(t.reqid) is not None for t in pol.templates):
                        x.del_policy(pol.src, pol.dst, pol.dir)
                    continue
                _sa, dst, _esp, spi = key.name.split(" ")
                sa = sas.get((dst, int(spi, 16)))
                if sa is not None and nictune_reqid(sa.reqid) is not None:
                    x.del_sa(sa.src, sa.dst, sa.spi)
        if failed:
            raise InvalidInput(f"{', '.join(failed)}: changed in place by the apply; the "
                               "previous SA's key is not kept (by design), so it cannot be "
                               "put back")
