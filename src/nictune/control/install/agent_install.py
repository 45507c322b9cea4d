"""`nictune agent install|uninstall|status`: the resident agent as a systemd
service, on this host or over SSH.

What lands on a host: the zipapp the SSH path ships (control/remote/agentzip.py,
the same bytes, checked against its SHA-256 on arrival) as
<state dir>/resident/nictune-agent.pyz, and the unit UNIT_NAME in the unit
directory (/etc/systemd/system unless told otherwise).  The zipapp is not
put under <state dir>/agent/: that is the SSH bootstrap's cache, which
discards whatever it does not recognise there.

Both ways run the same script, INSTALLER, with the host's own python3:
locally as a child process, over SSH as the one command of the session
(under `sudo -n` for a non-root login, as the agent).  So the unit's
ExecStart names the interpreter the host itself found, and one code path is
tested both ways.  Exchange: for install, once its checks pass, the script
says "python <path>" and is sent the archive and the unit text, each as
"<length>\\n<bytes>"; every action ends with one JSON line (what changed,
or why not).

The unit file (unit_text) says why each hardening setting is what it is;
the reasons are checked against systemd.exec(5), systemd.special(7) and
systemd-udev-settle.service(8) of systemd 252 (Debian 12), and the
capabilities against the kernel's checks named there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

from nictune.control.remote import agentzip
from nictune.control.outcome import Outcome
from nictune.host.errors import SYSTEM, InvalidInput, NictuneError, TransportError
from nictune.host import knobs
from nictune.host.validate import within
from nictune.profile.check import OWNED_SECTIONS

UNIT_NAME = "nictune-agent.service"
UNIT_DIR = "/etc/systemd/system"
ZIPAPP = os.path.join("resident", "nictune-agent.pyz")
# Paths end up in a unit file, where systemd expands % specifiers and $
# variables and splits on blanks: only plain absolute paths are let through.
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._+/-]{0,4095}$")
_ADDRESS = re.compile(r"^$|^(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9.-]{1,253}):[0-9]{1,5}$")
MIN_INTERVAL = 0.05


def owned_file_dirs() -> List[str]:
    """The directories the owned-file families write in without a profile's
    allowed_dirs: those of their default paths, a directory below another
    left out.  An owned file is replaced by rename, and a family creates its
    file's directory when missing (/etc/ucx): the parent must be writable."""
    dirs = sorted({os.path.dirname(knobs.load(s).default_path) for s in OWNED_SECTIONS})
    return [d for d in dirs if not any(o != d and within(d, o) for o in dirs)]


def check_path(value: str, what: str) -> str:
    if not _PLAIN_PATH.match(value or "") or "/../" in value + "/" or "//" in value:
        raise InvalidInput(
            f"{what} {value!r} is not a plain absolute path: it is written into a systemd unit, "
            "where % and $ are expanded and blanks split words, so only letters, digits and "
            "._+-/ are accepted (no '..', no '//')")
    return value.rstrip("/") or "/"


def check_options(interval: float, metrics_address: str) -> None:
    if not interval >= MIN_INTERVAL or interval != interval or interval == float("inf"):
        raise InvalidInput(f"--interval {interval!r} is not a number of seconds of at least "
                           f"{MIN_INTERVAL:g}: the agent polls what sends no notification "
                           "this often")
    if not _ADDRESS.match(metrics_address) or (
            metrics_address and not 0 < int(metrics_address.rsplit(":", 1)[1]) < 65536):
        raise InvalidInput(f"--metrics-address {metrics_address!r} is not HOST:PORT (a port "
                           "1-65535), nor '' for no metrics endpoint")


