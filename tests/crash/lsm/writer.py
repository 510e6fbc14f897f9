"""The kill test's writer process: appends deterministic batches to a store until SIGKILLed.

Usage: python writer.py STORE SEED MODE   (MODE: plain | compact | compact-once)

plain, compact (options in workload.WRITER_OPTIONS): continue from `last_seq + 1`, appending
`workload.batch(SEED, seq)` (the runs of several states) for seq after seq. compact-once: one
compact() of the store as it is, with workload.COMPACT_ONCE_OPTIONS (a retention of
COMPACT_ONCE_RETENTION: every state's runs below it folded, its newest runs merged, a base
image uploaded), then wait to be killed.
Protocol on stdout, one line each, flushed at once:

    open LAST_SEQ        the store was opened with this last seq
    durable SEQ          durable("disk") advanced to SEQ (only printed once it is true)
    compact              a compact() call starts (MODE compact, compact-once)
    compacted SECONDS    it returned, after SECONDS

Any exception ends the process with a traceback on stderr: the test sees an exit that was not
its SIGKILL and fails.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workload import COMPACT_EVERY, COMPACT_ONCE_OPTIONS, WRITER_OPTIONS, batch  # noqa: E402

import lsm  # noqa: E402

PACE_S = 0.0005
"""A pause after each batch, so that a run of a few hundred ms appends hundreds of batches,
not tens of thousands (the test replays every one of them in its model)."""


def compact_once(path: str) -> None:
    store = lsm.Store(path, **COMPACT_ONCE_OPTIONS)
    print(f"open {store.last_seq}", flush=True)
    print("compact", flush=True)
    start = time.perf_counter()
    store.compact()
    print(f"compacted {time.perf_counter() - start:.4f}", flush=True)
    while True:
        time.sleep(3600)


def main() -> None:
    path, seed, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "compact-once":
        compact_once(path)
        return
    store = lsm.Store(path, **WRITER_OPTIONS[mode])
    seq = store.last_seq + 1
    reported = store.durable("disk")
    print(f"open {store.last_seq}", flush=True)
    while True:
        store.append(seq, batch(seed, seq))
        seq += 1
        if mode == "compact" and seq % COMPACT_EVERY == 0:
            print("compact", flush=True)
            start = time.perf_counter()
            store.compact()
            print(f"compacted {time.perf_counter() - start:.4f}", flush=True)
        d = store.durable("disk")
        if d > reported:
            reported = d
            print(f"durable {d}", flush=True)
        time.sleep(PACE_S)


if __name__ == "__main__":
    main()
