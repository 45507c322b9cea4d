"""tests/nsenter.py, the helper the other netns tests enter namespaces with."""

from __future__ import annotations

import os

import pytest

from nsenter import in_netns

pytestmark = pytest.mark.netns


def test_in_netns_restores_namespace(veth_pair):
    home = os.readlink("/proc/self/ns/net")
    with in_netns(None):
        assert os.readlink("/proc/self/ns/net") == home
    with in_netns(veth_pair.ns_a):
        inside = os.readlink("/proc/self/ns/net")
        assert inside != home
    assert os.readlink("/proc/self/ns/net") == home
    with pytest.raises(KeyError):
        with in_netns(veth_pair.ns_b):
            assert os.readlink("/proc/self/ns/net") not in (home, inside)
            raise KeyError("boom")
    assert os.readlink("/proc/self/ns/net") == home
    with pytest.raises(FileNotFoundError):
        with in_netns("ntdoesnotexist"):
            pass
    assert os.readlink("/proc/self/ns/net") == home
    for bad in ("", "..", "a/b", "x" * 65):
        with pytest.raises(ValueError):
            with in_netns(bad):
                pass


def test_namespace_names_are_checked_before_anything_is_opened(veth_pair):
    # Was Rtnl("../etc"), when the host-side classes took a namespace name.
    with pytest.raises(ValueError):
        with in_netns("../etc"):
            pass
