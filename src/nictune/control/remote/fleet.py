"""Many hosts at once: inventory hosts -> per-host profiles -> SSH agents.

The controller resolves each host's profile (the profile, then the
inventory's `nictune:` override layers, then a play's) into the same plain
request the local CLI sends, and runs a bounded pool of SSH sessions.  A
host that cannot be reached, or does not answer in time, gets a report
with an error like any other failure; it never stops the others.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from nictune.control.remote import connection
from nictune.control.remote.hostreport import ProtocolError
from nictune.control.remote.request import build_request
from nictune.control.remote.ssh import SshHost, SshOptions, SshTarget
from nictune.host import errors
from nictune.host.errors import InvalidInput, NictuneError
from nictune.host.transaction.journal import DEFAULT_STATE_DIR
from nictune.inventory.errors import InventoryError, shown

DEFAULT_FORKS = 50

# Ansible's interpreter discovery values mean "find python3 yourself".
_DISCOVER = ("auto", "auto_legacy", "auto_silent", "auto_legacy_silent")


@dataclass
class Job:
    """One host's part of a fleet command."""
    label: str
    target: Optional[SshTarget]
    request: Optional[dict]
    error: Optional[dict] = None  # set when the host could not even be prepared


def ssh_host(host) -> SshHost:
    """The connection settings of an inventory host (Ansible variable names),
    as its play sees them when it comes from one (playbook.Play.host).
    Raises InventoryError, naming the variable and where it is set, for a
    host nictune would otherwise reach otherwise than Ansible: another
    connection plugin, another become, ssh args it cannot honour."""
    v = {name: _plain(host, name) for name in _READ_AS_IS}
    transport = connection.transport(host)
    connection.check_become(host)
    # ansible_python_interpreter only when used: nictune_python may stand in
    # for one written as a template ("{{ ansible_playbook_python }}").
    python = v["nictune_python"] or _plain(host, "ansible_python_interpreter") or "python3"
    if python in _DISCOVER:
        python = "python3"
    if transport == "ssh":
        line = connection.command_line(host)
    else:  # Ansible's paramiko connection reads neither the ssh args nor ~/.ssh/config
        line = connection.own_options(host)
    return SshHost(
        label=host.name,
        address=host.address,
        port=line.port,
        user=line.user,
        key_files=line.key_files,
        python=str(python),
        state_dir=str(v["nictune_state_dir"] or DEFAULT_STATE_DIR),
        known_hosts=line.known_hosts or [],
        proxy_jump=line.proxy_jump,
        identities_only=line.identities_only,
        hostname=line.hostname,
        proxy_command=line.proxy_command,
        host_key_note=connection.host_key_note(host, line),
        read_ssh_config=transport == "ssh",
    )


# The variables ssh_host() reads itself (the inventory Host checks the others),
# and ansible_python_interpreter when nictune_python is unset.
_READ_AS_IS = ("nictune_python", "nictune_state_dir",
               "ansible_ssh_common_args", "ansible_ssh_extra_args")


def _plain(host, name: str):
    """A variable's value, refused when it is Ansible Vault ciphertext, which
    would otherwise be read as the text of its placeholder, or a template
    Ansible would render, which would be used as written."""
    from nictune.inventory.model import VAULT_ADVICE, Vaulted
    from nictune.inventory.templates import NOT_RENDERED, is_template

    value = host.vars.get(name)
    if isinstance(value, Vaulted):
        file, line = host.where_of(name) or (None, None)
        raise InventoryError(file, line, f"{name} of host {host.name!r} is an Ansible Vault "
                                         f"value (!vault); {VAULT_ADVICE}")
    if is_template(value):
        file, line = host.where_of(name) or (None, None)
        advice = "; set nictune_python to the interpreter's path" if name == "ansible_python_interpreter" else ""
        raise InventoryError(file, line, f"{name} of host {host.name!r} {NOT_RENDERED}: {shown(value)}{advice}")
    return value


