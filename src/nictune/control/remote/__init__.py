"""Reaching hosts: the request an agent gets, where it runs (this host, a
namespace, SSH), the zipapp shipped to SSH targets, the agentless probe, and
many hosts at once (fleet.py)."""
