"""The shared vocabulary: keys, changes, statuses and error kinds."""

from __future__ import annotations

import json
import os
import re

import pytest

from nictune.host import errors
from nictune.host import model as m
from nictune.host.model import HOST, Change, Key, Outcome, Want

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATUSES = [m.PENDING, m.OK, m.APPLIED, m.UNSUPPORTED, m.SKIPPED, m.DRIFT, m.FAILED, m.REVERTED,
            m.REVERT_FAILED, m.NOT_APPLIED, m.KEPT]


def test_key_text_dict_and_order():
    key = Key("sysctl", "eth0.100", "net.ipv4.conf.eth0.100.rp_filter")
    assert str(key) == "sysctl:eth0.100:net.ipv4.conf.eth0.100.rp_filter"
    assert key.as_dict() == {"family": "sysctl", "target": "eth0.100", "name": "net.ipv4.conf.eth0.100.rp_filter"}
    assert Key.from_dict(key.as_dict()) == key
    assert len({key, Key.from_dict(key.as_dict())}) == 1
    assert sorted([Key("rings", "b", "rx"), Key("link", "z", "mtu"), Key("link", "a", "mtu")]) == [
        Key("link", "a", "mtu"), Key("link", "z", "mtu"), Key("rings", "b", "rx")]
    with pytest.raises(AttributeError):
        key.name = "x"  # frozen: a key never changes under a dict


def test_change_as_dict_leaves_out_empty_note_and_bound():
    change = Change(Key("link", "eth2", "mtu"), 1500, 9000, m.PENDING, "p.yaml:7")
    assert change.as_dict() == {"key": {"family": "link", "target": "eth2", "name": "mtu"},
                                "before": 1500, "after": 9000, "status": "pending", "source": "p.yaml:7"}
    bounded = Change(Key("channels", "eth2", "combined"), 16, 32, m.PENDING, "p.yaml:9", "a note", "min")
    assert bounded.as_dict()["note"] == "a note" and bounded.as_dict()["bound"] == "min"


@pytest.mark.parametrize("before", [1500, None, True, "4096 131072 6291456", "line\n",
                                    {"tx-tcp-segmentation": True, "tx-tcp6-segmentation": False}])
def test_change_round_trips_through_json(before):
    change = Change(Key("features", "eth2", "tso"), before, False, m.REVERT_FAILED, "p.yaml:3", "still on", None)
    again = Change.from_dict(json.loads(json.dumps(change.as_dict())))
    assert again == change


def test_want_json_is_what_the_profile_said():
    assert Want.parse({"min": 32}).as_json() == {"min": 32}
    assert Want.parse(9000).as_json() == 9000
    assert Want(32, "min").value == 32


def test_outcome_defaults_are_not_shared():
    a, b = Outcome("plan"), Outcome("plan")
    a.changes.append(1)
    a.warnings.append("w")
    assert b.changes == [] and b.warnings == [] and a.error is None


def test_host_target_name():
    assert HOST == "host"


def test_every_status_is_documented():
    with open(os.path.join(REPO, "docs", "reference", "report-format.md")) as f:
        documented = set(re.findall(r"^\| `([a-z-]+)` \|", f.read(), re.M))
    assert set(STATUSES) <= documented


def test_every_error_kind_has_an_exit_code():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    kinds = {errors.NictuneError.kind} | {cls.kind for cls in subclasses(errors.NictuneError)}
    assert kinds <= set(errors.EXIT_CODES)
    assert errors.exit_code(None) == 0
    assert errors.exit_code("rolled-back") == 3 and errors.exit_code("rollback-failed") == 4
    assert errors.exit_code("something-new") == 1
    assert errors.Conflict("x").as_dict() == {"kind": "conflict", "message": "x"}
