#!/usr/bin/env python3
"""A LABELLED STAND-IN for mstconfig (mstflint), for tests only: it is not
the vendor tool.  It prints the `-e q` table in the format of the real
outputs recorded in tests/recorded/mstconfig/ (header "Configurations:
Default Current Next Boot", a "*" on rows whose next-boot value differs,
the legend), and refuses what the real tool refuses: an unknown device or
parameter, a set without -y (it would prompt), a value that is not a
number or one of the parameter's names.  Its state (the device, each
key's default/current/next value) is the JSON file named by
NICTUNE_FAKE_MSTCONFIG; every set is appended to its "log"."""

import json
import os
import sys

LEGEND = "The '*' shows parameters with next value different from default/current value."


def main(argv):
    path = os.environ["NICTUNE_FAKE_MSTCONFIG"]
    with open(path) as f:
        state = json.load(f)
    extended = yes = False
    device = None
    args = list(argv)
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt == "-e":
            extended = True
        elif opt == "-y":
            yes = True
        elif opt == "-d" and args:
            device = args.pop(0)
        else:
            print(f"-E- Unknown flag: {opt}", file=sys.stderr)
            return 1
    if device != state["device"]:
        # What mstflint 4.21's mstconfig prints (on stdout) and its status,
        # as tests/unit/test_firmware_family.py checks against the real one.
        print("-E- Failed to open the device")
        return 3
    if not args:
        print("-E- No command found", file=sys.stderr)
        return 1
    command, rest = args[0], args[1:]
    rows = state["rows"]
    if command in ("q", "query"):
        for key in rest:
            if key not in rows:
                print(f"-E- Unknown Parameter: {key}", file=sys.stderr)
                return 1
        print(f"\nDevice #1:\n----------\n\nDevice type:    ConnectX7\nDevice:         {device}\n")
        if extended:
            print("Configurations:                              Default         Current         Next Boot")
        else:
            print("Configurations:                              Next Boot")
        for key in rest or sorted(rows):
            row = rows[key]
            cells = [_cell(row, row[c]) for c in ("default", "current", "next")]
            star = "*" if row["next"] != row["default"] or row["next"] != row["current"] else " "
            shown = cells if extended else cells[2:]
            print(f"{star}        {key:<36}" + "".join(f"{c:<16}" for c in shown))
        print(LEGEND)
        return 0
    if command in ("s", "set"):
        if not yes:
            print("Apply new Configuration? (y/n) [n] : N\n-I- Aborted by user", file=sys.stderr)
            return 1
        new = {}
        for pair in rest:
            key, _, value = pair.partition("=")
            if key not in rows:
                print(f"-E- Unknown Parameter: {key}", file=sys.stderr)
                return 1
            words = {w.lower(): int(n) for n, w in rows[key].get("words", {}).items()}
            if value.lower() in words:
                new[key] = words[value.lower()]
            elif value.isdigit():
                new[key] = int(value)
            else:
                print(f"-E- Bad value for {key}: {value}", file=sys.stderr)
                return 1
        for key, value in new.items():
            rows[key]["next"] = value
        state.setdefault("log", []).append(rest)
        with open(path, "w") as f:
            json.dump(state, f)
        print("Applying... Done!\n-I- Please reboot machine to load new configurations.")
        return 0
    print(f"-E- Unknown command: {command}", file=sys.stderr)
    return 1


def _cell(row, value):
    word = row.get("words", {}).get(str(value))
    return f"{word}({value})" if word else str(value)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
