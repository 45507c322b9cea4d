"""Audit reports for CI (JUnit XML) and monitoring (Prometheus textfile).

JUnit output is parsed back with xml.etree; Prometheus output is checked
line by line against the text exposition format's grammar, and, when
prometheus_client is installed, parsed with its own parser too.
"""

from __future__ import annotations

import os
import re
import stat
import xml.etree.ElementTree as ET

import pytest

from nictune.cli.output import envelope
from nictune.control.review.audit_formats import ReportFileError, junit, prometheus, write_report_file

SECRET = "s3cr3t-value-never-in-labels"
NOW = 1764500000.25


def change(family, target, name, before, after, status, source="p.yaml:3", bound=None):
    return {"key": {"family": family, "target": target, "name": name}, "before": before, "after": after,
            "status": status, "source": source, "note": "", "bound": bound}


def host(name, changes=(), error=None, seconds=0.5):
    drift = any(c["status"] == "drift" for c in changes)
    return {"host": name, "command": "verify", "ok": not error and not drift,
            "exit_code": 1 if error else 2 if drift else 0, "changed": False, "summary": {},
            "changes": list(changes), "warnings": [], "error": error, "seconds": seconds, "agent": "0.1.0"}


def fleet():
    return envelope("verify", [
        host("node01", [change("link", "ens1", "mtu", 9000, 9000, "ok"),
                        change("sysctl", "host", "net.ipv4.tcp_ecn", 1, 1, "ok")]),
        host("node02", [change("link", "ens1", "mtu", 1500, 9000, "drift"),
                        change("channels", "ens1", "combined", 8, 32, "drift", bound="min"),
                        change("nccl", "host", "/etc/nccl.conf", "NCCL_X=1\n", f"NCCL_KEY={SECRET}\n", "drift"),
                        change("rings", "ens1", "rx", None, 8192, "unsupported")]),
        host("node03", error={"kind": "transport", "message": "node03 (198.18.0.4:22): timed out after 10 s"}),
    ])


# -- JUnit ---------------------------------------------------------------------

def test_junit_counts_and_one_testcase_per_host():
    root = ET.fromstring(junit(fleet()).encode())
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    for element in (root, suite):
        assert (element.get("tests"), element.get("failures"), element.get("errors")) == ("3", "1", "1")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["node01", "node02", "node03"]
    assert {c.get("classname") for c in cases} == {"nictune.verify"}
    assert list(cases[0]) == []
    assert [e.tag for e in cases[1]] == ["failure"] and [e.tag for e in cases[2]] == ["error"]
    assert cases[0].get("time") == "0.500" and suite.get("time") == "1.500"


def test_junit_failure_lists_every_drifted_key_with_values():
    failure = ET.fromstring(junit(fleet()).encode()).find(".//testcase[@name='node02']/failure")
    assert failure.get("type") == "drift"
    assert failure.get("message") == ("3 drifted keys: link ens1 mtu; channels ens1 combined; "
                                      "nccl host /etc/nccl.conf")
    lines = failure.text.splitlines()
    assert lines == [
        "link ens1 mtu: expected 9000, actual 1500 (p.yaml:3)",
        "channels ens1 combined: expected at least 32, actual 8 (p.yaml:3)",
        f'nccl host /etc/nccl.conf: expected "NCCL_KEY={SECRET}\\n", actual "NCCL_X=1\\n" (p.yaml:3)',
    ]


def test_junit_error_for_a_host_that_could_not_be_audited():
    error = ET.fromstring(junit(fleet()).encode()).find(".//testcase[@name='node03']/error")
    assert error.get("type") == "transport"
    assert error.get("message") == error.text == "node03 (198.18.0.4:22): timed out after 10 s"


def test_junit_long_failure_message_is_cut_but_body_is_whole():
    keys = [change("sysctl", "host", f"net.ipv4.k{i}", 0, 1, "drift") for i in range(8)]
    failure = ET.fromstring(junit(envelope("verify", [host("n", keys)])).encode()).find(".//failure")
    assert failure.get("message").endswith("net.ipv4.k4; and 3 more")
    assert len(failure.text.splitlines()) == 8


