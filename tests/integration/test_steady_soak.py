"""The long run at a fixed rate (soak): memory and disk stay bounded, however long a run lasts.

`nosync run` of keyed_count reads a paced generator (open loop, unbounded, each key's state
keeping a 100-byte value), under abs and nosync, for NOSYNC_SOAK_S seconds (30 minutes by
default), and is stopped by `--duration`. After a warm-up (NOSYNC_SOAK_WARMUP_S, 5 minutes: the
state is whole and the store's retention window of snapshots is full), every process of the run
(the driver, its JVM, Spark's Python daemon and the workers) is sampled every few seconds:

- each one's resident memory holds its level: its median over the second half of the measured
  window is within +10% of its median over the first half, and its greatest within +25% of
  the first half's greatest (a worker's memory saws by 100 MB and more as snapshots and merges
  come and go: a leak raises the level, a saw does not; the spikes are bounded too). A process
  under 20 MB is not held to it;
- the run directory holds its level the same way: its median size over the second half within
  +10% of the first half's, its greatest within +25%. The size saws by half its level and more:
  merges write new runs, the runs they replace stay in LevelDB's files until the removed bytes
  reach the live ones and LevelDB is asked to rewrite them, and a sample landing at the top of
  a saw or not moves a half's greatest by a fifth from one run to the next. The store's
  retention bounds the level, not the run's length.

The run must also stop cleanly with everything it read committed. Run it with
`make soak` or `pytest -m soak tests/integration/test_steady_soak.py`."""

from __future__ import annotations

import json
import os
import statistics
import time

import pytest
from support.runs import start_run

from experiments.cluster.processes import cmdline, stat_fields
from lsm.files import tree_bytes

SOAK_S = float(os.environ.get("NOSYNC_SOAK_S", "1800"))
WARMUP_S = float(os.environ.get("NOSYNC_SOAK_WARMUP_S", "300"))
KEYS, RATE = 200_000, 20_000
"""Every key has its state after 5 s of input (2 partitions, keys cycling)."""
GROWTH = 1.10
"""How far a process's memory level and the run directory's (their medians) may grow."""
SPIKE_GROWTH = 1.25
"""How far a process's greatest memory and the run directory's greatest size may grow."""
STOP_GRACE_S = 300
"""The run must have stopped by this long after its --duration (the clean stop's last snapshot
or checkpoint included)."""


def descendants(root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := stat_fields(int(name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def quarters(values: list) -> list[tuple[int, int]]:
    """(median, greatest) of each quarter of `values` (None: not sampled then), for a message
    that shows whether memory grew or only sawed."""
    n = len(values)
    out = []
    for q in range(4):
        part = [v for v in values[q * n // 4 : (q + 1) * n // 4] if v is not None]
        if part:
            out.append((int(statistics.median(part)), max(part)))
    return out


def command(pid: int) -> str:
    return " ".join(cmdline(pid))[:120] or "?"


@pytest.mark.soak
@pytest.mark.parametrize("mode", ["abs", "nosync"])
def test_a_long_run_at_a_fixed_rate_holds_its_memory_and_disk(tmp_path, mode):
    run_dir = tmp_path / "run"
    # unbounded (records=none), stopped by --duration; output=none: the engine's own disk alone
    proc = start_run(
        run_dir,
        *["--duration", str(SOAK_S), "-p", f"rate={RATE}", "-p", "value_bytes=100"],
        records="none",
        keys=KEYS,
        out="none",
        mode=mode,
        log_to=tmp_path,
    )
    samples: list[dict] = []
    """After the warm-up: {"t", "disk", "rss": {pid: kB}} every few seconds."""
    names: dict[int, str] = {}
    log = open(tmp_path / "soak.jsonl", "w")  # noqa: SIM115 - closed below, written as it goes
    try:
        started = None
        while proc.poll() is None:
            time.sleep(5)
            if started is None:
                if (run_dir / "workers.json").exists():
                    started = time.monotonic()
                continue
            now = {p: r for p in descendants(proc.pid) if (r := rss_kb(p)) is not None}
            if proc.poll() is not None or not now:
                break  # ended meanwhile: its processes are going
            t = time.monotonic() - started
            assert t < SOAK_S + STOP_GRACE_S, f"the run did not stop within {STOP_GRACE_S:g}s of its --duration"
            if WARMUP_S <= t < SOAK_S - 10:
                for p in now.keys() - names.keys():
                    names[p] = command(p)
                row = {"t": round(t, 1), "disk": tree_bytes(str(run_dir)), "rss": now}
                samples.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
        proc.wait()
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (tmp_path / "stderr").read_text()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] is not None and summary["records_committed"] == summary["records_read"]
    assert len(samples) >= 4, "the run ended before its warm-up did"
    # memory and disk saw (snapshots, merges, LevelDB freeing removed runs in steps): the
    # level and the peaks of the measured window's second half are held to its first half's
    half = len(samples) // 2
    first, second = samples[: half + 1], samples[half:]
    grown = {}
    for p, name in names.items():
        a = [row["rss"][p] for row in first if p in row["rss"]]
        b = [row["rss"][p] for row in second if p in row["rss"]]
        if not a or not b or max(b) <= 20_000:
            continue
        if statistics.median(b) > GROWTH * statistics.median(a) or max(b) > SPIKE_GROWTH * max(a):
            grown[p] = (name, quarters([row["rss"].get(p) for row in samples]))
    assert not grown, f"resident memory grew after the warm-up (kB, median / greatest per quarter): {grown}"
    disk = [row["disk"] for row in samples]
    a, b = disk[: half + 1], disk[half:]
    assert statistics.median(b) <= GROWTH * statistics.median(a) and max(b) <= SPIKE_GROWTH * max(a), (
        f"the run directory grew (bytes, median / greatest per quarter): {quarters(disk)}"
    )