def unit_text(python: str, state_dir: str, interval: float = 30.0,
              metrics_address: str = "127.0.0.1:9463", metrics_detail: bool = False) -> str:
    """The systemd unit of the resident agent (host/resident/daemon.py) run from the
    zipapp under state_dir, by `python`; metrics_detail: its --metrics-detail."""
    python, state_dir = check_path(python, "python"), check_path(state_dir, "state directory")
    check_options(interval, metrics_address)
    zipapp = os.path.join(state_dir, ZIPAPP)
    argv = [python, "-s", "-S", "-m", "nictune.host.resident", "--state-dir", state_dir,
            "--interval", repr(float(interval)), "--metrics-address", metrics_address]
    argv += ["--metrics-detail"] if metrics_detail else []
    # systemd's own quoting: "" for the empty address (no endpoint).
    exec_start = " ".join(a if a else '""' for a in argv)
    return f"""\
# Written by `nictune agent install`; `nictune agent uninstall` removes it.
[Unit]
Description=nictune resident agent: keeps the last applied profile
# Ordering (systemd.special(7)).  The agent tunes netdevs that the NIC drivers
# create; those are loaded by udev's coldplug (systemd-udev-trigger.service),
# and a netdev that appears later (a slow driver, a VF, a reload) is re-tuned
# by the agent itself when its link notification arrives.  So it waits for
# the trigger, not for systemd-udev-settle.service, which is deprecated and
# would hold the boot for every device.  Before=network-pre.target (pulled in
# with Wants=, as that target asks of its users): MTU, rings and DCB are set
# before networkd/NetworkManager bring links up, and so before
# network-online.target, which also is ordered after it explicitly.
After=systemd-udev-trigger.service systemd-modules-load.service local-fs.target
Wants=network-pre.target
Before=network-pre.target network-online.target

[Service]
Type=simple
# The zipapp (the archive the SSH path ships) is the only code imported: -S
# keeps site-packages out, -s the user site; the manager's environment is
# empty apart from this.
Environment=PYTHONPATH={zipapp}
ExecStart={exec_start}
Restart=on-failure
RestartSec=5s
# Everything read-only but the API file systems (/proc, /sys, /dev), the state
# directory and the directories owned files may be in by default
# ({", ".join(owned_file_dirs())}: the families' default paths).  /proc/sys
# and /sys stay writable as long as ProtectKernelTunables= is off, and it must
# stay off: it remounts /proc/sys and /sys read-only, which forbids every
# sysctl and sysfs write the agent makes (configfs rdma_cm is
# /sys/kernel/config).  The owned files (nccl.conf, openmpi-mca-params.conf,
# ...) are replaced by rename, which needs their directory writable; the rest
# of /usr, /boot, /opt, /home and /root stay read-only ('-': a directory need
# not exist in an image that builds it later).  A directory a profile adds
# with allowed_dirs is read-only here too: add it with a drop-in
# (systemctl edit nictune-agent: ReadWritePaths=-DIR).
ProtectSystem=strict
ReadWritePaths={state_dir} {" ".join("-" + d for d in owned_file_dirs())}
# /run is read-only under ProtectSystem=strict, and the agent locks each
# target in /run/nictune (host/transaction/journal.py TARGET_LOCK_DIR) as every nictune
# does: systemd makes it writable, root's alone, and keeps it when the
# service stops (a CLI apply may hold a lock there).  The VM tier's boot
# under systemd found the agent unable to apply anything without it.
RuntimeDirectory=nictune
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=yes
PrivateTmp=yes
NoNewPrivileges=yes
# CAP_NET_ADMIN: every netlink write (rtnetlink, ethtool genetlink:
# GENL_UNS_ADMIN_PERM in net/ethtool/netlink.c; dcbnl: dcb_doit's
# netlink_capable(skb, CAP_NET_ADMIN) in net/dcb/dcbnl.c; devlink, rdma
# netlink), the SIOCETHTOOL set ioctls (dev_ethtool, net/ethtool/ioctl.c),
# net sysctls and netdev sysfs attributes (netdev_store,
# net/core/net-sysfs.c).  CAP_CHOWN: an owned file is replaced by a new one
# given the old one's owner (host/files.py).  Not granted: CAP_SYS_ADMIN (no
# setns, mount or PCI config-space write; configfs and sysfs files are
# root-owned, so uid 0 writes them by their mode bits alone), CAP_NET_RAW
# (netlink sockets need none; no packet sockets), CAP_DAC_OVERRIDE (all it
# touches is root's), CAP_NET_BIND_SERVICE (the metrics port is above 1023).
# A sysctl or driver attribute whose handler checks another capability
# fails with EPERM in the plan's read-back: add it with a drop-in
# (systemctl edit nictune-agent).
CapabilityBoundingSet=CAP_NET_ADMIN CAP_CHOWN
RestrictAddressFamilies=AF_NETLINK AF_UNIX AF_INET AF_INET6

[Install]
WantedBy=multi-user.target
"""


