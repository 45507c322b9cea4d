"""Audit reports for machines: JUnit XML for CI systems, Prometheus text for
node_exporter's textfile collector; and a playbook apply's rollouts as
JUnit XML (junit_rollouts: a testsuite per rollout).

Both take the JSON envelope of docs/reference/report-format.md (`verify` or `audit`,
one HOST per audited host).  A change whose status is `drift` (or `pending`,
the same fact seen by `plan`) is a drifted key; a host whose report carries
an `error` could not be audited (unreachable, timed out, agent failure).

JUnit: one <testcase> per host, with at most one <failure> (type "drift")
that lists every drifted key with its expected and actual value, or one
<error> for a host that could not be audited.  Not one <failure> per key:
the Ant/windyroad XSD that many consumers validate against allows a single
failure or error per testcase, Jenkins' junit plugin and Azure DevOps show
only the first, junitparser refuses the file and xunitparser miscounts it
(pytest-dev/pytest#5891, Catch2#1919, jasmine-reporters#102).  One
testcase per host also keeps testcase names unique, which GitLab needs.

Prometheus: no values in labels at all (a value may be a secret, and would
make a new series at every change); keys are labels (family, target, key).
Both formats show control characters in names as \\xNN (host/text.py): a
host name or key must not put escapes on a dashboard or a CI page.
node_exporter refuses sample timestamps in textfiles, so the audit time is
a gauge.  Samples carry the host label, so several audits can each write
their own *.prom file into one textfile directory as long as their hosts
differ.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from typing import Iterable, List

from nictune.host.errors import INVALID_INPUT, NictuneError
from nictune.host.files import write_atomic
from nictune.host.text import printable

DRIFTED = ("drift", "pending")
MISMATCHED = "switch-mismatch"  # the rail's switch port disagrees (knobs/switch.py)

# Characters XML 1.0 cannot carry at all, not even as &#N; references.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# Longest list of key names in a failure's one-line message; the body has all.
_MESSAGE_KEYS = 5


class ReportFileError(NictuneError):
    kind = INVALID_INPUT


# -- what the envelope says ----------------------------------------------------

def drifted(host: dict) -> List[dict]:
    return [c for c in host.get("changes") or [] if c.get("status") in DRIFTED]


def mismatched(host: dict) -> List[dict]:
    return [c for c in host.get("changes") or [] if c.get("status") == MISMATCHED]


def _key_words(change: dict) -> str:
    key = change["key"]
    return f"{key['family']} {key['target']} {key['name']}"


def _expected(change: dict) -> str:
    want = json.dumps(change.get("after"), ensure_ascii=False)
    bound = change.get("bound")
    return {"min": f"at least {want}", "max": f"at most {want}"}.get(bound, want)


def _hosts_or_error(envelope: dict) -> List[dict]:
    """The hosts, or one stand-in host when the command failed before any
    host (an invalid profile): CI must see a failure, not an empty green run."""
    if envelope.get("hosts") or not envelope.get("error"):
        return list(envelope.get("hosts") or [])
    return [{"host": "nictune", "error": envelope["error"], "changes": []}]


# -- JUnit -------------------------------------------------------------------

def _xml_text(text: str) -> str:
    """One field: control characters visible (host/text.py), and what XML
    1.0 cannot carry at all as \\uXXXX."""
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", printable(text))


def junit(envelope: dict) -> str:
    """The envelope as a JUnit XML document: a testcase per host."""
    command = envelope.get("command") or "audit"
    suite_name = f"nictune {command}"
    cases, failures, errors, seconds = [], 0, 0, 0.0
    for host in _hosts_or_error(envelope):
        case = ET.Element("testcase", classname=f"nictune.{command}", name=_xml_text(str(host["host"])))
        took = host.get("seconds")
        if isinstance(took, (int, float)) and not isinstance(took, bool):
            case.set("time", f"{took:.3f}")
            seconds += took
        if host.get("error"):
            errors += 1
            err = host["error"]
            message = _xml_text(str(err.get("message", "")))
            ET.SubElement(case, "error", type=_xml_text(str(err.get("kind", "error"))), message=message).text = message
        else:
            keys = drifted(host)
            if keys:
                failures += 1
                ET.SubElement(case, "failure", type="drift", message=_xml_text(_failure_message(keys))).text = \
                    _failure_body(keys)
            disagree = mismatched(host)
            if disagree:
                failures += 0 if keys else 1
                ET.SubElement(case, "failure", type=MISMATCHED, message=_xml_text(
                    f"{len(disagree)} switch port disagreement(s): " + "; ".join(
                        _key_words(c) for c in disagree[:_MESSAGE_KEYS]))).text = "\n".join(
                    _xml_text(f"{_key_words(c)}: {c.get('note', '')}") for c in disagree)
        cases.append(case)
    counts = {"tests": str(len(cases)), "failures": str(failures), "errors": str(errors)}
    root = ET.Element("testsuites", name=suite_name, **counts, time=f"{seconds:.3f}")
    suite = ET.SubElement(root, "testsuite", name=suite_name, **counts, skipped="0", time=f"{seconds:.3f}")
    suite.extend(cases)
    if envelope.get("agreement"):
        fabric_cases = _agreement_cases(envelope["agreement"])
        bad = sum(1 for c in fabric_cases if c.find("failure") is not None)
        ET.SubElement(root, "testsuite", name="nictune fabric agreement", tests=str(len(fabric_cases)),
                      failures=str(bad), errors="0", skipped="0", time="0.000").extend(fabric_cases)
        root.set("tests", str(len(cases) + len(fabric_cases)))
        root.set("failures", str(failures + bad))
    if envelope.get("cabling"):
        _cabling_suite(root, envelope["cabling"])
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _failure_message(keys: List[dict]) -> str:
    names = "; ".join(_key_words(c) for c in keys[:_MESSAGE_KEYS])
    more = f"; and {len(keys) - _MESSAGE_KEYS} more" if len(keys) > _MESSAGE_KEYS else ""
    return f"{len(keys)} drifted key{'s' if len(keys) != 1 else ''}: {names}{more}"


def _failure_body(keys: List[dict]) -> str:
    lines = []
    for c in keys:
        actual = json.dumps(c.get("before"), ensure_ascii=False)
        source = f" ({c['source']})" if c.get("source") else ""
        lines.append(_xml_text(f"{_key_words(c)}: expected {_expected(c)}, actual {actual}{source}"))
    return "\n".join(lines)


def _cabling_suite(root: ET.Element, doc: dict) -> None:
    """The cabling plan's check (control/review/cabling.py) as its own
    testsuite: a testcase per planned rail, a <failure> typed by its status
    (wrong-switch, swapped, ...) with the expected and the seen neighbour."""
    cases = []
    for row in doc.get("rails") or []:
        case = ET.Element("testcase", classname="nictune.cabling",
                          name=_xml_text(f"{row.get('host', '')} {row.get('rail', '')}"), time="0.000")
        if row.get("status") != "ok":
            message = _xml_text(str(row.get("message", "")))
            ET.SubElement(case, "failure", type=_xml_text(str(row.get("status"))),
                          message=message).text = message
        cases.append(case)
    failures = sum(1 for c in cases if c.find("failure") is not None)
    suite = ET.SubElement(root, "testsuite", name="nictune cabling", tests=str(len(cases)),
                          failures=str(failures), errors="0", skipped="0", time="0.000")
    suite.extend(cases)
    for name, add in (("tests", len(cases)), ("failures", failures)):
        root.set(name, str(int(root.get(name, "0")) + add))
def _agreement_cases(doc: dict) -> List[ET.Element]:
    """A testcase per value a fabric agrees on; per value it does not, a
    testcase with a failure per outlier host (JUnit takes one failure per
    testcase: control/review/agreement.py)."""
    from nictune.control.review.agreement import sentence

    cases = []
    for fabric in doc.get("fabrics") or []:
        name = fabric["fabric"]
        for row in fabric["values"]:
            classname = _xml_text(f"nictune.fabric.{name}")
            if row["agree"]:
                cases.append(ET.Element("testcase", classname=classname, name=_xml_text(row["name"]), time="0.000"))
                continue
            for outlier in row["outliers"]:
                for host in outlier["hosts"]:
                    case = ET.Element("testcase", classname=classname,
                                      name=_xml_text(f"{row['name']} on {host}"), time="0.000")
                    message = (f"{host}: {row['name']} {outlier['shown']}, the fabric's majority "
                               f"{row['majority']['shown']} on {row['majority']['count']} host(s): "
                               f"{row['predicts']}")
                    ET.SubElement(case, "failure", type="disagreement", message=_xml_text(message)).text = \
                        _xml_text(sentence(name, row))
                    cases.append(case)
    return cases


# -- JUnit of a playbook's rollouts (apply --junit) ------------------------------

# A host's outcome -> how its testcase ends (control/rollout/playbook.py OUTCOMES).
_OUTCOME_ENDS = {"failed": "failure", "rolled-back": "failure", "rollback-failed": "error",
                 "not-started": "skipped"}


def junit_rollouts(envelope: dict) -> str:
    """A playbook apply as JUnit XML: a testsuite per rollout (play), a
    testcase per host per batch (its apply, verify and traffic gate), a
    testcase per hook command, one for require_drain's plan check, and a
    skipped testcase per host never started.  A host that failed or was
    rolled back has one <failure> (one <error> when its rollback failed):
    the most specific reason first (its own apply or verify error, the gate
    pairs it was in), then the stop of its batch."""
    if not envelope.get("rollouts"):
        return junit(envelope)  # a playbook that did not load: its error, as for any command
    root = ET.Element("testsuites", name="nictune apply")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    seconds_all = 0.0
    for rollout in envelope.get("rollouts") or []:
        cases = _rollout_cases(rollout)
        counts = {"tests": len(cases), "failures": 0, "errors": 0, "skipped": 0}
        seconds = 0.0
        for case in cases:
            seconds += float(case.get("time") or 0)
            for end, counted in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
                counts[counted] += case.find(end) is not None
        suite = ET.SubElement(root, "testsuite", name=_xml_text(f"rollout: {rollout.get('play', '')}"),
                              **{k: str(v) for k, v in counts.items()}, time=f"{seconds:.3f}")
        suite.extend(cases)
        for k in totals:
            totals[k] += counts[k]
        seconds_all += seconds
    root.attrib.update({k: str(v) for k, v in totals.items() if k != "skipped"}, time=f"{seconds_all:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _case(classname: str, name: str, took: float = 0.0) -> ET.Element:
    return ET.Element("testcase", classname=_xml_text(classname), name=_xml_text(name), time=f"{took:.3f}")


def _end(case: ET.Element, end: str, kind: str, message: str, body: str = "") -> None:
    element = ET.SubElement(case, end, message=_xml_text(message))
    if end != "skipped":
        element.set("type", _xml_text(kind))
        element.text = "\n".join(_xml_text(line) for line in (body or message).split("\n"))


def _rollout_cases(rollout: dict) -> List[ET.Element]:
    cases: List[ET.Element] = []
    stopped = rollout.get("stopped") or {}
    check = rollout.get("drain_check")
    if check is not None:
        case = _case("nictune.rollout", "require_drain")
        if not check.get("passed"):
            _end(case, "failure", stopped.get("kind", "drain-required"), stopped.get("message", "require_drain"),
                 _drain_body(check))
        cases.append(case)
    if stopped and not rollout.get("batches") and check is None:
        case = _case("nictune.rollout", "start")
        _end(case, "failure", stopped.get("kind", "error"), stopped.get("message", ""))
        cases.append(case)
    for batch in rollout.get("batches") or []:
        cases += _batch_cases(batch)
    started = {n for batch in rollout.get("batches") or [] for n in batch.get("hosts") or []}
    for name in rollout.get("not_started") or []:
        if name not in started:
            case = _case("nictune.rollout.not_started", str(name))
            _end(case, "skipped", "", f"not started: {stopped.get('message', 'the rollout stopped')}")
            cases.append(case)
    return cases


def _batch_cases(batch: dict) -> List[ET.Element]:
    number = batch.get("number", "?")
    classname = f"nictune.rollout.batch{number}"
    cases = []
    for i, hook in enumerate(batch.get("hooks") or [], 1):
        argv = " ".join(str(a) for a in hook.get("argv") or [])
        case = _case(f"{classname}.hooks", f"{i} {hook.get('hook', 'hook')}: {argv}", hook.get("seconds") or 0.0)
        if not hook.get("ok"):
            why = (hook.get("error") or {}).get("message", "")
            _end(case, "failure", "hook-failed", f"{hook.get('source', '')}: {why}",
                 f"{why}\n{hook.get('output', '')}".rstrip("\n"))
        cases.append(case)
    by_host = {}
    for part in ("reports", "verify", "rollback"):
        for r in batch.get(part) or []:
            by_host.setdefault(r.get("host"), {})[part] = r
    gate = batch.get("gate") or {}
    stop = batch.get("stop") or {}
    for name in batch.get("hosts") or []:
        mine = by_host.get(name, {})
        took = sum(float(r.get("seconds") or 0) for r in mine.values()
                   if isinstance(r.get("seconds"), (int, float)) and not isinstance(r.get("seconds"), bool))
        case = _case(classname, str(name), took)
        outcome = (batch.get("outcomes") or {}).get(name)
        end = _OUTCOME_ENDS.get(outcome)
        if end == "skipped":
            _end(case, end, "", f"not started: {stop.get('message', '')}")
        elif end:
            reasons = _host_reasons(name, mine, gate)
            message = reasons[0] if reasons else f"{outcome}: {stop.get('message', '')}"
            _end(case, end, outcome, message, "\n".join(reasons + [f"batch stopped: {stop.get('message', '')}"]))
        cases.append(case)
    return cases


def _host_reasons(name: str, mine: dict, gate: dict) -> List[str]:
    """What went wrong on one host of a stopped batch, most specific first."""
    reasons = []
    for part, label in (("reports", "apply"), ("verify", "verify"), ("rollback", "rollback")):
        r = mine.get(part) or {}
        if r.get("error"):
            reasons.append(f"{label}: {r['error'].get('kind', '')}: {r['error'].get('message', '')}")
        elif part == "verify" and drifted(r):
            reasons.append(f"verify: {_failure_message(drifted(r))}")
    for row in gate.get("results") or []:
        if not row.get("passed") and name in (row.get("client"), row.get("server")):
            reasons.append(f"traffic gate: {row.get('client', '?')} -> {row.get('server', '?')} on "
                           f"{row.get('rail', '?')} ({row.get('tool', '?')}): {row.get('why') or 'failed'}")
    return reasons


def _drain_body(check: dict) -> str:
    lines = [f"plan failed on {f.get('host')}: {(f.get('error') or {}).get('message', '')}"
             for f in check.get("failed") or []]
    lines += [f"{d.get('host')}: {d.get('family')} {d.get('target')} {d.get('name')}: {d.get('why')}"
              for d in check.get("disruptive") or []]
    return "\n".join(lines) or "require_drain"


# -- Prometheus ----------------------------------------------------------------

_METRICS = {
    "nictune_audit_up": "Whether nictune could audit the host (1) or not (0: unreachable, timed out, agent error).",
    "nictune_audit_drift": "Whether a setting differs from the profile (1) or is as wanted (0).",
    "nictune_audit_drifted_keys": "Number of settings on the host that differ from the profile.",
    "nictune_audit_switch_mismatch": "Whether the rail's switch port disagrees with the profile on a check (1) or agrees (0).",
    "nictune_audit_last_run_timestamp_seconds": "When nictune last audited the host, in seconds since the Unix epoch.",
    "nictune_fabric_value_outliers": "Hosts of the fabric whose value differs from the fabric's majority "
                                     "(0: every host agrees), per must-match value.",
    "nictune_fabric_outlier": "1 for each host whose must-match value differs from its fabric's majority.",
}


def _label_value(value: str) -> str:
    """A label value in the exposition format: printable (so no newline is
    left to escape), then backslashes and quotes escaped."""
    return printable(value).replace("\\", "\\\\").replace('"', '\\"')


def _sample(metric: str, labels: dict, value: str) -> str:
    inner = ",".join(f'{name}="{_label_value(text)}"' for name, text in labels.items())
    return f"{metric}{{{inner}}} {value}"


def prometheus(envelope: dict, now: float) -> str:
    """The envelope in the Prometheus text exposition format (version 0.0.4),
    as node_exporter's textfile collector reads it."""
    families: dict = {name: [] for name in _METRICS}
    stamp = repr(round(float(now), 3))
    seen_hosts: set = set()
    for host in envelope.get("hosts") or []:
        name = printable(host["host"])
        # A series twice in one file makes node_exporter drop the whole file.
        if name in seen_hosts:
            continue
        seen_hosts.add(name)
        labels = {"host": name}
        families["nictune_audit_last_run_timestamp_seconds"].append(_sample(
            "nictune_audit_last_run_timestamp_seconds", labels, stamp))
        if host.get("error"):
            families["nictune_audit_up"].append(_sample("nictune_audit_up", labels, "0"))
            continue
        families["nictune_audit_up"].append(_sample("nictune_audit_up", labels, "1"))
        families["nictune_audit_drift"].extend(_drift_samples(name, host.get("changes") or []))
        families["nictune_audit_switch_mismatch"].extend(_drift_samples(
            name, host.get("changes") or [], (MISMATCHED,), "nictune_audit_switch_mismatch"))
        families["nictune_audit_drifted_keys"].append(_sample(
            "nictune_audit_drifted_keys", labels, str(len(drifted(host)))))
    _agreement_samples(envelope.get("agreement") or {}, families)
    lines: List[str] = []
    for metric, samples in families.items():
        if metric == "nictune_audit_switch_mismatch" and not samples:
            continue  # only with switch: checks (knobs/switch.py)
        if metric.startswith("nictune_fabric_") and not envelope.get("agreement"):
            continue  # no host names a fabric: no agreement, not "0 outliers"
        lines.append(f"# HELP {metric} {_METRICS[metric]}")
        lines.append(f"# TYPE {metric} gauge")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def _agreement_samples(doc: dict, families: dict) -> None:
    """A series per value each fabric compares (its outlier count) and one
    per outlier host: the values themselves stay out of the labels."""
    seen: set = set()
    for fabric in doc.get("fabrics") or []:
        name = printable(fabric["fabric"])
        for row in fabric["values"]:
            labels = {"fabric": name, "name": printable(row["name"])}
            if tuple(labels.values()) in seen:
                continue
            seen.add(tuple(labels.values()))
            hosts = sorted({printable(h) for o in row["outliers"] for h in o["hosts"]})
            families["nictune_fabric_value_outliers"].append(_sample(
                "nictune_fabric_value_outliers", labels, str(len(hosts))))
            families["nictune_fabric_outlier"].extend(
                _sample("nictune_fabric_outlier", {**labels, "host": h}, "1") for h in hosts)


