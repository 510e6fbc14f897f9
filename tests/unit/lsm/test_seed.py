"""Tests of `lsm.seed`, `Store.image` and `StoreOptions.on_logged`: a store rebuilt from a copy.

A replica holds a base image (`Store.image`) and the log records the persister reported
(`on_logged`); `seed` writes them into an empty directory and `Store` opens it. The model is
this file's own dict of versions (`state -> key -> [(seq, value or TOMBSTONE)]`); expected
values come from it, never from a store. `SeedMachine` drives a store with appends, merges
(`merge_fanout` 2, no background merges: `budget` 0, explicit `compact()`) and reopens, and
seeds new directories from images (at a random horizon), from the records alone, and from an
older image plus the records after it; every seeded store must answer every read it accepts
as the model does, and accept every read in [max(h, store horizon), last seq].
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from support.paths import ROOT

from lsm import TOMBSTONE, Image, LsmError, RetentionError, SeqOrderError, Store, StoreLockedError, seed

TIMEOUT_S = 5.0
"""Bound on every flush or wait: each takes milliseconds when it works."""

MISSING = object()

KEYS: list[object] = [0, 1, -7, 2**40, "", "a", "b", ("a", 1), ("a", 2), ("b",)]
"""A small key space of ints, strs and tuples, so that keys repeat and get many versions."""
STATES: list[object] = ["s", ("t", 1), 3]

values = st.one_of(
    st.integers(-3, 3),
    st.text(max_size=3),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.binary(max_size=2),
    st.just(TOMBSTONE),
    st.just(TOMBSTONE),
)
columns_st = st.lists(st.tuples(st.sampled_from(KEYS), values), min_size=1, max_size=5)
batch_st = st.tuples(
    st.dictionaries(st.sampled_from(STATES), st.tuples(columns_st, st.booleans()), min_size=1, max_size=3),
    st.integers(1, 3),
)
"""One append: per state, columns (key, value) passed as a (keys, values) pair (keys may
repeat: the later column wins) or as a mapping; and the step to its seq."""
PICKS = st.integers(0, 1 << 16)


def pick_in(pick: int, lo: int, hi: int) -> int:
    return lo + pick % (hi - lo + 1)


def typed(v: object) -> object:
    """A value with its containers' types spelled out (a tuple must not come back a list)."""
    if isinstance(v, list | tuple):
        return (type(v).__name__, [typed(x) for x in v])
    return (type(v).__name__, v)


class Versions:
    """Every version of every key of every state: the state after seq s is each key's newest
    version at or below s."""

    def __init__(self) -> None:
        self.chains: dict[object, dict[object, list[tuple[int, object]]]] = {}
        self.seqs: list[int] = []
        self.last = -1

    def append(self, seq: int, runs: dict[object, list[tuple[object, object]]]) -> None:
        assert seq > self.last
        for state, cols in runs.items():
            chains = self.chains.setdefault(state, {})
            for key, value in cols:
                chains.setdefault(key, []).append((seq, value))
        self.seqs.append(seq)
        self.last = seq

    def value(self, state: object, key: object, as_of: int) -> object:
        for seq, value in reversed(self.chains.get(state, {}).get(key, ())):
            if seq <= as_of:
                return MISSING if value is TOMBSTONE else value
        return MISSING

    def state(self, state: object, as_of: int) -> dict:
        out = {}
        for key in self.chains.get(state, {}):
            v = self.value(state, key, as_of)
            if v is not MISSING:
                out[key] = v
        return out


def append_to(store: Store, model: Versions, seq: int, runs: dict) -> None:
    """Appends `runs` ({state: (columns, as_pair)}) to the store and the model."""
    passed, modelled = {}, {}
    for state, (cols, as_pair) in runs.items():
        if as_pair:
            passed[state] = ([k for k, _ in cols], [v for _, v in cols])
            modelled[state] = list(cols)
        else:
            mapping = dict(cols)
            passed[state] = mapping
            modelled[state] = list(mapping.items())
    store.append(seq, passed)
    model.append(seq, modelled)


