"""Hostile LLDP frames and hostile report neighbours against nictune's
decoder (test helper; tests/unit/test_fuzz_lldp.py runs it in a subprocess
under RLIMIT_AS and reads the one JSON line it prints).

    lldp_driver.py SEED FRAMES DICTS

- frames: mutants of good frames (every TLV the decoder reads, the frame
  lldpd sends, the frame lldpad sends): a TLV's 9-bit length set to an edge
  (0, 1, 511, one past what is left), bytes flipped, the frame cut or grown
  past the frame cap, TLVs dropped, doubled, swapped or spliced from another
  frame, an OUI or subtype changed, random bytes.  lldp.decode must return a
  Neighbour or raise LldpError.
- dicts: mutants of a neighbour's report data (tests/fuzz/mutate.py's
  hostile values in any field, keys dropped and added, lists grown to
  100,000 entries): lldp.from_dict must return a Neighbour or raise LldpError.

Each case's allocation peak is measured (tracemalloc) and each is bounded in
time (SIGALRM).  One random.Random from the seed drives everything.
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import struct
import sys
import traceback
import tracemalloc
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for fuzz.mutate

from fuzz.mutate import HOSTILE_VALUES  # noqa: E402

from nictune.host.facts import lldp  # noqa: E402

CASE_BOUND = 2  # seconds; a case takes well under a millisecond


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def seed_frames() -> list:
    full = lldp.Neighbour(
        chassis_id="0c:42:a1:b2:c3:d4", chassis_subtype="mac", port_id="swp1s0",
        port_subtype="interface-name", ttl=120, port_description="rail0", system_name="leaf03",
        max_frame_size=9216,
        ets=lldp.EtsTlv((0, 0, 0, 3, 0, 0, 6, 0), (50, 0, 0, 50, 0, 0, 0, 0),
                        ("ets", "strict", "strict", "ets", "strict", "strict", "strict", "strict"),
                        willing=True, max_tcs=8),
        ets_recommendation=lldp.EtsTlv((0,) * 8, (100, 0, 0, 0, 0, 0, 0, 0), ("ets",) + ("strict",) * 7),
        pfc=lldp.PfcTlv((3,), willing=False, mbc=True, pfc_cap=8),
        apps=tuple(lldp.AppEntry(5, d, d >> 3) for d in range(0, 64, 3)) + (lldp.AppEntry(1, 0x8915, 3),))
    minimal = lldp.Neighbour(chassis_id="leaf03", chassis_subtype="local", port_id="0c:42:a1:00:00:01",
                             port_subtype="mac", ttl=0)
    frames = [lldp.encode(full), lldp.encode(minimal)]
    here = os.path.join(os.path.dirname(HERE), "fixtures", "lldp")
    if os.path.isdir(here):  # frames recorded from lldpd and lldpad (tests/netns)
        for name in sorted(os.listdir(here)):
            if name.endswith(".hex"):
                with open(os.path.join(here, name)) as f:
                    frames.append(bytes.fromhex(f.read().strip()))
    return frames


def _split(frame: bytes) -> tuple:
    """(header, [tlv bytes]) of a frame, as far as it splits."""
    header, body, tlvs, offset = frame[:14], frame[14:], [], 0
    while offset + 2 <= len(body):
        length = struct.unpack_from("!H", body, offset)[0] & 0x1FF
        tlvs.append(body[offset:offset + 2 + length])
        offset += 2 + length
    return header, tlvs


def _set_length(t: bytes, length: int) -> bytes:
    kind = t[0] >> 1 if t else 0
    return struct.pack("!H", kind << 9 | (length & 0x1FF)) + t[2:]


def mutate_frame(rng: random.Random, frames: list) -> bytes:
    header, tlvs = _split(rng.choice(frames))
    for _ in range(rng.randint(1, 4)):
        if not tlvs:
            tlvs = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))]
        i = rng.randrange(len(tlvs))
        op = rng.randrange(9)
        if op == 0:
            left = sum(map(len, tlvs[i:])) - 2
            tlvs[i] = _set_length(tlvs[i], rng.choice([0, 1, 2, 3, 4, 5, 25, 255, 256, 511, left, left + 1]))
        elif op == 1:
            t = bytearray(tlvs[i])
            if t:
                t[rng.randrange(len(t))] = rng.randrange(256)
            tlvs[i] = bytes(t)
        elif op == 2:
            del tlvs[i]
        elif op == 3:
            tlvs.insert(i, tlvs[i])
        elif op == 4:
            j = rng.randrange(len(tlvs))
            tlvs[i], tlvs[j] = tlvs[j], tlvs[i]
        elif op == 5:
            tlvs.insert(i, rng.choice(_split(rng.choice(frames))[1] or [b""]))
        elif op == 6 and len(tlvs[i]) >= 6 and tlvs[i][0] >> 1 == 127:
            oui = rng.choice([lldp.OUI_8021, lldp.OUI_8023, b"\x00\x00\x00", b"\xff\xff\xff"])
            tlvs[i] = tlvs[i][:2] + oui + bytes([rng.choice([4, 9, 10, 11, 12, 0, 255])]) + tlvs[i][6:]
        elif op == 7:
            tlvs[i] = tlvs[i][:rng.randrange(len(tlvs[i]) + 1)]
        else:
            tlvs.insert(i, lldp.tlv(rng.randrange(128), bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))))
    data = header + b"".join(tlvs)
    cut = rng.random()
    if cut < 0.05:
        data += bytes(rng.randint(lldp.MAX_FRAME - len(data), 1 << 20))
    elif cut < 0.1:
        data = data[:rng.randrange(len(data) + 1)]
    elif cut < 0.12:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    return data


def mutate_dict(rng: random.Random, good: dict) -> object:
    data = copy.deepcopy(good)
    for _ in range(rng.randint(1, 3)):
        target = data
        path = [k for k in ("ets", "ets_recommendation", "pfc") if isinstance(data.get(k), dict)]
        if path and rng.random() < 0.4:
            target = data[rng.choice(path)]
        if not isinstance(target, dict) or not target:
            return rng.choice(HOSTILE_VALUES)
        key = rng.choice(sorted(target, key=str))
        op = rng.randrange(4)
        if op == 0:
            target[key] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
        elif op == 1:
            del target[key]
        elif op == 2 and isinstance(target[key], list):
            target[key] = target[key] * rng.choice([2, 1000, 100000])
        else:
            target[rng.choice(["x", key + "_", "apps", "pfc"])] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
    return data


def _case(run) -> tuple:
    """(outcome, peak bytes, message) of run()."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    signal.alarm(CASE_BOUND)
    try:
        run()
        outcome, message = "decoded", ""
    except lldp.LldpError as e:
        outcome, message = "refused", str(e)
        if not str(e).isprintable():
            outcome = "unprintable refusal"
    except _Hang:
        outcome, message = "hang", ""
    except BaseException:  # noqa: BLE001 - the finding
        outcome, message = "traceback", traceback.format_exc()
    finally:
        signal.alarm(0)
    return outcome, tracemalloc.get_traced_memory()[1] - before, message


def main(seed: int, n_frames: int, n_dicts: int) -> dict:
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(seed)
    frames = seed_frames()
    good = lldp.decode(frames[0], rail="eth2", age=1.0).to_dict()
    outcomes, failures, peak = Counter(), [], 0
    tracemalloc.start()
    for kind, count, make, check in (
            ("frames", n_frames, lambda: mutate_frame(rng, frames), lldp.decode),
            ("dicts", n_dicts, lambda: mutate_dict(rng, good), lldp.from_dict)):
        for _ in range(count):
            case = make()
            outcome, case_peak, message = _case(lambda: check(case))
            outcomes[f"{kind}: {outcome}"] += 1
            peak = max(peak, case_peak)
            if outcome not in ("decoded", "refused") and len(failures) < 5:
                failures.append(message[-2000:] or outcome)
    return {"cases": {"frames": n_frames, "dicts": n_dicts}, "outcomes": dict(outcomes),
            "peak_bytes": peak, "seed_frames": len(frames), "failures": failures}


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:4]))))
