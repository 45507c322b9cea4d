"""Reviewing changes and drift: what a profile change does apart from
today's drift (change.py, gitrev.py for --base REF), snapshots for offline
plans, and reports for people and machines (markdown.py, audit_formats.py)."""
