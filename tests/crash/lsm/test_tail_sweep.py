"""Tail sweep: damage the log at offset after offset, then reopen.

A pristine store is built from small batches (the runs of several states) and closed; each
case copies only its log/ into a new directory, so that on open the log is the only source of state (Store._open: no
MANIFEST makes a new one with an empty remote tier of its own, no disk/ means nothing is
indexed, and the log replays from seq -1; a copy of the MANIFEST would name the pristine
store's remote/ by its absolute path). Each case damages one segment (truncate, zero-fill
to the end, flip one byte, zero 8 bytes) and reopens. The expected outcome is computed from
the framing alone (workload.parse_segment):

- the first record whose bytes changed is the damaged one; if an unchanged record follows it,
  the damage is in the middle: CorruptLogError naming the segment and the damaged record's
  offset, and the file is left as it was;
- otherwise it is a torn tail: the store opens at the seq of the last record before the
  damage, with exactly the model's state at that seq; appending, closing and reopening from
  the log alone then gives everything, and every segment parses cleanly to its end.

Offsets are chosen by a seeded random.Random (LSM_CRASH_SEED=<seed> replays a run).
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable

import pytest
from workload import Model, Rec, batch, diff, load_all, log_seqs, parse_segment, segment_paths

import lsm

SEED = int(os.environ.get("LSM_CRASH_SEED", random.SystemRandom().randrange(2**32)))
PHASE1 = 30
"""Batches written with tiny segments (several sealed segments)..."""
TOTAL = 72
"""...then up to TOTAL with large ones (the last segment holds dozens of records)."""
MORE = 6
"""Batches appended after a successful recovery."""
OPTIONS = dict(budget=0, seal_interval_s=3600.0)
"""Every store of the sweep: no merges (a merge deletes the log segments LevelDB has indexed,
and the sweep reads back every segment), no upload."""

Mutation = Callable[[bytes], bytes]


class Pristine:
    def __init__(self, path: str) -> None:
        self.path = path
        self.segments = segment_paths(path)
        self.data: dict[str, bytes] = {}
        self.records: dict[str, list[Rec]] = {}
        for p in self.segments:
            with open(p, "rb") as f:
                self.data[p] = f.read()
            self.records[p] = parse_segment(self.data[p], p)
        self.model = Model(SEED)
        self.model.advance(TOTAL + MORE)

    @property
    def last(self) -> str:
        return self.segments[-1]

    def last_before(self, seg: str) -> int:
        """The seq of the last record in the segments before `seg` (-1: none)."""
        i = self.segments.index(seg)
        return next((self.records[p][-1].seq for p in reversed(self.segments[:i]) if self.records[p]), -1)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Pristine:
    print(f"tail sweep: LSM_CRASH_SEED={SEED}")
    path = str(tmp_path_factory.mktemp("pristine") / "store")
    with lsm.Store(path, segment_bytes=700, **OPTIONS) as s:
        for seq in range(PHASE1):
            s.append(seq, batch(SEED, seq))
            s.flush("disk")
    with lsm.Store(path, segment_bytes=1 << 20, **OPTIONS) as s:
        for seq in range(PHASE1, TOTAL):
            s.append(seq, batch(SEED, seq))
            s.flush("disk")
    for _ in range(2):  # the second time after a check that the log alone yields the state
        only_log(path)
        p = Pristine(path)
        assert log_seqs(path) == list(range(TOTAL)), "the pristine log is not seqs 0..TOTAL-1"
        with lsm.Store(path, **OPTIONS) as s:
            got, want = load_all(s), p.model.state(TOTAL - 1)
            assert s.last_seq == TOTAL - 1 and got == want, f"pristine store:\n{diff(got, want)}"
    only_log(path)
    p = Pristine(path)
    assert len(p.segments) >= 3, f"expected several segments, got {p.segments}"
    assert len(p.records[p.last]) >= 30, f"the last segment holds {len(p.records[p.last])} records"
    return p


def copy_log(src: str, dst: str) -> None:
    """A new store directory holding only a copy of `src`'s log."""
    os.makedirs(dst)
    shutil.copytree(os.path.join(src, "log"), os.path.join(dst, "log"))


def only_log(path: str) -> None:
    """Leaves only the log of a closed store (a copy of the MANIFEST would keep the remote)."""
    for name in os.listdir(path):
        if name != "log":
            full = os.path.join(path, name)
            if os.path.isdir(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)


