"""Every knob family, registered here and nowhere else.

REGISTERED is in the order a reader meets the sections in a profile (and
in the schema and docs/profile-reference.md).  FAMILIES is the order an
apply writes them: each family's `position`, whose reason its module gives.
In short: sysctls and files first; then device settings, channels before
rings; global pause before DCB, DCB before the RoCE files; link MTU and
admin state last.  Expectations (expect:) are only read.
"""

from nictune.host.knobs.crypto import CryptoFamily
from nictune.host.knobs.dcb import DcbFamily
from nictune.host.knobs.eswitch import EswitchFamily
from nictune.host.knobs.ethtool import (
    ChannelsFamily,
    CoalesceFamily,
    FeaturesFamily,
    PauseFamily,
    RingsFamily,
)
from nictune.host.knobs.expect import ExpectFamily
from nictune.host.knobs.ipsec import IpsecFamily
from nictune.host.knobs.link import LinkFamily
from nictune.host.knobs.macsec import MacsecFamily
from nictune.host.knobs.mpi import MpiFamily
from nictune.host.knobs.nccl import NcclFamily
from nictune.host.knobs.nvshmem import NvshmemFamily
from nictune.host.knobs.ovs import OvsFamily
from nictune.host.knobs.roce import RoceFamily
from nictune.host.knobs.sriov import SriovFamily
from nictune.host.knobs.sysctl import SysctlFamily
from nictune.host.knobs.tunable import TunableFamily
from nictune.host.knobs.ucx import UcxFamily

REGISTERED = (
    LinkFamily,
    EswitchFamily,
    SriovFamily,
    FeaturesFamily,
    CryptoFamily,
    RingsFamily,
    ChannelsFamily,
    CoalesceFamily,
    PauseFamily,
    SysctlFamily,
    RoceFamily,
    DcbFamily,
    TunableFamily,
    NcclFamily,
    UcxFamily,
    MpiFamily,
    NvshmemFamily,
    OvsFamily,
    MacsecFamily,
    IpsecFamily,
    ExpectFamily,
)

FAMILIES = tuple(sorted(REGISTERED, key=lambda family: family.position))


def family_named(name: str):
    """The family class whose keys carry `name`, or None."""
    return next((f for f in REGISTERED if f.name == name), None)
