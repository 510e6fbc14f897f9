"""`nosync bench lsm`: the state store's runs against the limits beneath them, in one sitting.

The workload is a keyed operator's state: K keys (str, as `keyed_count`'s), int values. Each
limit does the same work as the store, on the same data, the fastest way its library offers,
warmed, best of three (the writes: best of R, one per version):

- bare_run_write_updates_per_s: the columns of an append's run built as the store builds them
  (the keys and the values each packed by one msgpack call; an append's run is neither hashed
  nor sorted, its merges do that), then one write and one fsync of their bytes to a file;
- bare_run_load_keys_per_s: the same packed keys and values decoded (one msgpack call each)
  into a dict (`dict(zip(...))`);
- bare_get_as_of_per_s: as-of look-ups in the same runs, each decoded in memory into a dict
  beforehand (as the store reads an append's run): newest run first, the first run at or
  below the as-of seq that holds the key.

Then the store, through its public API: `run_write_updates_per_s` is `append` of the whole state
as one run plus `flush("disk")` (durable: logged and fsynced), the keys given as checked
(`Updates(..., checked=True)`: the engine checks its keys where it makes them, at `key_by`);
`run_write_checking_updates_per_s` is the same for a caller whose keys the store checks first
(reported, no bar); `run_load_keys_per_s` is `load`
on a store opened afresh, the run read back from LevelDB; `get_as_of_per_s` is `get(state, key,
as_of=s)` over R runs of the whole state (R snapshots), on a store opened afresh, best of two
passes. Also: reopen time, a merge of the R runs, and the space the tiers take against the
live bytes. Every figure is a ratio to its limit, since machines of this kind differ by 2x in
raw speed.
"""

from __future__ import annotations

import os
import random
import shutil
import time

import msgpack

from lsm import Store, Updates

STATE = "counts"
BARS = {
    "run_write_updates_per_s": ("bare_run_write_updates_per_s", 0.7),
    "run_load_keys_per_s": ("bare_run_load_keys_per_s", 0.7),
    "get_as_of_per_s": ("bare_get_as_of_per_s", 0.7),
}
ABSOLUTE_BARS = {"reopen_s": 2.0, "space_amplification": 1.5}


def make_state(keys: int, seed: int) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    ks = [str(k) for k in rng.sample(range(10 * keys), keys)]
    return ks, [rng.randrange(1 << 20) for _ in range(keys)]


def bare_write(path: str, keys: list, values: list) -> float:
    """Seconds to build an append's columns and write them with one write + fsync."""
    t = time.perf_counter()
    data = b"".join([msgpack.packb(keys, use_bin_type=True), msgpack.packb(values, use_bin_type=True)])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def bare_load(keys_b: bytes, values_b: bytes) -> float:
    t = time.perf_counter()
    d = dict(zip(msgpack.unpackb(keys_b), msgpack.unpackb(values_b), strict=True))
    took = time.perf_counter() - t
    assert len(d) > 0
    return took


def bare_get(runs: list[tuple[int, dict]], probes: list) -> float:
    """As-of look-ups over (seq, dict) runs, newest first."""
    newest_first = sorted(runs, key=lambda r: -r[0])
    missing = object()
    found = 0
    t = time.perf_counter()
    for k, s in probes:
        for seq, d in newest_first:
            if seq > s:
                continue
            v = d.get(k, missing)
            if v is not missing:
                found += 1
                break
    took = time.perf_counter() - t
    assert found == len(probes), "every probed key was written before its as-of seq"
    return len(probes) / took


