"""Inline crypto offload per interface: the ethtool feature bits under names.

    crypto:
      tls_tx: true          # tls-hw-tx-offload        kTLS records encrypted by the NIC
      tls_rx: true          # tls-hw-rx-offload        kTLS records decrypted by the NIC
      esp: true             # esp-hw-offload           IPsec ESP crypto offload (xfrmdev_ops)
      esp_tx_csum: true     # esp-tx-csum-hw-offload   checksums inside ESP on transmit
      macsec: true          # macsec-hw-offload        MACsec offload (macsec_ops)

The bits are features like any other, so this family is the features
family (knobs/ethtool.py) with its own section and names: same dump, same
set message, same read-back.  What it adds is the NIC class's capability
table (nicclass.py, `crypto`): asking a class for an offload its driver has
no operations for reads, in plan, as "not supported by <driver>: ..."
before anything is written.  A bit the device reports [fixed] (veth: all
off; netdevsim: esp and macsec on, tls off) can only be asked for the value
it has; anything else is unsupported, with the reason.

These bits let the stack hand SAs and TLS sockets to the device; whether a
given SA or socket then runs there is what expect: ipsec_offload and the
kTLS counters (expect: counters: {TlsTxDevice: ...}) tell.
"""

from __future__ import annotations

from typing import Optional

from nictune.host.facts import nicclass
from nictune.host.knobs.ethtool import CRYPTO_BITS, FeaturesFamily
from nictune.host.model import Key, Unsupported

_WHAT = {
    "tls_tx": "kTLS transmit offload (tls-hw-tx-offload).",
    "tls_rx": "kTLS receive offload (tls-hw-rx-offload).",
    "esp": "IPsec ESP crypto offload (esp-hw-offload); SAs still need `offload dev`.",
    "esp_tx_csum": "Checksums inside ESP on transmit (esp-tx-csum-hw-offload).",
    "macsec": "MACsec offload (macsec-hw-offload); the link's own offload mode is macsec:.",
}


class CryptoFamily(FeaturesFamily):
    # The reference's example (docs/reference/profile.md), checked against the schema.
    example = """\
interfaces:
  rails:
    match: {driver: mlx5_core}
    crypto: {tls_tx: true, tls_rx: true, esp: true, esp_tx_csum: true, macsec: true}
"""
    name = "crypto"
    position = 31
    position_note = "with the features (the same ethtool bits), just after them"
    sections = ("crypto",)
    settings = tuple(f"crypto.{k}" for k in CRYPTO_BITS)

    @classmethod
    def schema(cls, s):
        return {"entry": {"crypto": s.section(
            "Inline crypto offload bits, by name (each on or off): the ethtool features "
            "tls-hw-tx-offload, tls-hw-rx-offload, esp-hw-offload, esp-tx-csum-hw-offload "
            "and macsec-hw-offload.",
            {k: {"type": "boolean", "description": _WHAT[k]} for k in CRYPTO_BITS},
            minProperties=1)}}

    @classmethod
    def nic_support(cls, driver, setting):
        name = setting.split(".", 1)[1]
        return nicclass.crypto_unsupported(driver, name) or (
            nicclass.crypto_note(driver, name))

    @classmethod
    def label(cls, target, name):
        return f"{name} ({CRYPTO_BITS.get(name, name)})"

    def key_name(self, name: str) -> str:
        return name  # the schema admits only CRYPTO_BITS' names

    def _bits(self, target: str, name: str, changeable_only: bool) -> list:
        dev = self._devices[target]
        bit = CRYPTO_BITS[name]
        if bit not in dev.active or (changeable_only and bit not in dev.changeable):
            return []
        return [bit]

    def read(self, keys):
        out = super().read(keys)
        for key in keys:
            if isinstance(out[key], Unsupported) and key.target in self._devices:
                # The kernel knows every bit; a device without one is an old kernel.
                out[key] = Unsupported(f"this kernel has no feature {CRYPTO_BITS[key.name]}")
        return out

    def check(self, key: Key, want) -> Optional[str]:
        if want.value:
            why = nicclass.crypto_unsupported(self.driver_of(key.target), key.name)
            if why:
                return why
        dev = self._devices.get(key.target)
        if dev is not None and not self._bits(key.target, key.name, True):
            bit = CRYPTO_BITS[key.name]
            state = "on" if dev.active.get(bit) else "off"
            return (f"{key.target}: {bit} is fixed {state} (the driver does not let it change); "
                    f"only {key.name}: {str(dev.active.get(bit, False)).lower()} can be met")
        return None

    def show(self, target):
        dev = self._shown_device(target)
        if dev is None:
            return {}
        # Only the bits the device lets change: fixed ones are not settings.
        shown = {k: dev.active[b] for k, b in CRYPTO_BITS.items() if b in dev.changeable}
        return {"crypto": shown} if shown else {}
