"""`ansible-test sanity` (ansible-core's own checker, in the venv) on the
collection ansible_collections/nictune/network: documentation blocks, the
argument spec against them, attributes, imports, YAML, pep8, pylint ...

ansible-test builds a virtualenv per test and bootstraps pip into it with a
script it downloads from ci-files.testing.ansible.com, which is not reachable
here; its cache (~/.ansible/test/cache/get_pip_<version>.py) gets a stand-in
that takes pip from the venv's own ensurepip instead.  The requirements
themselves come from the package index, as any pip install.  HOME is a
directory in the project's .venv, so the virtualenvs are built once and kept
(a warm run takes about 10 s), and nothing is written to the user's home."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COLLECTION = os.path.join(ROOT, "ansible_collections", "nictune", "network")
ANSIBLE_TEST = os.path.join(os.path.dirname(sys.executable), "ansible-test")
GET_PIP = """\
# Stand-in for ansible-test's downloaded get-pip (tests/lint/test_ansible_collection_sanity.py).
import subprocess, sys
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
"""


def pip_version() -> str:
    """The pip ansible-test bootstraps (it names its cached script after it)."""
    from ansible_test._internal.python_requirements import get_venv_packages

    class Python:
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"

    return get_venv_packages(Python())["pip"]


def test_the_collection_passes_ansible_test_sanity():
    assert os.path.isfile(os.path.join(COLLECTION, "galaxy.yml")), COLLECTION
    home = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "ansible-test-home")
    cache = os.path.join(home, ".ansible", "test", "cache")
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, f"get_pip_{pip_version().replace('.', '_')}.py"), "w") as f:
        f.write(GET_PIP)
    result = subprocess.run([ANSIBLE_TEST, "sanity", "--python", f"{sys.version_info[0]}.{sys.version_info[1]}",
                             "--local"], cwd=COLLECTION, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "HOME": home})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    for test in ("validate-modules", "ansible-doc", "yamllint", "pylint", "pep8", "import", "action-plugin-docs"):
        assert f'Running sanity test "{test}"' in out, (test, out[-3000:])
    assert glob.glob(os.path.join(COLLECTION, "plugins", "modules", "*.py"))
