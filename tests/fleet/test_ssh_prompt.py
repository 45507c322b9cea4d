"""A connection to a real OpenSSH sshd sends at once (TCP_NODELAY) and
acknowledges the server's unsolicited host-keys notice at once: without
both, Nagle's algorithm and the client's delayed ACK hold each connection
some 80 ms (control/remote/ssh.py _prompt_transport; the time is the
bench's to show, bench/bench_controller.py's SSH figures)."""

from __future__ import annotations

import re
import socket

import paramiko
import pytest

from nictune.control.remote import ssh

pytestmark = pytest.mark.netns


def endpoint(fleet, host) -> ssh._Endpoint:
    config = open(fleet.ssh_config).read()
    key = re.search(r"IdentityFile (\S+)", config).group(1)
    known = re.search(r"UserKnownHostsFile (\S+)", config).group(1)
    return ssh._Endpoint(host.address, 22, "root", [key], [known], None, None, True)


def test_a_connection_sends_at_once_and_acknowledges_the_host_keys_notice(fleet, monkeypatch):
    notices = []
    parse = paramiko.Transport._parse_global_request

    def noted(self, m):
        notices.append(m.get_text())
        m.rewind()
        return parse(self, m)

    monkeypatch.setattr(paramiko.Transport, "_parse_global_request", noted)
    host = fleet.of_kind("sshd")[0]
    client = ssh._connect(endpoint(fleet, host), ssh.SshOptions(connect_timeout=10))
    try:
        transport = client.get_transport()
        chan = transport.open_session()
        chan.exec_command("true")
        assert chan.recv_exit_status() == 0
        assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        # OpenSSH sent its notice, and it went through the handler that acknowledges it
        assert "hostkeys-00@openssh.com" in notices, notices
        handler = transport._handler_table[paramiko.common.MSG_GLOBAL_REQUEST]
        assert getattr(handler, "__name__", "") == "global_request"
    finally:
        client.close()


def test_a_socket_that_is_not_tcp_is_left_as_it_is():
    a, b = socket.socketpair()
    try:
        transport = ssh._prompt_transport(a)
        handler = transport._handler_table[paramiko.common.MSG_GLOBAL_REQUEST]
        assert handler == transport._parse_global_request
    finally:
        a.close()
        b.close()
