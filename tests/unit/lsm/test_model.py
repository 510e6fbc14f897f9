"""Model-based tests of the store: the real Store and a dict of versions, driven side by side.

As in LevelDB's fault_injection_test and RocksDB's crash test: hypothesis draws a sequence of
appends to several states, reads (get and load, now and as of a seq in the retention window,
versions), rollbacks, flushes, merges, snapshots, simulated crashes (`abandon`), clean
reopens and restores from the remote tier, and after every step the store must agree with
the model.

- `StoreMachine` runs the store as it runs in production, with small sizes: tiny log
  segments, a small memory bound, a small `merge_fanout`, and (sometimes) a budget that lets
  the background compactor merge whenever runs call for it, so that the persister and the
  compactor really move runs through the log, LevelDB, merges and the remote tier while the
  test runs.
- `MergeMachine` is about merges: every compact() merges a state's newest runs (fanout 2 or 3)
  into multi-version runs and folds those at or below the horizon into a base, and after each
  one, every load and get as of every seq in the retention window is checked. Some of its
  appends pass `lsm.Updates`: pairs (packed in chunks, as a writer logs them) before columns.
  No background merges (budget 0): a failing run replays the same merges, so it is shrunk.

The model is `state -> key -> [(seq, value or TOMBSTONE)]`. Expected values, orders and bounds
come from it and from the documented contract, never from the store. A failure prints the
steps and a `@reproduce_failure` blob (print_blob) so it can be replayed exactly.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import msgpack
import pytest
from hypothesis import HealthCheck, Phase, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import lsm
from lsm import TOMBSTONE, LsmError, RetentionError, Store, StoreLockedError

FLUSH_TIMEOUT_S = 5.0
"""A flush or wait that has not finished after this long is a hang: each takes milliseconds."""

MISSING = object()
T = TypeVar("T")

# A small key space that mixes every key type, the int range edges, and keys that differ only
# after a NUL ("a" / "a\x00"), or compare equal in Python but not as keys: lists are tuples.
KEYS: list[object] = [
    None,
    -(2**63),
    -1,
    0,
    7,
    2**63 - 1,
    2**63,
    2**64 - 1,
    "",
    "a",
    "a\x00",
    "ab",
    "b",
    "\u00e9",
    b"",
    b"a",
    b"a\x00",
    b"\xff",
    ("a",),
    ("a", 1),
    ("a", 2),
    ("b", -1),
]
STATES: list[object] = ["s", "s\x00", b"s", ("s", 1), None]
"""State names whose encodings share prefixes (one state's runs must never be another's)."""

values = st.one_of(
    st.integers(-3, 3),
    st.text(max_size=3),
    st.none(),
    st.binary(max_size=3),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.lists(st.integers(0, 3), max_size=2),
    st.frozensets(st.integers(0, 3), max_size=2),
    st.sets(st.text(max_size=1), max_size=2),
    st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 2), max_size=2).map(collections.Counter),
    st.just(TOMBSTONE),
    st.just(TOMBSTONE),
)

columns_st = st.tuples(st.sampled_from(KEYS), values, st.booleans())
updates_st = st.tuples(st.lists(columns_st, max_size=5), st.booleans())
"""One state's updates: columns (key, value, pass a tuple key as a list), and whether to pass
them as a (keys, values) pair (keys may repeat) or as a mapping."""
MERGE_KEYS: list[object] = [None, 0, "a", "a\x00", b"a", ("a", 1)]
pair_chunks_st = st.one_of(
    st.none(),
    st.none(),
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(MERGE_KEYS), st.one_of(st.integers(-3, 3), st.text(max_size=2)), st.booleans()),
            max_size=4,
        ),
        min_size=1,
        max_size=3,
    ),
)
"""None (the columns passed as a pair or a mapping), or `lsm.Updates`' pairs: chunks of
(key, plain value, pass a tuple key as a list), each packed by one msgpack call."""
merge_batches_st = st.tuples(
    st.dictionaries(
        st.sampled_from(STATES[:3]),
        st.tuples(
            st.lists(st.tuples(st.sampled_from(MERGE_KEYS), values, st.booleans()), min_size=1, max_size=5),
            st.booleans(),
            pair_chunks_st,
        ),
        min_size=1,
    ),
    st.integers(1, 2),
)
"""An append to the merge machine's states: a few keys, so that each has many versions and
deletions to merge, and runs of at least one column, of about one size, which size-tiered
merges take; a third of them passed as `lsm.Updates`, with pairs before the columns."""
PAIRS_PACKER = msgpack.Packer(use_bin_type=True)


def typed(v: object) -> object:
    """A value with every container's type spelled out: set and frozenset, Counter and dict,
    list and tuple compare equal in Python, or nearly, but must come back as they were."""
    t = type(v).__name__
    if isinstance(v, set | frozenset):
        return (t, sorted(map(repr, map(typed, v))))
    if isinstance(v, dict):
        return (t, [(typed(k), typed(x)) for k, x in v.items()])
    if isinstance(v, list | tuple):
        return (t, [typed(x) for x in v])
    return (t, v)


def as_passed(key: object, as_list: bool) -> object:
    """The key as the caller hands it over: a tuple key sometimes as a list (the same key)."""
    if as_list and type(key) is tuple:
        return list(key)
    return key


def format_order(key: object) -> tuple:
    """FORMAT.md's key order, written from its table: by type byte (None 01, int 04, big int
    05, bytes 06, str 07, tuple 08), then the natural order, tuples element-wise."""
    if key is None:
        return (1,)
    if type(key) is int:
        return (4 if key < 2**63 else 5, key)
    if type(key) is bytes:
        return (6, key)
    if type(key) is str:
        return (7, key)
    return (8, tuple(format_order(k) for k in key))


class Model:
    """Every version of every key of every state; the state after seq s is the newest
    version <= s of each key. A state exists (has runs) from the first append naming it."""

    def __init__(self) -> None:
        self.chains: dict[object, dict[object, list[tuple[int, object]]]] = {}
        self.named: dict[object, list[int]] = {}
        self.last = -1

    def append(self, seq: int, runs: dict[object, list[tuple[object, object]]]) -> None:
        assert seq > self.last
        for state, cols in runs.items():
            self.named.setdefault(state, []).append(seq)
            chains = self.chains.setdefault(state, {})
            for key, value in cols:
                # in column order: for a key twice in one append, the later column comes later
                # in its chain and so wins
                chains.setdefault(key, []).append((seq, value))
        self.last = seq

    def value(self, state: object, key: object, as_of: int | None = None) -> object:
        for seq, value in reversed(self.chains.get(state, {}).get(key, ())):
            if as_of is None or seq <= as_of:
                return MISSING if value is TOMBSTONE else value
        return MISSING

    def state(self, state: object, as_of: int | None = None) -> dict:
        out = {}
        for key in self.chains.get(state, {}):
            v = self.value(state, key, as_of)
            if v is not MISSING:
                out[key] = v
        return out

    def versions(self, state: object, key: object, after: int, upto: int) -> list[tuple[int, object]]:
        """One (seq, value) per seq in (after, upto]: the seq's last column for the key."""
        per_seq: dict[int, object] = {}
        for seq, value in self.chains.get(state, {}).get(key, ()):
            if after < seq <= upto:
                per_seq[seq] = value
        return sorted(per_seq.items(), key=lambda sv: sv[0])

    def states(self) -> list:
        return sorted(self.named, key=format_order)

    def truncate(self, seq: int) -> None:
        """What rollback(seq) and a crash that keeps the prefix up to seq leave."""
        for state in list(self.chains):
            for key in list(self.chains[state]):
                kept = [(s, v) for s, v in self.chains[state][key] if s <= seq]
                if kept:
                    self.chains[state][key] = kept
                else:
                    del self.chains[state][key]
        self.named = {st_: [s for s in seqs if s <= seq] for st_, seqs in self.named.items()}
        self.named = {st_: seqs for st_, seqs in self.named.items() if seqs}
        self.last = min(self.last, seq)


