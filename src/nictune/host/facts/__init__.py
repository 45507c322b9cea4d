"""What the host is, read but never changed: the facts plans are made from.

health.py (link, congestion and error counters), rdma.py (RDMA devices, ports
and GID tables), nicclass.py (what each NIC driver can take), ibauto.py (the
`auto` RDMA device lists and GID indexes), ipsec.py (which IPsec SAs concern
an interface).  The Host itself (the interfaces, and the door to the kernel)
is host/machine.py.
"""