def _drift_samples(host: str, changes: Iterable[dict], bad: tuple = DRIFTED,
                   metric: str = "nictune_audit_drift") -> List[str]:
    out, seen = [], set()
    switch = bad != DRIFTED  # the switch checks have a series of their own
    for c in changes:
        if c.get("status") not in bad + ("ok",) or (c["key"].get("family") == "switch") != switch:
            continue  # unsupported, skipped: not a statement about drift
        key = c["key"]
        labels = {"host": host, "family": printable(key["family"]),
                  "target": printable(key["target"]), "key": printable(key["name"])}
        ident = tuple(labels.values())
        if ident in seen:
            continue
        seen.add(ident)
        out.append(_sample(metric, labels, "1" if c["status"] in bad else "0"))
    return out


# -- files -------------------------------------------------------------------

def write_report_file(path: str, text: str, mode: int = 0o644) -> None:
    """Write a report so that no reader (node_exporter, a CI upload) ever sees
    half of it: a temporary file in the same directory, then a rename.  The
    temporary name starts with a dot and does not end in .prom, so the
    textfile collector never reads it."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise ReportFileError(f"cannot write the report to {path}: it is a directory")
    try:
        write_atomic(target, text, mode=mode)
    except OSError as e:
        raise ReportFileError(f"cannot write the report to {path}: {e.strerror or e}") from None
