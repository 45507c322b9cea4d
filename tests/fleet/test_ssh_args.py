"""ansible_ssh_common_args against a real sshd: the options Ansible's ssh
would take from them are the ones nictune connects with.

Each host of the inventory below is one sshd host of the fleet (the
namespace hosts of tests/fleet/conftest.py, removed when the module ends),
reached only if nictune honours what the args say: its address and port
only in `-o HostName`/`-p`, a ProxyCommand (a relay script that notes its
use), and StrictHostKeyChecking=no, which nictune does not honour and now
says so when it refuses the host key.
"""

from __future__ import annotations

import json
import sys

import pytest
from fleet_helpers import nictune

from nictune.inventory import load_inventory

pytestmark = pytest.mark.netns

RELAY = """\
#!{python}
# A ProxyCommand: note the use, then relay stdin/stdout to host:port.
import os, socket, sys, threading
with open({mark!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
conn.settimeout(None)
def upstream():
    while True:
        data = os.read(0, 65536)
        if not data:
            conn.shutdown(socket.SHUT_WR)
            return
        conn.sendall(data)
threading.Thread(target=upstream, daemon=True).start()
while True:
    data = conn.recv(65536)
    if not data:
        break
    os.write(1, data)
"""


def _inventory(fleet, tmp_path, relay) -> str:
    host = fleet.of_kind("sshd")[0]
    own = load_inventory(fleet.inventory).hosts[host.name].vars
    common = {"nictune_state_dir": own["nictune_state_dir"], "nictune_python": own["nictune_python"]}
    hosts = {
        # Not a name that resolves: only -o HostName says where it is.
        "nt-args-only": dict(common, ansible_ssh_common_args=(
            f"-o HostName={host.address} -l root -p {host.port} -i {fleet.key_file} "
            f"-o UserKnownHostsFile={fleet.known_hosts} -o IdentitiesOnly=yes")),
        "nt-proxied": dict(common, ansible_host=host.address, ansible_user="root",
                           ansible_ssh_private_key_file=fleet.key_file, ansible_ssh_common_args=(
                               f"-o 'ProxyCommand={relay} %h %p' -o UserKnownHostsFile={fleet.known_hosts}")),
        "nt-unchecked": dict(common, ansible_host=host.address, ansible_user="root",
                             ansible_ssh_private_key_file=fleet.key_file,
                             ansible_ssh_common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"),
    }
    path = tmp_path / "hosts.yml"
    path.write_text(json.dumps({"all": {"hosts": hosts}}, indent=1))
    return str(path)


@pytest.fixture
def inventory(fleet, tmp_path):
    mark = tmp_path / "relay.log"
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY.format(python=sys.executable, mark=str(mark)))
    relay.chmod(0o755)
    return _inventory(fleet, tmp_path, relay), mark


def plan(profile, inventory, name) -> dict:
    code, report = nictune("plan", profile, "-i", inventory, "--limit", name, "--connect-timeout", "5")
    [result] = report["hosts"]
    return result


def test_address_port_user_and_key_from_the_args_alone(fleet, profile, inventory):
    result = plan(profile, inventory[0], "nt-args-only")
    assert result["ok"], result["error"]


def test_a_proxy_command_from_the_args_carries_the_session(fleet, profile, inventory):
    path, mark = inventory
    result = plan(profile, path, "nt-proxied")
    assert result["ok"], result["error"]
    host = fleet.of_kind("sshd")[0]
    assert mark.read_text().split("\n")[0] == f"{host.address} 22"


def test_strict_host_key_checking_no_is_refused_by_name(fleet, profile, inventory):
    path, _ = inventory
    result = plan(profile, path, "nt-unchecked")
    assert result["unreachable"] and not result["ok"]
    message = result["error"]["message"]
    assert "unknown host key" in message, message
    assert f"-o StrictHostKeyChecking=no in ansible_ssh_common_args ({path}:" in message
