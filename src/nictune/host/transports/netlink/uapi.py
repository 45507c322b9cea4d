"""Kernel ABI names the knob families' schemas use, without pyroute2.

The controller imports every family for its schema (profile/schema.py),
and the controller never loads pyroute2: the enums a schema lists live
here, and the netlink modules that encode them import them from here.
"""

# include/uapi/linux/devlink.h: enum devlink_eswitch_mode,
# devlink_eswitch_inline_mode, devlink_eswitch_encap_mode.
ESWITCH_MODES = {"legacy": 0, "switchdev": 1}
INLINE_MODES = {"none": 0, "link": 1, "network": 2, "transport": 3}
ENCAP_MODES = {"none": 0, "basic": 1}

# include/uapi/linux/if_link.h: IFLA_VF_LINK_STATE_AUTO, _ENABLE, _DISABLE.
VF_LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}

# include/uapi/linux/dcbnl.h: DCB_CAP_DCBX_* (dcbnl getdcbx/setdcbx modes).
DCBX_HOST, DCBX_LLD_MANAGED, DCBX_VER_CEE, DCBX_VER_IEEE, DCBX_STATIC = 1, 2, 4, 8, 16

# include/uapi/linux/ethtool.h: enum tunable_id ETHTOOL_PFC_PREVENTION_TOUT
# (milliseconds) and its PFC_STORM_PREVENTION_AUTO / _DISABLE values.
ETHTOOL_PFC_PREVENTION_TOUT = 3
PFC_STORM_PREVENTION_AUTO, PFC_STORM_PREVENTION_DISABLE = 0xFFFF, 0
