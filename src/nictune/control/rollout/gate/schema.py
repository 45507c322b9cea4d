"""The gate: section's JSON Schema: the words a playbook may use, and their limits."""

from __future__ import annotations

from typing import Any, Dict

from nictune.profile.schema import register_words

RAIL_NAME = r"^(?!\.{1,2}$)(?!-)[A-Za-z0-9_.@-]{1,15}$"
GATE_PERCENT = r"^(100(\.0{1,3})?|[0-9]{1,2}(\.[0-9]{1,3})?)%$"
COUNTER_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.:\[\]-]{0,127}$"
PEERS_PATTERN = r"^[^\x00-\x1f\x7f]{1,1000}$"  # the play's HOST_PATTERN
CPUS_PATTERN = r"^(numa|any|[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?){0,255})$"
register_words({
    RAIL_NAME: "an interface name: 1-15 letters, digits, '_', '.', '@' or '-', not starting with '-'",
    GATE_PERCENT: 'a percentage from "0%" to "100%" with up to 3 decimals ("0.1%")',
    COUNTER_NAME: "a counter name as ethtool -S or sysfs gives it (letters, digits, '_', '.', ':', '-')",
    CPUS_PATTERN: '"numa", "any" or a CPU list as taskset -c takes one ("0-15,32-47")',
})

MAX_SECONDS = 3600
DEFAULT_STREAMS = 8
MAX_STREAMS = 128  # iperf3's own limit (src/iperf.h MAX_STREAMS)
DEFAULT_PORT = 5201
NOT_YET = ("ib_send_lat",)
DEFAULT_PERFTEST_PORT = 18515  # perftest_parameters.h DEF_PORT

_IPERF3_SCHEMA = {
    "type": "object",
    "description": "iperf3 between each pair, TCP, and UDP with udp:.",
    "properties": {
        "seconds": {"type": "integer", "minimum": 1, "maximum": 600,
                    "description": "Length of each run (iperf3 -t). Default 5."},
        "min_gbps": {"type": "number", "minimum": 0, "maximum": 100000,
                     "description": "TCP: the least Gbit/s the server must receive on the rail, all streams "
                                    "together (end.sum_received), per pair and rail. A host's inventory variable "
                                    "nictune_gate_min_gbps replaces it for that host; a pair is held to the "
                                    "lower floor of its two hosts."},
        "streams": {"type": "integer", "minimum": 1, "maximum": MAX_STREAMS,
                    "description": "TCP: parallel streams (iperf3 -P); one stream does not fill a 400G rail. "
                                   f"Default {DEFAULT_STREAMS}. iperf3 3.16 and later runs each in its own "
                                   "thread; with an older one on either end the streams run as one-stream "
                                   "processes on ports port, port+1, ..., their figures summed."},
        "zerocopy": {"type": "boolean",
                     "description": "TCP: send with sendfile() (iperf3 -Z), sparing the sender's CPU. Default "
                                    "false."},
        "cpus": {"type": "string", "pattern": CPUS_PATTERN, "maxLength": 4096,
                 "description": "Where iperf3 runs on both ends (taskset -c): \"numa\" (default) the CPUs local "
                                "to the rail's NIC (/sys/class/net/RAIL/device/local_cpulist, unpinned where the "
                                "rail has no such file), \"any\" unpinned, or a CPU list (\"0-15,32-47\")."},
        "max_retransmits": {"type": "integer", "minimum": 0, "maximum": 2**62,
                            "description": "TCP: the most retransmitted segments the client may count."},
        "udp": {"type": "object", "additionalProperties": False,
                "description": "Also a UDP run at a fixed rate, for loss.",
                "properties": {
                    "gbps": {"type": "number", "minimum": 0.001, "maximum": 100000,
                             "description": "The rate to send at (iperf3 -u -b)."},
                    "max_loss": {"type": "string", "pattern": GATE_PERCENT, "maxLength": 8,
                                 "description": "The most datagrams lost, as a percentage (\"0.1%\")."}},
                "required": ["gbps", "max_loss"]},
    },
    "additionalProperties": False,
}

_IB_WRITE_BW_SCHEMA = {
    "type": "object",
    "description": "perftest ib_write_bw between each pair over the rail's RoCE port (where RDMA devices "
                   "exist), with the GID NCCL would use and the profile's traffic class.",
    "properties": {
        "seconds": {"type": "integer", "minimum": 1, "maximum": 600,
                    "description": "Length of each run (-D). Default 5."},
        "size": {"type": "integer", "minimum": 1, "maximum": 8388608,
                 "description": "Message size in bytes (-s). Default 65536."},
        "min_gbps": {"type": "number", "minimum": 0, "maximum": 100000,
                     "description": "The least average Gbit/s (BW average[Gb/sec])."},
        "tclass": {"type": "integer", "minimum": 0, "maximum": 255,
                   "description": "Traffic class byte (--tclass). Default: the play's profile's "
                                  "(roce.verbs_tos, NCCL_IB_TC, roce.tos: perftest.traffic_class)."},
        "port": {"type": "integer", "minimum": 1024, "maximum": 65535,
                 "description": "TCP port of perftest's out-of-band exchange (-p). Default 18515."},
    },
    "additionalProperties": False,
}

LAUNCHER_ARG = r"^[^\x00-\x1f\x7f]{1,4096}$"
NCCL_PLACEHOLDERS = ("hosts", "addresses", "np", "gpus", "batch", "rollout")

