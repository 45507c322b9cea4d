"""A measurement's row: who measured with whom, on which rail, with which
tool, its figures, and whether it passed and why not.  The gate's result
lists these; baselines are keyed by them."""

from __future__ import annotations

from typing import Optional


def row(client: str, server: Optional[str], rail: str, tool: str) -> dict:
    return {"client": client, "server": server, "rail": rail, "tool": tool,
            "figures": {}, "passed": True, "why": ""}


def describe(r: dict) -> str:
    who = f"{r['client']} > {r['server']}" if r["server"] else r["client"]
    return f"{who} on {r['rail']} ({r['tool']}): {r['why']}"


def fail(row: dict, why: str) -> None:
    row["passed"] = False
    row["why"] = f"{row['why']}; {why}" if row.get("why") else why
