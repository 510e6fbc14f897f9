"""The crash tests' workload and their independent view of the store.

- `batch(seed, seq)`: the runs of `seq` (state -> updates), a pure function of (seed, seq), so
  that the writer process and the test agree on every batch without talking to each other;
- `Model`: every version of every key of every state, replayed from `batch` alone (never
  from the store);
- `parse_segment`: a reader of the log framing written from FORMAT.md, independent of
  lsm/records.py, for the expected outcome of a damage and for checking files end cleanly.
"""

from __future__ import annotations

import bisect
import os
import random
import struct

import xxhash

import lsm

STATES: list[object] = ["ops", ("op", 1), b"meta"]
"""The states every batch writes some of (names of three types)."""
KEYS = 300
SEGMENT_HEADER_SIZE = 16
RECORD_HEADER = struct.Struct("<4sIQ")
SEQ = struct.Struct("<Q")

WRITER_OPTIONS = {
    # Durability advances every few ms, segments roll every few dozen records (each roll is
    # followed by an upload), and background merges run whenever four runs of a state call
    # for one.
    "plain": dict(segment_bytes=4096, seal_interval_s=0.05, retention=400, merge_fanout=4, uploads=True),
    # The writer also calls compact() itself (upload, merges and folds at a horizon that
    # moves, a base image, LevelDB compaction, deletion of log segments) every COMPACT_EVERY
    # batches.
    "compact": dict(segment_bytes=2048, seal_interval_s=0.02, retention=60, merge_fanout=3, uploads=True),
}
CHECK_OPTIONS = dict(uploads=True)
"""How the test opens the store between the writer's rounds: with uploads, like the writer, so
that no log segment is dropped before the remote tier has it."""
COMPACT_EVERY = 40
COMPACT_ONCE_RETENTION = 5
COMPACT_ONCE_OPTIONS = dict(retention=COMPACT_ONCE_RETENTION, budget=0, merge_fanout=4, uploads=True)
"""writer.py compact-once: merges only in its one compact() call."""


def batch(seed: int, seq: int) -> dict[object, object]:
    """The runs of seq `seq`: 1-3 states, each 1-6 distinct keys out of KEYS, about 15%
    deletions; a third of the runs are (keys, values) pairs whose first key comes again at
    the end with another value (the later column wins)."""
    rng = random.Random(f"{seed}/{seq}")
    out: dict[object, object] = {}
    for state in rng.sample(STATES, rng.randint(1, 3)):
        keys, values = [], []
        for k in rng.sample(range(KEYS), rng.randint(1, 6)):
            keys.append(f"k{k:03d}")
            values.append(value(rng, seq, k))
        if rng.random() < 0.33:
            keys.append(keys[0])
            values.append(value(rng, seq, -1))
            out[state] = (keys, values)
        else:
            out[state] = dict(zip(keys, values, strict=True))
    return out


def value(rng: random.Random, seq: int, k: int) -> object:
    r = rng.random()
    if r < 0.15:
        return lsm.TOMBSTONE
    if r < 0.55:
        return seq * 1000 + k
    if r < 0.8:
        return f"v{seq}.{k}" + "x" * rng.randrange(40)
    if r < 0.9:
        return (seq, frozenset({k}))
    return bytes(rng.randrange(256) for _ in range(rng.randrange(8)))


def columns(updates: object) -> list[tuple[object, object]]:
    if isinstance(updates, dict):
        return list(updates.items())
    keys, values = updates
    return list(zip(keys, values, strict=True))


