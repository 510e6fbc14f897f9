"""Model-based test of the store: the real Store and a dict of versions, driven side by side.

As in LevelDB's fault_injection_test and RocksDB's crash test: hypothesis draws a sequence of
appends, reads, rollbacks, flushes, compactions, snapshots, simulated crashes (`abandon`),
clean reopens and restores from the remote tier, and after every step the store must agree
with the model. The store runs with tiny memtables, a short flush interval and (sometimes)
tiny log segments, so that its persister really moves batches through the log, LevelDB and the
remote tier while the test runs.

The model is `key -> [(seq, value or TOMBSTONE)]`. Expected values, orders and bounds come from
it and from the documented contract, never from the store. A failure prints the steps and a
`@reproduce_failure` blob (print_blob) so it can be replayed exactly.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import lsm
from lsm import TOMBSTONE, RetentionError, Store, StoreLockedError

FLUSH_TIMEOUT_S = 5.0
"""A flush that has not finished after this long is a hang: every flush here takes milliseconds."""

MISSING = object()
T = TypeVar("T")

# A small key space that mixes every key type, the int range edges, and keys that differ only
# after a NUL ("a" / "a\x00"), which the encoding's escaping has to keep apart.
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
PREFIXES: list[object] = [None, "", "a", "a\x00", "b", b"", b"a", (), ("a",), ("a", 1), 0, 2**63]

values = st.one_of(
    st.integers(-3, 3),
    st.text(max_size=3),
    st.none(),
    st.binary(max_size=3),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.just(TOMBSTONE),
)


def as_passed(key: object, as_list: bool) -> object:
    """The key as the caller hands it over: a tuple key sometimes as a list (the same key)."""
    if as_list and type(key) is tuple:
        return list(key)
    return key


class Model:
    """Every version of every key; the state after seq s is the newest version <= s."""

    def __init__(self) -> None:
        self.chains: dict[object, list[tuple[int, object]]] = {}
        self.last = -1

    def append(self, seq: int, updates: list[tuple[object, object]]) -> None:
        assert seq > self.last
        for key, value in updates:
            # Appended in batch order: for one key in one batch, the later pair comes later
            # in its chain and so wins.
            self.chains.setdefault(key, []).append((seq, value))
        self.last = seq

    def value(self, key: object, as_of: int | None = None) -> object:
        for seq, value in reversed(self.chains.get(key, ())):
            if as_of is None or seq <= as_of:
                return MISSING if value is TOMBSTONE else value
        return MISSING

    def state(self, as_of: int | None = None) -> dict[object, object]:
        out = {}
        for key in self.chains:
            v = self.value(key, as_of)
            if v is not MISSING:
                out[key] = v
        return out

    def truncate(self, seq: int) -> None:
        """What rollback(seq) and a crash that keeps the prefix up to seq leave."""
        for key in list(self.chains):
            kept = [(s, v) for s, v in self.chains[key] if s <= seq]
            if kept:
                self.chains[key] = kept
            else:
                del self.chains[key]
        self.last = min(self.last, seq)


def prefix_matches(prefix: object, key: object) -> bool:
    """The documented meaning of scan(prefix=...), written independently of the encoding."""
    if prefix is None:
        return True
    if type(prefix) in (str, bytes):
        return type(key) is type(prefix) and key.startswith(prefix)
    if type(prefix) is tuple:
        return type(key) is tuple and key[: len(prefix)] == prefix
    return type(key) is type(prefix) and key == prefix


def state_diff(got: dict, expected: dict, as_of: int | None, horizon: int) -> str:
    lines = [f"state as of {as_of} (horizon {horizon}) differs from the model:"]
    for k in sorted(set(got) | set(expected), key=repr):
        g, e = got.get(k, MISSING), expected.get(k, MISSING)
        if g != e:
            shown = ["-" if v is MISSING else repr(v) for v in (g, e)]
            lines.append(f"  {k!r}: store {shown[0]}, model {shown[1]}")
    return "\n".join(lines)


def type_group(key: object) -> str:
    return "None" if key is None else type(key).__name__


def check_scan_order(keys: list[object]) -> None:
    """Keys of one type are contiguous and in their natural order (ints numerically, str by
    code point, bytes bytewise, tuples element-wise); no key appears twice."""
    assert len(keys) == len(set(keys)), f"scan returned a key twice: {keys!r}"
    groups: list[str] = []
    for key in keys:
        g = type_group(key)
        if not groups or groups[-1] != g:
            assert g not in groups, f"keys of type {g} are not contiguous in {keys!r}"
            groups.append(g)
    for g in groups:
        run = [k for k in keys if type_group(k) == g]
        assert run == sorted(run, key=lambda k: 0 if k is None else k), f"{g} keys out of order: {run!r}"


PICKS = st.integers(0, 1 << 16)
"""Where in a range to pick a seq. The range itself depends on the store (its horizon moves in
the background, a crash recovers a seq anywhere in [durable, last]), so the draw must not:
hypothesis needs the same draws to replay a failure."""


def pick_in(pick: int, lo: int, hi: int) -> int:
    return lo + pick % (hi - lo + 1)


def store_threads(path: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if path in t.name and t.is_alive()]


def leveldb_writer_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("lsm-leveldb-writer"))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lsm-model-")
        self.path = os.path.join(self.dir, "store")
        self.store: Store | None = None
        self.model = Model()
        self.snapshots: list[lsm.Snapshot] = []
        self.horizon_seen = -1
        self.writer_threads = leveldb_writer_threads()

    # -- opening and closing -------------------------------------------------------------------

    @initialize(
        memtable_updates=st.integers(3, 8),
        memory_updates=st.sampled_from([1 << 20, 1 << 20, 12]),
        flush_interval_s=st.sampled_from([0.005, 0.02]),
        segment_bytes=st.sampled_from([1 << 20, 400, 1]),
        seal_interval_s=st.sampled_from([5.0, 0.05]),
        compact_every_updates=st.sampled_from([0, 0, 5]),
        retention=st.integers(0, 12),
    )
    def open_store(self, **options: object) -> None:
        note(f"store options: {options}")
        self.options = options
        self.store = Store(self.path, **options)

    def reopen_store(self) -> None:
        assert store_threads(self.path) == [], "a store thread outlived close/abandon"
        assert leveldb_writer_threads() <= self.writer_threads, "a LevelDB writer thread leaked"
        self.snapshots = []
        self.store = Store(self.path, **self.options)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------------

    def as_of_in_window(self, pick: int) -> int:
        """A seq an as-of read may name: between the horizon and the last seq."""
        s = self.store
        return pick_in(pick, max(s.horizon, -1), max(s.last_seq, s.horizon, -1))

    def read_as_of(self, as_of: int, read: Callable[[], T]) -> T | None:
        """Runs `read`; a RetentionError is accepted only if the horizon really passed as_of
        (background compaction may move it between drawing as_of and reading)."""
        try:
            return read()
        except RetentionError:
            assert self.store.horizon > as_of, f"RetentionError for as_of {as_of} inside the window"
            return None

    def compare_state(self, as_of: int | None) -> None:
        s = self.store
        result = self.read_as_of(as_of if as_of is not None else s.last_seq, lambda: list(s.scan(as_of=as_of)))
        if result is None:
            return
        check_scan_order([k for k, _ in result])
        got, expected = dict(result), self.model.state(as_of)
        assert got == expected, state_diff(got, expected, as_of, s.horizon)

    # -- writes --------------------------------------------------------------------------------

    @rule(
        updates=st.lists(st.tuples(st.sampled_from(KEYS), values, st.booleans()), max_size=5),
        step=st.integers(1, 3),
    )
    def append(self, updates: list[tuple[object, object, bool]], step: int) -> None:
        seq = self.model.last + step
        self.store.append(seq, [(as_passed(k, as_list), v) for k, v, as_list in updates])
        self.model.append(seq, [(k, v) for k, v, _ in updates])

    @rule(pick=PICKS, then_flush=st.sampled_from([None, None, "disk", "remote"]))
    def rollback(self, pick: int, then_flush: str | None) -> None:
        """Rolls back to a seq in the window (or above the last: a no-op); sometimes flushes
        right after, so that the durability of the rolled-back store is checked at once."""
        s = self.store
        to_seq = pick_in(pick, max(s.horizon, -1), self.model.last + 2)
        note(f"rollback to {to_seq}")
        try:
            s.rollback(to_seq)
        except RetentionError:
            # Only if a background compaction moved the horizon past to_seq meanwhile.
            assert s.horizon > to_seq, f"rollback to {to_seq} refused inside the window"
            return
        if to_seq < self.model.last:
            self.model.truncate(to_seq)
        assert s.last_seq == self.model.last
        if then_flush is not None:
            assert s.flush(then_flush, timeout=FLUSH_TIMEOUT_S) == self.model.last
            assert s.durable(then_flush) >= self.model.last

    # -- reads ---------------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), as_list=st.booleans())
    def get_latest(self, key: object, as_list: bool) -> None:
        assert self.store.get(as_passed(key, as_list), default=MISSING) == self.model.value(key)

    @rule(key=st.sampled_from(KEYS), pick=PICKS)
    def get_as_of(self, key: object, pick: int) -> None:
        as_of = self.as_of_in_window(pick)
        got = self.read_as_of(as_of, lambda: (self.store.get(key, as_of=as_of, default=MISSING),))
        if got is not None:
            assert got[0] == self.model.value(key, as_of)

    @rule(prefix=st.sampled_from(PREFIXES), pick=PICKS, latest=st.booleans())
    def scan_prefix(self, prefix: object, pick: int, latest: bool) -> None:
        as_of = None if latest else self.as_of_in_window(pick)
        got = self.read_as_of(
            self.store.last_seq if as_of is None else as_of,
            lambda: list(self.store.scan(prefix, as_of=as_of)),
        )
        if got is None:
            return
        check_scan_order([k for k, _ in got])
        expected = {k: v for k, v in self.model.state(as_of).items() if prefix_matches(prefix, k)}
        assert dict(got) == expected

    @rule(pick=PICKS)
    def scan_as_of(self, pick: int) -> None:
        self.compare_state(self.as_of_in_window(pick))

    # -- durability, compaction ----------------------------------------------------------------

    @rule(level=st.sampled_from(["memory", "disk", "disk", "remote"]))
    def flush(self, level: str) -> None:
        target = self.store.flush(level, timeout=FLUSH_TIMEOUT_S)
        assert target == self.model.last
        assert self.store.durable(level) >= self.model.last

    @rule()
    def compact(self) -> None:
        s = self.store
        # compact() flushes to the remote tier without a timeout; flush with one first so a
        # flush that cannot finish fails this test instead of hanging it.
        s.flush("remote", timeout=FLUSH_TIMEOUT_S)
        before = s.horizon
        bound = [self.model.last - self.options["retention"]] + [snap.seq for snap in self.snapshots]
        expected = max(before, min(bound))
        s.compact()
        assert s.horizon == expected
        if expected >= 0:
            key = KEYS[expected % len(KEYS)]
            with pytest.raises(RetentionError):
                s.get(key, as_of=expected - 1)
            with pytest.raises(RetentionError):
                list(s.scan(as_of=expected - 1))
            with pytest.raises(RetentionError):
                s.rollback(expected - 1)
            assert s.get(key, as_of=expected, default=MISSING) == self.model.value(key, expected)
            self.compare_state(expected)

    # -- snapshots -----------------------------------------------------------------------------

    @rule()
    def take_snapshot(self) -> None:
        snap = self.store.snapshot()
        assert snap.seq == self.model.last
        self.snapshots.append(snap)

    @precondition(lambda self: self.snapshots)
    @rule(pick=PICKS, key=st.sampled_from(KEYS))
    def read_snapshot(self, pick: int, key: object) -> None:
        snap = self.snapshots[pick % len(self.snapshots)]
        assert snap.seq >= self.store.horizon, "compaction passed a pinned snapshot"
        assert snap.get(key, default=MISSING) == self.model.value(key, snap.seq)
        got = list(snap.scan())
        check_scan_order([k for k, _ in got])
        assert dict(got) == self.model.state(snap.seq)

    @precondition(lambda self: self.snapshots)
    @rule(pick=PICKS)
    def release_snapshot(self, pick: int) -> None:
        self.snapshots.pop(pick % len(self.snapshots)).release()

    # -- crashes and reopens -------------------------------------------------------------------

    @rule()
    def crash(self) -> None:
        durable = self.store.durable("disk")
        appended = self.model.last
        self.store.abandon()
        self.reopen_store()
        last = self.store.last_seq
        note(f"crash: durable {durable}, appended {appended}, recovered {last}")
        assert durable <= last <= appended, f"recovered last_seq {last} outside [{durable}, {appended}]"
        self.model.truncate(last)

    @rule()
    def reopen(self) -> None:
        self.store.flush("disk", timeout=FLUSH_TIMEOUT_S)
        self.store.close()
        self.reopen_store()
        assert self.store.last_seq == self.model.last

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

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def latest_state_matches(self) -> None:
        if self.store is None:
            return
        s = self.store
        assert s.last_seq == self.model.last
        for key in KEYS:
            assert s.get(key, default=MISSING) == self.model.value(key), f"get({key!r})"
        self.compare_state(None)

    @invariant()
    def horizon_is_monotonic_and_respects_pins(self) -> None:
        if self.store is None:
            return
        h = self.store.horizon
        assert h >= self.horizon_seen, f"horizon went back from {self.horizon_seen} to {h}"
        self.horizon_seen = h
        for snap in self.snapshots:
            assert h <= snap.seq, f"horizon {h} passed the pinned snapshot {snap.seq}"
        assert h <= max(self.model.last, -1)


TestStoreModel = StoreMachine.TestCase
TestStoreModel.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    print_blob=True,
    # No shrinking: whether a failure shows can depend on where the persister is when a step
    # runs (what is indexed, what is logged), so shrinking mostly replays flaky candidates
    # (and waits out flush timeouts) for minutes. The failing run is printed whole instead,
    # with its notes and the blob that replays it.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.soak
def test_store_model_soak():
    """The same state machine, ten times longer (`make soak`; not part of `make test`)."""
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        StoreMachine,
        settings=settings(TestStoreModel.settings, max_examples=2000, stateful_step_count=80),
    )
