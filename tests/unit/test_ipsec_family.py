"""The ipsec family's own logic, without a kernel that takes SAs (the host
has no ESP; tests/vm/guest/test_ipsec_sas.py installs them for real): what
marks nictune's SAs and policies, what plans show (fingerprint, never the
key), what the schema and expand refuse."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from jsonschema import Draft202012Validator

from nictune.host.errors import InvalidInput
from nictune.host.transports.io import LiveIO
from nictune.host.knobs import family_named
from nictune.host.knobs import ipsec as fam
from nictune.host.model import Key, Unsupported
from nictune.host.transports.netlink.xfrm import Alg, Offload, Policy, Sa, Template
from nictune.profile import SCHEMA

KEY = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"


@pytest.fixture
def key_file(tmp_path):
    def make(hexkey=KEY, name="k"):
        path = tmp_path / name
        path.write_text(hexkey + "\n")
        os.chmod(path, 0o600)
        return str(path)
    if os.getuid() != 0:
        pytest.skip("key files must be root's")
    return make


def family(driver="netdevsim"):
    host = SimpleNamespace(interfaces=lambda: [SimpleNamespace(name="eth0", index=3,
                                                               driver=driver)],
                           io=LiveIO())  # key files are read through the host's port
    return fam.IpsecFamily(host)


def source(*path):
    return "p.yaml:" + ".".join(path)


def section(key_path, **over):
    sa = {"src": "198.18.0.1", "dst": "198.18.0.2", "spi": 0x1001, "reqid": 1,
          "key_file": key_path, "offload": "crypto", "dir": "out", **over}
    return {"ipsec": {"lab": True, "sas": [sa], "policies": [
        {"src": "198.18.0.1", "dst": "198.18.0.2/32", "dir": "out",
         "tmpl": {"src": "198.18.0.1", "dst": "198.18.0.2", "reqid": 1}}]}}


def test_the_plan_shows_the_fingerprint_never_the_key(key_file):
    f = family()
    path = key_file()
    sa, pol = f.expand("eth0", section(path), source)
    assert sa.key == Key("ipsec", "eth0", "sa 198.18.0.2 esp 0x00001001")
    assert sa.want.value == ("198.18.0.1 > 198.18.0.2 reqid 1 transport rfc4106(gcm(aes)) "
                             "160 bits icv 128 offload crypto dir out replay 128 esn lifetime "
                             "packets 3000000000/4000000000")
    assert pol.key.name == "policy 198.18.0.1/32 > 198.18.0.2/32 dir out"
    assert pol.want.value == ("tmpl 198.18.0.1 > 198.18.0.2 esp transport reqid 1 priority 0 "
                              "offload none")
    note = f.note(sa.key)
    from nictune.host.transports.keyfile import fingerprint
    assert f"fingerprint {fingerprint((KEY + chr(10)).encode())}" in note
    assert "0x6e740001" in note
    assert "nothing rekeys it" in note and "restarts its AES-GCM nonces" in note
    texts = repr((sa, pol, note, f.note(pol.key))).lower()
    assert KEY not in texts and KEY[:16] not in texts


def test_expand_refuses_what_must_not_reach_the_kernel(key_file):
    f = family()
    with pytest.raises(InvalidInput, match=r"p.yaml:ipsec.sas.0: ipsec.sas\[0\]: .*does not "
                                           r"appear to be an IPv4 or IPv6 address"):
        f.expand("eth0", section(key_file(), dst="198.18.0.300"), source)
    with pytest.raises(InvalidInput, match="both must be of one family"):
        family().expand("eth0", section(key_file(), dst="2001:db8::2"), source)
    with pytest.raises(InvalidInput, match="holds 16 bytes; rfc4106.* takes 20, 28 or 36"):
        family().expand("eth0", section(key_file("00" * 16)), source)
    with pytest.raises(InvalidInput, match="an offloaded SA needs dir"):
        sec = section(key_file())
        del sec["ipsec"]["sas"][0]["dir"]
        family().expand("eth0", sec, source)
    path = key_file()
    os.chmod(path, 0o644)
    with pytest.raises(InvalidInput, match="ipsec.sas\\[0\\].key_file: .*mode 0644"):
        family().expand("eth0", section(path), source)
    sec = section(key_file())
    sec["ipsec"]["sas"].append(dict(sec["ipsec"]["sas"][0]))
    with pytest.raises(InvalidInput, match="a second SA to 198.18.0.2 with spi 0x00001001"):
        family().expand("eth0", sec, source)


def test_the_schema_takes_the_shape_and_refuses_ranges():
    v = Draft202012Validator(SCHEMA)

    def errors(sa):
        doc = {"nictune": 1, "interfaces": {"r": {"match": {"name": "eth0"},
                                                  "ipsec": {"sas": [sa]}}}}
        return [e.message for e in v.iter_errors(doc)]

    ok = {"src": "198.18.0.1", "dst": "198.18.0.2", "proto": "esp", "spi": 0x1001, "reqid": 7,
          "mode": "tunnel", "aead": "rfc4106(gcm(aes))", "icv": 96, "key_file": "/etc/k",
          "offload": "packet", "dir": "in", "replay_window": 256, "esn": True,
          "lifetime": {"soft_packets": 1, "hard_packets": 2, "soft_bytes": 3, "hard_bytes": 4}}
    assert errors(ok) == []
    assert errors({**ok, "replay_window": 100}) and errors({**ok, "replay_window": 0})
    assert errors({**ok, "lifetime": {"hard_packets": 0}})
    assert errors({**ok, "lifetime": {"hard_packets": 2 ** 64 - 1}})  # that is XFRM_INF
    assert errors({**ok, "spi": 255}) and errors({**ok, "spi": 2 ** 32})
    assert errors({**ok, "reqid": 0}) and errors({**ok, "reqid": 65536})
    assert errors({**ok, "proto": "ah"}) and errors({**ok, "icv": 100})
    assert errors({**ok, "key": KEY})  # no inline key: key files only
    assert errors({**ok, "key_file": "etc/k"})


def sa(reqid, offload=Offload(3, False, False), spi=0x1001):
    return Sa("198.18.0.1", "198.18.0.2", spi, "esp", "transport", reqid,
              "out" if offload else None, offload, (Alg("aead", "rfc4106(gcm(aes))", 160, 128),))


def test_an_sa_is_nictunes_only_by_its_reqid_block():
    f = family()
    names = {3: "eth0", 4: "eth1"}
    assert fam.nictune_reqid(0x6E740001) == 1 and fam.nictune_reqid(0x6E74FFFF) == 0xFFFF
    assert fam.nictune_reqid(1) is None and fam.nictune_reqid(0x6E740000) is None
    assert fam.nictune_reqid(0x6E750000) is None
    # As `ip xfrm state add` without options leaves it: no window, no ESN, no limits.
    assert f._sa_value(sa(0x6E740001), "eth0", names) == (
        "198.18.0.1 > 198.18.0.2 reqid 1 transport rfc4106(gcm(aes)) 160 bits icv 128 "
        "offload crypto dir out replay 0 no-esn lifetime packets inf/inf")
    assert f._sa_value(sa(0x6E740001, Offload(4, False, False)), "eth0", names).endswith(
        "offload crypto dir out on eth1 replay 0 no-esn lifetime packets inf/inf")
    foreign = f._sa_value(sa(1), "eth0", names)  # strongSwan's first reqid
    assert isinstance(foreign, Unsupported)
    assert "not installed by nictune (reqid 0x1" in foreign.reason
    assert f._sa_value(None, "eth0", names) is None


def test_a_policy_is_nictunes_only_when_every_template_is():
    f = family()
    t = Template("198.18.0.1", "198.18.0.2", "esp", 0, "transport", 0x6E740001)
    pol = Policy("198.18.0.1/32", "198.18.0.2/32", "out", 0, 8, None, (t,))
    assert f._policy_value(pol, "eth0", {}) == (
        "tmpl 198.18.0.1 > 198.18.0.2 esp transport reqid 1 priority 0 offload none")
    ike = Template("198.18.0.1", "198.18.0.2", "esp", 0, "transport", 1)
    for templates in ((ike,), (t, ike), ()):
        value = f._policy_value(Policy("198.18.0.1/32", "198.18.0.2/32", "out", 0, 8, None,
                                       templates), "eth0", {})
        assert isinstance(value, Unsupported), templates


def test_each_nic_class_is_told(key_file):
    f = family_named("ipsec")
    assert f is fam.IpsecFamily
    assert f.nic_support("mana", "ipsec.sas").startswith("not supported by mana")
    assert "crypto and packet" in f.nic_support("mlx5_core", "ipsec.sas")
    mana = family("mana")
    (k, _pol) = [d.key for d in mana.expand("eth0", section(key_file()), source)]
    assert mana.check(k, None).startswith("not supported by mana")
    sw = family("mana")
    (k, _pol) = [d.key for d in sw.expand("eth0", section(key_file(), offload="none"), source)]
    assert sw.check(k, None) is None
    nsim = family("netdevsim")
    (k, _pol) = [d.key for d in nsim.expand("eth0", section(key_file(), esn=False), source)]
    assert nsim.check(k, None) is None


def test_esn_crypto_offload_is_refused_where_the_driver_has_no_advance_esn(key_file):
    # net/xfrm/xfrm_device.c xfrm_dev_state_add: netdevsim has no
    # xdo_dev_state_advance_esn; the plan says so from the driver rule.
    from nictune.host.facts import nicclass

    nsim = family("netdevsim")
    (k, _pol) = [d.key for d in nsim.expand("eth0", section(key_file()), source)]
    assert nsim.check(k, None) == (f"not supported by netdevsim: "
                                   f"{nicclass.IPSEC_ESN_NO_ADVANCE.why} "
                                   f"({nicclass.IPSEC_ESN_NO_ADVANCE.source})")
    mlx5 = family("mlx5_core")  # the capability is the firmware's: left to the kernel
    (k, _pol) = [d.key for d in mlx5.expand("eth0", section(key_file()), source)]
    assert mlx5.check(k, None) is None
    sw = family("netdevsim")  # ESN in software is always there
    (k, _pol) = [d.key for d in sw.expand("eth0", section(key_file(), offload="none"), source)]
    assert sw.check(k, None) is None


def test_static_sas_are_refused_outside_a_lab(key_file):
    doc = section(key_file())
    del doc["ipsec"]["lab"]
    with pytest.raises(InvalidInput, match=r"^p.yaml:ipsec.sas: ipsec.sas: static SAs are "
                                           r"refused outside a lab: nothing rekeys.*nonce.*"
                                           r"set ipsec.lab: true$"):
        family().expand("eth0", doc, source)
    doc["ipsec"]["lab"] = False
    with pytest.raises(InvalidInput, match="refused outside a lab"):
        family().expand("eth0", doc, source)
    # Policies alone pass (they only route traffic to SAs).
    (pol,) = family().expand("eth0", {"ipsec": {"policies": doc["ipsec"]["policies"]}}, source)
    assert pol.key.name.startswith("policy ")


def test_every_sa_gets_a_replay_window_esn_and_lifetimes(key_file):
    (sa, _pol) = family().expand("eth0", section(
        key_file(), replay_window=64, esn=False,
        lifetime={"soft_packets": 10, "hard_packets": 20, "soft_bytes": 4000,
                                  "hard_bytes": 5000}), source)
    assert sa.want.value.endswith("offload crypto dir out replay 64 no-esn lifetime packets "
                                  "10/20 bytes 4000/5000")
    for lifetime, problem in (({"soft_packets": 20, "hard_packets": 20}, "not below"),
                              ({"soft_bytes": 9, "hard_bytes": 5}, "not below"),
                              ({"hard_bytes": 5}, "soft_bytes inf is not below"),
                              ({"hard_packets": 2 ** 32}, "32-bit sequence space")):
        with pytest.raises(InvalidInput, match=rf"p.yaml:ipsec.sas.0: ipsec.sas\[0\].lifetime"
                                               rf".*{problem}"):
            family().expand("eth0", section(key_file(), esn=False, lifetime=lifetime), source)
    # With ESN the sequence space is 64-bit: only the key's wear bounds it.
    (sa, _pol) = family().expand("eth0", section(key_file(), lifetime={"hard_packets": 2 ** 40}),
                                 source)
    assert "packets 3000000000/1099511627776" in sa.want.value


def test_a_key_file_error_names_the_profile_line_of_its_sa(tmp_path):
    """Through the loader's sources, as a plan gets them: a list item has
    a line of its own (ipsec.sas[1] is not the line of ipsec.sas)."""
    from fakes import FakeHost
    from nictune.host import agent
    from nictune.profile.loader import load_profile

    missing = tmp_path / "no-such-key"
    profile = tmp_path / "p.yaml"
    profile.write_text(
        "nictune: 1\ninterfaces:\n  rails:\n    match: {driver: mlx5_core}\n    ipsec:\n"
        "      lab: true\n      sas:\n"
        "        - {src: 198.18.0.1, dst: 198.18.0.2, spi: 0x1001, reqid: 1, offload: none,\n"
        f"           key_file: {missing}}}\n"
        "        - src: 198.18.0.1\n          dst: 198.18.0.3\n          spi: 0x1002\n"
        f"          reqid: 2\n          offload: none\n          key_file: {missing}\n")
    loaded = load_profile(str(profile))
    report = agent.run({"nictune_request": 1, "command": "plan", "state_dir": str(tmp_path / "s"),
                        "profile": {"path": loaded.path, "doc": loaded.doc,
                                    "sources": loaded.sources}},
                       host=FakeHost("cx7-host", tmp_path / "root"))
    assert report["error"]["message"] == (f"{profile}:9: ipsec.sas[0].key_file: key file "
                                          f"{missing}: does not exist")
    assert loaded.sources["interfaces/rails/ipsec/sas/1/key_file"] == f"{profile}:15"
