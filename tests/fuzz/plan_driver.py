"""Many agent requests, one process (test helper for the fuzz tests).

Runs under `ip netns exec NS`: reads one JSON request per line and writes
one host report per line, through the agent's own run(), reusing one Host
so thousands of plans cost seconds, not a process each.  An exception that
escapes run() is the finding: it is written as {"escaped": "..."} so the
test can name the request that caused it.
"""

from __future__ import annotations

import json
import sys
import traceback

from nictune.host import agent
from nictune.host.machine import Host


def main() -> int:
    state_dir = sys.argv[1]
    host = Host()
    try:
        for line in sys.stdin:
            request = dict(json.loads(line), state_dir=state_dir)
            try:
                out = agent.run(request, host=host)
            except BaseException:  # noqa: BLE001 - the finding itself
                out = {"escaped": traceback.format_exc()}
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()
    finally:
        host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
