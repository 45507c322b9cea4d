"""The shipped examples of how a site keeps the resident agents' metrics
beyond one Prometheus (contrib/prometheus/, docs/howto/metrics-at-scale.md),
checked by the real promtool of Debian's prometheus package (scripts/setup
puts it in .venv/bin): the configs load, the recording rules load, and
`promtool test rules` computes the roll-ups of the series the agents export
by default.  Every series the rules read is one the default exporter has,
with the labels they group by.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nictune.host.resident import metrics
from tests.unit.test_metrics import metric_names

CONTRIB = Path(__file__).resolve().parents[2] / "contrib" / "prometheus"
CONFIGS = ("nictune-shard.yml", "nictune-global.yml")
RULES = CONTRIB / "nictune-rules.yml"


def _promtool() -> str:
    for path in (os.path.join(os.path.dirname(sys.executable), "promtool"), shutil.which("promtool")):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("no promtool binary (scripts/setup puts it in .venv/bin)")


def _promtool_run(*args: str, cwd: Path = CONTRIB) -> subprocess.CompletedProcess:
    return subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("config", CONFIGS)
def test_promtool_loads_the_shipped_configs(config):
    r = _promtool_run("check", "config", config)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_loads_the_rules_and_its_unit_test_computes_the_roll_ups():
    r = _promtool_run("check", "rules", RULES.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"SUCCESS: (\d+) rules found", r.stdout).group(1) == str(len(_recorded()))
    r = _promtool_run("test", "rules", "nictune-rules.test.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_refuses_a_broken_rule_and_a_wrong_expectation(tmp_path):
    # So that the checks above can fail: the same files, one rule broken,
    # then one expected value wrong.
    shutil.copy(CONTRIB / "nictune-rules.test.yml", tmp_path)
    text = RULES.read_text()
    (tmp_path / RULES.name).write_text(text.replace("sum by (fabric) (nictune_drifted_keys)",
                                                    "sum by (fabric) (nictune_drifted_keys", 1))
    assert _promtool_run("check", "rules", RULES.name, cwd=tmp_path).returncode != 0
    (tmp_path / RULES.name).write_text(text.replace("(rate(nictune_pfc_rx_pause_frames_total[5m]))",
                                                    "(rate(nictune_pfc_rx_pause_frames_total[5m])) * 2"))
    assert _promtool_run("test", "rules", "nictune-rules.test.yml", cwd=tmp_path).returncode != 0


def _recorded() -> list:
    """(record name, expr) of every rule."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(rule["record"], rule["expr"]) for group in groups for rule in group["rules"]]


def test_the_rules_read_only_series_the_default_exporter_has():
    rules = _recorded()
    assert len(rules) > 10
    for record, expr in rules:
        names = metric_names(expr)
        assert names and names <= set(metrics.CATALOG) | {"up"}, (record, names)
        # They group by what the default output has: never priority, never a key.
        for labels in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            grouped = {label.strip() for label in labels.split(",")}
            for name in names:
                assert not grouped & set(metrics.DETAIL_LABELS.get(name, ())), (record, grouped)
            assert grouped <= {"fabric", "device"}, (record, grouped)


def test_federation_and_remote_write_take_every_roll_up():
    federate = yaml.safe_load((CONTRIB / "nictune-global.yml").read_text())["scrape_configs"][0]
    assert federate["metrics_path"] == "/federate" and federate["honor_labels"] is True
    selectors = federate["params"]["match[]"]
    assert len(selectors) == 1
    federated = re.fullmatch(r'\{__name__=~"(.+)"\}', selectors[0]).group(1)
    shard = yaml.safe_load((CONTRIB / "nictune-shard.yml").read_text())
    assert shard["rule_files"] == [RULES.name]
    kept = shard["remote_write"][0]["write_relabel_configs"][0]
    assert kept["action"] == "keep" and kept["source_labels"] == ["__name__"]
    recorded = _recorded()
    assert len(recorded) >= 10, recorded
    for record, _expr in recorded:
        assert re.fullmatch(federated, record), record
        assert re.fullmatch(kept["regex"], record), record
    # The drift itself (which key, which node) leaves the shard too; the
    # per-rail counters stay.
    assert re.fullmatch(kept["regex"], "nictune_drift")
    assert not re.fullmatch(kept["regex"], "nictune_pfc_rx_pause_frames_total")