class Profiles:
    """Per-host profiles: the base profile plus each host's override layers.
    Hosts with the same layers share one merged, validated profile -- or
    one error: a broken profile is built and linted once, not once per host."""

    def __init__(self, path: str, gate: Optional[Callable] = None, document=None):
        self.path = path
        self.gate = gate  # e.g. lint: raises on a profile that must not run
        # The file as profile.yamlpos.read_target parsed it (or the
        # ProfileError reading it raised), so it is not read once more;
        # None: read it here.
        self.document = document
        self._cache: Dict[str, object] = {}  # layers -> profile, or the exception it raised

    def for_host(self, host):
        layers = list(host.nictune_overrides())
        # repr, not json.dumps(sort_keys=True): an inventory may give a mapping
        # keys of mixed types, which sort_keys cannot order (the merge refuses them).
        key = repr(layers)
        if key not in self._cache:
            try:
                profile = self._build(layers)
                if self.gate:
                    self.gate(profile)
                self._cache[key] = profile
            except Exception as e:  # noqa: BLE001 - stored and raised again for each host
                self._cache[key] = e
        found = self._cache[key]
        if isinstance(found, Exception):
            raise found
        return found

    def _build(self, layers: list):
        from nictune.profile.loader import load_profile, load_profile_parsed

        if isinstance(self.document, Exception):
            raise self.document
        if self.document is not None:
            return load_profile_parsed(self.document, self.path, overrides=layers)
        return load_profile(self.path, overrides=layers)


class PlayProfiles(Profiles):
    """A play's per-host profiles: its profiles, inventory layers, play vars."""

    def __init__(self, play, gate: Optional[Callable] = None):
        super().__init__(play.profiles[0], gate=gate)
        self.play = play

    def _build(self, layers: list):
        return self.play.profile(layers)


def jobs_for(command: str, hosts: list, profiles: Optional[Profiles], options: SshOptions,
             show_file_content: bool = False, lldp_wait: float = 0) -> List[Job]:
    """hosts: inventory hosts, as their play sees them if they come from one."""
    jobs = []
    for host in hosts:
        try:
            target = SshTarget(ssh_host(host), options)
            profile = profiles.for_host(host) if profiles else None
            jobs.append(Job(host.name, target, build_request(command, profile, show_file_content, lldp_wait)))
        except InvalidInput as e:  # a bad nictune_state_dir...: its message names no host
            jobs.append(Job(host.name, None, None, errors.error(errors.INVALID_INPUT,
                                                                f"{host.name}: {e}")))
        except NictuneError as e:  # ProfileError included
            jobs.append(Job(host.name, None, None, e.as_dict()))
    return jobs


def failed_report(label: str, command: str, error: dict, seconds: float = 0.0) -> dict:
    """A host report for a host whose agent never answered: the agent's own
    report shape (agent.report), plus whether the host was unreachable."""
    from nictune.host import agent
    from nictune.host.model import Outcome

    report = agent.report(Outcome(command, error=error), label, time.monotonic() - seconds)
    report["unreachable"] = error["kind"] == errors.TRANSPORT
    return report


def run_jobs(command: str, jobs: List[Job], forks: int = DEFAULT_FORKS,
             progress: Optional[Callable[[dict], None]] = None) -> List[dict]:
    """Run every job, at most `forks` at a time; reports in the jobs' order."""
    reports: List[Optional[dict]] = [None] * len(jobs)

    def one(job: Job) -> dict:
        started = time.monotonic()
        if job.error:
            return failed_report(job.label, command, job.error)
        try:
            return job.target.run(job.request)
        except ProtocolError as e:  # the host answered, with nonsense: reached, not trusted
            return dict(failed_report(job.label, command, e.as_dict(), time.monotonic() - started),
                        unreachable=False)
        except NictuneError as e:
            return failed_report(job.label, command, e.as_dict(), time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - one host's surprise is that host's error
            return failed_report(job.label, command, errors.error(
                errors.SYSTEM, f"{job.label}: {type(e).__name__}: {e}"), time.monotonic() - started)

    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(jobs)))) as pool:
        futures = {pool.submit(one, job): i for i, job in enumerate(jobs)}
        for future in as_completed(futures):
            report = future.result()
            reports[futures[future]] = report
            if progress:
                progress(report)
    return reports  # type: ignore[return-value]