def test_junit_escapes_markup_quotes_and_control_characters():
    name = 'h<1>&"\'\nx\x01\x1b'
    keys = [change("sysctl", "host", "net.a]]>b", "<&>", "\x00", "drift")]
    text = junit(envelope("verify", [host(name, keys)]))
    root = ET.fromstring(text.encode())   # well-formed, whatever the host was called
    case = root.find(".//testcase")
    assert case.get("name") == 'h<1>&"\'\\x0ax\\x01\\x1b'  # control characters visible (item 10)
    assert "net.a]]>b" in case.find("failure").get("message")
    assert 'expected "\\u0000", actual "<&>"' in case.find("failure").text


def test_junit_when_the_command_failed_before_any_host():
    report = envelope("verify", [], error={"kind": "profile", "message": "p.yaml:3: mtu: expected an integer"})
    root = ET.fromstring(junit(report).encode())
    assert (root.get("tests"), root.get("errors")) == ("1", "1")
    assert root.find(".//testcase/error").get("type") == "profile"


# -- Prometheus ------------------------------------------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
VALUE = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|Inf|NaN)"
SAMPLE = re.compile(rf"({NAME})(?:\{{({LABEL}(?:,{LABEL})*)?\}})? ({VALUE})")
HELP = re.compile(rf"# HELP ({NAME}) (?:[^\\\n]|\\[\\n])*")
TYPE = re.compile(rf"# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)")


def parse_exposition(text):
    """Check every line against the format; return {metric: [(labels, value)]}."""
    assert text.endswith("\n")
    samples, typed, helped, done = {}, set(), set(), set()
    current = None
    for line in text.splitlines():
        if m := HELP.fullmatch(line):
            assert m.group(1) not in helped
            helped.add(m.group(1))
            continue
        if m := TYPE.fullmatch(line):
            assert m.group(1) not in typed and m.group(1) not in samples  # TYPE before its samples
            typed.add(m.group(1))
            continue
        m = SAMPLE.fullmatch(line)
        assert m, f"not a valid sample line: {line!r}"
        metric = m.group(1)
        if metric != current:  # a family's samples are together
            assert metric not in done
            if current:
                done.add(current)
            current = metric
        assert metric in typed and metric in helped
        labels = {}
        for pair in re.findall(LABEL, m.group(2) or ""):
            name, value = pair.split("=", 1)
            assert name not in labels
            labels[name] = re.sub(r"\\(.)", lambda e: {"n": "\n"}.get(e.group(1), e.group(1)), value[1:-1])
        entry = (labels, float(m.group(3)))
        assert entry not in samples.get(metric, [])
        samples.setdefault(metric, []).append(entry)
    return samples


def test_prometheus_metrics_per_host_and_key():
    text = prometheus(fleet(), NOW)
    samples = parse_exposition(text)
    assert samples["nictune_audit_up"] == [({"host": "node01"}, 1), ({"host": "node02"}, 1), ({"host": "node03"}, 0)]
    assert samples["nictune_audit_drifted_keys"] == [({"host": "node01"}, 0), ({"host": "node02"}, 3)]
    assert samples["nictune_audit_last_run_timestamp_seconds"] == [({"host": h}, NOW) for h in ("node01", "node02", "node03")]
    drift = {(s["host"], s["family"], s["target"], s["key"]): v for s, v in samples["nictune_audit_drift"]}
    assert drift == {
        ("node01", "link", "ens1", "mtu"): 0, ("node01", "sysctl", "host", "net.ipv4.tcp_ecn"): 0,
        ("node02", "link", "ens1", "mtu"): 1, ("node02", "channels", "ens1", "combined"): 1,
        ("node02", "nccl", "host", "/etc/nccl.conf"): 1,
    }   # unsupported keys say nothing about drift; an unreachable host has no keys
    assert SECRET not in text and "9000" not in text and "1500" not in text   # no values at all
    assert text.count("# TYPE ") == 4 and "# TYPE nictune_audit_up gauge" in text


def test_prometheus_label_values_are_escaped():
    name = 'we"ird\\host\nname'
    keys = [change("sysctl", "host", 'net.a"b\\c', 0, 1, "drift")]
    text = prometheus(envelope("verify", [host(name, keys)]), NOW)
    assert 'host="we\\"ird\\\\host\\\\x0aname"' in text  # the newline made visible (item 10)
    samples = parse_exposition(text)
    shown = 'we"ird\\host\\x0aname'
    assert samples["nictune_audit_drift"] == [({"host": shown, "family": "sysctl", "target": "host", "key": 'net.a"b\\c'}, 1)]