def check_against(s: Store, model: Versions, lo: int, where: str) -> None:
    """Every load, and every get of every key, as of every seq in [lo, model.last], and now."""
    for as_of in [*range(lo, model.last + 1), None]:
        at = model.last if as_of is None else as_of
        for state in STATES:
            got, want = s.load(state, as_of=as_of), model.state(state, at)
            assert {k: typed(v) for k, v in got.items()} == {k: typed(v) for k, v in want.items()}, (
                f"{where}: load({state!r}, as_of={as_of}): {got}, model {want}"
            )
            for key in KEYS:
                g, w = s.get(state, key, as_of=as_of, default=MISSING), model.value(state, key, at)
                assert typed(g) == typed(w), f"{where}: get({state!r}, {key!r}, as_of={as_of}): {g!r}, model {w!r}"


def check_seeded(seeded: Store, model: Versions, must_read_from: int, where: str) -> None:
    """A seeded store holds the model's last seq, answers every read as of `must_read_from`
    or later, and answers every read it accepts (from its horizon) as the model does."""
    assert seeded.last_seq == model.last, f"{where}: last seq {seeded.last_seq}, model {model.last}"
    assert seeded.horizon <= max(must_read_from, -1), (
        f"{where}: horizon {seeded.horizon} refuses reads as of {must_read_from} and later"
    )
    check_against(seeded, model, max(seeded.horizon, -1), where)
    if seeded.horizon > 0:
        with pytest.raises(RetentionError):
            seeded.load(STATES[0], as_of=seeded.horizon - 1)


class Collector:
    """What `on_logged` reported: every call's (seq, body) list, in the order of the calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[list[tuple[int, bytes]]] = []

    def __call__(self, records: list[tuple[int, bytes]]) -> None:
        with self.lock:
            self.calls.append(list(records))

    def records(self) -> list[tuple[int, bytes]]:
        with self.lock:
            return [r for call in self.calls for r in call]


def wait_for(condition: object, what: str) -> None:
    """Polls `condition()` until it holds, or fails after TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {TIMEOUT_S}s"
        time.sleep(0.002)


class SeedMachine(RuleBasedStateMachine):
    """A store and the model side by side; seeded copies of the store checked against the model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lsm-seed-")
        self.path = os.path.join(self.dir, "store")
        self.store: Store | None = None
        self.model = Versions()
        self.logged = Collector()
        self.options: dict = {}
        self.images: list[tuple[Image, int]] = []
        """(image, the least seq its seeded store must answer reads as of)."""
        self.seeds = 0

    @initialize(
        retention=st.sampled_from([0, 1, 2, 5, 1000]),
        segment_bytes=st.sampled_from([1 << 20, 300, 1]),
        history=st.lists(batch_st, min_size=1, max_size=12),
    )
    def open_store(self, retention: int, segment_bytes: int, history: list) -> None:
        self.options = dict(
            merge_fanout=2,
            budget=0,
            merge_min_bytes=0,
            retention=retention,
            segment_bytes=segment_bytes,
            on_logged=self.logged,
        )
        note(f"store options: retention {retention}, segment_bytes {segment_bytes}")
        self.store = Store(self.path, **self.options)
        for runs, step in history:
            append_to(self.store, self.model, self.model.last + step, runs)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    def seed_and_open(self, base: Image | None, records: list) -> tuple[str, Store]:
        self.seeds += 1
        path = os.path.join(self.dir, f"seeded-{self.seeds}")
        last = seed(path, base, records)
        assert last == self.model.last, f"seed returned {last}, the model's last seq is {self.model.last}"
        return path, Store(path, budget=0)

    def check_then_drop(self, path: str, seeded: Store, must_read_from: int, where: str) -> None:
        try:
            check_seeded(seeded, self.model, must_read_from, where)
            # a seeded store goes on from its last seq, and only from there
            with pytest.raises(SeqOrderError):
                seeded.append(self.model.last, {STATES[0]: {0: 1}})
            seeded.append(self.model.last + 1, {STATES[0]: {"after": 1}})
            assert seeded.get(STATES[0], "after") == 1
        finally:
            seeded.close()
            shutil.rmtree(path)

    # -- the store --------------------------------------------------------------------------

    @rule(batches=st.lists(batch_st, min_size=1, max_size=5))
    def append(self, batches: list) -> None:
        for runs, step in batches:
            append_to(self.store, self.model, self.model.last + step, runs)

    @rule()
    def compact(self) -> None:
        report = self.store.compact()
        note(f"compact: {report}; horizon {self.store.horizon}")

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = Store(self.path, **self.options)
        assert self.store.last_seq == self.model.last

    # -- seeds --------------------------------------------------------------------------------

    @rule(pick=PICKS, kind=st.sampled_from(["window", "window", "below", "default"]))
    def seed_from_image(self, pick: int, kind: str) -> None:
        """An image at a horizon h in [horizon, last] (or below the horizon, or the default),
        seeded with no records: every read as of max(h, horizon) or later is the model's."""
        s = self.store
        top = max(s.last_seq, -1)
        if kind == "window":
            h = pick_in(pick, max(s.horizon, -1), top)
        elif kind == "below":
            h = pick_in(pick, -1, max(s.horizon, -1))
        else:
            h = None
        horizon = s.horizon
        img = s.image()
        note(f"image(horizon={h}): seq {img.seq}, horizon {img.horizon}; store horizon {horizon}")
        assert img.seq == self.model.last
        must = max(top if h is None else h, horizon)
        self.images.append((img, must))
        path, seeded = self.seed_and_open(img, [])
        self.check_then_drop(path, seeded, must, f"seeded from image(horizon={h})")

    @rule()
    def seed_from_records(self) -> None:
        """The records on_logged reported, alone: every seq once, in order, and they rebuild
        the whole history (no horizon)."""
        self.store.flush(timeout=TIMEOUT_S)
        records = self.logged.records()
        assert [q for q, _ in records] == self.model.seqs, "on_logged did not report every seq once, in order"
        path, seeded = self.seed_and_open(None, records)
        self.check_then_drop(path, seeded, -1, "seeded from the records alone")

    @precondition(lambda self: self.images)
    @rule(pick=PICKS, all_records=st.booleans())
    def seed_from_image_and_later_records(self, pick: int, all_records: bool) -> None:
        """An image taken earlier plus the records logged after its seq (or all of them:
        seed skips those the image covers)."""
        img, must = self.images[pick % len(self.images)]
        self.store.flush(timeout=TIMEOUT_S)
        records = self.logged.records()
        if not all_records:
            records = [r for r in records if r[0] > img.seq]
        note(f"seed: image at {img.seq} (horizon {img.horizon}) and {len(records)} records")
        path, seeded = self.seed_and_open(img, records)
        self.check_then_drop(path, seeded, must, f"seeded from the image at {img.seq} and later records")


