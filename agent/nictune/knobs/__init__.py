"""Every knob family, in the order an apply writes them.

Sysctls and files first; then device settings, channels before rings
(changing the channel count can reallocate rings on mlx5 and MANA); link
MTU and admin state last, since an MTU change reopens queues on both
drivers.  Rollback walks this order backwards.
"""

from nictune.knobs.ethtool import (
    ChannelsFamily,
    CoalesceFamily,
    FeaturesFamily,
    PauseFamily,
    RingsFamily,
)
from nictune.knobs.link import LinkFamily
from nictune.knobs.nccl import NcclFamily
from nictune.knobs.sysctl import SysctlFamily

FAMILIES = (
    SysctlFamily,
    NcclFamily,
    FeaturesFamily,
    ChannelsFamily,
    RingsFamily,
    CoalesceFamily,
    PauseFamily,
    LinkFamily,
)
