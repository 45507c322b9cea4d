"""Labs for demos and tests: network namespaces on this machine that stand in
for hosts (namespaces.py: two joined by veth; fleet.py: N hosts, each with
its own sshd).  Controller side; never shipped to a host."""