def run(
    workdir: str,
    keys: int = 1_000_000,
    rounds: int = 5,
    probes: int = 200_000,
    seed: int = 7,
    progress=lambda msg: None,
) -> dict:
    os.makedirs(workdir, exist_ok=True)
    r: dict = {"keys": keys, "runs": rounds, "probes": probes}
    progress("preparing the state")
    ks, vs = make_state(keys, seed)
    versions = [vs] + [[v + n for v in vs] for n in range(1, rounds)]
    rng = random.Random(seed + 1)
    look = [(ks[rng.randrange(keys)], rng.randint(1, rounds)) for _ in range(probes)]

    progress("limit: a run's columns built and written with one fsync")
    bare_path = os.path.join(workdir, "bare.run")
    r["bare_run_write_updates_per_s"] = keys / min(bare_write(bare_path, ks, v) for v in versions)
    os.unlink(bare_path)
    progress("limit: the columns decoded into a dict")
    kb, vb = msgpack.packb(ks), msgpack.packb(vs)
    r["bare_run_load_keys_per_s"] = keys / min(bare_load(kb, vb) for _ in range(3))
    progress("limit: as-of look-ups in the runs, in memory")
    # decoded from their packed columns, as the store reads a run: the probes' keys are other
    # objects than the dicts' (a look-up compares the strings, as the store's does)
    bare_runs = [
        (seq + 1, dict(zip(msgpack.unpackb(kb), msgpack.unpackb(msgpack.packb(v)), strict=True)))
        for seq, v in enumerate(versions)
    ]
    r["bare_get_as_of_per_s"] = max(bare_get(bare_runs, look) for _ in range(2))
    del bare_runs

    progress("store: one run of the whole state, durable")
    path = os.path.join(workdir, "store")
    shutil.rmtree(path, ignore_errors=True)
    store = Store(path, retention=1 << 40, budget=0)
    best = checking = float("inf")
    for seq, v in enumerate(versions, start=1):
        # the engine's way: its keys were checked where they were made (key_by), once
        t = time.perf_counter()
        store.append(seq, {STATE: Updates(ks, v, checked=True)})
        store.flush("disk")
        best = min(best, time.perf_counter() - t)
    r["run_write_updates_per_s"] = keys / best
    r["run_bytes"] = store.stats.appended_bytes // rounds
    for seq in range(rounds + 1, rounds + 4):
        # any caller's way: the store checks every key first
        t = time.perf_counter()
        store.append(seq, {STATE: (ks, versions[-1])})
        store.flush("disk")
        checking = min(checking, time.perf_counter() - t)
    r["run_write_checking_updates_per_s"] = keys / checking
    store.rollback(rounds)
    store.close()

    progress("store: reopen")
    t = time.perf_counter()
    store = Store(path, retention=1 << 40, budget=0)
    r["reopen_s"] = time.perf_counter() - t
    store.close()

    progress("store: load one run back into a dict")
    best = float("inf")
    for _ in range(3):
        store = Store(path, retention=1 << 40, budget=0)
        t = time.perf_counter()
        got = store.load(STATE, as_of=1)
        best = min(best, time.perf_counter() - t)
        store.close()
        assert len(got) == keys
    r["run_load_keys_per_s"] = keys / best

    progress("store: as-of gets over the runs")
    store = Store(path, retention=1 << 40, budget=0)
    get = store.get
    best_rate = 0.0
    for _ in range(2):
        found = 0
        t = time.perf_counter()
        for k, s in look:
            if get(STATE, k, as_of=s) is not None:
                found += 1
        best_rate = max(best_rate, len(look) / (time.perf_counter() - t))
        assert found == len(look), "every probed key was written before its as-of seq"
    r["get_as_of_per_s"] = best_rate
    store.close()

    progress("store: merge the runs, retention 0")
    store = Store(path, retention=0, budget=0)
    t = time.perf_counter()
    report = store.compact()
    r["merge_s"] = time.perf_counter() - t
    r["merges"] = report["merges"]
    assert store.load(STATE) == dict(zip(ks, versions[-1], strict=True)), "the merge changed the state"
    sizes = store.disk_bytes()
    r["live_bytes"] = len(msgpack.packb(ks)) + len(msgpack.packb(versions[-1]))
    r["disk_tier_bytes"] = sizes["disk"] + sizes["log"]
    r["space_amplification"] = r["disk_tier_bytes"] / r["live_bytes"]
    store.close()
    shutil.rmtree(path, ignore_errors=True)

    for field, (limit, bar) in BARS.items():
        r[f"{field}_ratio"] = r[field] / r[limit]
        r[f"{field}_bar"] = f">= {bar} x {limit}"
        r[f"{field}_ok"] = r[field] / r[limit] >= bar
    for field, bar in ABSOLUTE_BARS.items():
        r[f"{field}_bar"] = f"<= {bar}"
        r[f"{field}_ok"] = r[field] <= bar
    return r


def render(r: dict) -> str:
    rows = [
        ("run write (limit)", f"{r['bare_run_write_updates_per_s']:,.0f} updates/s", "columns + 1 fsync"),
        ("run load (limit)", f"{r['bare_run_load_keys_per_s']:,.0f} keys/s", "decode into a dict"),
        ("as-of get (limit)", f"{r['bare_get_as_of_per_s']:,.0f} reads/s", "dict per run, in memory"),
    ]
    for field, (_, bar) in BARS.items():
        ok = "ok" if r[f"{field}_ok"] else "BELOW BAR"
        rows.append((field, f"{r[field]:,.0f}/s", f"{r[field + '_ratio']:.2f} x limit (bar {bar}) {ok}"))
    for field, bar in ABSOLUTE_BARS.items():
        ok = "ok" if r[f"{field}_ok"] else "ABOVE BAR"
        rows.append((field, f"{r[field]:.3f}", f"bar <= {bar} {ok}"))
    rows.append(("run write, keys checked", f"{r['run_write_checking_updates_per_s']:,.0f}/s", "any caller (no bar)"))
    rows.append(("merge of the runs", f"{r['merge_s']:.2f} s", f"{r['merges']} merge(s)"))
    width = max(len(a) for a, _, _ in rows)
    return "\n".join(f"{a:<{width}}  {b:>22}  {c}" for a, b, c in rows)