def test_prometheus_duplicate_host_is_written_once():
    report = envelope("verify", [host("a"), host("a")])
    assert len(parse_exposition(prometheus(report, NOW))["nictune_audit_up"]) == 1


def test_prometheus_client_reads_it():
    parser = pytest.importorskip("prometheus_client.parser")
    name = 'we"ird\\host\nname'
    report = envelope("verify", [host(name, [change("link", "e", "mtu", 1, 2, "drift")]), host("b", error={"kind": "transport", "message": "x"})])
    families = {f.name: f for f in parser.text_string_to_metric_families(prometheus(report, NOW))}
    assert {f.type for f in families.values()} == {"gauge"}
    up = {s.labels["host"]: s.value for s in families["nictune_audit_up"].samples}
    shown = 'we"ird\\host\\x0aname'  # the newline made visible (item 10)
    assert up == {shown: 1.0, "b": 0.0}
    (drift,) = families["nictune_audit_drift"].samples
    assert drift.labels == {"host": shown, "family": "link", "target": "e", "key": "mtu"} and drift.value == 1.0


# -- writing the files ---------------------------------------------------------------

def test_write_report_file_is_atomic_and_readable(tmp_path):
    path = tmp_path / "nictune.prom"
    path.write_text("old\n")
    write_report_file(str(path), "new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644   # node_exporter runs as another user
    assert os.listdir(tmp_path) == ["nictune.prom"]      # no temporary file left behind


def test_write_report_file_errors_are_one_paragraph(tmp_path):
    with pytest.raises(ReportFileError) as info:
        write_report_file(str(tmp_path / "missing" / "x.xml"), "x")
    assert str(tmp_path / "missing" / "x.xml") in info.value.message and "\n" not in info.value.message
    with pytest.raises(ReportFileError, match="is a directory"):
        write_report_file(str(tmp_path), "x")


# -- fabric agreement ------------------------------------------------------------------

def agreeing_fleet():
    """Three hosts of fabric f, each as its profile wants; c's MTU and
    NCCL_IB_TC differ from a's and b's (control/review/agreement.py)."""
    from nictune.control.review.agreement import Membership, agreement
    from nictune.host.knobs import nccl

    def one(name, mtu, tc):
        return host(name, [change("link", "rail0", "mtu", mtu, mtu, "ok"),
                           change("nccl", "host", "/etc/nccl.conf", nccl.render({"NCCL_IB_TC": tc}),
                                  nccl.render({"NCCL_IB_TC": tc}), "ok")])

    hosts = [one("a", 9000, 106), one("b", 9000, 106), one("c", 4200, 0)]
    members = Membership()
    for h in hosts:
        members.add(h["host"], "f")
    return envelope("audit", hosts, agreement=agreement(hosts, members))


def test_junit_a_failure_per_outlier_of_a_fabric():
    root = ET.fromstring(junit(agreeing_fleet()).encode())
    suite = root.find("testsuite[@name='nictune fabric agreement']")
    failed = {c.get("name"): c.find("failure") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert set(failed) == {"mtu on c", "NCCL_IB_TC on c"}
    assert failed["NCCL_IB_TC on c"].get("type") == "disagreement"
    assert failed["NCCL_IB_TC on c"].get("message").startswith(
        "c: NCCL_IB_TC 0, the fabric's majority 106 on 2 host(s): their QPs use the peer's traffic class")
    assert (suite.get("failures"), root.get("failures")) == ("2", "2")
    assert int(root.get("tests")) == 3 + int(suite.get("tests"))  # the hosts' cases and the fabric's


def test_prometheus_a_series_per_compared_value_and_per_outlier():
    text = prometheus(agreeing_fleet(), NOW)
    samples = parse_exposition(text)
    outliers = {s["name"]: v for s, v in samples["nictune_fabric_value_outliers"]}
    assert outliers["mtu"] == 1 and outliers["NCCL_IB_TC"] == 1 and outliers["NCCL_IB_SL"] == 0
    assert sorted((s["name"], s["host"]) for s, _ in samples["nictune_fabric_outlier"]) == [
        ("NCCL_IB_TC", "c"), ("mtu", "c")]
    assert "4200" not in text and "106" not in text  # names, never values, in labels
    assert "nictune_fabric_" not in prometheus(fleet(), NOW)  # no fabric: no agreement series
