"""Every knob family, registered here and nowhere else.

CATALOG names each family's module and class and the profile sections it
owns, so that the agent imports only the families a command needs
(families_for(), load()): a verify of sysctls and MTUs does not pay for
importing OVS, IPsec or MACsec.  REGISTERED and FAMILIES import them all,
on first use (the controller's schema, docs/reference/profile.md, `show`);
tests/unit/test_agent_imports.py checks CATALOG against the classes.

REGISTERED is in the order a reader meets the sections in a profile (and
in the schema and docs/reference/profile.md).  FAMILIES is the order an
apply writes them: each family's `position`, whose reason its module gives.
In short: sysctls and files first; then device settings, channels before
rings; global pause before DCB, DCB before the RoCE files; link MTU and
admin state last.  Expectations (expect:) are only read.
"""

# name -> (module under nictune.host.knobs, class, entry sections, host
# sections), in REGISTERED order.
CATALOG = {
    "link": ("link", "LinkFamily", ("mtu", "txqueuelen", "state"), ()),
    "eswitch": ("eswitch", "EswitchFamily", ("eswitch",), ()),
    "sriov": ("sriov", "SriovFamily", ("sriov",), ()),
    "features": ("ethtool", "FeaturesFamily", ("features",), ()),
    "crypto": ("crypto", "CryptoFamily", ("crypto",), ()),
    "rings": ("ethtool", "RingsFamily", ("rings",), ()),
    "channels": ("ethtool", "ChannelsFamily", ("channels",), ()),
    "coalesce": ("ethtool", "CoalesceFamily", ("coalesce",), ()),
    "pause": ("ethtool", "PauseFamily", ("pause",), ()),
    "sysctl": ("sysctl", "SysctlFamily", ("sysctl",), ("sysctl",)),
    "roce": ("roce", "RoceFamily", ("roce",), ()),
    "dcb": ("dcb", "DcbFamily", ("roce",), ()),
    "tunable": ("tunable", "TunableFamily", ("roce",), ()),
    "nccl": ("nccl", "NcclFamily", (), ("nccl",)),
    "ucx": ("ucx", "UcxFamily", (), ("ucx",)),
    "mpi": ("mpi", "MpiFamily", (), ("mpi",)),
    "nvshmem": ("nvshmem", "NvshmemFamily", (), ("nvshmem",)),
    "ovs": ("ovs", "OvsFamily", (), ("ovs",)),
    "macsec": ("macsec", "MacsecFamily", ("macsec",), ()),
    "ipsec": ("ipsec", "IpsecFamily", ("ipsec",), ()),
    "expect": ("expect", "ExpectFamily", ("expect",), ()),
}


def load(name: str):
    """The family class named `name` (KeyError for one nictune does not
    know), importing its module alone."""
    module, cls, _, _ = CATALOG[name]
    return getattr(__import__("nictune.host.knobs." + module, fromlist=[cls]), cls)


def families_for(doc: dict) -> list:
    """The names of the families whose sections the profile document uses."""
    entries = (doc.get("interfaces") or {}).values()
    used = {s for entry in entries if isinstance(entry, dict) for s in entry}
    host = doc.get("host") or {}
    return [name for name, (_, _, sections, host_sections) in CATALOG.items()
            if used.intersection(sections) or any(s in host for s in host_sections)]


def family_named(name: str):
    """The family class whose keys carry `name`, or None."""
    return load(name) if name in CATALOG else None


def __getattr__(attr: str):
    # REGISTERED and FAMILIES import every family: computed once, on first use.
    if attr == "REGISTERED":
        value = tuple(load(name) for name in CATALOG)
    elif attr == "FAMILIES":
        value = tuple(sorted(__getattr__("REGISTERED"), key=lambda family: family.position))
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    globals()[attr] = value
    return value
