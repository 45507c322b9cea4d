"""Every knob family, registered here and nowhere else: one line in REGISTRY.

A family's class says everything about it (its name, sections, position,
schema...).  CATALOG, below REGISTRY, is derived from the classes by
profile/catalog.py and kept in this file, so that the agent imports only the
families a command needs (families_for(), load()) without importing all of
them to learn who owns which section: a verify of sysctls and MTUs does not
pay for importing OVS, IPsec or MACsec.  tests/unit/test_agent_imports.py
fails when CATALOG is not what the classes say.  REGISTERED and FAMILIES
import them all, on first use (the controller's schema,
docs/reference/profile.md, `show`).

REGISTERED is in the order a reader meets the sections in a profile (and
in the schema and docs/reference/profile.md).  FAMILIES is the order an
apply writes them: each family's `position`, whose reason its module gives.
In short: sysctls and files first; then device settings, channels before
rings; global pause before DCB, DCB before the RoCE files; link MTU and
admin state last.  Expectations (expect:) are only read.

Adding a family: its module, its tests, its line in REGISTRY, then
`python -m nictune.profile.catalog` rewrites CATALOG.
"""

# The registration: "module.Class" under nictune.host.knobs, one line per
# family, in REGISTERED order.
REGISTRY = (
    "link.LinkFamily",
    "routing.RoutingFamily",
    "firmware.FirmwareFamily",
    "eswitch.EswitchFamily",
    "sriov.SriovFamily",
    "pcie.PcieFamily",
    "ethtool.FeaturesFamily",
    "crypto.CryptoFamily",
    "ethtool.RingsFamily",
    "ethtool.ChannelsFamily",
    "ethtool.CoalesceFamily",
    "ethtool.PauseFamily",
    "irq.IrqFamily",
    "sysctl.SysctlFamily",
    "roce.RoceFamily",
    "dcb.DcbFamily",
    "tunable.TunableFamily",
    "nccl.NcclFamily",
    "ucx.UcxFamily",
    "mpi.MpiFamily",
    "nvshmem.NvshmemFamily",
    "jobenv.SlurmTaskPrologFamily",
    "jobenv.EnrootEnvironFamily",
    "jobenv.EnrootMountsFamily",
    "jobenv.EnvironmentFamily",
    "ovs.OvsFamily",
    "macsec.MacsecFamily",
    "ipsec.IpsecFamily",
    "expect.ExpectFamily",
    "switch.SwitchFamily",
    "pcie.GpudirectFamily",
)

# BEGIN derived by profile/catalog.py from REGISTRY and the classes: do not edit.
# name -> (module, class, entry sections, host sections), in REGISTERED order.
CATALOG = {
    "link": ("link", "LinkFamily", ("mtu", "txqueuelen", "state"), ()),
    "routing": ("routing", "RoutingFamily", ("routing",), ()),
    "firmware": ("firmware", "FirmwareFamily", ("firmware",), ()),
    "eswitch": ("eswitch", "EswitchFamily", ("eswitch",), ()),
    "sriov": ("sriov", "SriovFamily", ("sriov",), ()),
    "pcie": ("pcie", "PcieFamily", ("pcie",), ()),
    "features": ("ethtool", "FeaturesFamily", ("features",), ()),
    "crypto": ("crypto", "CryptoFamily", ("crypto",), ()),
    "rings": ("ethtool", "RingsFamily", ("rings",), ()),
    "channels": ("ethtool", "ChannelsFamily", ("channels",), ()),
    "coalesce": ("ethtool", "CoalesceFamily", ("coalesce",), ()),
    "pause": ("ethtool", "PauseFamily", ("pause",), ()),
    "irq": ("irq", "IrqFamily", ("irq",), ()),
    "sysctl": ("sysctl", "SysctlFamily", ("sysctl",), ("sysctl",)),
    "roce": ("roce", "RoceFamily", ("roce",), ()),
    "dcb": ("dcb", "DcbFamily", ("roce",), ()),
    "tunable": ("tunable", "TunableFamily", ("roce",), ()),
    "nccl": ("nccl", "NcclFamily", (), ("nccl",)),
    "ucx": ("ucx", "UcxFamily", (), ("ucx",)),
    "mpi": ("mpi", "MpiFamily", (), ("mpi",)),
    "nvshmem": ("nvshmem", "NvshmemFamily", (), ("nvshmem",)),
    "slurm_task_prolog": ("jobenv", "SlurmTaskPrologFamily", (), ("slurm_task_prolog",)),
    "enroot_environ": ("jobenv", "EnrootEnvironFamily", (), ("enroot_environ",)),
    "enroot_mounts": ("jobenv", "EnrootMountsFamily", (), ("enroot_mounts",)),
    "environment": ("jobenv", "EnvironmentFamily", (), ("environment",)),
    "ovs": ("ovs", "OvsFamily", (), ("ovs",)),
    "macsec": ("macsec", "MacsecFamily", ("macsec",), ()),
    "ipsec": ("ipsec", "IpsecFamily", ("ipsec",), ()),
    "expect": ("expect", "ExpectFamily", ("expect",), ()),
    "switch": ("switch", "SwitchFamily", ("switch",), ()),
    "gpudirect": ("pcie", "GpudirectFamily", ("pcie",), ()),
}
# The host: sections of the families that own a file (knobs/envfile.py).
OWNED_FILE_SECTIONS = ("nccl", "ucx", "mpi", "nvshmem", "slurm_task_prolog", "enroot_environ", "enroot_mounts", "environment")
# The families whose keys a family asks for as defaults (Family.defaults_for).
DEFAULTS_FOR = {"routing": ("sysctl",)}
# END derived by profile/catalog.py.


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
    names = [name for name, (_, _, sections, host_sections) in CATALOG.items()
             if used.intersection(sections) or any(s in host for s in host_sections)]
    also = {other for name in names for other in DEFAULTS_FOR.get(name, ())}
    return [name for name in CATALOG if name in names or name in also]


def family_named(name: str):
    """The family class whose keys carry `name`, or None."""
    return load(name) if name in CATALOG else None


def derived_catalog() -> str:
    """The text profile/catalog.py keeps between the BEGIN and END lines,
    from REGISTRY and the classes it names (importing every family)."""
    from nictune.host.knobs.envfile import OwnedFileFamily

    classes = []
    for line in REGISTRY:
        module, _, cls = line.partition(".")
        classes.append(getattr(__import__("nictune.host.knobs." + module, fromlist=[cls]), cls))
    rows = [f"    {_text(c.name)}: ({_text(c.__module__.rpartition('.')[2])}, {_text(c.__name__)}, "
            f"{_text(c.sections)}, {_text(c.host_sections)})," for c in classes]
    owned = tuple(s for c in classes if issubclass(c, OwnedFileFamily) for s in c.host_sections)
    defaults = ", ".join(f"{_text(c.name)}: {_text(c.defaults_for)}" for c in classes if c.defaults_for)
    return "\n".join([
        "# name -> (module, class, entry sections, host sections), in REGISTERED order.",
        "CATALOG = {", *rows, "}",
        "# The host: sections of the families that own a file (knobs/envfile.py).",
        f"OWNED_FILE_SECTIONS = {_text(owned)}",
        "# The families whose keys a family asks for as defaults (Family.defaults_for).",
        f"DEFAULTS_FOR = {{{defaults}}}"]) + "\n"


def _text(value) -> str:
    """A str or tuple of str as Python source, in double quotes."""
    if isinstance(value, str):
        return '"' + value + '"'
    return "(" + ", ".join(map(_text, value)) + ("," if len(value) == 1 else "") + ")"


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
