"""Every knob family, in the order an apply writes them.

Sysctls and files first; then device settings, channels before rings
(changing the channel count can reallocate rings on mlx5 and MANA); global
pause before DCB (mlx5 keeps link pause and PFC in one port register and
will not run both: pause goes off before PFC comes on, and a rollback,
which walks this order backwards, turns PFC off before pause comes back);
DCB before the RoCE files (ECN enables are per priority, and the priority
a DSCP lands on is set by the DCB map); link MTU and admin state last,
since an MTU change reopens queues on both drivers and, on mlx5, resizes
the receive buffers that PFC headroom was computed for.  Expectations
(expect:) are only read.
"""

from nictune.host.knobs.dcb import DcbFamily
from nictune.host.knobs.expect import ExpectFamily
from nictune.host.knobs.ethtool import (
    ChannelsFamily,
    CoalesceFamily,
    FeaturesFamily,
    PauseFamily,
    RingsFamily,
)
from nictune.host.knobs.link import LinkFamily
from nictune.host.knobs.nccl import NcclFamily
from nictune.host.knobs.roce import RoceFamily
from nictune.host.knobs.sysctl import SysctlFamily

FAMILIES = (
    SysctlFamily,
    NcclFamily,
    FeaturesFamily,
    ChannelsFamily,
    RingsFamily,
    CoalesceFamily,
    PauseFamily,
    DcbFamily,
    RoceFamily,
    LinkFamily,
    ExpectFamily,  # read-only: health expectations, never written
)
