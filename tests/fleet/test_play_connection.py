"""A play's vars reach the SSH connection (issue 9, item 15), against a real sshd.

The inventory gives one host a wrong address, port, user and key; the
play gives the right ones.  As in Ansible, play vars win over inventory
vars, so the plan reaches the host.  The fleet is the namespace hosts of
tests/fleet/conftest.py, removed when the module ends.
"""

from __future__ import annotations

import pytest
from fleet_helpers import ECN_PROFILE, nictune

pytestmark = pytest.mark.netns

def test_play_vars_set_address_port_user_and_key(fleet, tmp_path):
    host = fleet.of_kind("sshd")[0]
    wrong_address = fleet.of_kind("unreachable")[0].address
    inventory = tmp_path / "inv.ini"
    inventory.write_text(open(fleet.inventory).read().replace(
        f"{host.name} ansible_host={host.address} ansible_user=root ansible_ssh_private_key_file={fleet.key_file}",
        f"{host.name} ansible_host={wrong_address} ansible_port=1 ansible_user=nobody "
        f"ansible_ssh_private_key_file={tmp_path}/absent_key"))
    assert wrong_address in inventory.read_text()
    (tmp_path / "p.yaml").write_text(ECN_PROFILE)
    playbook = tmp_path / "pb.yaml"
    playbook.write_text(f"- hosts: {host.name}\n  profile: p.yaml\n  vars:\n"
                        f"    ansible_host: {host.address}\n    ansible_port: 22\n    ansible_user: root\n"
                        f"    ansible_ssh_private_key_file: {fleet.key_file}\n")

    code, report = nictune("plan", str(tmp_path / "p.yaml"), "-i", str(inventory), "--limit", host.name,
                           "--connect-timeout", "2")
    assert code == 1 and report["hosts"][0]["unreachable"], report  # as the inventory says: wrong

    code, report = nictune("plan", str(playbook), "-i", str(inventory), "--connect-timeout", "2")
    [result] = report["hosts"]
    assert result["host"] == host.name and result["ok"], result
