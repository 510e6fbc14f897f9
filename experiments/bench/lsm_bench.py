"""`nosync bench lsm`: the state store against the limits beneath it, measured in one sitting.

Workload (the issue's): 16-byte keys, 32-byte values, batches of 1000 updates, 1M distinct keys.
The limits are measured first, on the same batches:

- bare_dict_updates_per_s: the batches applied to a plain dict (dict.update), one core;
- leveldb_put_per_s: the same updates written straight to plyvel, one write batch per batch,
  MVCC keys (key + seq), the disk tier's LevelDB options;
- leveldb_seek_per_s: as-of look-ups on that LevelDB with one reused raw iterator (seek to
  key + seq, step back);
- leveldb_seek_same_files_per_s: the same look-ups straight on the store's own LevelDB files
  (after the store is closed), one seek each to the store's MVCC key, keys encoded beforehand
  and values left packed: the same files the store reads. Not a limit, but where the store's
  reads lose to it: leveldb_seek_same_files_coded_per_s, the same loop encoding each key and
  unpacking each value, as the store must.

Reads run on settled files: before any read, each LevelDB (the raw one, the store's) is
compacted whole (`compact_range` over every key), so that no figure depends on how far
LevelDB's own background compaction got. Reads are measured twice (best pass counts) for the
limits and the store alike, so that a cold cache favours neither.

Then the store, through its public API only. Every figure is a ratio to its limit, since
machines of this kind differ by 2x in raw speed.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import time
from dataclasses import dataclass

import msgpack
import plyvel

from lsm import Store
from lsm.disk import LEVELDB_OPTIONS
from lsm.keys import encode_key, mvcc_key

BARS = {
    "append_updates_per_s": ("bare_dict_updates_per_s", 0.5),
    "sustained_updates_per_s": ("leveldb_put_per_s", 0.8),
    "get_as_of_per_s": ("leveldb_seek_limit_per_s", 0.7),
}
ABSOLUTE_BARS = {"append_p99_ms": 2.0, "reopen_s": 2.0, "space_amplification": 1.5}


@dataclass
class Workload:
    keys: list[bytes]
    values: list[bytes]
    batch: int
    seed: int

    def batches(self, rounds: int) -> list[list[tuple[bytes, bytes]]]:
        """`rounds` passes over every key, each in its own shuffled order."""
        rng = random.Random(self.seed)
        out = []
        nv = len(self.values)
        v = 0
        for _ in range(rounds):
            order = list(range(len(self.keys)))
            rng.shuffle(order)
            for i in range(0, len(order), self.batch):
                chunk = order[i : i + self.batch]
                out.append([(self.keys[j], self.values[(v + n) % nv]) for n, j in enumerate(chunk)])
                v += len(chunk)
        return out


def make_workload(keys: int, batch: int, seed: int) -> Workload:
    rng = random.Random(seed)
    return Workload(
        [rng.randbytes(16) for _ in range(keys)],
        [rng.randbytes(32) for _ in range(65_536)],
        batch,
        seed,
    )


def bare_dict(batches: list) -> float:
    d: dict = {}
    t = time.perf_counter()
    for b in batches:
        d.update(b)
    return sum(map(len, batches)) / (time.perf_counter() - t)


_SEQ = struct.Struct(">Q")


def leveldb_put(path: str, batches: list) -> float:
    shutil.rmtree(path, ignore_errors=True)
    db = plyvel.DB(path, **LEVELDB_OPTIONS)
    t = time.perf_counter()
    for seq, b in enumerate(batches):
        suffix = _SEQ.pack(seq)
        wb = db.write_batch()
        put = wb.put
        for k, v in b:
            put(k + suffix, v)
        wb.write()
    rate = sum(map(len, batches)) / (time.perf_counter() - t)
    db.close()
    return rate


def settle(path: str) -> tuple[float, list[int]]:
    """Compacts a closed LevelDB whole, so reads find it in the state compaction leaves;
    returns the seconds it took and how many files each level then holds."""
    db = plyvel.DB(path, **LEVELDB_OPTIONS)
    t = time.perf_counter()
    # bounds given: plyvel passes LevelDB an empty key for a bound left out, and a range from
    # the empty key to the empty key holds nothing to compact
    db.compact_range(start=b"", stop=b"\xff" * 64)
    took = time.perf_counter() - t
    files = [int(db.get_property(f"leveldb.num-files-at-level{i}".encode())) for i in range(7)]
    db.close()
    return took, files


def leveldb_seek(path: str, probes: list[tuple[bytes, int]], passes: int = 2) -> float:
    """Seek to key + (seq + 1), step back: the newest version <= seq (ascending seqs)."""
    db = plyvel.DB(path, **LEVELDB_OPTIONS)
    it = db.raw_iterator()
    best = 0.0
    for _ in range(passes):
        found = 0
        t = time.perf_counter()
        for k, seq in probes:
            it.seek(k + _SEQ.pack(seq + 1))
            it.prev()
            if it.valid() and it.key()[:16] == k:
                found += 1
                it.value()
        best = max(best, len(probes) / (time.perf_counter() - t))
        assert found == len(probes), "every probed key was written before its as-of seq"
    db.close()
    return best


def leveldb_seek_same_files(path: str, probes: list[tuple[bytes, int]], passes: int = 2) -> tuple[float, float]:
    """One seek per look-up to the store's own MVCC key, on the store's LevelDB files: with the
    keys encoded beforehand and the values left packed (the limit), and with each key encoded
    and each value unpacked in the loop, as any reader of these files must (where the store's
    read loses to the limit, without the store's own read path)."""
    mkeys = [mvcc_key(encode_key(k), seq) for k, seq in probes]
    db = plyvel.DB(path, **LEVELDB_OPTIONS)
    it = db.raw_iterator()
    best = best_coded = 0.0
    for _ in range(passes):
        t = time.perf_counter()
        for mk in mkeys:
            it.seek(mk)
            if it.valid():
                it.key()
                it.value()
        best = max(best, len(mkeys) / (time.perf_counter() - t))
        found = 0
        t = time.perf_counter()
        for k, seq in probes:
            ek = encode_key(k)
            it.seek(mvcc_key(ek, seq))
            if it.valid():
                mk, raw = it.item()
                if mk[:-8] == ek and raw:
                    msgpack.unpackb(raw)
                    found += 1
        best_coded = max(best_coded, len(probes) / (time.perf_counter() - t))
        assert found == len(probes), "every probed key was written before its as-of seq"
    db.close()
    return best, best_coded


def _probes(w: Workload, n: int, rounds: int, seed: int) -> list[tuple[bytes, int]]:
    """Random keys with a random as-of seq from the second round on (every key exists)."""
    rng = random.Random(seed)
    per_round = len(w.keys) // w.batch
    lo, hi = per_round, per_round * rounds - 1
    return [(w.keys[rng.randrange(len(w.keys))], rng.randint(lo, hi)) for _ in range(n)]


def _fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    return path


def run(
    workdir: str,
    keys: int = 1_000_000,
    batch: int = 1000,
    rounds: int = 5,
    probes: int = 200_000,
    seed: int = 7,
    progress=lambda msg: None,
) -> dict:
    os.makedirs(workdir, exist_ok=True)
    w = make_workload(keys, batch, seed)
    progress("preparing batches")
    burst = w.batches(1)
    sustained = w.batches(rounds)
    look = _probes(w, probes, rounds, seed + 1)
    r: dict = {"keys": keys, "batch": batch, "burst_updates": keys, "sustained_updates": keys * rounds}

    progress("limit: bare dict")
    r["bare_dict_updates_per_s"] = max(bare_dict(burst) for _ in range(3))
    progress("limit: LevelDB puts")
    raw = os.path.join(workdir, "raw-leveldb")
    r["leveldb_put_per_s"] = leveldb_put(raw, sustained)
    r["raw_settle_s"], r["raw_files_per_level"] = settle(raw)
    progress("limit: LevelDB seeks")
    r["leveldb_seek_per_s"] = leveldb_seek(raw, look)
    shutil.rmtree(raw, ignore_errors=True)

    progress("store: append burst")
    store = Store(_fresh(os.path.join(workdir, "burst")))
    t = time.perf_counter()
    for seq, b in enumerate(burst):
        store.append(seq, b)
    r["append_updates_per_s"] = keys / (time.perf_counter() - t)
    store.close()
    shutil.rmtree(os.path.join(workdir, "burst"), ignore_errors=True)

    progress("store: sustained")
    path = _fresh(os.path.join(workdir, "sustained"))
    store = Store(path, retention=1 << 40)
    t = time.perf_counter()
    for seq, b in enumerate(sustained):
        store.append(seq, b)
    appended = time.perf_counter() - t
    store.flush("disk")
    durable = time.perf_counter() - t
    store._persister.drain_index()
    indexed = time.perf_counter() - t
    n = keys * rounds
    r["sustained_appended_updates_per_s"] = n / appended
    r["sustained_durable_updates_per_s"] = n / durable
    r["sustained_updates_per_s"] = n / indexed
    r["sustained_backpressure_s"] = store.stats.backpressure_s

    store.close()
    r["store_settle_s"], r["store_files_per_level"] = settle(os.path.join(path, "disk"))
    progress("limit: LevelDB seeks on the store's files")
    r["leveldb_seek_same_files_per_s"], r["leveldb_seek_same_files_coded_per_s"] = leveldb_seek_same_files(
        os.path.join(path, "disk"), look
    )

    progress("store: reopen")
    t = time.perf_counter()
    store = Store(path, retention=1 << 40)
    r["reopen_s"] = time.perf_counter() - t
    r["reopen_updates_held"] = n

    progress("store: as-of gets")
    get = store.get
    best = 0.0
    for _ in range(2):
        found = 0
        t = time.perf_counter()
        for k, seq in look:
            if get(k, as_of=seq) is not None:
                found += 1
        best = max(best, len(look) / (time.perf_counter() - t))
        assert found == len(look), "every probed key was written before its as-of seq"
    r["get_as_of_per_s"] = best

    progress("store: append latency under flush and compaction")
    store.options.retention = len(sustained) // 2
    r.update(_latency_phase(store, w, len(sustained), r["sustained_updates_per_s"]))
    store.close()

    progress("store: compaction, retention 0")
    store = Store(path, retention=0)
    t = time.perf_counter()
    report = store.compact()
    r["compact_s"] = time.perf_counter() - t
    r["compact_versions_dropped"] = report["versions_dropped"]
    sizes = store.disk_bytes()
    live = 0
    for k, v in store.scan():
        live += len(msgpack.packb(k)) + len(msgpack.packb(v))
    r["live_bytes"] = live
    r["disk_tier_bytes"] = sizes["disk"] + sizes["log"]
    r["remote_tier_bytes"] = sizes["remote"]
    r["space_amplification"] = r["disk_tier_bytes"] / live
    r["remote_space_amplification"] = sizes["remote"] / live
    store.close()
    shutil.rmtree(path, ignore_errors=True)

    r["leveldb_seek_limit_per_s"] = max(r["leveldb_seek_per_s"], r["leveldb_seek_same_files_per_s"])
    for field, (limit, bar) in BARS.items():
        r[f"{field}_ratio"] = r[field] / r[limit]
        r[f"{field}_bar"] = f">= {bar} x {limit}"
        r[f"{field}_ok"] = r[field] / r[limit] >= bar
    for field, bar in ABSOLUTE_BARS.items():
        r[f"{field}_bar"] = f"<= {bar}"
        r[f"{field}_ok"] = r[field] <= bar
    return r


def _latency_phase(store: Store, w: Workload, first_seq: int, rate: float) -> dict:
    """Appends at half the sustained rate while a compaction (dropping the older half of all
    versions) and the persister's flushes run, timing every call."""
    extra = w.batches(2)
    interval = w.batch / (rate * 0.5)
    lat: list[float] = []
    compaction_busy = []
    store._persister.compactor.request()
    seq = first_seq + 1
    next_t = time.perf_counter()
    for b in extra:
        now = time.perf_counter()
        if now < next_t:
            time.sleep(next_t - now)
        next_t += interval
        t = time.perf_counter()
        store.append(seq, b)
        lat.append(time.perf_counter() - t)
        compaction_busy.append(store._persister.compactor.busy)
        seq += 1
    store._persister.compactor.stop()
    lat.sort()
    during = sum(compaction_busy)
    return {
        "append_p50_ms": lat[len(lat) // 2] * 1e3,
        "append_p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
        "append_max_ms": lat[-1] * 1e3,
        "append_calls_timed": len(lat),
        "append_calls_during_compaction": during,
    }


def render(r: dict) -> str:
    rows = [
        ("bare dict (limit)", f"{r['bare_dict_updates_per_s']:,.0f} updates/s", ""),
        ("LevelDB put (limit)", f"{r['leveldb_put_per_s']:,.0f} updates/s", ""),
        ("LevelDB seek (limit)", f"{r['leveldb_seek_per_s']:,.0f} reads/s", "seek + prev, raw put DB"),
        ("LevelDB seek, store's files", f"{r['leveldb_seek_same_files_per_s']:,.0f} reads/s", "one seek"),
        (
            "  the same, keys encoded in the loop",
            f"{r['leveldb_seek_same_files_coded_per_s']:,.0f} reads/s",
            "and values unpacked (not a limit)",
        ),
    ]
    for field, (_, bar) in BARS.items():
        ok = "ok" if r[f"{field}_ok"] else "BELOW BAR"
        rows.append((field, f"{r[field]:,.0f}/s", f"{r[field + '_ratio']:.2f} x limit (bar {bar}) {ok}"))
    for field, bar in ABSOLUTE_BARS.items():
        ok = "ok" if r[f"{field}_ok"] else "ABOVE BAR"
        rows.append((field, f"{r[field]:.3f}", f"bar <= {bar} {ok}"))
    width = max(len(a) for a, _, _ in rows)
    return "\n".join(f"{a:<{width}}  {b:>22}  {c}" for a, b, c in rows)
