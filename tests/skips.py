"""The one place that decides whether a skip may stand under CI.

A test skips when this machine lacks what it needs.  Outside CI that is a
skip that says why.  Under CI (CI=true, as CI services set it; see
in_ci) most such skips mean the run tested less than it says:
a tool scripts/setup installs is missing, the run is not root, network
namespaces or sshd do not work, a reference file is absent.  Those fail.

What stays a skip under CI is listed in MACHINE_SKIPS, each with why: a
property of the machine that scripts/setup cannot install and that CI
cannot be expected to have (an iproute2 too old for a subcommand, a kernel
package the VM tier installs later, a machine with systemd running...).
Everything not listed fails under CI, so a new environmental skip cannot
make CI pass having tested nothing.

tests/conftest.py applies the verdict to every test report and collection
report (pytest.skip, skipif, importorskip alike)."""

from __future__ import annotations

import os
import re
from typing import Optional

import pytest

# (pattern searched in the skip's reason, why it is a fact about the machine)
MACHINE_SKIPS = (
    (r"has no 'dcb .+' \(iproute2 >= ",
     "the distribution's iproute2 is older than the subcommand (Debian 12 ships 6.1, without "
     "'dcb apptrust'); scripts/setup installs the distribution's, there is no newer to install"),
    (r"no generic 6\.12 kernel or busybox here \(scripts/test-vm installs them\)",
     "the VM tier's kernel is installed by scripts/test-vm, which runs after pytest and fails "
     "under CI when it cannot"),
    (r"no 6\.12 kernel with its headers and source here \(scripts/test-vm installs them\)",
     "as above: scripts/test-vm installs them and fails under CI without them"),
    (r"this kernel has netdevsim loaded",
     "the guest tests would act on the host's own netdevsim devices"),
    (r"systemd runs here",
     "the test is for hosts without systemd; a machine running systemd cannot pretend otherwise"),
    (r"needs systemd-analyze",
     "systemd-analyze comes with systemd itself, which scripts/setup does not install"),
    (r"this machine already has a user ",
     "the test creates that user and will not touch an existing one"),
    (r"a lab is (already )?up on this machine",
     "a developer's lab is running; the test will not tear it down"),
    (r"no other python3 here",
     "other Python versions are the machine's (a pyenv, say), not something scripts/setup installs"),
    (r"no network interface but lo here",
     "a machine with only the loopback device has no real interface to name"),
)


def in_ci() -> bool:
    """CI set to a true value, as CI services set it (CI=true, CI=1)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def machine_reason(reason: str) -> Optional[str]:
    """Why `reason` may stay a skip under CI, or None when it must fail."""
    for pattern, why in MACHINE_SKIPS:
        if re.search(pattern, reason):
            return why
    return None


def ci_failure(reason: str) -> Optional[str]:
    """The failure message a skip for `reason` becomes, or None when the
    skip stands (not under CI, or a fact about the machine)."""
    if not in_ci() or machine_reason(reason) is not None:
        return None
    return (f"skipped under CI: {reason}. CI must run this test: install what it needs "
            "(scripts/setup), run as root with network namespaces and sshd, with the reference "
            "files beside the clone (tests/real_world.py), or, if this is a fact about the "
            "machine that nothing can install, list it in tests/skips.py MACHINE_SKIPS "
            "saying why")


def _skip_reason(report) -> Optional[str]:
    """The reason of a skipped report (not an xfail), else None."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason.removeprefix("Skipped: ")


def fail_environmental_skip(report) -> None:
    """Turn `report` (a test or collection report) into a failure when it
    is a skip that CI may not take."""
    reason = _skip_reason(report)
    if reason is None:
        return
    message = ci_failure(reason)
    if message is not None:
        report.outcome = "failed"
        report.longrepr = message


# Hook implementations: tests/conftest.py imports them; a pytest run
# outside tests/ gets them with `-p skips`.


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_environmental_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    fail_environmental_skip(outcome.get_result())
