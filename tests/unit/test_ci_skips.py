"""Under CI a skip for something scripts/setup installs, for root, or for
namespaces and sshd fails (tests/skips.py decides, in one place); a fact
about the machine listed there stays a skip; outside CI every skip stays
a skip.  Run through a real pytest, as CI runs it."""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import skips

TESTS = Path(__file__).resolve().parent.parent

CASES = textwrap.dedent("""\
    import os
    import pytest

    def test_needs_root_skip():
        pytest.skip("needs root for network namespaces")

    @pytest.mark.skipif(True, reason="iperf3 is not installed")
    def test_needs_tool_skipif():
        pass

    def test_machine_iproute2():
        pytest.skip("iproute2-6.1.0 has no 'dcb apptrust' (iproute2 >= 6.2)")

    @pytest.mark.xfail(reason="known", strict=True)
    def test_expected_failure():
        assert False

    def test_passes():
        pass
    """)
IMPORTORSKIP = "import pytest\npytest.importorskip('no_such_module_for_nictune')\n"


def run_pytest(tmp_path, ci: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "test_importorskip.py").write_text(IMPORTORSKIP)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = ci
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "skips", "-p", "no:cacheprovider",
                           "-rA", "--continue-on-collection-errors", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True)


def summary(proc) -> str:
    return proc.stdout.strip().splitlines()[-1]


def test_outside_ci_every_skip_stays_a_skip(tmp_path):
    proc = run_pytest(tmp_path, ci="")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\b1 passed, 4 skipped, 1 xfailed\b", summary(proc)), proc.stdout


def test_under_ci_environmental_skips_fail_and_machine_facts_stay(tmp_path):
    proc = run_pytest(tmp_path, ci="true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"\b1 failed, 1 passed, 1 skipped, 1 xfailed, 2 errors", summary(proc)), out
    assert "FAILED test_cases.py::test_needs_root_skip" in out, out  # skipped in the call
    assert "ERROR test_cases.py::test_needs_tool_skipif" in out, out  # skipped in set-up
    assert "ERROR test_importorskip.py" in out, out
    assert "SKIPPED [1] test_cases.py:12: iproute2-6.1.0 has no 'dcb apptrust'" in out, out
    assert "skipped under CI: needs root for network namespaces. CI must run this test" in out, out
    assert "skipped under CI: iperf3 is not installed." in out, out


def test_ci_false_is_not_ci(tmp_path):
    assert summary(run_pytest(tmp_path, ci="false")).count("skipped") == 1


@functools.lru_cache(maxsize=None)
def skip_reasons_in_tests() -> tuple:
    """Every literal reason text given to pytest.skip/skipif/mark.skip in
    tests/ (f-strings by their literal parts)."""
    texts = []
    for path in TESTS.rglob("*.py"):
        if path.name in ("skips.py", Path(__file__).name):  # the patterns and examples themselves
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Constant, ast.JoinedStr)):
                texts.append(ast.unparse(node))
    return tuple(texts)


@pytest.mark.parametrize("pattern", [p for p, _ in skips.MACHINE_SKIPS])
def test_every_machine_skip_is_still_one_a_test_takes(pattern):
    """An entry no test's reason matches any more is a hole waiting for a
    wrong skip to fall through: remove it."""
    texts = skip_reasons_in_tests()
    assert len(texts) > 1000, len(texts)
    assert any(re.search(pattern, t) for t in texts), pattern
