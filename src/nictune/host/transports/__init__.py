"""How the host side talks to the kernel and its neighbours.

io.py is the one door (`Host.io`): file reads and writes, netlink, ioctls,
OVSDB, key files; the live host's port and the base of the replaying ones.
netlink/ speaks the netlink protocols (rtnetlink, ethtool, devlink, DCB,
MACsec, XFRM) and the ethtool ioctl; ovsdb.py the OVSDB JSON-RPC protocol;
keyfile.py reads MACsec/IPsec key files without letting the key out.
"""
