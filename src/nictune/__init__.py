"""nictune: plan, apply, verify and roll back NIC tuning on AI hosts.

The package has two sides, one directory apart.  The *host side*,
nictune/host/, runs on the machine being tuned and imports only the
standard library, this module and four files of pyroute2; it is what ships
to a host (control/remote/agentzip.py).  The *controller side* (cli, control,
profile, inventory, lab) may import anything, the host side included,
never the other way round.  This module holds only what both need: the
version and the format numbers.
"""

__version__ = "0.1.0"
REPORT_FORMAT = 1
# "nictune_request" in every request the agent takes; here, not in agent.py,
# so the controller can build requests without importing the agent.
REQUEST_FORMAT = 1
