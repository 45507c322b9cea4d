#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nictune contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: profile
short_description: Apply, verify or roll back a nictune profile on a host
version_added: "0.1.0"
description:
  - Runs nictune's agent on the managed host, the same zipapp C(nictune apply -i) ships over SSH
    (nictune's host side and four pyroute2 modules), with the host's own Python 3 and nothing
    installed on it.
  - The controller side (the action plugin of the same name) reads the profile with nictune,
    which must be installed on the controller, builds the request and the agent, and passes
    both to this module.
  - C(state=applied) applies; in check mode it plans (nictune plan) and writes nothing.
    Changed only when something was written. A failed apply is rolled back by nictune and the
    task fails with the rollback's result.
  - C(state=verified) reads only, and fails when the host drifted from the profile.
  - C(state=rolled_back) restores the host as it was before nictune's last apply.
options:
  profile:
    description:
      - Path of the nictune profile on the controller, relative to the playbook's directory.
      - Required unless I(state=rolled_back).
    type: path
  state:
    description: What to do with the profile.
    type: str
    choices: [applied, verified, rolled_back]
    default: applied
  state_dir:
    description:
      - nictune's state directory on the host (journal, history), as the inventory's
        C(nictune_state_dir) sets it for C(nictune apply -i).
    type: path
    default: /var/lib/nictune
  request:
    description:
      - Set by the action plugin, not by the user; the JSON request nictune's agent takes, as text.
      - Never logged, it carries the profile's document (keys included).
    type: str
  agent:
    description:
      - Set by the action plugin, not by the user; the agent zipapp, base64.
    type: str
author:
  - nictune contributors (@nictune)
attributes:
  check_mode:
    support: full
    description: Check mode is nictune plan; nothing is written.
  diff_mode:
    support: full
    description: The before and after of every setting that changes (or drifted).
  platform:
    support: full
    platforms: posix
    description: Linux hosts with Python 3.9 or later.
notes:
  - The collection's role C(nictune.network.profiles) maps inventory groups to profiles.
"""

EXAMPLES = r"""
- name: Tune the NICs of the training nodes
  nictune.network.profile:
    profile: profiles/training.yaml
    state_dir: "{{ nictune_state_dir | default('/var/lib/nictune') }}"

- name: Report drift, write nothing
  nictune.network.profile:
    profile: profiles/training.yaml
    state: verified

- name: Undo nictune's last apply
  nictune.network.profile:
    state: rolled_back
"""

RETURN = r"""
report:
  description: nictune's host report (docs/reference/report-format.md), as C(nictune apply --json) gives it per host.
  returned: always
  type: dict
changes:
  description: The settings that changed, would change, or drifted, as C(key before -> after) lines.
  returned: always
  type: list
  elements: str
rolled_back:
  description:
    - True when an apply failed and nictune restored every change (the report's error kind
      C(rolled-back)); a rollback that failed too has kind C(rollback-failed).
  returned: always
  type: bool
"""

import base64
import json
import os
import sys
import tempfile

from ansible.module_utils.basic import AnsibleModule

COMMANDS = {"applied": "apply", "verified": "verify", "rolled_back": "rollback"}


def run_agent(module, request, agent):
    """The agent's one-line JSON report for `request`."""
    fd, path = tempfile.mkstemp(suffix=".pyz")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(agent))
        rc, out, err = module.run_command([sys.executable, "-I", path], data=json.dumps(request),
                                          binary_data=True, environ_update={"LANG": "C"})
    finally:
        os.unlink(path)
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        module.fail_json(msg="nictune's agent gave no report (exit %d): %s" % (rc, err.strip()[-500:]))


def key_text(key):
    target = key.get("target")
    where = "" if target in (None, "host") else "%s " % target
    return "%s%s %s" % (where, key.get("family", ""), key.get("name", ""))


def shown(value):
    return "(absent)" if value is None else json.dumps(value) if not isinstance(value, str) else value


def diff_of(report):
    """Ansible's before/after: one line per setting that is not as wanted."""
    rows = [c for c in report.get("changes") or [] if c.get("status") not in ("ok", "unchanged")]
    before = "".join("%s = %s\n" % (key_text(c["key"]), shown(c.get("before"))) for c in rows)
    after = "".join("%s = %s\n" % (key_text(c["key"]), shown(c.get("after"))) for c in rows)
    lines = ["%s: %s -> %s (%s)" % (key_text(c["key"]), shown(c.get("before")), shown(c.get("after")),
                                    c.get("status")) for c in rows]
    return {"before": before, "after": after, "before_header": "host", "after_header": "profile"}, lines


def main():
    module = AnsibleModule(
        argument_spec=dict(
            profile=dict(type="path"),
            state=dict(type="str", choices=list(COMMANDS), default="applied"),
            state_dir=dict(type="path", default="/var/lib/nictune"),
            # no_log: neither the profile's document (MACsec, IPsec keys) nor 380 kB of
            # agent in the invocation Ansible logs; text, so that only these whole values mask.
            request=dict(type="str", no_log=True),
            agent=dict(type="str", no_log=True),
        ),
        required_if=[("state", "applied", ("profile",)), ("state", "verified", ("profile",))],
        supports_check_mode=True,
    )
    request, agent = module.params["request"], module.params["agent"]
    if not request or not agent:
        module.fail_json(msg="nictune.network.profile runs through its action plugin (the controller "
                             "needs nictune installed); request and agent are set by it")
    try:
        request = dict(json.loads(request), state_dir=module.params["state_dir"])
    except (TypeError, ValueError) as e:
        module.fail_json(msg="request is not nictune's JSON request: %s" % e)
    state = module.params["state"]
    if module.check_mode and state != "verified":
        request["command"] = "plan"  # check mode: nictune plan, nothing written
    report = run_agent(module, request, agent)
    diff, lines = diff_of(report)
    error = report.get("error") or {}
    rolled_back = error.get("kind") == "rolled-back"  # host/errors.py: every change was restored
    result = dict(changed=bool(report.get("changed")) and not module.check_mode, report=report,
                  changes=lines, rolled_back=rolled_back, diff=diff)
    if module.check_mode and state == "applied":
        result["changed"] = bool(lines)  # what an apply would write
    if error:
        module.fail_json(msg="nictune %s: %s" % (request["command"], error.get("message", error)), **result)
    if state == "verified" and lines:
        module.fail_json(msg="nictune verify: %d setting(s) drifted: %s" % (len(lines), "; ".join(lines)),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