def expected(old: bytes, new: bytes, recs: list[Rec], before: int) -> tuple[str, int]:
    """("open", last seq) for a torn tail, ("corrupt", offset) for damage in the middle."""
    if len(new) < 16:
        return "open", before
    if new[:8] != old[:8]:
        return "corrupt", 0
    assert new[8:16] == old[8:16], "the sweep does not damage the version or reserved field"

    def intact(r: Rec) -> bool:
        return new[r.start : r.end] == old[r.start : r.end]

    damaged = next((i for i, r in enumerate(recs) if not intact(r)), None)
    if damaged is None:
        return "open", recs[-1].seq if recs else before
    if any(intact(r) for r in recs[damaged + 1 :]):
        return "corrupt", recs[damaged].start
    return "open", recs[damaged - 1].seq if damaged else before


def truncate_at(o: int) -> Mutation:
    return lambda d: d[:o]


def zero_from(o: int) -> Mutation:
    return lambda d: d[:o] + bytes(len(d) - o)


def flip_at(o: int, mask: int) -> Mutation:
    return lambda d: d[:o] + bytes([d[o] ^ mask]) + d[o + 1 :]


def zero_range(o: int, n: int) -> Mutation:
    return lambda d: d[:o] + bytes(len(d[o : o + n])) + d[o + n :]


def run_case(p: Pristine, root: str, seg_index: int, name: str, mutate: Mutation) -> tuple[str, str | None]:
    """Damages a copy of the pristine store and checks the reopen: the expected outcome
    ("open" or "corrupt") and a failure message (None: as expected)."""
    store = os.path.join(root, name)
    copy_log(p.path, store)
    pristine_seg = p.segments[seg_index]
    seg = os.path.join(store, "log", os.path.basename(pristine_seg))
    old = p.data[pristine_seg]
    new = mutate(old)
    with open(seg, "wb") as f:
        f.write(new)
    outcome, at = expected(old, new, p.records[pristine_seg], p.last_before(pristine_seg))
    try:
        if outcome == "corrupt":
            return outcome, check_reported(store, seg, new, at)
        return outcome, check_recovered(p, store, at)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def check_reported(store: str, seg: str, new: bytes, offset: int) -> str | None:
    try:
        s = lsm.Store(store, **OPTIONS)
    except lsm.CorruptLogError as e:
        if os.path.realpath(e.path) != os.path.realpath(seg) or e.offset != offset:
            return f"CorruptLogError at {e.path}:{e.offset}, expected {seg}:{offset} ({e})"
        with open(seg, "rb") as f:
            if f.read() != new:
                return "the failed open changed the damaged segment"
        return None
    last = s.last_seq
    s.close()
    return f"opened (last seq {last}) instead of raising CorruptLogError at offset {offset}"


def check_recovered(p: Pristine, store: str, last: int) -> str | None:
    try:
        s = lsm.Store(store, **OPTIONS)
    except lsm.LsmError as e:
        return f"expected a recovery to seq {last}, got {type(e).__name__}: {e}"
    try:
        got, want = load_all(s), p.model.state(last)
        if s.last_seq != last or got != want:
            return f"recovered to seq {s.last_seq}, expected {last}:\n{diff(got, want)}"
        for seq in range(last + 1, last + 1 + MORE):
            s.append(seq, batch(SEED, seq))
    finally:
        s.close()
    end = last + MORE
    only_log(store)
    with lsm.Store(store, **OPTIONS) as s:
        got, want = load_all(s), p.model.state(end)
        if s.last_seq != end or got != want:
            return f"after appending: seq {s.last_seq}, expected {end}:\n{diff(got, want)}"
    try:
        seqs = log_seqs(store)
    except AssertionError as e:
        return f"after appending past the recovery, the log does not parse cleanly: {e}"
    if seqs != list(range(end + 1)):
        return f"after appending past the recovery, the log holds seqs {seqs}"
    return None


def inner_offsets(r: Rec) -> list[int]:
    """Offsets inside a record: in its magic, length, checksum, seq and runs."""
    return sorted(
        {r.start + i for i in (1, 3, 4, 7, 8, 12, 15, 16, 19, 23)}
        | {
            r.start + 24 + (r.end - r.start - 24) // 2,
            r.end - 1,
        }
    )


