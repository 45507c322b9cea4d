"""kTLS counters: /proc/net/tls_stat as health facts and as expect: counters.

The host kernel here has no tls module, so the file is written in the exact
format of the 6.12 kernel's net/tls/tls_proc.c (seq_printf "%-32s\\t%lu\\n"
over tls_mib_list, in its order); tests/vm/guest/test_tls.py reads the real
one.  The host is the recorded ConnectX-7 state on the fake kernel
(tests/fakes.py), as in test_expect.py.
"""

from __future__ import annotations

import pytest

from fakes import FakeHost
from nictune.host import model as m
from nictune.host.transaction.engine import Engine
from nictune.host.facts.health import TLS_COUNTERS, Health, parse_tls_stat

pytestmark = pytest.mark.recorded

P0 = "enp23s0f0np0"


def kernel_text(values: dict) -> str:
    """What tls_statistics_seq_show prints: every counter of tls_mib_list."""
    return "".join("%-32s\t%d\n" % (name, values.get(name, 0)) for name in TLS_COUNTERS)


@pytest.fixture
def host(tmp_path):
    fake = FakeHost("cx7-host", tmp_path / "root")
    fake.state_dir = str(tmp_path / "state")
    return fake


def with_tls(host, values: dict) -> None:
    path = host.path("proc/net/tls_stat")
    import os

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(kernel_text(values))


def test_the_kernel_format_parses_to_every_counter():
    text = kernel_text({"TlsTxSw": 3, "TlsDecryptError": 18446744073709551615})
    assert text.splitlines()[0] == "TlsCurrTxSw                     \t0"
    stat = parse_tls_stat(text)
    assert list(stat) == list(TLS_COUNTERS)
    assert stat["TlsTxSw"] == 3 and stat["TlsDecryptError"] == 2 ** 64 - 1
    # A newer kernel's extra counter is kept (6.14 adds rekey counters).
    assert parse_tls_stat(text + "%-32s\t%d\n" % ("TlsTxRekeyOk", 2))["TlsTxRekeyOk"] == 2


@pytest.mark.parametrize("bad", ["TlsTxSw\n", "TlsTxSw\t-1\n", "TlsTxSw 1 2\n", "Tls;rm 1\n"])
def test_text_that_is_not_the_kernels_is_refused_with_its_line(bad):
    with pytest.raises(ValueError, match="tls_stat line 2"):
        parse_tls_stat(kernel_text({})[:38] + bad)


def test_the_counters_are_health_facts_only_when_the_module_is_loaded(host):
    iface = next(i for i in host.interfaces() if i.name == P0)
    assert "tls" not in Health(host).of(iface)
    with_tls(host, {"TlsCurrTxSw": 1, "TlsTxSw": 4})
    facts = Health(host).of(iface)["tls"]
    assert facts["TlsCurrTxSw"] == 1 and facts["TlsTxSw"] == 4 and facts["TlsTxDevice"] == 0


def doc(expect: dict) -> dict:
    return {"nictune": 1, "interfaces": {"a": {"match": {"name": P0}, "expect": expect}}}


def plan(host, expect):
    out = Engine(host, host.state_dir).plan(doc(expect), {})
    return {c.key.name: c for c in out.changes}


def test_tls_counters_are_expected_like_any_counter(host):
    with_tls(host, {"TlsDecryptError": 0, "TlsTxDevice": 0, "TlsRxSw": 9})
    # counters: the increase over the interval (none: the file stays);
    # counter_totals: the value as it reads (tests/unit/test_counter_rise.py).
    got = plan(host, {"counters": {"TlsDecryptError": 0, "TlsTxDevice": {"min": 1}},
                      "counter_totals": {"TlsRxSw": {"max": 10}}})
    assert {k: (c.status, c.before) for k, c in got.items()} == {
        "counters.TlsDecryptError": (m.OK, 0),
        "counters.TlsTxDevice": (m.DRIFT, 0),     # unmet: drift, never written
        "counter_totals.TlsRxSw": (m.OK, 9),
    }
    with_tls(host, {"TlsDecryptError": 7})
    got = plan(host, {"counter_totals": {"TlsDecryptError": 0}})
    assert got["counter_totals.TlsDecryptError"].before == 7


def test_without_the_tls_module_an_expectation_is_unsupported(host):
    got = plan(host, {"counters": {"TlsDecryptError": 0, "rx_out_of_buffer": {"max": 0}}})
    c = got["counters.TlsDecryptError"]
    assert c.status == m.UNSUPPORTED and "the tls module is not loaded" in c.note
    assert got["counters.rx_out_of_buffer"].status != m.UNSUPPORTED  # ethtool counters as before


def test_a_counter_this_kernel_lacks_is_unsupported_by_name(host):
    with_tls(host, {})
    c = plan(host, {"counters": {"TlsTxRekeyOk": 0}})["counters.TlsTxRekeyOk"]
    assert c.status == m.UNSUPPORTED and "no counter TlsTxRekeyOk" in c.note
