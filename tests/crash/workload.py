"""The crash tests' workload and their independent view of the store.

- `batch(seed, seq)`: the update batch of `seq`, a pure function of (seed, seq), so that the
  writer process and the test agree on every batch without talking to each other;
- `Model`: every version of every key, replayed from `batch` alone (never from the store);
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

KEYS = 300
SEGMENT_HEADER_SIZE = 16
RECORD_HEADER = struct.Struct("<4sIQ")
SEQ = struct.Struct("<Q")

WRITER_OPTIONS = {
    # Durability advances every few ms, segments roll every few dozen records (each roll is
    # followed by an upload), and background compaction runs every few hundred batches.
    "plain": dict(
        memtable_updates=32,
        flush_interval_s=0.01,
        segment_bytes=4096,
        seal_interval_s=0.05,
        retention=400,
        compact_every_updates=1500,
    ),
    # The writer also calls compact() itself (upload + base image + LevelDB compaction +
    # deletion of log segments) every COMPACT_EVERY batches.
    "compact": dict(
        memtable_updates=16,
        flush_interval_s=0.01,
        segment_bytes=2048,
        seal_interval_s=0.02,
        retention=60,
        compact_every_updates=400,
    ),
}
COMPACT_EVERY = 40
COMPACT_ONCE_RETENTION = 5


def batch(seed: int, seq: int) -> list[tuple[str, object]]:
    """The updates of seq `seq`: 1-6 distinct keys out of KEYS, about 15% deletions."""
    rng = random.Random(f"{seed}/{seq}")
    out: list[tuple[str, object]] = []
    for k in rng.sample(range(KEYS), rng.randint(1, 6)):
        r = rng.random()
        if r < 0.15:
            v: object = lsm.TOMBSTONE
        elif r < 0.55:
            v = seq * 1000 + k
        elif r < 0.9:
            v = f"v{seq}.{k}" + "x" * rng.randrange(40)
        else:
            v = bytes(rng.randrange(256) for _ in range(rng.randrange(8)))
        out.append((f"k{k:03d}", v))
    return out


class Model:
    """Every version of every key after the batches 0..last, in a dict of version lists."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.last = -1
        self._versions: dict[str, list[tuple[int, object]]] = {}

    def advance(self, seq: int) -> None:
        """Replays the batches up to `seq` (inclusive)."""
        for s in range(self.last + 1, seq + 1):
            for k, v in batch(self.seed, s):
                self._versions.setdefault(k, []).append((s, v))
        self.last = max(self.last, seq)

    def state(self, as_of: int | None = None) -> dict[str, object]:
        """The live keys right after seq `as_of` (default: the last)."""
        as_of = self.last if as_of is None else as_of
        assert as_of <= self.last, f"model asked for seq {as_of} beyond its last {self.last}"
        out = {}
        for k, chain in self._versions.items():
            i = bisect.bisect_right(chain, as_of, key=lambda v: v[0])
            if i and chain[i - 1][1] is not lsm.TOMBSTONE:
                out[k] = chain[i - 1][1]
        return out


def diff(got: dict, want: dict, limit: int = 5) -> str:
    """A short description of how two states differ ('' if they do not)."""
    lines = []
    for k in sorted(set(got) | set(want)):
        g, w = got.get(k, "<absent>"), want.get(k, "<absent>")
        if g != w:
            lines.append(f"  {k}: store {g!r:.60} model {w!r:.60}")
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
