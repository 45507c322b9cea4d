"""Hosts that are not the live one: recorded reads, answered again.

snapshot.py records a show's reads at the Host's port (`nictune show --save`)
and replays them for `nictune plan --from-snapshots`; snapshot_check.py
checks a snapshot file before a replay trusts it; probe_reads.py takes an
agentless audit's reads apart into the questions the probe asks and answers
them back; decoded.py lets those replays share what hosts answered alike.
"""