TestSeedModel = SeedMachine.TestCase
TestSeedModel.settings = settings(
    max_examples=40,
    stateful_step_count=20,
    deadline=None,
    print_blob=True,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)


# -- plain tests ------------------------------------------------------------------------------


def fill(s: Store, model: Versions, seqs: list[int]) -> None:
    """Appends to every state at each of `seqs`: keys overwritten, some deleted."""
    for q in seqs:
        runs = {
            "s": ([("a", q), (q % 4, str(q)), (("k", q % 3), (q, "v"))], True),
            ("t", 1): ([(q % 5, q), ((q + 2) % 5, TOMBSTONE)], False),
        }
        append_to(s, model, q, runs)


def test_seed_into_a_directory_holding_a_store_raises_naming_the_path(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "store")
    model = Versions()
    with Store(path) as s:
        fill(s, model, [1, 2, 5])
        img = s.image()
    with pytest.raises(LsmError) as err:
        seed(path, img, [])
    assert not isinstance(err.value, StoreLockedError)
    assert path in str(err.value)
    # nothing of the store changed
    with Store(path) as s:
        check_against(s, model, -1, "the store seed refused")
    # a seeded directory is a store as well
    seeded = str(tmp_path / "seeded")
    assert seed(seeded, img, []) == 5
    with pytest.raises(LsmError, match=str(tmp_path / "seeded")):
        seed(seeded, img, [])


def test_seed_while_a_store_holds_the_lock_raises_store_locked(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "store")
    s = Store(path)
    try:
        with pytest.raises(StoreLockedError) as err:
            seed(path, None, [])
        assert err.value.path == path
    finally:
        s.close()


HOLDER = """
import sys
import lsm
s = lsm.Store(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()
s.close()
"""


def test_seed_while_another_process_holds_the_lock_raises_store_locked(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "store")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, path], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "locked", "the process holding the store did not start"
        with pytest.raises(StoreLockedError, match=path):
            seed(path, None, [])
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()
    # once it let go, the directory holds a store: seeding it is refused, not locked
    with pytest.raises(LsmError) as err:
        seed(path, None, [])
    assert not isinstance(err.value, StoreLockedError)


