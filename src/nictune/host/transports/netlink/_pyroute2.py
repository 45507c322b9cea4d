"""pyroute2's message classes without pyroute2/__init__.py.

`import pyroute2` runs the package __init__, which imports every pyroute2
subsystem (asyncio, ndb, conntrack, ...) and costs 150-250 ms; the agent's
whole CPU budget per run is ~150 ms.  We only need the message classes, so
we put a bare module object for `pyroute2` into sys.modules (with the real
package's search path, so submodules still resolve) before importing them.
If something already imported the real pyroute2, we simply reuse it.

Never import pyroute2.netlink.nlsocket / .generic from here: they pull in
asyncio (~60 ms).
"""

from __future__ import annotations

import importlib.util
import sys
import types


def _install_bare_package() -> None:
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("pyroute2 is not installed")
    mod = types.ModuleType("pyroute2")
    mod.__path__ = list(spec.submodule_search_locations)
    mod.__spec__ = spec
    mod.__file__ = spec.origin
    mod.__package__ = "pyroute2"
    sys.modules["pyroute2"] = mod


_install_bare_package()

from pyroute2.netlink import (  # noqa: E402
    NLA_F_NESTED,
    ctrlmsg,
    genlmsg,
    nla,
    nlmsg,
)

__all__ = ["NLA_F_NESTED", "ctrlmsg", "genlmsg", "nla", "nlmsg"]
