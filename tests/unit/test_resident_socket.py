"""The fast audit's pieces on this machine: the stream-local channel-open
message the controller sends (control/remote/ssh.py), and the resident agent's
socket (host/resident/daemon.py AuditSocket): bounded request, plan/verify only,
its own archive only, a uid-0 peer only (a real client run as nobody with
setpriv), and a real verify answered through it.  The whole path over real
sshd is tests/fleet/test_resident_audit_fleet.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading

import pytest

from nictune.control.remote.ssh import STREAMLOCAL, streamlocal_open
from nictune.host.resident import daemon
from nictune.host.resident.daemon import AuditSocket, read_request, refusal


def _string(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def test_the_channel_open_carries_the_streamlocal_payload():
    # OpenSSH PROTOCOL 2.4: byte SSH_MSG_CHANNEL_OPEN (90), string
    # "direct-streamlocal@openssh.com", uint32 sender channel, uint32 window,
    # uint32 max packet, string socket path, string reserved, uint32 reserved.
    got = streamlocal_open(7, 2097152, 32768, "/var/lib/nictune/agent.sock").asbytes()
    want = (bytes([90]) + _string(STREAMLOCAL.encode()) + struct.pack(">III", 7, 2097152, 32768)
            + _string(b"/var/lib/nictune/agent.sock") + _string(b"") + struct.pack(">I", 0))
    assert STREAMLOCAL == "direct-streamlocal@openssh.com"
    assert got == want


def test_a_request_is_one_bounded_line_in_bounded_time():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b'{"x": 1}\nrest')
        assert read_request(b, limit=100) == b'{"x": 1}'
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x" * 200)
        with pytest.raises(ValueError, match="longer than 100 bytes"):
            read_request(b, limit=100)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"no newline yet")
        with pytest.raises(ValueError, match="no request line within"):
            read_request(b, timeout=0.2)


def test_only_plan_and_verify_of_this_archive_and_state_dir_pass(tmp_path):
    state = str(tmp_path)
    ok = {"command": "verify", "agent_id": "abc", "state_dir": state}
    assert refusal(ok, state, "abc") is None
    assert refusal(dict(ok, command="plan"), state, "abc") is None
    for command in ("apply", "rollback", "show", None):
        assert "only plan and verify" in refusal(dict(ok, command=command), state, "abc")
    assert refusal(dict(ok, agent_id="def"), state, "abc") == "version"
    assert refusal(ok, state, None) == "version"  # not run from an archive: never answers
    assert refusal(dict(ok, state_dir="/elsewhere"), state, "abc") == "another state directory"
    assert refusal([ok], state, "abc") == "not a request"


def _serve_once(server: AuditSocket) -> threading.Thread:
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    return t


def _ask(path: str, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX) as c:
        c.connect(path)
        c.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def test_the_socket_is_root_only_and_answers_a_real_verify(tmp_path):
    state = str(tmp_path / "state")
    os.mkdir(state, 0o700)
    server = AuditSocket(state, "abc", allowed_uid=os.getuid())
    try:
        assert oct(os.stat(server.path).st_mode & 0o777) == "0o600"
        request = {"nictune_request": 1, "command": "verify", "state_dir": state,
                   "agent_id": "abc", "profile": {"path": "p.yaml", "doc": {}}}
        t = _serve_once(server)
        answer = _ask(server.path, request)
        t.join(10)
        assert answer["agent_id"] == "abc" and answer["command"] == "verify", answer
        assert answer["ok"] and answer["error"] is None and "refused" not in answer

        t = _serve_once(server)
        answer = _ask(server.path, dict(request, command="apply"))
        t.join(10)
        assert answer["refused"] == "only plan and verify through the socket"
    finally:
        server.close()
    assert not os.path.exists(server.path)


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv")
                    or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, setpriv and /usr/bin/python3")
def test_a_peer_that_is_not_root_is_refused(tmp_path):
    # The file mode keeps others out already; here it is opened on purpose
    # so that the credential check alone stands between nobody and the agent.
    top = tempfile.mkdtemp(dir="/tmp")  # pytest's tmp_path lies under a 0700 directory
    state = os.path.join(top, "state")
    os.mkdir(state)
    for d in (top, state):
        os.chmod(d, 0o755)
    server = AuditSocket(state, "abc")
    os.chmod(server.path, 0o666)
    client = ("import json, socket, sys\n"
              "c = socket.socket(socket.AF_UNIX); c.connect(sys.argv[1])\n"
              "c.sendall(json.dumps({'command': 'verify', 'agent_id': 'abc', "
              "'state_dir': sys.argv[2]}).encode() + b'\\n')\n"
              "print(c.makefile().readline())\n")
    try:
        t = _serve_once(server)
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              "/usr/bin/python3", "-I", "-c", client, server.path, state],
                             capture_output=True, text=True, timeout=20, cwd="/")
        t.join(10)
    finally:
        server.close()
        shutil.rmtree(top)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"nictune_resident": 1, "refused": "uid 65534 is not allowed",
                                      "agent_id": None}


def test_not_run_from_an_archive_the_agent_has_no_id():
    assert daemon.archive_id() is None  # imported from the source tree here
