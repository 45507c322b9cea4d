# -*- coding: utf-8 -*-
# Copyright: nictune contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The controller's half of nictune.network.profile: reads the profile with
nictune (installed on the controller), builds the request and the agent
zipapp nictune ships over SSH, and runs the module with both."""

from __future__ import absolute_import, division, print_function
__metaclass__ = type

import base64
import json

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

COMMANDS = {"applied": "apply", "verified": "verify", "rolled_back": "rollback"}


def _nictune_request(path, command):
    try:
        from nictune.cli.reporting import load_profile
        from nictune.control.remote import agentzip
        from nictune.control.remote.request import build_request
        from nictune.host.errors import NictuneError
    except ImportError as e:
        raise AnsibleActionFail("nictune.network.profile needs nictune on the controller: %s" % e)
    try:
        profile = load_profile(path) if path else None
    except NictuneError as e:
        raise AnsibleActionFail(str(e))
    return json.dumps(build_request(command, profile)), base64.b64encode(agentzip.build().data).decode()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        state = args.get("state", "applied")
        if state not in COMMANDS:
            raise AnsibleActionFail("state must be one of %s, got %r" % (", ".join(COMMANDS), state))
        path = args.get("profile")
        if path:
            path = self._loader.path_dwim(path)
        elif state != "rolled_back":
            raise AnsibleActionFail("profile is required with state=%s" % state)
        request, agent = _nictune_request(path, COMMANDS[state])
        args.update(request=request, agent=agent)
        if path:
            args["profile"] = path
        result.update(self._execute_module(module_name="nictune.network.profile", module_args=args,
                                           task_vars=task_vars))
        # The module's echo of its arguments would carry the profile's document (secrets
        # included: MACsec and IPsec keys) and the 380 kB agent into every -v log.
        result["invocation"] = {"module_args": dict((k, args[k]) for k in ("profile", "state", "state_dir")
                                                    if k in args)}
        return result