def state_diff(got: dict, expected: dict, where: str) -> str:
    lines = [f"{where} differs from the model:"]
    for k in sorted(set(got) | set(expected), key=repr):
        g, e = got.get(k, MISSING), expected.get(k, MISSING)
        if g is MISSING or e is MISSING or typed(g) != typed(e):
            shown = ["-" if v is MISSING else repr(v) for v in (g, e)]
            lines.append(f"  {k!r}: store {shown[0]}, model {shown[1]}")
    return "\n".join(lines)


def same_state(got: dict, expected: dict) -> bool:
    return got.keys() == expected.keys() and all(typed(got[k]) == typed(expected[k]) for k in got)


PICKS = st.integers(0, 1 << 16)
"""Where in a range to pick a seq. The range itself depends on the store (its horizon moves in
the background, a crash recovers a seq anywhere in [durable, last]), so the draw must not:
hypothesis needs the same draws to replay a failure."""


def pick_in(pick: int, lo: int, hi: int) -> int:
    return lo + pick % (hi - lo + 1)


def store_threads(path: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if path in t.name and t.is_alive()]


def merges_settled(s: Store) -> bool:
    """No merge running and none called for (REQUIRES: store._cond held)."""
    c = s._persister.compactor
    return not c.busy and not c._plans(s.compaction_horizon())


