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