# Runs as `python3 -I -S -c INSTALLER ACTION STATE_DIR UNIT_DIR SYSTEMCTL SHA256`
# on the host, as root.  SYSTEMCTL is "1" to run systemctl, "0" for --no-start.
INSTALLER = r"""
import hashlib, json, os, subprocess, sys
action, state, unit_dir, systemctl, sha = sys.argv[1:6]
UNIT = "nictune-agent.service"
unit_path = os.path.join(unit_dir, UNIT)
zip_path = os.path.join(state, "resident", "nictune-agent.pyz")
out, inp = sys.stdout, sys.stdin.buffer
os.umask(0o077)

def done(**report):
    out.write(json.dumps(report) + "\n"); out.flush()
    sys.exit(0 if report.get("ok") else 1)

def fail(why):
    done(ok=False, error=why)

def received():
    size = int(inp.readline())
    data = inp.read(size)
    if len(data) != size:
        fail("the controller's data arrived cut short")
    return data

def put(path, data, mode):
    # Unchanged files are left as they are (a second install changes nothing).
    try:
        with open(path, "rb") as f:
            if f.read() == data and os.stat(path).st_mode & 0o7777 == mode:
                return False
    except FileNotFoundError:
        pass
    tmp = "%s.nictune-new-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True

def systemd_runs():
    return os.path.isdir("/run/systemd/system")  # sd_booted(3)

def sysctl(*args):
    r = subprocess.run(["systemctl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    return r.returncode, (r.stdout.strip() or r.stderr.strip())

def run_systemctl(*args):
    code, text = sysctl(*args)
    if code:
        fail("systemctl %s failed (exit %d): %s" % (" ".join(args), code, text))

def unsafe_state():
    if not os.path.exists(state):
        return None
    st = os.stat(state)
    if not os.path.isdir(state):
        return "%s is not a directory" % state
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return ("%s must be owned by uid %d and writable by nobody else: the agent runs "
                "as root from what it holds" % (state, os.geteuid()))
    return None

try:
    if systemctl == "1" and action != "status" and not systemd_runs():
        fail("systemd is not running on this host (no /run/systemd/system), so the agent "
             "cannot be started or stopped as a service: use --no-start to only write or "
             "remove the files")
    if not os.path.isdir(unit_dir):
        fail("the unit directory %s does not exist (systemd reads units from "
             "/etc/systemd/system; --unit-dir names another)" % unit_dir)
    if action == "install":
        why = unsafe_state()
        if why:
            fail(why)
        # The interpreter by its real path: a virtualenv's python is a link to
        # it, and one under /tmp (a checkout there) is hidden from the
        # service by PrivateTmp=yes, as the VM tier's boot under systemd found.
        python = os.path.realpath(sys.executable)
        if python.startswith(("/tmp/", "/var/tmp/")):
            fail("the interpreter %s lies under %s, which the service's PrivateTmp=yes hides "
                 "from it: install with a python3 outside it" % (python, python.split("/")[1]))
        # Ready: what is known to fail has been said instead of this line.
        out.write("python %s\n" % python); out.flush()
        zipdata, unit = received(), received()
        if hashlib.sha256(zipdata).hexdigest() != sha:
            fail("the agent archive arrived damaged")
        os.makedirs(state, mode=0o700, exist_ok=True)
        os.makedirs(os.path.dirname(zip_path), mode=0o700, exist_ok=True)
        changed = [p for p, d, m in ((zip_path, zipdata, 0o600), (unit_path, unit, 0o644))
                   if put(p, d, m)]
        if systemctl == "1":
            run_systemctl("daemon-reload")
            run_systemctl("enable", UNIT)
            run_systemctl("restart" if changed else "start", UNIT)
        done(ok=True, changed=changed, unit=unit_path, zipapp=zip_path, started=systemctl == "1")
    elif action == "uninstall":
        if systemctl == "1" and os.path.exists(unit_path):  # else nothing to stop: done before
            run_systemctl("disable", "--now", UNIT)
        removed = []
        for path in (unit_path, zip_path):
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(os.path.dirname(zip_path))
        except OSError:
            pass
        if systemctl == "1":
            run_systemctl("daemon-reload")
        done(ok=True, changed=removed, unit=unit_path, zipapp=zip_path)
    elif action == "status":
        report = dict(ok=True, unit=unit_path, zipapp=zip_path,
                      unit_installed=os.path.isfile(unit_path),
                      zipapp_installed=os.path.isfile(zip_path), systemd=systemd_runs())
        if report["systemd"]:
            report["active"] = sysctl("is-active", UNIT)[1]
            report["enabled"] = sysctl("is-enabled", UNIT)[1]
        try:
            with open(os.path.join(state, "agent-status.json")) as f:
                report["agent"] = json.load(f)
        except (OSError, ValueError):
            report["agent"] = None
        done(**report)
    else:
        fail("unknown action %r" % action)
except OSError as e:
    fail("%s: %s" % (getattr(e, "filename", None) or "a file", e.strerror or e))
"""