def sweep(p: Pristine, root: str, cases: list[tuple[str, Mutation]], seg_index: int = -1) -> None:
    failures = []
    outcomes = {"open": 0, "corrupt": 0}
    for name, mutate in cases:
        outcome, msg = run_case(p, root, seg_index, name, mutate)
        outcomes[outcome] += 1
        if msg:
            failures.append(f"{name} (expected {outcome}): {msg}")
    print(f"seed {SEED}: {len(cases)} cases, {outcomes['open']} cut, {outcomes['corrupt']} reported")
    assert not failures, f"seed {SEED}: {len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures[:15])


def test_truncated_tail_is_cut(pristine: Pristine, tmp_path) -> None:
    rng = random.Random(f"{SEED}/truncate")
    recs = pristine.records[pristine.last]
    size = len(pristine.data[pristine.last])
    offsets = {r.start for r in recs} | {size, 0, 1, 8, 15}
    inner = [o for r in recs for o in inner_offsets(r)]
    offsets |= set(rng.sample(inner, 20)) | set(inner_offsets(recs[-1]))
    cases = [(f"truncate@{o}", truncate_at(o)) for o in sorted(offsets)]
    sweep(pristine, str(tmp_path), cases)


def test_zero_filled_tail_is_cut(pristine: Pristine, tmp_path) -> None:
    rng = random.Random(f"{SEED}/zero")
    recs = pristine.records[pristine.last]
    inner = [o for r in recs for o in inner_offsets(r)]
    offsets = {r.start for r in recs} | set(rng.sample(inner, 20)) | set(inner_offsets(recs[-1]))
    cases = [(f"zero-from@{o}", zero_from(o)) for o in sorted(offsets)]
    sweep(pristine, str(tmp_path), cases)


def test_flipped_byte_is_cut_at_the_tail_and_reported_in_the_middle(pristine: Pristine, tmp_path) -> None:
    rng = random.Random(f"{SEED}/flip")
    recs = pristine.records[pristine.last]
    inner = [o for r in recs for o in [r.start, *inner_offsets(r)]]
    offsets = set(rng.sample(inner, 30)) | {0, 3, 7}
    offsets |= {recs[-1].start, *inner_offsets(recs[-1]), recs[0].start, *inner_offsets(recs[0])}
    cases = [(f"flip@{o}", flip_at(o, rng.randrange(1, 256))) for o in sorted(offsets)]
    sweep(pristine, str(tmp_path), cases)


def test_zeroed_range_in_the_middle_is_reported(pristine: Pristine, tmp_path) -> None:
    rng = random.Random(f"{SEED}/zero8")
    recs = pristine.records[pristine.last]
    offsets = set(rng.sample([o for r in recs[:-1] for o in inner_offsets(r)], 20))
    offsets |= {recs[0].start, recs[-2].start, recs[-2].end - 4, recs[-1].start + 8}
    cases = [(f"zero8@{o}", zero_range(o, 8)) for o in sorted(offsets)]
    sweep(pristine, str(tmp_path), cases)


def test_damage_in_a_sealed_segment_is_reported(pristine: Pristine, tmp_path) -> None:
    """Only the last segment may end torn: in a sealed one even a tail is corruption."""
    seg = max(pristine.segments[:-1], key=lambda p: len(pristine.records[p]))
    recs = pristine.records[seg]
    assert len(recs) >= 3, f"no sealed segment holds 3 records: {pristine.records}"
    size = len(pristine.data[seg])
    cases = [
        ("sealed-flip-middle", flip_at(recs[1].start + 20, 0x40)),
        ("sealed-flip-last-record", flip_at(recs[-1].start + 20, 0x40)),
        ("sealed-truncate-last-record", truncate_at(size - 3)),
        ("sealed-zero-tail", zero_from(recs[-1].start + 4)),
        ("sealed-zero8-first-record", zero_range(recs[0].start + 24, 8)),
    ]
    for name, mutate in cases:
        store = os.path.join(str(tmp_path), name)
        copy_log(pristine.path, store)
        target = os.path.join(store, "log", os.path.basename(seg))
        new = mutate(pristine.data[seg])
        with open(target, "wb") as f:
            f.write(new)
        damaged = next(r for r in recs if new[r.start : r.end] != pristine.data[seg][r.start : r.end])
        for attempt in (1, 2):  # a failed open must release the store's lock
            with pytest.raises(lsm.CorruptLogError) as ei:
                lsm.Store(store, **OPTIONS)
            e = ei.value
            assert os.path.realpath(e.path) == os.path.realpath(target), f"{name} (try {attempt}): {e}"
            assert e.offset == damaged.start, f"{name} (try {attempt}): {e}"
        with open(target, "rb") as f:
            assert f.read() == new, f"{name}: the failed open changed the damaged segment"
