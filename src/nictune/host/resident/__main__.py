"""`python3 -m nictune.host.resident`: the resident agent (daemon.py)."""

import sys

from nictune.host.resident.daemon import main

if __name__ == "__main__":  # importing this module (pkgutil.walk_packages) starts nothing
    sys.exit(main())
