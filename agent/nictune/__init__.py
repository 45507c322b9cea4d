"""nictune: plan, apply, verify and roll back NIC tuning on AI hosts.

The package has two sides.  The *host side* (model, engine, knobs, netlink,
agent) runs on the machine being tuned and imports only the standard library
and parts of pyroute2.  The *controller side* (cli, profile loading, schema)
may import anything, including the host side, but never the other way round.
"""

__version__ = "0.1.0"
REPORT_FORMAT = 1
# "nictune_request" in every request the agent takes; here, not in agent.py,
# so the controller can build requests without importing the agent.
REQUEST_FORMAT = 1
