"""Playbook rollouts: plays in batches (playbook.py), the hooks around them,
the traffic gate after each batch (gate/) and the traffic tools it drives
(traffic.py, perftest.py, nccltests.py)."""
