"""host/model.py's records are plain classes (the agent imports the module
on every run, and dataclasses costs more than the rest of a verify), and
behave exactly as the dataclasses they were: each is compared here with a
dataclass twin declared as model.py declared it before."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from nictune.host import model


class twin:  # the declarations model.py had, as dataclasses
    @dataclass(frozen=True, order=True)
    class Key:
        family: str
        target: str
        name: str

    @dataclass(frozen=True)
    class Want:
        value: Any
        bound: Optional[str] = None

    @dataclass(frozen=True)
    class Desired:
        key: Any
        want: Any
        source: str = ""

    @dataclass
    class Change:
        key: Any
        before: Any
        after: Any
        status: str
        source: str = ""
        note: str = ""
        bound: Optional[str] = None
        disruptive: str = ""

    @dataclass(frozen=True)
    class Unsupported:
        reason: str

    @dataclass
    class Outcome:
        command: str
        changes: list = field(default_factory=list)
        warnings: list = field(default_factory=list)
        error: Optional[dict] = None
        facts: dict = field(default_factory=dict)
        extra: dict = field(default_factory=dict)


SAMPLES = {
    "Key": [("link", "eth0", "mtu"), ("link", "eth0", "state"), ("sysctl", "host", "a.b"),
            ("link", "eth1", "mtu")],
    "Want": [(9000,), (9000, None), (32, "min"), ({"min": 1},), ([1, 2],), (True,)],
    "Desired": [(("k",), ("w",)), (("k",), ("w",), "p.yaml:3"), (("k2",), ("w",), "p.yaml:3")],
    "Change": [(("k",), 1500, 9000, "pending"), (("k",), 1500, 9000, "pending", "p:1", "n", "min", "d"),
               (("k",), None, {"a": True}, "ok")],
    "Unsupported": [("no such device",), ("other",)],
    "Outcome": [("plan",), ("verify", [1], ["w"], {"kind": "x"}, {"f": 1}, {"e": 2})],
}


def _pairs(name):
    for args in SAMPLES[name]:
        args = tuple(model.Key("f", "t", a[0]) if isinstance(a, tuple) else a for a in args)
        yield getattr(model, name)(*args), getattr(twin, name)(*args)


def _hash(obj):
    try:
        return ("hash", hash(obj))
    except TypeError as e:
        return ("unhashable", str(e).split("'")[1])


@pytest.mark.parametrize("name", list(SAMPLES))
def test_each_record_behaves_as_its_dataclass(name):
    pairs = list(_pairs(name))
    assert pairs, name
    for mine, theirs in pairs:
        assert repr(mine) == repr(theirs).replace("twin.", "")
        assert type(mine).__match_args__ == type(theirs).__match_args__
        h_mine, h_theirs = _hash(mine), _hash(theirs)
        assert h_mine[0] == h_theirs[0]
        for other_mine, other_theirs in pairs:
            assert (mine == other_mine) == (theirs == other_theirs)
            assert (mine != other_mine) == (theirs != other_theirs)
            if h_mine[0] == "hash" and mine == other_mine:
                assert hash(mine) == hash(other_mine)
        assert (mine == theirs) is False  # another class: never equal, as dataclasses
        frozen = type(theirs).__dataclass_params__.frozen
        for attr in type(theirs).__match_args__:
            if frozen:
                with pytest.raises(AttributeError):
                    setattr(mine, attr, 1)
                with pytest.raises(AttributeError):
                    delattr(mine, attr)
        assert copy.deepcopy(mine) == mine and pickle.loads(pickle.dumps(mine)) == mine


def test_keys_order_as_the_dataclass_ordered_them():
    keys = [args for args in SAMPLES["Key"]]
    mine = sorted(model.Key(*k) for k in keys)
    theirs = sorted(twin.Key(*k) for k in keys)
    assert [repr(k) for k in mine] == [repr(k).replace("twin.", "") for k in theirs]
    a, b = model.Key("a", "b", "c"), model.Key("a", "b", "d")
    assert (a < b, a <= b, a > b, a >= b, a <= a, a >= a) == (True, True, False, False, True, True)
    with pytest.raises(TypeError):
        a < ("a", "b", "c")


def test_init_takes_what_the_dataclass_took():
    assert model.Change(key=model.Key("a", "b", "c"), before=1, after=2, status="ok",
                        disruptive="x").disruptive == "x"
    assert model.Want(value=3, bound="max") == model.Want(3, "max")
    with pytest.raises(TypeError):
        model.Key("a", "b")
    with pytest.raises(TypeError):
        model.Unsupported("a", "b")
    a, b = model.Outcome("plan"), model.Outcome("plan")
    a.changes.append(1)
    a.facts["x"] = 1
    assert b.changes == [] and b.facts == {}
    explicit = model.Outcome("plan", None, None, None, None, None)  # None stays None
    assert explicit.changes is None and explicit.extra is None
    assert json.dumps(model.Key("a", "b", "c").as_dict())


def test_the_model_imports_no_dataclasses():
    agent = os.path.dirname(os.path.dirname(os.path.dirname(model.__file__)))
    code = ("import sys\nsys.path.insert(0, sys.argv[1])\nimport nictune.host.model\n"
            "print('dataclasses' in sys.modules, 'typing' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, agent], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "False"]