class Model:
    """Every version of every key after the batches 0..last, in a dict of version lists."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.last = -1
        self._versions: dict[tuple[object, str], list[tuple[int, object]]] = {}

    def advance(self, seq: int) -> None:
        """Replays the batches up to `seq` (inclusive)."""
        for s in range(self.last + 1, seq + 1):
            for state, updates in batch(self.seed, s).items():
                for k, v in columns(updates):
                    chain = self._versions.setdefault((state, k), [])
                    if chain and chain[-1][0] == s:
                        chain[-1] = (s, v)  # the later column of one batch
                    else:
                        chain.append((s, v))
        self.last = max(self.last, seq)

    def state(self, as_of: int | None = None) -> dict[object, dict[str, object]]:
        """Every state's live keys right after seq `as_of` (default: the last)."""
        as_of = self.last if as_of is None else as_of
        assert as_of <= self.last, f"model asked for seq {as_of} beyond its last {self.last}"
        out: dict[object, dict[str, object]] = {state: {} for state in STATES}
        for (state, k), chain in self._versions.items():
            i = bisect.bisect_right(chain, as_of, key=lambda v: v[0])
            if i and chain[i - 1][1] is not lsm.TOMBSTONE:
                out[state][k] = chain[i - 1][1]
        return out

    def deleted(self, as_of: int) -> dict[object, list[str]]:
        """The keys of each state that had a value once and are deleted as of `as_of`."""
        out: dict[object, list[str]] = {state: [] for state in STATES}
        for (state, k), chain in self._versions.items():
            i = bisect.bisect_right(chain, as_of, key=lambda v: v[0])
            if i and chain[i - 1][1] is lsm.TOMBSTONE and any(v is not lsm.TOMBSTONE for _, v in chain[: i - 1]):
                out[state].append(k)
        return out


def load_all(store: lsm.Store, as_of: int | None = None) -> dict[object, dict]:
    return {state: store.load(state, as_of=as_of) for state in STATES}


def diff(got: dict, want: dict, limit: int = 5) -> str:
    """A short description of how two {state: {key: value}} differ ('' if they do not)."""
    lines = []
    for state in sorted(set(got) | set(want), key=repr):
        g_state, w_state = got.get(state, {}), want.get(state, {})
        for k in sorted(set(g_state) | set(w_state)):
            g, w = g_state.get(k, "<absent>"), w_state.get(k, "<absent>")
            if g != w:
                lines.append(f"  {state!r} {k}: store {g!r:.60} model {w!r:.60}")
    more = f"\n  ... {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


class Rec:
    """One record as the framing lays it out: [start, end) in the file, and its seq."""

    __slots__ = ("start", "end", "seq")

    def __init__(self, start: int, end: int, seq: int) -> None:
        self.start, self.end, self.seq = start, end, seq

    def __repr__(self) -> str:
        return f"Rec(seq={self.seq}, [{self.start}, {self.end}))"


def parse_segment(data: bytes, where: str = "segment") -> list[Rec]:
    """Every record of an undamaged segment; AssertionError at the first byte out of place."""
    assert data[:8] == b"NSLSMLOG", f"{where}: bad segment magic {data[:8]!r}"
    assert len(data) >= SEGMENT_HEADER_SIZE, f"{where}: shorter than its header"
    assert struct.unpack_from("<I", data, 8)[0] == 4, f"{where}: not format version 4"
    out: list[Rec] = []
    pos = SEGMENT_HEADER_SIZE
    while pos < len(data):
        assert pos + RECORD_HEADER.size <= len(data), f"{where}: partial record header at {pos}"
        magic, n, checksum = RECORD_HEADER.unpack_from(data, pos)
        assert magic == b"LSMR", f"{where}: bad record magic at {pos}"
        payload = data[pos + RECORD_HEADER.size : pos + RECORD_HEADER.size + n]
        assert len(payload) == n, f"{where}: record at {pos} runs past the end"
        assert xxhash.xxh3_64_intdigest(payload, n) == checksum, f"{where}: checksum at {pos}"
        end = pos + RECORD_HEADER.size + n
        out.append(Rec(pos, end, SEQ.unpack_from(payload)[0]))
        pos = end
    return out


def segment_paths(store: str) -> list[str]:
    d = os.path.join(store, "log")
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".log")]


def log_seqs(store: str) -> list[int]:
    """The seqs of every record of every log segment, each segment parsed strictly."""
    seqs: list[int] = []
    for p in segment_paths(store):
        with open(p, "rb") as f:
            seqs.extend(r.seq for r in parse_segment(f.read(), p))
    return seqs