def wait_for_merges(s: Store) -> None:
    """Waits until the background compactor has merged what the runs call for."""
    deadline = time.monotonic() + FLUSH_TIMEOUT_S
    with s._cond:
        while not merges_settled(s):
            assert time.monotonic() < deadline, f"background merges did not settle in {FLUSH_TIMEOUT_S}s"
            s._cond.wait(0.01)


class StoreChecks(RuleBasedStateMachine):
    """What both machines share: the store, the model, opening, reading and checking."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lsm-model-")
        self.path = os.path.join(self.dir, "store")
        self.store: Store | None = None
        self.model = Model()
        self.snapshots: list[lsm.Snapshot] = []
        self.horizon_seen = -1
        """The horizon at the last check (-1 again after a restore from the remote tier)."""
        self.last_high = -1
        """The highest seq appended (a rollback lowers the last seq, not this)."""
        self.retention_low = 1 << 62
        """The least retention the store has been opened with."""
        self.options: dict = {}

    def open(self, **options: object) -> None:
        note(f"store options: {options}")
        self.options = options
        self.retention_low = options["retention"]
        # runs this small merge in the background as big ones do
        self.options = options = {"merge_min_bytes": 0, **options}
        self.store = Store(self.path, **options)

    def reopen_store(self) -> None:
        assert store_threads(self.path) == [], "a store thread outlived close/abandon"
        self.snapshots = []
        self.store = Store(self.path, **self.options)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    def as_of_in_window(self, pick: int) -> int:
        """A seq an as-of read may name: between the horizon and the last seq."""
        s = self.store
        return pick_in(pick, max(s.horizon, -1), max(s.last_seq, s.horizon, -1))

    def read_as_of(self, as_of: int, read: Callable[[], T]) -> T | None:
        """Runs `read`; a RetentionError is accepted only if the horizon really passed as_of
        (background merges may move it between drawing as_of and reading)."""
        try:
            return read()
        except RetentionError:
            assert self.store.horizon > as_of, f"RetentionError for as_of {as_of} inside the window"
            return None

    def check_load(self, state: object, as_of: int | None) -> None:
        s = self.store
        got = self.read_as_of(as_of if as_of is not None else s.last_seq, lambda: s.load(state, as_of=as_of))
        if got is None:
            return
        expected = self.model.state(state, as_of)
        assert same_state(got, expected), state_diff(got, expected, f"state {state!r} as of {as_of}")

    def check_get(self, state: object, key: object, as_of: int | None, as_list: bool = False) -> None:
        s = self.store
        got = self.read_as_of(
            as_of if as_of is not None else s.last_seq,
            lambda: (s.get(state, as_passed(key, as_list), as_of=as_of, default=MISSING),),
        )
        if got is not None:
            want = self.model.value(state, key, as_of)
            assert typed(got[0]) == typed(want), f"get({state!r}, {key!r}, as_of={as_of}): {got[0]!r}, model {want!r}"

    def check_window(self) -> None:
        """Every load, and every get of a key ever written, as of every seq in the window."""
        s = self.store
        for as_of in range(max(s.horizon, -1), self.model.last + 1):
            for state in STATES:
                self.check_load(state, as_of)
                for key in self.model.chains.get(state, {}):
                    self.check_get(state, key, as_of)

    def append_runs(self, runs: dict[object, tuple], step: int, log_now: bool = False) -> None:
        """Appends one batch: each state's (columns, as_pair) passed as a (keys, values) pair or
        a mapping, or (columns, checked, chunks of pairs) passed as `lsm.Updates`; with
        `log_now`, logged on this thread when the store can."""
        seq = self.model.last + step
        passed, model_runs = {}, {}
        for state, (cols, as_pair, *rest) in runs.items():
            chunks = rest[0] if rest else None
            if chunks is not None:
                # checked: the caller promises store keys (REQUIRES), so no key goes as a list
                checked = as_pair
                # a chunk as a map (keyed operators) or an array of pairs (older writers)
                packed = [
                    (
                        len(c),
                        PAIRS_PACKER.pack_map_pairs([(as_passed(k, lst), v) for k, v, lst in c])
                        if len(c) % 2
                        else PAIRS_PACKER.pack([[as_passed(k, lst), v] for k, v, lst in c]),
                    )
                    for c in chunks
                ]
                keys = [k if checked else as_passed(k, lst) for k, _, lst in cols]
                passed[state] = lsm.Updates(keys, [v for _, v, _ in cols], packed, checked)
                model_runs[state] = [(k, v) for c in chunks for k, v, _ in c] + [(k, v) for k, v, _ in cols]
                event("append: Updates with pairs" if any(chunks) else "append: Updates, empty chunks")
            elif as_pair:
                passed[state] = ([as_passed(k, lst) for k, _, lst in cols], [v for _, v, _ in cols])
                model_runs[state] = [(k, v) for k, v, _ in cols]
            else:
                mapping = {k: v for k, v, _ in cols}
                passed[state] = mapping
                model_runs[state] = list(mapping.items())
        self.store.append(seq, passed, log_now=log_now)
        self.model.append(seq, model_runs)
        self.last_high = max(self.last_high, seq)

    def do_rollback(self, pick: int) -> int | None:
        """Rolls back to a seq in the window (or above the last: a no-op); the target, or None
        if a background merge moved the horizon past it meanwhile."""
        s = self.store
        to_seq = pick_in(pick, max(s.horizon, -1), self.model.last + 2)
        note(f"rollback to {to_seq}")
        if any(lo <= to_seq < hi for state in STATES for lo, hi, _ in s.runs(state)):
            event("rollback: into a merged run")
        try:
            s.rollback(to_seq)
        except RetentionError:
            assert s.horizon > to_seq, f"rollback to {to_seq} refused inside the window"
            return None
        if to_seq < self.model.last:
            self.model.truncate(to_seq)
        assert s.last_seq == self.model.last
        return to_seq

    def do_crash(self) -> None:
        durable = self.store.durable("disk")
        appended = self.model.last
        self.store.abandon()
        self.reopen_store()
        last = self.store.last_seq
        note(f"crash: durable {durable}, appended {appended}, recovered {last}")
        assert durable <= last <= appended, f"recovered last_seq {last} outside [{durable}, {appended}]"
        self.model.truncate(last)

    def do_compact(self) -> dict:
        """compact(): the horizon goes to min(last - retention, pinned snapshots), never back;
        below it every read is refused; each state keeps at most one run at or below it."""
        s = self.store
        if self.options.get("uploads"):
            # compact() flushes to the remote tier without a timeout; flush with one first so a
            # flush that cannot finish fails this test instead of hanging it.
            s.flush("remote", timeout=FLUSH_TIMEOUT_S)
        before = s.horizon
        bound = [self.model.last - self.options["retention"]] + [snap.seq for snap in self.snapshots]
        expected = max(before, min(bound))
        report = s.compact()
        note(f"compact: {report}")
        event("compact: merged" if report["merges"] else "compact: nothing to merge")
        assert s.horizon == expected, f"horizon {s.horizon}, expected {expected}"
        assert report["horizon"] <= s.horizon
        for state in STATES:
            folded = [r for r in s.runs(state) if r[1] <= expected]
            assert len(folded) <= 1, f"{state!r}: runs at or below the horizon {expected} not folded: {s.runs(state)}"
        if expected >= 0:
            state, key = STATES[expected % len(STATES)], KEYS[expected % len(KEYS)]
            with pytest.raises(RetentionError):
                s.get(state, key, as_of=expected - 1)
            with pytest.raises(RetentionError):
                s.load(state, as_of=expected - 1)
            with pytest.raises(RetentionError):
                s.versions(state, key, upto=expected - 1)
            with pytest.raises(RetentionError):
                s.rollback(expected - 1)
            for state in STATES:
                self.check_load(state, expected)
        return report

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def latest_state_matches(self) -> None:
        if self.store is None:
            return
        s = self.store
        assert s.last_seq == self.model.last
        for state in STATES:
            self.check_load(state, None)
        for key in KEYS:
            self.check_get(STATES[0], key, None)

    @invariant()
    def states_and_runs_are_well_formed(self) -> None:
        if self.store is None:
            return
        s = self.store
        assert s.states() == self.model.states()
        for state in STATES:
            runs = s.runs(state)
            assert all(lo <= hi for lo, hi, _ in runs), runs
            assert all(a[1] < b[0] for a, b in zip(runs, runs[1:], strict=False)), f"{state!r}: runs overlap: {runs}"
            assert not runs or runs[-1][1] <= self.model.last, runs

    @invariant()
    def horizon_is_monotonic_and_respects_retention_and_pins(self) -> None:
        if self.store is None:
            return
        h = self.store.horizon
        assert h >= self.horizon_seen, f"horizon went back from {self.horizon_seen} to {h}"
        # a rollback lowers the last seq, never the horizon: the bound is the highest last seq
        bound = max(-1, self.last_high - self.retention_low)
        assert h <= bound, f"horizon {h} passed the highest last seq - retention ({bound})"
        self.horizon_seen = h
        for snap in self.snapshots:
            assert h <= snap.seq, f"horizon {h} passed the pinned snapshot {snap.seq}"


class StoreMachine(StoreChecks):
    @initialize(
        memory_bytes=st.sampled_from([1 << 30, 1 << 30, 2000]),
        segment_bytes=st.sampled_from([1 << 20, 400, 1]),
        seal_interval_s=st.sampled_from([5.0, 0.05]),
        merge_fanout=st.sampled_from([2, 3, 4]),
        budget=st.sampled_from([0, 1.0, 1.0]),
        retention=st.integers(0, 12),
        uploads=st.booleans(),
        history=st.lists(
            st.tuples(st.dictionaries(st.sampled_from(STATES), updates_st, max_size=3), st.integers(1, 3)), max_size=16
        ),
    )
    def open_store(self, history: list[tuple[dict, int]], **options: object) -> None:
        """Opens the store and appends a history to begin with (most rules need runs to act
        on, and hypothesis draws many short programs)."""
        self.open(**options)
        for runs, step in history:
            self.append_runs(runs, step)

    # -- writes --------------------------------------------------------------------------------

    @rule(
        batches=st.lists(
            st.tuples(st.dictionaries(st.sampled_from(STATES), updates_st, max_size=3), st.integers(1, 3)),
            min_size=1,
            max_size=4,
        )
    )
    def append(self, batches: list[tuple[dict, int]]) -> None:
        """A few appends in a row (enough of them that a state's runs call for merges)."""
        for runs, step in batches:
            self.append_runs(runs, step)

    @rule(runs=st.dictionaries(st.sampled_from(STATES), updates_st, max_size=3), step=st.integers(1, 3))
    def append_logged_now(self, runs: dict, step: int) -> None:
        """An append logged on this thread when it can be (a lineage point's way)."""
        self.append_runs(runs, step, log_now=True)

    @rule(pick=PICKS, then_flush=st.sampled_from([None, None, "disk", "remote"]))
    def rollback(self, pick: int, then_flush: str | None) -> None:
        """Sometimes flushes right after, so that the durability of the rolled-back store is
        checked at once."""
        if self.do_rollback(pick) is None:
            return
        if then_flush == "remote" and not self.options["uploads"]:
            then_flush = "disk"
        if then_flush is not None:
            s = self.store
            assert s.flush(then_flush, timeout=FLUSH_TIMEOUT_S) == self.model.last
            assert s.durable(then_flush) >= self.model.last

    # -- reads ---------------------------------------------------------------------------------

    @rule(state=st.sampled_from(STATES), key=st.sampled_from(KEYS), as_list=st.booleans())
    def get_latest(self, state: object, key: object, as_list: bool) -> None:
        self.check_get(state, key, None, as_list)

    @rule(state=st.sampled_from(STATES), key=st.sampled_from(KEYS), pick=PICKS)
    def get_as_of(self, state: object, key: object, pick: int) -> None:
        self.check_get(state, key, self.as_of_in_window(pick))

    @rule(state=st.sampled_from(STATES), pick=PICKS, latest=st.booleans())
    def load(self, state: object, pick: int, latest: bool) -> None:
        self.check_load(state, None if latest else self.as_of_in_window(pick))

    @rule(state=st.sampled_from(STATES), key=st.sampled_from(KEYS), after=PICKS, upto=PICKS)
    def versions(self, state: object, key: object, after: int, upto: int) -> None:
        """Every version above the horizon survives merges; older ones may be gone."""
        s = self.store
        upto_seq = self.as_of_in_window(upto)
        after_seq = pick_in(after, max(s.horizon, -1), max(upto_seq, s.horizon, -1)) - 1
        got = self.read_as_of(upto_seq, lambda: s.versions(state, key, after=after_seq, upto=upto_seq))
        if got is None:
            return
        h = s.horizon
        want = self.model.versions(state, key, after_seq, upto_seq)
        assert [(q, typed(v)) for q, v in got if q > h] == [(q, typed(v)) for q, v in want if q > h]
        assert {q: typed(v) for q, v in got}.items() <= {q: typed(v) for q, v in want}.items()

    # -- durability, merges --------------------------------------------------------------------

    @rule(level=st.sampled_from(["memory", "disk", "disk", "remote"]))
    def flush(self, level: str) -> None:
        s = self.store
        if level == "remote" and not self.options["uploads"]:
            with pytest.raises(LsmError, match="uploads=False"):
                s.flush(level, timeout=FLUSH_TIMEOUT_S)
            return
        assert s.flush(level, timeout=FLUSH_TIMEOUT_S) == self.model.last
        assert s.durable(level) >= self.model.last

    @rule()
    def compact(self) -> None:
        self.do_compact()

    @precondition(lambda self: self.options["budget"] > 0)
    @rule()
    def let_background_merges_run(self) -> None:
        s = self.store
        s.flush(timeout=FLUSH_TIMEOUT_S)
        s._persister.drain_index()
        wait_for_merges(s)
        event(f"background merges so far: {'some' if s.stats.merges else 'none'}")
        for state in STATES:
            self.check_load(state, None)

    # -- snapshots -----------------------------------------------------------------------------

    @rule()
    def take_snapshot(self) -> None:
        snap = self.store.snapshot()
        assert snap.seq == self.model.last
        self.snapshots.append(snap)

    @precondition(lambda self: self.snapshots)
    @rule(pick=PICKS, state=st.sampled_from(STATES), key=st.sampled_from(KEYS))
    def read_snapshot(self, pick: int, state: object, key: object) -> None:
        snap = self.snapshots[pick % len(self.snapshots)]
        assert snap.seq >= self.store.horizon, "a merge passed a pinned snapshot"
        assert typed(snap.get(state, key, default=MISSING)) == typed(self.model.value(state, key, snap.seq))
        got, want = snap.load(state), self.model.state(state, snap.seq)
        assert same_state(got, want), state_diff(got, want, f"snapshot {snap.seq} of {state!r}")

    @precondition(lambda self: self.snapshots)
    @rule(pick=PICKS)
    def release_snapshot(self, pick: int) -> None:
        self.snapshots.pop(pick % len(self.snapshots)).release()

    # -- crashes and reopens -------------------------------------------------------------------

    @rule()
    def crash(self) -> None:
        self.do_crash()

    @rule()
    def reopen(self) -> None:
        self.store.flush("disk", timeout=FLUSH_TIMEOUT_S)
        self.store.close()
        self.reopen_store()
        assert self.store.last_seq == self.model.last

    @precondition(lambda self: self.options["uploads"])
    @rule()
    def restore_from_remote(self) -> None:
        """Everything flushed to the remote tier comes back into an empty local directory."""
        self.store.flush("remote", timeout=FLUSH_TIMEOUT_S)
        self.store.close()
        for part in ("disk", "log"):
            shutil.rmtree(os.path.join(self.path, part))
        self.reopen_store()
        # The horizon restarts at the newest base image (or -1): the remote tier holds every
        # version after it, so as-of reads from there on are answerable again.
        self.horizon_seen = -1
        assert self.store.last_seq == self.model.last

    @rule()
    def second_open_is_refused(self) -> None:
        with pytest.raises(StoreLockedError):
            Store(self.path, **self.options)


class MergeMachine(StoreChecks):
    """get/load as of every seq in the window, against the model, with merges included."""

    @initialize(
        merge_fanout=st.sampled_from([2, 3]),
        retention=st.sampled_from([0, 1, 3, 8, 1000]),
        segment_bytes=st.sampled_from([1 << 20, 1]),
        history=st.lists(merge_batches_st, min_size=4, max_size=20),
    )
    def open_store(self, history: list[tuple[dict, int]], **options: object) -> None:
        self.open(budget=0, **options)
        for runs, step in history:
            self.append_runs(runs, step)

    @rule(batches=st.lists(merge_batches_st, min_size=1, max_size=4))
    def append(self, batches: list[tuple[dict, int]]) -> None:
        for runs, step in batches:
            self.append_runs(runs, step)

    @rule()
    def merge(self) -> None:
        """Merges the newest runs of each state (size-tiered) and folds those at or below the
        horizon, then checks the whole window."""
        self.do_compact()
        self.check_window()

    @rule()
    def pin(self) -> None:
        """A snapshot holds the horizon back: merges above it make runs that later horizons
        cut across (as checkpoints do in production)."""
        self.snapshots.append(self.store.snapshot())

    @precondition(lambda self: self.snapshots)
    @rule()
    def unpin(self) -> None:
        self.snapshots.pop(0).release()

    @rule(merge_fanout=st.sampled_from([2, 3, 5]), retention=st.sampled_from([0, 1, 2, 4, 8, 1000]))
    def reopen_with(self, merge_fanout: int, retention: int) -> None:
        """Another fanout and retention from now on: the next merges take runs merged at
        other horizons (a run reaching across the new horizon, with history below it)."""
        self.store.close()
        self.options = {**self.options, "merge_fanout": merge_fanout, "retention": retention}
        self.retention_low = min(self.retention_low, retention)
        note(f"store options: {self.options}")
        self.reopen_store()
        assert self.store.last_seq == self.model.last

    @rule(pick=PICKS)
    def rollback(self, pick: int) -> None:
        if self.do_rollback(pick) is not None:
            self.check_window()

    @rule()
    def crash(self) -> None:
        self.do_crash()
        self.check_window()

    @rule(pick=PICKS)
    def read_at(self, pick: int) -> None:
        as_of = self.as_of_in_window(pick)
        for state in STATES[:3]:
            self.check_load(state, as_of)
            for key in MERGE_KEYS:
                self.check_get(state, key, as_of)


COMMON = dict(
    deadline=None,
    print_blob=True,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TestStoreModel = StoreMachine.TestCase
TestStoreModel.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    # No shrinking: whether a failure shows can depend on where the persister and the
    # background compactor are when a step runs (what is indexed, logged, merged), so
    # shrinking mostly replays flaky candidates (and waits out flush timeouts) for minutes.
    # The failing run is printed whole instead, with its notes and the blob that replays it.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    **COMMON,
)

TestMergeModel = MergeMachine.TestCase
TestMergeModel.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    # No shrinking either: a failing program is printed whole (shrinking one takes minutes)
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    **COMMON,
)


@pytest.mark.soak
def test_store_model_soak():
    """The same state machine, far longer (`make soak`; not part of `make test`)."""
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        StoreMachine,
        settings=settings(TestStoreModel.settings, max_examples=2000, stateful_step_count=80),
    )


@pytest.mark.soak
def test_merge_model_soak():
    """The merge machine, far longer (`make soak`; not part of `make test`)."""
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        MergeMachine,
        settings=settings(TestMergeModel.settings, max_examples=1000, stateful_step_count=60),
    )
