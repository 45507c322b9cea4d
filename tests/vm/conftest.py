"""tests/vm/guest runs only inside the test VM (tests/vm/run.py sets
NICTUNE_VM_GUEST=1 there): on the host it would act on the host's kernel,
which has no RDMA."""

import os

collect_ignore = [] if os.environ.get("NICTUNE_VM_GUEST") == "1" else ["guest", "run.py"]