CRASHING_SEED = """
import os, signal, sys
import lsm
seeding = sys.modules["lsm.seed"]  # the module: `lsm.seed` is its function
def crash(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
seeding.write_manifest = crash
src = lsm.Store(sys.argv[1])
img = src.image()
src.close()
lsm.seed(sys.argv[2], img, [])
"""


def test_a_seed_killed_before_its_manifest_can_be_seeded_again(tmp_path) -> None:  # noqa: ANN001
    """seed writes the manifest last, because "a directory without one is no store, and is
    seeded again" (its comment; the nosync worker seeds a store directory without a MANIFEST):
    a seed killed just before the manifest leaves a directory a second seed must take."""
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    model = Versions()
    with Store(src) as s:
        fill(s, model, [0, 1, 2, 4])
    proc = subprocess.run([sys.executable, "-c", CRASHING_SEED, src, dst], cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert not os.path.exists(os.path.join(dst, "MANIFEST"))
    with Store(src) as s:
        img = s.image()
    assert seed(dst, img, []) == 4
    with Store(dst) as seeded:
        check_seeded(seeded, model, img.seq, "seeded again after a killed seed")


@pytest.mark.parametrize("source", ["image", "records", "image+records", "nothing"])
def test_a_seeded_store_goes_on_after_its_last_seq_only(tmp_path, source: str) -> None:  # noqa: ANN001
    got = Collector()
    model = Versions()
    with Store(str(tmp_path / "src"), on_logged=got) as s:
        fill(s, model, [2, 3, 7])
        img = s.image()
        fill(s, model, [9, 10])
        s.flush(timeout=TIMEOUT_S)
        if source == "image":
            base, records = s.image(), []
        elif source == "records":
            base, records = None, got.records()
        elif source == "image+records":
            base, records = img, [r for r in got.records() if r[0] > img.seq]
        else:
            base, records, model = None, [], Versions()
    path = str(tmp_path / "seeded")
    last = seed(path, base, records)
    assert last == model.last
    with Store(path) as seeded:
        for bad in (last, last - 1, -5):
            if bad <= last:
                with pytest.raises(SeqOrderError):
                    seeded.append(bad, {"s": {"x": 1}})
        assert seeded.last_seq == last
        fill(seeded, model, [last + 1, last + 4])
        check_against(seeded, model, max(seeded.horizon, -1), f"seeded from {source}, appended to")
    with Store(path) as seeded:
        assert seeded.last_seq == last + 4
        check_against(seeded, model, max(seeded.horizon, -1), f"seeded from {source}, reopened")


def test_on_logged_reports_every_seq_once_in_order_and_rebuilds_the_store(tmp_path) -> None:  # noqa: ANN001
    got = Collector()
    model = Versions()
    seqs = [0, 1, 4, 5, 6, 10, 11, 20, *range(21, 60, 3)]
    s = Store(str(tmp_path / "src"), on_logged=got, segment_bytes=500, merge_fanout=2, merge_min_bytes=0)
    try:
        for i, q in enumerate(seqs):
            fill(s, model, [q])
            if i % 7 == 3:
                # the persister logs what it has in one record write: calls of several records
                wait_for(lambda q=q: got.records() and got.records()[-1][0] == q, f"seq {q} reported")
        # no flush: the persister reports on its own
        wait_for(lambda: got.records() and got.records()[-1][0] == seqs[-1], "report of the last seq")
        s.flush(timeout=TIMEOUT_S)
        s.compact()
        records = got.records()
        assert [q for q, _ in records] == seqs
        for call in got.calls:
            assert call, "on_logged was called with no records"
        assert all(type(body) is bytes for _, body in records)
        assert s.durable("disk") == seqs[-1]
    finally:
        s.close()
    assert [q for q, _ in got.records()] == seqs, "closing reported something again"
    path = str(tmp_path / "seeded")
    assert seed(path, None, records) == seqs[-1]
    with Store(path) as seeded:
        check_seeded(seeded, model, -1, "seeded from what on_logged reported")


def test_on_logged_reports_nothing_again_after_a_reopen(tmp_path) -> None:  # noqa: ANN001
    """A reopened store replays its log (a crash left it unindexed) without reporting those
    records again; what is appended after is reported once."""
    got = Collector()
    model = Versions()
    path = str(tmp_path / "src")
    s = Store(path, on_logged=got)
    fill(s, model, [1, 2, 3])
    s.flush(timeout=TIMEOUT_S)
    s.abandon()
    with Store(path, on_logged=got) as s:
        fill(s, model, [4, 6])
        s.flush(timeout=TIMEOUT_S)
    assert [q for q, _ in got.records()] == [1, 2, 3, 4, 6]
    seeded = str(tmp_path / "seeded")
    assert seed(seeded, None, got.records()) == 6
    with Store(seeded) as t:
        check_seeded(t, model, -1, "seeded from the records of two opens")


def test_image_of_an_empty_store_seeds_an_empty_store(tmp_path) -> None:  # noqa: ANN001
    with Store(str(tmp_path / "src")) as s:
        img = s.image()
    assert (img.seq, img.rows) == (-1, [])
    path = str(tmp_path / "seeded")
    assert seed(path, img, []) == -1
    with Store(path) as t:
        assert t.last_seq == -1
        assert t.load("s") == {}
        t.append(0, {"s": {"a": 1}})
        assert t.load("s") == {"a": 1}


def test_image_is_of_the_moment_it_was_made(tmp_path) -> None:  # noqa: ANN001
    """Appends and merges after `image` returns change nothing in it; batches not yet indexed
    are in it."""
    model = Versions()
    s = Store(str(tmp_path / "src"), merge_fanout=2, budget=0, merge_min_bytes=0, retention=0)
    try:
        fill(s, model, [0, 1, 2, 3])
        s.compact()
        fill(s, model, [5, 6])  # maybe not indexed yet: the image takes them from memory
        img = s.image()
        frozen = Versions()
        frozen.chains = {st_: {k: list(v) for k, v in ch.items()} for st_, ch in model.chains.items()}
        frozen.seqs, frozen.last = list(model.seqs), model.last
        fill(s, model, [8, 9, 12])
        s.compact()
    finally:
        s.close()
    path = str(tmp_path / "seeded")
    assert seed(path, img, []) == 6
    with Store(path) as t:
        check_seeded(t, frozen, 3, "seeded from an image made before later appends")


def test_a_seeded_store_reads_what_its_remote_tier_holds_beyond_the_copy(tmp_path) -> None:  # noqa: ANN001
    """A copy that stops at seq 3, a remote tier that goes to seq 8: the seeded store holds 8."""
    remote = str(tmp_path / "remote")
    model = Versions()
    s = Store(str(tmp_path / "src"), remote=remote, uploads=True, segment_bytes=200)
    try:
        fill(s, model, [0, 1, 3])
        img = s.image()
        fill(s, model, [4, 6, 8])
        s.flush("remote", timeout=TIMEOUT_S)
    finally:
        s.abandon()  # the machine is lost
    path = str(tmp_path / "seeded")
    assert seed(path, img, [], remote=remote) == 3
    with Store(path, uploads=True) as t:
        check_seeded(t, model, 3, "seeded from a copy, its remote tier beyond it")


def test_a_seeded_store_uploads_what_its_remote_tier_lacks(tmp_path) -> None:  # noqa: ANN001
    """A copy at seq 9 over a remote tier that stops at 5: the seeded store fills the remote
    tier in, so that a restore from it alone holds everything."""
    remote = str(tmp_path / "remote")
    model = Versions()
    s = Store(str(tmp_path / "src"), remote=remote, uploads=True, segment_bytes=200)
    try:
        fill(s, model, [0, 2, 3, 5])
        s.flush("remote", timeout=TIMEOUT_S)
        fill(s, model, [6, 7, 9])
        img = s.image()
    finally:
        s.abandon()
    path = str(tmp_path / "seeded")
    assert seed(path, img, [], remote=remote) == 9
    with Store(path, uploads=True, segment_bytes=200) as t:
        check_seeded(t, model, 9, "seeded over a remote tier that lags")
        fill(t, model, [11])
        assert t.flush("remote", timeout=TIMEOUT_S) == 11
    for part in ("disk", "log"):
        shutil.rmtree(os.path.join(path, part))
    with Store(path) as u:
        check_seeded(u, model, 11, "restored from the remote tier the seeded store filled in")