_NCCL_TESTS_SCHEMA = {
    "type": "object",
    "description": "nccl-tests all_reduce_perf once per batch, across its hosts through the site's launcher "
                   "(where the hosts have GPUs and nccl-tests), with a bus bandwidth floor.",
    "properties": {
        "launcher": {"type": "array", "maxItems": 256,
                     "items": {"type": "string", "pattern": LAUNCHER_ARG, "maxLength": 4096},
                     "description": "The site's MPI/Slurm launcher, an argv list put before all_reduce_perf's, "
                                    "run on the batch's first host. Placeholders: {hosts} (the batch's inventory "
                                    "names, comma-joined), {addresses} (their ansible_host addresses), {np} "
                                    "(hosts x gpus ranks), {gpus}; {{ and }} for literal braces. Empty or absent: "
                                    "all_reduce_perf alone on each host of the batch, with -g gpus."},
        "binary": {"type": "string", "minLength": 1, "maxLength": 4096,
                   "description": "all_reduce_perf on the hosts: an absolute path ending in /all_reduce_perf, "
                                  "or all_reduce_perf (found on PATH). Default all_reduce_perf."},
        "gpus": {"type": "integer", "minimum": 1, "maximum": 64,
                 "description": "GPUs per host. With a launcher one rank per GPU (-g 1); without, -g gpus. "
                                "Default 8."},
        "min_bytes": {"type": "integer", "minimum": 1, "maximum": 1 << 40,
                      "description": "Smallest message size in bytes (-b). Default 1 GiB."},
        "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1 << 40,
                      "description": "Largest message size in bytes (-e). Default 1 GiB."},
        "step_factor": {"type": "integer", "minimum": 2, "maximum": 1024,
                        "description": "Size multiplier from one row to the next (-f). Default 2."},
        "iterations": {"type": "integer", "minimum": 1, "maximum": 100000,
                       "description": "Timed iterations per size (-n). Default 20."},
        "warmup": {"type": "integer", "minimum": 0, "maximum": 100000,
                   "description": "Warm-up iterations per size (-w). Default 5."},
        "min_busbw": {"type": "number", "minimum": 0, "maximum": 100000,
                      "description": "The least average bus bandwidth, GB/s (\"# Avg bus bandwidth\")."},
        "timeout": {"type": "number", "minimum": 1, "maximum": MAX_SECONDS,
                    "description": "Seconds the run may take, launcher included; then it is killed. "
                                   "Default: the gate's timeout:, else 300."},
    },
    "additionalProperties": False,
}

GATE_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "title": "gate",
    "description": "Traffic between hosts after a batch is applied and verified (control/rollout/gate/); "
                   "a failed gate rolls the batch back.",
    "properties": {
        "rails": {"type": "array", "minItems": 1, "maxItems": 64, "uniqueItems": True,
                  "items": {"type": "string", "pattern": RAIL_NAME, "maxLength": 15},
                  "description": "Interfaces to exercise, by name, on every host of the pair."},
        "peers": {"type": "string", "pattern": PEERS_PATTERN, "maxLength": 1000,
                  "description": "Inventory pattern of hosts to measure the batch against. Default: the batch's "
                                 "hosts with each other (a ring); a batch of one with the host an earlier batch kept."},
        "timeout": {"type": "number", "minimum": 1, "maximum": MAX_SECONDS,
                    "description": "Seconds one measurement may take, start to end. Default: its length + 15."},
        "port": {"type": "integer", "minimum": 1024, "maximum": 65535,
                 "description": "TCP/UDP port of the iperf3 servers. Default 5201."},
        "iperf3": _IPERF3_SCHEMA,
        "ib_write_bw": _IB_WRITE_BW_SCHEMA,
        "nccl_tests": _NCCL_TESTS_SCHEMA,
        "counters": {"type": "object", "additionalProperties": False,
                     "description": "Health counters read on both ends before and after the traffic "
                                    "(Tls* names: the host's /proc/net/tls_stat, of its network namespace).",
                     "properties": {"max": {
                         "type": "object", "minProperties": 1, "maxProperties": 256,
                         "propertyNames": {"type": "string", "pattern": COUNTER_NAME, "maxLength": 128},
                         "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 2**62},
                         "description": "counter name -> the most it may rise during the traffic."},
                         "min": {
                         "type": "object", "minProperties": 1, "maxProperties": 256,
                         "propertyNames": {"type": "string", "pattern": COUNTER_NAME, "maxLength": 128},
                         "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 2**62},
                         "description": "counter name -> the least it must rise during the traffic: that "
                                        "an offload is in use (TlsTxDevice: 1 while the traffic uses kTLS)."}},
                     "minProperties": 1},
        "ipsec_offload": {"enum": ["crypto", "packet"],
                          "description": "On every host and rail: at least one SA offloaded to the rail in "
                                         "this mode (packet counts as crypto), none of the rail's addresses in "
                                         "software, and the offloaded SAs' packets rising during the traffic "
                                         "(`ip -s xfrm state list nokeys`). The in-use half of expect: "
                                         "{ipsec_offload: {if_present: ...}}."},
        "baseline": {"type": "string", "minLength": 1, "maxLength": 4096,
                     "description": "JSON file of figures written by `nictune gate record`, relative to the "
                                    "playbook's directory."},
        "max_regression": {"type": "string", "pattern": GATE_PERCENT, "maxLength": 8,
                           "description": "How far below its baseline a throughput figure may fall (\"10%\")."},
        **{name: {"type": "object", "description": "Not yet supported by this nictune."} for name in NOT_YET},
    },
    "required": ["rails"],
    "additionalProperties": False,
}
