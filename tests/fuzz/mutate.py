"""Seeded mutations of YAML/INI text for the fuzz tests (test helper).

Two kinds: edits of the text (lines dropped, doubled, swapped, re-indented,
hazards spliced in) and edits of the parsed tree (a value swapped for a
hostile one, a key dropped, added or misspelt).  The hostile values are
those a red team reached for: paths into /proc, /dev and /etc/shadow, names
with escapes, numbers at the edges, YAML tags that construct objects, alias
bombs.  Everything is driven by one random.Random, so a seed names a case.
"""

from __future__ import annotations

import random
from typing import Any, List

import yaml

HOSTILE_VALUES: List[Any] = [
    None, True, False, 0, -1, 1 << 64, 1.5, float("nan"), 1e309, "", " ", "x" * 5000,
    "eth0\x1b[31m", "rt#1", "a\nb", "../../etc/shadow", "/etc/shadow", "/proc/self/environ",
    "/dev/zero", "/sys/class/net/lo/mtu", "/etc/nccl.conf/../shadow", "auto", "AUTO", "=",
    "^", "$(reboot)", "`id`", "; rm -rf /", "{{ ansible_host }}", "lab*", "[a-", "\u202e",
    "\x00", [], {}, [1, [2, [3]]], {"a": {"b": {"c": None}}}, {"match": {}}, "9000", 9000,
    68, 65536, 2 ** 31, -(2 ** 31), "0x10", "1e3", "yes", "on", "~",
]

# Spliced into the text as whole lines or at the end of one.
HAZARDS: List[str] = [
    "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system",
    "&a [*a]",
    "a: &x [1, 2]\nb: [*x, *x, *x, *x]\nc: [*b, *b, *b]",
    "? [complex, key]\n: value",
    "%YAML 1.1\n---",
    "---\n---",
    "...",
    "\t",
    "<<: *undefined",
    "key: 'unterminated",
    "key: \"\\x1b[2J\"",
    "[" * 50,
    "{a: {b: {c: {d: {e: {f: 1}}}}}}",
    "nictune: 2",
    "extends: /etc/passwd",
    "extends: ../../../../etc/shadow",
    "extends: [a.yaml, a.yaml]",
    "interfaces: {x: {match: {name: \"*\"}, mtu: 1}}",
    "host: {nccl: {path: /proc/self/environ}}",
    "host: {sysctl: {kernel.core_pattern: '|/bin/sh'}}",
    "host: {sysctl: {../../proc/sys/kernel/x: 1}}",
    "\ufeffnictune: 1",
    "\x00",
]


def tree_mutation(rng: random.Random, doc: Any) -> Any:
    """doc with one node changed: replaced, dropped, added to or misspelt."""
    paths = list(_paths(doc, ()))
    if not paths:
        return rng.choice(HOSTILE_VALUES)
    path = rng.choice(paths)
    parent = _get(doc, path[:-1]) if path else None
    op = rng.randrange(5)
    if not path:
        return rng.choice(HOSTILE_VALUES)
    last = path[-1]
    if op == 0:
        parent[last] = rng.choice(HOSTILE_VALUES)
    elif op == 1 and isinstance(parent, dict):
        del parent[last]
    elif op == 2 and isinstance(parent, dict):
        parent[rng.choice(["x", "unknown", str(last) + "_", "Match", "on_unsupported", 0, None])] = (
            rng.choice(HOSTILE_VALUES))
    elif op == 3 and isinstance(parent, dict) and isinstance(last, str) and last:
        value = parent.pop(last)
        parent[last[:-1] if rng.random() < 0.5 else last.upper()] = value
    elif isinstance(parent, list):
        parent.append(parent[last])
    else:
        parent[last] = rng.choice(HOSTILE_VALUES)
    return doc


def text_mutation(rng: random.Random, text: str) -> str:
    lines = text.splitlines()
    if not lines:
        return rng.choice(HAZARDS)
    i = rng.randrange(len(lines))
    op = rng.randrange(7)
    if op == 0:
        del lines[i]
    elif op == 1:
        lines.insert(i, lines[i])
    elif op == 2:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == 3:
        lines[i] = " " * rng.choice([1, 2, 3, 8]) + lines[i]
    elif op == 4:
        lines.insert(i, rng.choice(HAZARDS))
    elif op == 5:
        lines[i] = lines[i] + rng.choice([" #", ":", " [", "{", " &b", " *b", " !!binary", "\x1b"])
    else:
        pos = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:pos] + chr(rng.choice([0, 9, 0x1b, 0x85, 0x2028, ord(":"), ord("-")])) + lines[i][pos:]
    return "\n".join(lines) + "\n"


def mutated_yaml(rng: random.Random, seed_text: str, rounds: int = 3) -> str:
    """A mutant of seed_text: tree edits when it parses, then text edits."""
    text = seed_text
    for _ in range(rng.randint(1, rounds)):
        if rng.random() < 0.5:
            try:
                doc = yaml.safe_load(text)
                text = yaml.safe_dump(tree_mutation(rng, doc), sort_keys=False,
                                      allow_unicode=rng.random() < 0.5)
                continue
            except (yaml.YAMLError, ValueError, RecursionError):
                pass
        text = text_mutation(rng, text)
    return text


def mutated_ini(rng: random.Random, seed_text: str, rounds: int = 3) -> str:
    text = seed_text
    extras = ["[g:children]", "[g:vars]", "h[1:100000000]", "h[z:a]", "h[01:10:0]",
              "h ansible_port=notaport", "[2001:db8::1]:99999", "h ansible_host=\x1b[31m",
              "[unterminated", "h nictune='{\"mtu\": []}'", "[all:children]\nall",
              "h[a:c][1:3][x:z]", "=", "h nictune=!vault"]
    for _ in range(rng.randint(1, rounds)):
        if rng.random() < 0.3:
            lines = text.splitlines()
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(extras))
            text = "\n".join(lines) + "\n"
        else:
            text = text_mutation(rng, text)
    return text


def _paths(node: Any, prefix: tuple):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _get(node: Any, path: tuple) -> Any:
    for part in path:
        node = node[part]
    return node

