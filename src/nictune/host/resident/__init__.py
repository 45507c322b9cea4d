"""The resident agent: the agent run as a service, keeping the last applied
profile on its host (daemon.py), and its Prometheus metrics (metrics.py).

`python3 -m nictune.host.resident` runs daemon.main() (__main__.py): the
command line the systemd unit that `nictune agent install` writes starts.
Importing this package imports nothing more.
"""
