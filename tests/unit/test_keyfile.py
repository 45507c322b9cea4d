"""Key files (host/transports/keyfile.py): who may hold a key, how it is fingerprinted,
and that no refusal ever quotes the key."""

from __future__ import annotations

import hashlib
import os

import pytest

from nictune.host.transports import keyfile
from nictune.host.errors import InvalidInput

KEY = "00112233445566778899aabbccddeeff"


def _write(path, text=KEY + "\n", mode=0o600, uid=0):
    path.write_text(text)
    os.chmod(path, mode)
    os.chown(path, uid, 0)
    return str(path)


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.skip("key files must be owned by root: these tests chown")


def test_a_good_file_gives_the_key_and_the_fingerprint(tmp_path):
    path = _write(tmp_path / "k")
    key, fp = keyfile.load(path, length=16)
    assert bytes(key) == bytes.fromhex(KEY)
    assert fp == hashlib.sha256((KEY + "\n").encode()).hexdigest()[:8]
    assert keyfile.check(path) == fp
    keyfile.wipe(key)
    assert bytes(key) == bytes(16)


def test_a_rotation_changes_the_fingerprint(tmp_path):
    a = keyfile.check(_write(tmp_path / "a"))
    b = keyfile.check(_write(tmp_path / "b", "ff" * 16))
    assert a != b and len(a) == len(b) == 8


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o400, 0o700, 0o604])
def test_any_mode_but_0600_is_refused(tmp_path, mode):
    path = _write(tmp_path / "k", mode=mode)
    with pytest.raises(InvalidInput, match=f"mode {mode:04o}, must be 0600") as e:
        keyfile.load(path)
    assert KEY not in str(e.value)


def test_a_file_not_owned_by_root_is_refused(tmp_path):
    path = _write(tmp_path / "k", uid=65534)
    with pytest.raises(InvalidInput, match="owned by uid 65534, must be owned by root"):
        keyfile.load(path)


def test_symlinks_directories_fifos_and_missing_files_are_refused(tmp_path):
    real = _write(tmp_path / "k")
    os.symlink(real, tmp_path / "link")
    with pytest.raises(InvalidInput, match="symbolic link"):
        keyfile.load(str(tmp_path / "link"))
    d = tmp_path / "dir"
    d.mkdir(mode=0o600)
    with pytest.raises(InvalidInput, match="not a regular file"):
        keyfile.load(str(d))
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(InvalidInput, match="not a regular file"):
        keyfile.load(str(tmp_path / "fifo"))
    with pytest.raises(InvalidInput, match="does not exist"):
        keyfile.load(str(tmp_path / "none"))
    with pytest.raises(InvalidInput, match="absolute path"):
        keyfile.load("relative/key")


@pytest.mark.parametrize("text", ["", "0011zz", "001", KEY + "\n\n", "0x" + KEY, KEY + " "])
def test_content_that_is_not_hex_is_refused_without_quoting_it(tmp_path, text):
    path = _write(tmp_path / "k", text)
    with pytest.raises(InvalidInput, match="hex digits") as e:
        keyfile.load(path)
    assert text.strip() == "" or text.strip() not in str(e.value)


def test_the_length_must_match_the_cipher(tmp_path):
    path = _write(tmp_path / "k")
    with pytest.raises(InvalidInput, match="16-byte key, the cipher needs 32 bytes") as e:
        keyfile.load(path, length=32)
    assert KEY not in str(e.value)


def test_a_symlinked_directory_on_the_path_is_refused(tmp_path):
    """O_NOFOLLOW covers the last name only: a link higher up (keys -> an
    attacker's directory) is refused too, at every depth."""
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    _write(real / "sub" / "k")
    os.symlink(real, tmp_path / "keys")
    os.symlink(real / "sub", real / "linked-sub")
    for path, link in ((tmp_path / "keys" / "sub" / "k", tmp_path / "keys"),
                       (real / "linked-sub" / "k", real / "linked-sub")):
        with pytest.raises(InvalidInput, match=f"{link} \\(on its path\\) is a symbolic link") as e:
            keyfile.load(str(path))
        assert KEY not in str(e.value)
    assert keyfile.check(str(real / "sub" / "k"))  # the same file by its own path
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidInput, match="file \\(on its path\\) is not a directory"):
        keyfile.load(str(tmp_path / "file" / "k"))
    with pytest.raises(InvalidInput, match="does not exist"):
        keyfile.load(str(tmp_path / "no-dir" / "k"))


@pytest.mark.parametrize("path", ["{d}/../{d_name}/k", "{d}/./k", "{d}//k", "{d}/k/", "/"])
def test_a_key_path_must_be_normalised(tmp_path, path):
    d = tmp_path / "d"
    d.mkdir()
    _write(d / "k")
    text = path.format(d=d, d_name=d.name)
    with pytest.raises(InvalidInput, match="must be an absolute, normalised path"):
        keyfile.load(text)


@pytest.mark.parametrize("path", ["/etc/keys/../shadow", "/etc/./k", "/etc//k", "/etc/k/"])
def test_the_profile_schema_refuses_a_key_path_that_is_not_normalised(path):
    from nictune.profile.errors import ProfileError
    from nictune.profile.loader import load_profile_text

    for section in (f"macsec: {{tx_sa: {{an: 0, key_file: '{path}'}}}}",
                    f"ipsec: {{sas: [{{src: 198.18.0.1, dst: 198.18.0.2, spi: 4097, reqid: 1, "
                    f"key_file: '{path}'}}]}}"):
        text = f"nictune: 1\ninterfaces:\n  r:\n    match: {{name: r0}}\n    {section}\n"
        with pytest.raises(ProfileError, match="key_file.*is not allowed.*normalised"):
            load_profile_text(text, "p.yaml")