def _argv(python: str, action: str, state_dir: str, unit_dir: str, start: bool) -> List[str]:
    sha = agentzip.build().sha256 if action == "install" else "-"
    return [python, "-I", "-S", "-c", INSTALLER, action, state_dir, unit_dir,
            "1" if start else "0", sha]


def _exchange(send, readline, action: str, state_dir: str, interval: float,
              metrics_address: str, label: str, metrics_detail: bool = False) -> dict:
    """The controller's side of INSTALLER, over any pair of byte streams."""
    line = readline()
    if action == "install" and line.startswith(b"python /"):
        python = line[len(b"python "):].strip().decode()
        bundle = agentzip.build()
        unit = unit_text(python, state_dir, interval, metrics_address, metrics_detail).encode()
        send(b"%d\n" % len(bundle.data) + bundle.data + b"%d\n" % len(unit) + unit)
        line = readline()
    try:
        report = json.loads(line)
    except ValueError:
        raise TransportError(f"{label}: the installer sent no report") from None
    if not isinstance(report, dict) or not isinstance(report.get("ok"), bool):
        raise TransportError(f"{label}: the installer's report is not one")
    return {**report, **_outcome(report).fields(), "host": label}


def _outcome(report: dict) -> Outcome:
    """The installer's report in the one result shape: its error (a string,
    as the installer runs without nictune) becomes {kind, message}."""
    if report["ok"]:
        changed = report.get("changed")
        return Outcome(True, changed=[str(p) for p in changed] if isinstance(changed, list) else [])
    return Outcome.failed(SYSTEM, str(report.get("error") or "the installer failed without saying why"))


