"""A neighbour that behaves like a browser and the desktop beside ComfyUI: it keeps a working set
hot (one byte of every page read and written every `period` seconds) and now and then bursts
(allocates a block, writes every page of it, holds it a moment, frees it: a heavy page opened).
It measures what the user feels: how long each pass over its working set took (a pass that waits
on swap takes long), its major page faults, and its bursts.

Run as its own process (bench/ram_short.py starts it inside the bench's cgroups):

    python tests/neighbour.py --hot-bytes N --burst-bytes N --record OUT.json
        [--period 0.1] [--burst-every 20,30] [--burst-hold 1.0] [--seed 0]

It prints "ready" once its working set is touched. Commands on stdin, one a line: "burst" (a
burst now; answers "burst done SECONDS" once the block is freed again) and "stop" (writes the
record and exits). The record is also rewritten every few seconds, so a neighbour the kernel's
OOM killer ends leaves what it measured until then."""

from __future__ import annotations

import argparse
import json
import mmap
import os
import queue
import random
import resource
import sys
import threading
import time

import numpy as np

PAGE = mmap.PAGESIZE
RECORD_EVERY_S = 2.0


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile (share in 0..1) of `values`, or None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, int(np.ceil(share * len(ordered))))
    return ordered[rank - 1]


def summary(touch_ms: list[float], bursts: list[dict], hot_bytes: int, burst_bytes: int, started: float) -> dict:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return dict(hot_bytes=hot_bytes, burst_bytes=burst_bytes, passes=len(touch_ms),
                p50_ms=_round(percentile(touch_ms, 0.50)), p95_ms=_round(percentile(touch_ms, 0.95)),
                max_ms=_round(max(touch_ms) if touch_ms else None),
                major_faults=usage.ru_majflt, minor_faults=usage.ru_minflt,
                bursts=bursts, seconds=round(time.monotonic() - started, 1))


def _round(value):
    return None if value is None else round(value, 3)


def write_record(path: str, record: dict):
    temporary = f"{path}.tmp"
    with open(temporary, "w") as out:
        json.dump(record, out)
    os.replace(temporary, path)


def one_byte_per_page(block: mmap.mmap) -> np.ndarray:
    return np.frombuffer(block, dtype=np.uint8)[::PAGE]


def touched_block(nbytes: int) -> mmap.mmap:
    """An anonymous private block of `nbytes`, every page written once (so it is really
    allocated, not the shared zero page)."""
    block = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pages = one_byte_per_page(block)
    pages[:] = 1
    del pages  # a block with a live view cannot be closed
    return block


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hot-bytes", type=int, required=True)
    parser.add_argument("--burst-bytes", type=int, required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--period", type=float, default=0.1)
    parser.add_argument("--burst-every", default="20,30", help="seconds between timed bursts: LOW,HIGH (0 for none)")
    parser.add_argument("--burst-hold", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    low, high = (float(x) for x in (args.burst_every.split(",") + [args.burst_every])[:2])
    timer = random.Random(args.seed)  # the same burst times in every run of a bench

    started = time.monotonic()
    hot_block = touched_block(args.hot_bytes)
    hot_pages = one_byte_per_page(hot_block)
    commands: queue.Queue[str] = queue.Queue()

    def read_commands():
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("stop")  # the bench went away: end too

    threading.Thread(target=read_commands, daemon=True).start()
    print("ready", flush=True)

    touch_ms: list[float] = []
    bursts: list[dict] = []
    burst = None  # the block of the burst under way: {block, began, touch_s, free_at, asked}
    next_burst = started + timer.uniform(low, high) if low > 0 else float("inf")
    last_record = 0.0
    while True:
        now = time.monotonic()
        try:
            command = commands.get_nowait()
        except queue.Empty:
            command = None
        if command == "stop":
            break
        if command == "burst" and burst is not None:
            burst["asked"] = True  # one is under way: answer when it ends
        elif command == "burst" or (burst is None and now >= next_burst):
            if command != "burst":
                next_burst = now + timer.uniform(low, high)
            block = touched_block(args.burst_bytes)
            burst = dict(block=block, began=now, touch_s=time.monotonic() - now,
                         free_at=time.monotonic() + args.burst_hold, asked=command == "burst")
        if burst is not None and time.monotonic() >= burst["free_at"]:
            burst["block"].close()
            took = time.monotonic() - burst["began"]
            bursts.append(dict(at_s=round(burst["began"] - started, 1), touch_s=round(burst["touch_s"], 3),
                               total_s=round(took, 3), asked=burst["asked"]))
            if burst["asked"]:
                print(f"burst done {took:.3f}", flush=True)
            burst = None

        began = time.perf_counter()
        hot_pages += 1  # read and write one byte of every page of the working set
        touch_ms.append((time.perf_counter() - began) * 1000)

        if time.monotonic() - last_record >= RECORD_EVERY_S:
            write_record(args.record, summary(touch_ms, bursts, args.hot_bytes, args.burst_bytes, started))
            last_record = time.monotonic()
        time.sleep(max(0.0, args.period - (time.monotonic() - now)))

    write_record(args.record, summary(touch_ms, bursts, args.hot_bytes, args.burst_bytes, started))
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
