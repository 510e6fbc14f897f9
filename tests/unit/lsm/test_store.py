"""Focused tests of Store behaviour that the state machine (test_model.py) reaches rarely.

Expected values are written out here or computed from a plain dict of versions, never taken
from the store. `index_all` uses `compact()` with the default retention (which moves no
horizon in these small stores) as the public way to wait until LevelDB holds every batch.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

from lsm import (
    TOMBSTONE,
    KeyEncodingError,
    LsmError,
    RetentionError,
    SeqOrderError,
    Store,
    StoreClosedError,
    StoreLockedError,
)
from lsm.files import copy_store, scratch_near
from lsm.keys import encode_key

TIMEOUT_S = 5.0
"""Bound on every flush that could hang: they all take milliseconds when they work."""

MISSING = object()

OpenStore = Callable[..., Store]


@pytest.fixture
def open_store(tmp_path) -> Iterator[OpenStore]:  # noqa: ANN001 - pytest's tmp_path
    """Opens stores under tmp_path; whatever a test leaves open is abandoned afterwards."""
    opened: list[Store] = []

    def open_(name: str = "store", **options: object) -> Store:
        s = Store(str(tmp_path / name), **options)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.abandon()


def index_all(s: Store) -> None:
    """Waits until every batch is indexed on the disk tier (compact() drains the memtables)."""
    assert s.options.retention > s.last_seq + 1, "index_all must not move the horizon"
    s.compact()


def state_of(history: list[tuple[int, list]], as_of: int | None = None) -> dict:
    """The state after `as_of` of a list of (seq, updates) batches, by replaying them."""
    out: dict = {}
    for seq, updates in history:
        if as_of is not None and seq > as_of:
            break
        for k, v in updates:
            k = tuple(k) if isinstance(k, list) else k
            if v is TOMBSTONE:
                out.pop(k, None)
            else:
                out[k] = v
    return out


def append_all(s: Store, history: list[tuple[int, list]]) -> None:
    for seq, updates in history:
        s.append(seq, updates)


def remote_files(s: Store) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(s.path, "remote")) if n.endswith(".arrow"))


HISTORY: list[tuple[int, list]] = [
    (1, [("a", 1), ("b", 1), (("t", 1), "x")]),
    (2, [("a", 2), ("c", b"\x00")]),
    (4, [("b", TOMBSTONE), (7, None)]),
    (5, []),
    (8, [("a", TOMBSTONE), ("d", (1, "two")), (["t", 2], "y")]),
    (9, [("a", 9), (("t", 1), TOMBSTONE)]),
]


# -- append: seq order, refused keys and values --------------------------------------------


def test_seqs_must_be_ints_strictly_above_the_last(open_store: OpenStore) -> None:
    s = open_store()
    with pytest.raises(SeqOrderError):
        s.append(-1, [("a", 1)])
    s.append(5, [("a", 5)])
    for bad in (5, 4, 0, -3, 6.0, "6", True, None, 2**64):
        with pytest.raises(SeqOrderError):
            s.append(bad, [("a", bad)])
        assert s.last_seq == 5
    assert s.get("a") == 5
    s.append(6, [("a", 6)])
    assert s.last_seq == 6
    assert s.get("a") == 6
    assert s.get("a", as_of=5) == 5


@pytest.mark.parametrize("bad_key", [True, False, 1.5, ("x", 2.5), [1, True], object()])
def test_a_batch_with_a_bad_key_is_refused_whole(open_store: OpenStore, bad_key: object) -> None:
    s = open_store()
    s.append(1, [("a", 1)])
    with pytest.raises(KeyEncodingError):
        s.append(2, [("a", 2), (bad_key, 2), ("b", 2)])
    assert s.last_seq == 1
    assert s.get("a") == 1
    assert s.get("b", default=MISSING) is MISSING
    s.append(2, [("b", 2)])
    assert s.flush(timeout=TIMEOUT_S) == 2
    index_all(s)
    assert dict(s.scan()) == {"a": 1, "b": 2}


@pytest.mark.parametrize("bad_key", [2**64, -(2**63) - 1])
def test_an_int_key_outside_the_msgpack_range_is_refused(open_store: OpenStore, bad_key: int) -> None:
    s = open_store()
    s.append(1, [("a", 1)])
    with pytest.raises(LsmError):
        s.append(2, [("b", 2), (bad_key, 2)])
    assert s.last_seq == 1
    assert s.get("b", default=MISSING) is MISSING
    s.append(2, [(2**64 - 1, "max"), (-(2**63), "min")])
    assert s.flush(timeout=TIMEOUT_S) == 2
    index_all(s)
    assert dict(s.scan()) == {"a": 1, 2**64 - 1: "max", -(2**63): "min"}
    assert [k for k, _ in s.scan() if type(k) is int] == [-(2**63), 2**64 - 1]


@pytest.mark.parametrize("bad_value", [object(), 2**64, {1: {2}}, [1, object()], 1j])
def test_a_batch_with_a_value_msgpack_cannot_encode_is_refused_whole(open_store: OpenStore, bad_value: object) -> None:
    s = open_store()
    s.append(1, [("a", 1)])
    with pytest.raises(LsmError):
        s.append(2, [("a", 2), ("b", bad_value)])
    assert s.last_seq == 1
    assert s.get("a") == 1
    s.append(2, [("b", 2)])
    assert s.flush(timeout=TIMEOUT_S) == 2
    index_all(s)
    assert dict(s.scan()) == {"a": 1, "b": 2}


@pytest.mark.parametrize("bad_pair", [("a",), ("a", 1, 2), ()])
def test_an_update_that_is_not_a_pair_is_refused(open_store: OpenStore, bad_pair: tuple) -> None:
    """append's contract: updates are (key, value) pairs, and what cannot be stored is refused
    with nothing added. Accepting the batch leaves it to fail later in the persister."""
    s = open_store()
    s.append(1, [("a", 1)])
    with pytest.raises(LsmError):
        s.append(2, [("b", 2), bad_pair])
    assert s.last_seq == 1
    assert s.flush(timeout=TIMEOUT_S) == 1
    s.append(2, [("b", 2)])
    assert s.flush(timeout=TIMEOUT_S) == 2
    index_all(s)
    assert dict(s.scan()) == {"a": 1, "b": 2}


def test_within_a_batch_the_later_pair_wins(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, [("k", 1), ("k", 2), ("j", TOMBSTONE), ("j", 3), ("g", 4), ("g", TOMBSTONE)])
    s.append(2, [("k", 20), (("t",), 1), (["t"], 2)])
    expected_1 = {"k": 2, "j": 3}
    expected_2 = {"k": 20, "j": 3, ("t",): 2}
    assert dict(s.scan(as_of=1)) == expected_1 and dict(s.scan()) == expected_2
    assert s.get("g", default=MISSING) is MISSING
    index_all(s)
    assert dict(s.scan(as_of=1)) == expected_1 and dict(s.scan()) == expected_2
    assert s.get("k", as_of=1) == 2 and s.get(("t",)) == 2
    assert s.get("g", default=MISSING) is MISSING


def test_none_is_a_value_not_an_absence(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, [("n", None), (None, "none-key")])
    for _ in range(2):
        assert s.get("n", default=MISSING) is None
        assert s.get(None) == "none-key"
        assert dict(s.scan()) == {"n": None, None: "none-key"}
        index_all(s)


# -- keys on the read path -----------------------------------------------------------------


def test_list_keys_are_the_tuple_keys(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, [(["a", ["b", 1]], "nested"), (("c", 2), "flat")])
    for _ in range(2):
        assert s.get(("a", ("b", 1))) == "nested"
        assert s.get(["a", ["b", 1]]) == "nested"
        assert s.get(["c", 2]) == "flat"
        assert dict(s.scan()) == {("a", ("b", 1)): "nested", ("c", 2): "flat"}
        assert list(s.scan(["a"])) == [(("a", ("b", 1)), "nested")]
        index_all(s)


def test_a_tuple_key_holding_a_list_is_the_same_key(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, [(("a", (1, 2)), "v")])
    assert s.get(("a", [1, 2])) == "v"
    index_all(s)
    assert s.get(("a", [1, 2])) == "v"


@pytest.mark.parametrize("bad_key", [True, 1.0, (1.0,)])
def test_get_refuses_keys_that_append_refuses(open_store: OpenStore, bad_key: object) -> None:
    """True == 1 and 1.0 == 1 in Python: read from a memtable they must not find key 1 (they
    cannot be found on the disk tier, so the answer would depend on where key 1 lives)."""
    s = open_store(flush_interval_s=60)
    s.append(1, [(1, "one"), ((1,), "tuple-one")])
    with pytest.raises(KeyEncodingError):
        s.get(bad_key)
    index_all(s)
    with pytest.raises(KeyEncodingError):
        s.get(bad_key)


def test_keys_that_differ_after_a_nul_stay_apart_on_the_disk_tier(open_store: OpenStore) -> None:
    """str/bytes keys and their extensions by a NUL byte, once both are in LevelDB."""
    s = open_store()
    s.append(1, [("a", 1), ("a\x00", 2), (b"a", 3), (b"a\x00", 4)])
    index_all(s)
    assert s.get("a") == 1
    assert s.get(b"a") == 3
    got = list(s.scan())
    assert [k for k, _ in got if type(k) is str] == ["a", "a\x00"]
    assert [k for k, _ in got if type(k) is bytes] == [b"a", b"a\x00"]
    assert dict(got) == {"a": 1, "a\x00": 2, b"a": 3, b"a\x00": 4}
    s.append(2, [("a", TOMBSTONE)])
    assert s.get("a", default=MISSING) is MISSING
    assert dict(s.scan()) == {b"a": 3, b"a\x00": 4, "a\x00": 2}


def test_bytes_keys_versions_do_not_interleave(open_store: OpenStore) -> None:
    """A bytes key whose escaped form continues with 0xFF bytes must not sort between the
    versions of its prefix key (FORMAT.md: a key's versions are contiguous)."""
    s = open_store()
    other = b"a\x00" + b"\xff" * 6 + b"\xfa"
    s.append(0, [(b"a", "old")])
    s.append(10, [(b"a", "new"), (other, "other")])
    index_all(s)
    assert s.get(b"a", as_of=5) == "old"
    assert s.get(b"a") == "new"
    assert list(s.scan(as_of=5)) == [(b"a", "old")]


def test_tuple_prefix_matches_only_equal_first_elements(open_store: OpenStore) -> None:
    s = open_store()
    s.append(
        1,
        [
            (("a", 1), 1),
            (("a\x00", 1), 2),
            (("ab",), 3),
            (("a",), 4),
            ("a", 5),
            ("ab", 6),
            (b"a", 7),
        ],
    )
    for _ in range(2):
        assert list(s.scan(("a",))) == [(("a",), 4), (("a", 1), 1)]
        assert list(s.scan("a")) == [("a", 5), ("ab", 6)]
        assert list(s.scan(b"a")) == [(b"a", 7)]
        assert list(s.scan(("a", 1))) == [(("a", 1), 1)]
        index_all(s)


def test_as_of_scans_over_long_histories_find_every_version(open_store: OpenStore) -> None:
    """Keys with many versions (more than an as-of scan steps over before it seeks), with
    deletions, seq 0, neighbours whose encodings share a prefix, and keys with one version:
    every as-of scan, whole and by prefix, equals the replayed history."""
    s = open_store()
    history: list[tuple[int, list]] = []
    for seq in range(0, 40):
        updates: list = [(("k", 1), seq), (("k", 10), -seq)]
        if seq % 3 == 0:
            updates.append((("k", 2), TOMBSTONE if seq % 6 == 0 else seq))
        if seq % 13 == 0:
            updates.append((("k", 1, "x"), f"x{seq}"))
        if seq == 7:
            updates.append(("once", 7))
        if seq in (0, 39):
            updates.append((b"\xff" * 3, seq))
        history.append((seq, updates))
    append_all(s, history)
    for indexed in (False, True):
        for as_of in [-1, *range(0, 40), None]:
            want = state_of(history, as_of)
            assert dict(s.scan(as_of=as_of)) == want, (indexed, as_of)
            assert list(s.scan(as_of=as_of)) == sorted(s.scan(as_of=as_of), key=lambda kv: encode_key(kv[0]))
            by_prefix = {k: v for k, v in want.items() if isinstance(k, tuple) and k[:2] == ("k", 1)}
            assert dict(s.scan(("k", 1), as_of=as_of)) == by_prefix, (indexed, as_of)
        index_all(s)


def test_as_of_minus_one_is_the_state_before_any_batch(open_store: OpenStore) -> None:
    s = open_store()
    s.append(0, [("a", 1)])
    for _ in range(2):
        assert s.horizon == -1
        assert s.get("a", as_of=-1, default=MISSING) is MISSING
        assert list(s.scan(as_of=-1)) == []
        index_all(s)


# -- options, durability levels, the lock ------------------------------------------------------


def test_unknown_option_is_refused_and_leaves_the_directory_free(open_store: OpenStore, tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(LsmError, match="bogus"):
        Store(str(tmp_path / "store"), bogus=1)
    s = open_store()
    s.append(1, [("a", 1)])
    assert s.get("a") == 1


def test_unknown_durability_level_is_refused(open_store: OpenStore) -> None:
    s = open_store()
    with pytest.raises(LsmError):
        s.durable("cloud")
    with pytest.raises(LsmError):
        s.flush("cloud")


def test_second_open_is_refused_until_close(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, [("a", 1)])
    with pytest.raises(StoreLockedError):
        open_store()
    s.append(2, [("a", 2)])
    s.close()
    s = open_store()
    assert s.get("a") == 2
    s.abandon()
    s = open_store()
    assert s.get("a") == 2
    with pytest.raises(StoreLockedError):
        open_store()


def test_a_closed_store_refuses_calls(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, [("a", 1)])
    s.close()
    s.close()
    with pytest.raises(StoreClosedError):
        s.append(2, [("a", 2)])
    with pytest.raises(StoreClosedError):
        s.get("a")
    with pytest.raises(StoreClosedError):
        s.flush()


def test_close_keeps_everything_and_abandon_keeps_what_is_durable(open_store: OpenStore) -> None:
    s = open_store(flush_interval_s=60)
    append_all(s, HISTORY[:3])
    assert s.flush("disk", timeout=TIMEOUT_S) == 4
    append_all(s, HISTORY[3:])
    s.abandon()  # nothing froze the memtable after the flush: seqs 5.. were only in memory
    s = open_store(flush_interval_s=60)
    assert s.last_seq == 4
    assert dict(s.scan()) == state_of(HISTORY, 4)
    append_all(s, HISTORY[3:])
    s.close()
    s = open_store(flush_interval_s=60)
    assert s.last_seq == 9
    assert dict(s.scan()) == state_of(HISTORY)
    for seq in range(-1, 10):
        assert dict(s.scan(as_of=seq)) == state_of(HISTORY, seq)


def closed_with_bulk(open_store: OpenStore) -> list[tuple[int, list]]:
    """Writes HISTORY and then a bulk of 200,000 updates at seqs 10..19 (enough that LevelDB is
    still indexing them when the log has made them durable) to "store", closes it, and
    returns the bulk."""
    s = open_store(flush_interval_s=60)
    append_all(s, HISTORY)
    bulk = [(seq, [(f"k{i}", seq) for i in range(20_000)]) for seq in range(10, 20)]
    append_all(s, bulk)
    s.close()
    return bulk


def test_close_leaves_leveldb_no_log_to_recover(open_store: OpenStore, tmp_path) -> None:  # noqa: ANN001
    bulk = closed_with_bulk(open_store)
    disk = tmp_path / "store" / "disk"
    logs = {p.name: p.stat().st_size for p in disk.iterdir() if p.suffix == ".log"}
    assert logs and all(size == 0 for size in logs.values()), logs
    assert any(p.suffix == ".ldb" for p in disk.iterdir())
    # LevelDB alone holds every version: a copy without the store's own log has them all
    shutil.copytree(tmp_path / "store", tmp_path / "copy")
    shutil.rmtree(tmp_path / "copy" / "log")
    c = open_store("copy", flush_interval_s=60)
    assert c.last_seq == 19
    for seq in [*range(-1, 11), 19]:
        assert dict(c.scan(as_of=seq)) == state_of(HISTORY + bulk, seq)


def contents(root: str) -> dict[str, str]:
    """Every file under `root`: its path -> the sha256 of its bytes."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_a_copy_of_a_store_is_written_without_touching_the_original(open_store: OpenStore, tmp_path) -> None:  # noqa: ANN001
    bulk = closed_with_bulk(open_store)
    original = str(tmp_path / "store")
    before = contents(original)
    copy_store(original, str(tmp_path / "copy"))
    tables = [n for n in before if n.endswith(".ldb")]
    assert tables and all(os.path.samefile(tmp_path / "store" / n, tmp_path / "copy" / n) for n in tables)
    assert not [n for n in contents(str(tmp_path / "copy")) if os.path.basename(n) == "LOCK"]
    # the copy is written every way a store writes: its log, LevelDB's tables rewritten
    # whole by a compaction that drops old versions, the remote tier
    c = open_store("copy", flush_interval_s=60, retention=0)
    c.append(20, [("k1", "changed"), ("k2", TOMBSTONE)])
    c.compact()
    assert c.get("k1") == "changed" and c.get("k3") == 19
    c.close()
    assert contents(original) == before
    o = open_store("store")
    assert o.last_seq == 19
    assert dict(o.scan()) == state_of(HISTORY + bulk)
    assert dict(o.scan(as_of=5)) == state_of(HISTORY, 5)


def test_a_scratch_for_a_copy_lies_on_the_store_s_file_system(open_store: OpenStore, tmp_path, monkeypatch) -> None:  # noqa: ANN001 - pytest's fixtures
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's directory")
    closed_with_bulk(open_store)
    original = str(tmp_path / "store")
    monkeypatch.setattr(tempfile, "tempdir", "/dev/shm")
    with scratch_near(original, "lsm-test-") as scratch:
        assert os.stat(scratch).st_dev == os.stat(original).st_dev
        assert os.path.dirname(scratch) == str(tmp_path) and os.listdir(scratch) == []
        copy_store(original, os.path.join(scratch, "copy"))
        tables = [n for n in contents(original) if n.endswith(".ldb")]
        assert tables and all(
            os.path.samefile(os.path.join(original, n), os.path.join(scratch, "copy", n)) for n in tables
        )
    assert not os.path.exists(scratch)
    # a store on the temporary directory's own file system: the scratch is under it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    with scratch_near(original, "lsm-test-") as scratch:
        assert os.path.dirname(scratch) == str(tmp_path / "tmp")
    assert os.listdir(tmp_path / "tmp") == []


def test_a_store_opened_without_uploads_refuses_a_remote_flush(open_store: OpenStore) -> None:
    s = open_store(seal_interval_s=0.01)
    append_all(s, HISTORY)
    s.close()
    s = open_store(seal_interval_s=0.01, uploads=False)
    with pytest.raises(LsmError, match="uploads=False"):
        s.flush("remote", timeout=TIMEOUT_S)
    assert dict(s.scan()) == state_of(HISTORY)
    s.close()
    assert remote_files(s) == []


# -- rollback ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_rollback_restores_the_state_and_frees_later_seqs(open_store: OpenStore, where: str) -> None:
    s = open_store()
    append_all(s, HISTORY)
    if where == "disk":
        index_all(s)
    s.rollback(4)
    assert s.last_seq == 4
    assert dict(s.scan()) == state_of(HISTORY, 4)
    assert s.get("a") == 2
    redo = [(5, [("a", "again")]), (6, [("e", 6)])]
    append_all(s, redo)
    expected = HISTORY[:3] + redo
    assert dict(s.scan()) == state_of(expected)
    assert dict(s.scan(as_of=5)) == state_of(expected, 5)
    s.close()
    s = open_store()
    assert s.last_seq == 6
    assert dict(s.scan()) == state_of(expected)
    for seq in range(-1, 7):
        assert dict(s.scan(as_of=seq)) == state_of(expected, seq)


def test_rollback_after_reopen_into_a_gap_before_the_last_segment(open_store: OpenStore) -> None:
    """A reopened store knows an unread segment's last seq only as a bound (the next segment's
    first - 1); rolling back into that gap must still log a batch at the target, so that a
    flush to the remote tier can reach it."""
    s = open_store()
    s.append(2, [("a", 2)])
    s.append(5, [("b", 5)])
    s.flush("remote", timeout=TIMEOUT_S)
    s.append(8, [("a", 8)])
    s.compact()  # everything indexed and uploaded; 8 starts a new log segment
    s.close()
    s = open_store()
    s.rollback(7)
    assert s.last_seq == 7
    assert dict(s.scan()) == {"a": 2, "b": 5}
    assert s.flush("remote", timeout=TIMEOUT_S) == 7
    assert s.durable("remote") >= 7
    s.close()
    s = open_store()
    assert s.last_seq == 7
    assert dict(s.scan()) == {"a": 2, "b": 5}


@pytest.mark.parametrize("flushed", [False, True])
def test_rollback_to_a_seq_without_a_batch_becomes_durable(open_store: OpenStore, flushed: bool) -> None:
    """rollback(to_seq) makes last_seq == to_seq; flushing must then reach to_seq on every
    level, and a crash must not recover less than durable("disk") said."""
    s = open_store()
    s.append(1, [("a", 1)])
    s.append(3, [("a", 3)])
    if flushed:
        s.flush("remote", timeout=TIMEOUT_S)
    s.rollback(2)
    assert s.last_seq == 2
    assert s.get("a") == 1
    assert s.flush("disk", timeout=TIMEOUT_S) == 2
    assert s.durable("disk") >= 2
    assert s.flush("remote", timeout=TIMEOUT_S) == 2
    assert s.durable("remote") >= 2
    durable = s.durable("disk")
    s.abandon()
    s = open_store()
    assert durable <= s.last_seq <= 2
    assert s.get("a") == 1


def test_rollback_after_reopen_into_a_segment_that_open_did_not_read(open_store: OpenStore) -> None:
    """On open, a segment wholly below what LevelDB indexed is not read; its last seq is taken
    to be one below the next segment's first. Rolling back into that gap must work."""
    s = open_store(segment_bytes=1)
    for seq in (1, 2, 5):
        s.append(seq, [("a", seq)])
        s.flush("disk", timeout=TIMEOUT_S)
    index_all(s)
    s.close()
    s = open_store(segment_bytes=1)
    s.rollback(2)
    assert s.last_seq == 2
    assert s.get("a") == 2
    s.append(3, [("a", 3)])
    s.close()
    s = open_store(segment_bytes=1)
    assert s.last_seq == 3
    assert s.get("a") == 3
    assert s.get("a", as_of=2) == 2


def test_rollback_below_the_horizon_is_refused(open_store: OpenStore) -> None:
    s = open_store(retention=2)
    append_all(s, HISTORY)
    s.compact()
    assert s.horizon == 9 - 2
    with pytest.raises(RetentionError) as info:
        s.rollback(6)
    assert info.value.seq == 6 and info.value.horizon == 7
    assert s.last_seq == 9
    assert dict(s.scan()) == state_of(HISTORY)
    s.rollback(8)
    assert dict(s.scan()) == state_of(HISTORY, 8)


# -- snapshots and compaction ----------------------------------------------------------------


def test_snapshot_pins_its_seq_against_compaction(open_store: OpenStore) -> None:
    s = open_store(retention=0)
    history = [
        (
            seq,
            [("k", seq), (f"only{seq}", seq)] + ([("gone", TOMBSTONE)] if seq == 4 else [("gone", 1)]),
        )
        for seq in range(1, 7)
    ]
    append_all(s, history[:3])
    snap = s.snapshot()
    assert snap.seq == 3
    append_all(s, history[3:])
    s.compact()
    assert s.horizon == 3
    assert snap.get("k") == 3
    assert dict(snap.scan()) == state_of(history, 3)
    assert s.get("gone", as_of=3) == 1
    assert dict(s.scan(as_of=3)) == state_of(history, 3)
    with pytest.raises(RetentionError):
        s.get("k", as_of=2)
    snap.release()
    snap.release()
    s.compact()
    assert s.horizon == 6
    with pytest.raises(RetentionError):
        s.get("k", as_of=3)
    assert dict(s.scan()) == state_of(history)
    assert dict(s.scan(as_of=6)) == state_of(history, 6)


def test_two_snapshots_of_one_seq_pin_it_until_both_are_released(open_store: OpenStore) -> None:
    s = open_store(retention=0)
    s.append(1, [("k", 1)])
    a, b = s.snapshot(), s.snapshot()
    s.append(2, [("k", 2)])
    a.release()
    s.compact()
    assert s.horizon == 1
    assert b.get("k") == 1
    with b:
        pass
    s.compact()
    assert s.horizon == 2


def test_compaction_horizon_follows_retention(open_store: OpenStore) -> None:
    s = open_store(retention=3)
    append_all(s, HISTORY)
    s.compact()
    assert s.horizon == 6
    for seq in range(6, 10):
        assert dict(s.scan(as_of=seq)) == state_of(HISTORY, seq)
    with pytest.raises(RetentionError):
        list(s.scan(as_of=5))


# -- the remote tier -------------------------------------------------------------------------


def test_flush_remote_uploads_everything(open_store: OpenStore) -> None:
    s = open_store()
    append_all(s, HISTORY)
    assert remote_files(s) == []
    assert s.flush("remote", timeout=TIMEOUT_S) == 9
    assert s.durable("remote") == 9
    assert s.durable("disk") >= 9
    assert remote_files(s) != []
    s.append(10, [("z", 1)])
    assert s.flush("remote", timeout=TIMEOUT_S) == 10
    assert s.durable("remote") == 10


def _drop_local_tiers(path: str) -> None:
    for part in ("disk", "log"):
        shutil.rmtree(os.path.join(path, part))
    assert sorted(os.listdir(path)) == ["LOCK", "MANIFEST", "remote"]


def test_restore_from_remote_log_segments(open_store: OpenStore) -> None:
    s = open_store(segment_bytes=64)
    append_all(s, HISTORY[:4])
    s.flush("remote", timeout=TIMEOUT_S)
    append_all(s, HISTORY[4:])
    s.flush("remote", timeout=TIMEOUT_S)
    path = s.path
    s.close()
    _drop_local_tiers(path)
    s = open_store(segment_bytes=64)
    assert s.last_seq == 9
    assert s.horizon == -1
    assert dict(s.scan()) == state_of(HISTORY)
    for seq in range(-1, 10):
        assert dict(s.scan(as_of=seq)) == state_of(HISTORY, seq)
    s.append(10, [("a", 10)])
    s.close()
    s = open_store(segment_bytes=64)
    assert s.get("a") == 10


def test_restore_from_a_base_image(open_store: OpenStore) -> None:
    s = open_store(retention=0)
    append_all(s, HISTORY)
    s.compact()
    assert s.horizon == 9
    assert any(n.startswith("base-") for n in remote_files(s))
    path = s.path
    s.close()
    _drop_local_tiers(path)
    s = open_store(retention=0)
    assert s.last_seq == 9
    assert s.horizon == 9
    assert dict(s.scan()) == state_of(HISTORY)
    assert s.get("d") == (1, "two")
    assert s.get("a") == 9


def test_restore_from_a_base_image_and_later_segments(open_store: OpenStore) -> None:
    s = open_store(retention=2)
    append_all(s, HISTORY[:4])
    s.compact()
    assert s.horizon == 3
    append_all(s, HISTORY[4:])
    s.flush("remote", timeout=TIMEOUT_S)
    path = s.path
    s.close()
    _drop_local_tiers(path)
    s = open_store(retention=2)
    assert s.last_seq == 9
    assert s.horizon == 3
    for seq in range(3, 10):
        assert dict(s.scan(as_of=seq)) == state_of(HISTORY, seq)


# -- backpressure ------------------------------------------------------------------------------


def test_appends_under_a_small_memory_bound_all_land(open_store: OpenStore) -> None:
    s = open_store(memory_updates=4, memtable_updates=2, flush_interval_s=0.005)
    history = [(seq, [(seq % 17, seq), (f"s{seq % 5}", seq), ((seq % 3,), seq)]) for seq in range(100)]
    append_all(s, history)
    assert s.last_seq == 99
    assert isinstance(s.stats.backpressure_s, float)
    assert s.stats.backpressure_s > 0
    assert dict(s.scan()) == state_of(history)
    assert dict(s.scan(as_of=50)) == state_of(history, 50)


def test_rollback_keeps_the_remote_tier_whole_after_a_background_compaction(open_store: OpenStore) -> None:
    """One remote log segment can span several local segments (everything sealed is uploaded
    at once, here after an outage of the remote tier), and a background compaction deletes
    the local segments at or below its horizon without writing a base image when no remote
    segment is stale. A rollback into that remote segment must not lose, from the remote
    tier, the seqs at or below the rollback point: a restore must bring them back.

    The one background compaction is run through a private call, to fix when it happens."""
    s = open_store(retention=2, segment_bytes=1, seal_interval_s=60, compact_every_updates=0)
    remote = os.path.join(s.path, "remote")
    shutil.rmtree(remote)
    open(remote, "w").close()  # the remote tier is unreachable while a file stands in its place
    history = [(1, [("one", 1)]), (2, [("two", 2)]), (3, [("three", 3)])]
    for batch in history:
        append_all(s, [batch])
        assert s.flush("disk", timeout=TIMEOUT_S) == batch[0]
    with pytest.raises(LsmError):
        s.flush("remote", timeout=1.0)
    os.unlink(remote)
    os.mkdir(remote)
    assert s.flush("remote", timeout=TIMEOUT_S) == 3
    s._persister.drain_index()
    s._persister.compactor.run(full=False)
    assert s.horizon == 1
    s.rollback(2)
    assert s.flush("remote", timeout=TIMEOUT_S) == 2
    path = s.path
    s.close()
    _drop_local_tiers(path)
    s = open_store(retention=2)
    assert s.last_seq == 2
    assert dict(s.scan()) == state_of(history, 2)


def test_rollback_rechecks_the_horizon_after_waiting_for_a_compaction(
    open_store: OpenStore,
) -> None:
    """rollback waits for a running background compaction; if that compaction moves the
    horizon past to_seq, the versions rollback would need are gone: it must refuse
    (RetentionError), not roll back to the state at the new horizon.

    The interleaving is arranged by wrapping the compaction lock so that one background
    compaction runs right before rollback gets the lock."""
    s = open_store(retention=2, compact_every_updates=0)
    history = [(seq, [("k", seq)]) for seq in range(1, 11)]
    append_all(s, history)
    s.flush("disk", timeout=TIMEOUT_S)
    s._persister.drain_index()
    compactor = s._persister.compactor
    real_lock = compactor.lock

    class CompactionWinsTheLock:
        def __enter__(self) -> object:
            compactor.lock = real_lock
            compactor.run(full=False)
            return real_lock.__enter__()

        def __exit__(self, *exc: object) -> None:
            real_lock.__exit__(*exc)

    compactor.lock = CompactionWinsTheLock()
    assert s.horizon == -1
    try:
        s.rollback(7)
    except RetentionError:
        assert s.horizon > 7
        assert s.last_seq == 10
        assert dict(s.scan()) == state_of(history)
    else:
        assert s.last_seq == 7
        assert s.get("k") == 7


def test_flush_remote_after_a_rollback_below_an_earlier_flush(open_store: OpenStore) -> None:
    """A flush("remote") asked for seq 3, then a rollback to 1: a later flush("remote") of
    seq 2 must upload at once, not wait for the segment to age (seal_interval_s)."""
    s = open_store(seal_interval_s=60)
    history = [(1, [("a", 1)]), (2, [("a", 2)]), (3, [("a", 3)])]
    append_all(s, history)
    assert s.flush("remote", timeout=TIMEOUT_S) == 3
    s.rollback(1)
    assert s.flush("remote", timeout=TIMEOUT_S) == 1
    s.append(2, [("a", "again")])
    assert s.flush("remote", timeout=TIMEOUT_S) == 2
    assert s.durable("remote") == 2
