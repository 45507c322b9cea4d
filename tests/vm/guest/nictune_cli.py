"""The VM tests' way to run nictune's CLI (in-process, CliRunner), to
write test key files, to render reports as the fleet audit does, and to
check that no test key ended up in its output or state directory."""

from __future__ import annotations

import hashlib
import json
import os
from typing import List

from typer.testing import CliRunner

from nictune.cli.app import app
from nictune.control.review import audit_formats as fmt


def nictune(*args: str) -> tuple:
    """(exit code, JSON report, stdout) of one nictune command."""
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout), result.stdout


def changes(report: dict) -> dict:
    """The one host's changes by (target, family, name)."""
    (host,) = report["hosts"]
    return {(c["key"]["target"], c["key"]["family"], c["key"]["name"]): c
            for c in host["changes"]}


def key_file(path, hexkey: str) -> str:
    """A test key written as a key file (hex, one line, mode 0600)."""
    path.write_text(hexkey + "\n")
    os.chmod(path, 0o600)
    return str(path)


def fingerprint(hexkey: str) -> str:
    """The fingerprint nictune shows for the key file key_file() writes."""
    return hashlib.sha256((hexkey + "\n").encode()).hexdigest()[:8]


def assert_no_key(keys: List[str], texts: List[str], state_dir: str, journaled: bool = True) -> None:
    """No key (hex strings), in hex either case or raw, in the texts (the
    reports) nor in any file under the state directory, which holds files
    exactly when the run was journaled (an apply)."""
    needles = [k.lower() for k in keys] + [k.upper() for k in keys]
    raw = [bytes.fromhex(k) for k in keys]
    for text in texts:
        assert not any(n in text for n in needles)
        assert not any(r in text.encode("latin-1", "replace") for r in raw)
    scanned = 0
    for base, _dirs, files in os.walk(state_dir):
        for name in files:
            with open(os.path.join(base, name), "rb") as f:
                data = f.read()
            assert not any(n.encode() in data for n in needles), name
            assert not any(r in data for r in raw), name
            scanned += 1
    assert texts and bool(scanned) == journaled, (len(texts), scanned)


def audited(report: dict, drifted: set) -> list:
    """The report as the fleet audit writes it (control/review/audit_formats.py:
    --junit and --prometheus), checked to name exactly the `drifted` keys
    (pending in a plan, drift in a verify): the outputs then grepped for
    the keys have the values of those changes in them."""
    xml, prom = fmt.junit(report), fmt.prometheus(report, 0.0)
    flagged = {line.split('key="')[1].split('"}')[0] for line in prom.splitlines()
               if line.startswith("nictune_audit_drift{") and line.endswith(" 1")}
    assert flagged >= drifted and ("<failure" in xml) == bool(flagged), (flagged, xml)
    return [xml, prom]