def run_local(action: str, state_dir: str, unit_dir: str = UNIT_DIR, start: bool = True,
              interval: float = 30.0, metrics_address: str = "127.0.0.1:9463",
              python: Optional[str] = None, metrics_detail: bool = False) -> dict:
    state_dir, unit_dir = check_path(state_dir, "state directory"), check_path(unit_dir, "unit directory")
    check_options(interval, metrics_address)
    proc = subprocess.Popen(_argv(python or sys.executable, action, state_dir, unit_dir, start),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def send(data: bytes) -> None:
            proc.stdin.write(data)
            proc.stdin.flush()

        return _exchange(send, proc.stdout.readline, action, state_dir, interval,
                         metrics_address, "localhost", metrics_detail)
    except TransportError as e:
        proc.kill()
        tail = proc.stderr.read().decode(errors="replace").strip().splitlines()[-1:]
        raise TransportError(f"{e}{': ' + tail[0] if tail else ''}") from None
    finally:
        proc.stdin.close()
        proc.wait()


def run_ssh(host, options, action: str, unit_dir: str, start: bool, interval: float,
            metrics_address: str, metrics_detail: bool = False) -> dict:
    """host: an SshHost (control/remote/fleet.py ssh_host)."""
    from nictune.control.remote import ssh

    state_dir = check_path(host.state_dir, "nictune_state_dir")
    unit_dir = check_path(unit_dir, "unit directory")
    if not ssh.PYTHON.match(host.python):
        raise InvalidInput(f"{host.label}: nictune_python {host.python!r} is not a python3 "
                           "command or an absolute path")
    client, hops = ssh._open(host, options)
    try:
        argv = _argv(host.python, action, state_dir, unit_dir, start)
        if client.get_transport().get_username() != "root":
            argv = ["sudo", "-n", "--"] + argv
        chan = client.get_transport().open_session(timeout=options.connect_timeout)
        lines = ssh._Lines(chan, time.monotonic() + options.command_timeout, host.label)
        chan.exec_command("exec " + " ".join(shlex.quote(a) for a in argv))
        try:
            report = _exchange(chan.sendall, lambda: lines.readline("installer answer"), action,
                               state_dir, interval, metrics_address, host.label, metrics_detail)
        except TransportError as e:
            raise TransportError(f"{e} ({ssh._stderr_tail(chan) or 'no error output'})") from None
        chan.shutdown_write()
        chan.status_event.wait(max(0.0, lines.deadline - time.monotonic()))
        return report
    except (OSError, EOFError, ssh.paramiko.SSHException) as e:
        raise TransportError(f"{host.label}: the session failed: {e}") from None
    finally:
        client.close()
        for c in hops:
            c.close()


def run_fleet(hosts: list, options, action: str, unit_dir: Optional[str], start: bool,
              interval: float, metrics_address: str, forks: int = 50,
              metrics_detail: bool = False) -> List[dict]:
    """hosts: inventory hosts.  A host's own unit directory may come from its
    inventory variable nictune_unit_dir; --unit-dir (unit_dir) wins."""
    from nictune.control.remote import fleet

    check_options(interval, metrics_address)

    def one(host) -> dict:
        try:
            where = unit_dir or fleet._plain(host, "nictune_unit_dir") or UNIT_DIR
            return run_ssh(fleet.ssh_host(host), options, action, str(where), start, interval,
                           metrics_address, metrics_detail)
        except NictuneError as e:
            return {"host": host.name, **Outcome.of_error(e).fields()}
        except Exception as e:  # noqa: BLE001 - one host's surprise is that host's error
            return {"host": host.name, **Outcome.failed(SYSTEM, f"{type(e).__name__}: {e}").fields()}

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(hosts)))) as pool:
        return list(pool.map(one, hosts))


def service_status(state_dir: str, unit_dir: str = UNIT_DIR) -> dict:
    """This host's side of INSTALLER's status, in-process (no child python
    for `nictune agent status`, which scripts poll)."""
    unit_path, zip_path = os.path.join(unit_dir, UNIT_NAME), os.path.join(state_dir, ZIPAPP)
    report = {"unit": unit_path, "zipapp": zip_path, "unit_installed": os.path.isfile(unit_path),
              "zipapp_installed": os.path.isfile(zip_path),
              "systemd": os.path.isdir("/run/systemd/system")}
    if report["systemd"]:
        for word in ("is-active", "is-enabled"):
            r = subprocess.run(["systemctl", word, UNIT_NAME], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True)
            report[word[3:]] = r.stdout.strip() or r.stderr.strip()
    return report
