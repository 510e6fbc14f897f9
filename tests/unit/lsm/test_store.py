"""Focused tests of Store behaviour that the state machines (test_model.py) reach rarely.

Expected values are written out here or computed from a plain replay of the appended columns
(`expected`), never taken from the store. Most reads are checked in several phases: as
appended (the runs may still be in memory), once LevelDB holds every run (`index_all` waits
for the persister's `drain_index`), after merges (`compact()` with a small `merge_fanout`
and a retention that moves no horizon), and after a reopen.
"""

from __future__ import annotations

import collections
import datetime
import enum
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import pytest

from lsm import (
    TOMBSTONE,
    KeyEncodingError,
    LookupTooDearError,
    LsmError,
    RetentionError,
    SeqOrderError,
    Store,
    StoreClosedError,
    StoreLockedError,
    Updates,
    ValueEncodingError,
)
from lsm.files import copy_store, scratch_near
from lsm.store import LOG_NOW_BYTES

TIMEOUT_S = 5.0
"""Bound on every flush or wait that could hang: they all take milliseconds when they work."""

MISSING = object()

OpenStore = Callable[..., Store]
History = list[tuple[int, dict]]


@pytest.fixture
def open_store(tmp_path) -> Iterator[OpenStore]:  # noqa: ANN001 - pytest's tmp_path
    """Opens stores under tmp_path; whatever a test leaves open is abandoned afterwards. Runs
    this small merge in the background as big ones do (merge_min_bytes 0), unless a test says."""
    opened: list[Store] = []

    def open_(name: str = "store", **options: object) -> Store:
        s = Store(str(tmp_path / name), **{"merge_min_bytes": 0, **options})
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.abandon()


def index_all(s: Store) -> None:
    """Waits until LevelDB holds every appended run (nothing is left in memory)."""
    s.flush(timeout=TIMEOUT_S)
    s._persister.drain_index()
    assert s.indexed == s.last_seq


def wait_until(s: Store, condition: Callable[[], bool], what: str) -> None:
    """Waits for a condition the store's background threads bring about, or fails."""
    deadline = time.monotonic() + TIMEOUT_S
    with s._cond:
        while not condition():
            assert time.monotonic() < deadline, f"no {what} after {TIMEOUT_S}s"
            s._cond.wait(0.01)


def merges_settled(s: Store) -> bool:
    """No merge running and none called for (REQUIRES: store._cond held)."""
    c = s._persister.compactor
    return not c.busy and not c._plans(s.compaction_horizon())


def canonical(key: object) -> object:
    """A key as the store returns it: lists are tuples, at any depth."""
    if isinstance(key, list | tuple):
        return tuple(canonical(k) for k in key)
    return key


def columns(updates: Mapping | tuple) -> list[tuple[object, object]]:
    """One state's updates as (key, value) columns, in order."""
    if isinstance(updates, Mapping):
        return list(updates.items())
    keys, values = updates
    return list(zip(keys, values, strict=True))


def expected(history: History, as_of: int | None = None) -> dict[object, dict]:
    """Every state named in `history` and its contents after `as_of`, by replaying the columns."""
    out: dict[object, dict] = {state: {} for _, runs in history for state in runs}
    for seq, runs in history:
        if as_of is not None and seq > as_of:
            break
        for state, updates in runs.items():
            for k, v in columns(updates):
                if v is TOMBSTONE:
                    out[state].pop(canonical(k), None)
                else:
                    out[state][canonical(k)] = v
    return out


def all_keys(history: History) -> dict[object, set]:
    """state -> every key ever written to it, and one never written."""
    out: dict[object, set] = {state: {"never-written"} for _, runs in history for state in runs}
    for _, runs in history:
        for state, updates in runs.items():
            out[state].update(canonical(k) for k, _ in columns(updates))
    return out


def check(s: Store, history: History, as_ofs: list, where: str = "") -> None:
    """load and get of every state and key of `history` equal the replay, as of each seq
    (None: now, the replay up to the store's last seq)."""
    keys = all_keys(history)
    for as_of in as_ofs:
        want = expected(history, s.last_seq if as_of is None else as_of)
        got = {state: s.load(state, as_of=as_of) for state in want}
        assert got == want, f"{where} as of {as_of}"
        for state, ks in keys.items():
            for k in ks:
                assert s.get(state, k, as_of=as_of, default=MISSING) == want[state].get(k, MISSING), (
                    f"{where} get({state!r}, {k!r}, as_of={as_of})"
                )


def append_all(s: Store, history: History) -> None:
    for seq, runs in history:
        s.append(seq, runs)


def phases(s: Store) -> Iterator[str]:
    """Pauses while the store's runs are as appended, then indexed, then merged (REQUIRES: a
    store opened with a small merge_fanout and a retention that compact() does not pass)."""
    yield "as appended"
    index_all(s)
    yield "indexed"
    assert s.options.retention > s.last_seq + 1, "phases() must not move the horizon"
    s.compact()
    yield "merged"


def remote_files(s: Store) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(s.path, "remote")) if n.endswith(".arrow"))


HISTORY: History = [
    (1, {"s": {"a": 1, "b": 1, ("t", 1): "x"}, "o": {"a": "o1"}}),
    (2, {"s": {"a": 2, "c": b"\x00"}}),
    (4, {"s": {"b": TOMBSTONE, 7: None}, ("o", 1): (["z", "z", "y"], [1, 2, TOMBSTONE])}),
    (5, {}),
    (8, {"s": (["a", "d", ["t", 2]], [TOMBSTONE, (1, "two"), "y"]), "o": {"a": TOMBSTONE}}),
    (9, {"s": {"a": 9, ("t", 1): TOMBSTONE}, ("o", 1): {"z": TOMBSTONE}}),
]
HISTORY_SEQS = [-1, *range(0, 11)]


def test_the_replay_of_history_is_what_it_says() -> None:
    """The expected values the tests compare with, written out once by hand."""
    assert expected(HISTORY, 4) == {
        "s": {"a": 2, "c": b"\x00", ("t", 1): "x", 7: None},
        "o": {"a": "o1"},
        ("o", 1): {"z": 2},
    }
    assert expected(HISTORY) == {
        "s": {"a": 9, "c": b"\x00", 7: None, "d": (1, "two"), ("t", 2): "y"},
        "o": {},
        ("o", 1): {},
    }


# -- append: seq order, refused states, keys, values, shapes -----------------------------------


def test_seqs_must_be_ints_strictly_above_the_last(open_store: OpenStore) -> None:
    s = open_store()
    with pytest.raises(SeqOrderError):
        s.append(-1, {"s": {"a": 1}})
    s.append(5, {"s": {"a": 5}})
    for bad in (5, 4, 0, -3, 6.0, "6", True, None, 2**64):
        with pytest.raises(SeqOrderError):
            s.append(bad, {"s": {"a": bad}})
        assert s.last_seq == 5
    assert s.get("s", "a") == 5
    s.append(6, {"s": {"a": 6}})
    assert s.last_seq == 6
    assert s.get("s", "a") == 6
    assert s.get("s", "a", as_of=5) == 5


def assert_nothing_added(s: Store) -> None:
    """What the refusing tests' stores hold: seq 1 only, then a valid seq 2 lands."""
    assert s.last_seq == 1
    assert s.states() == ["s"]
    assert s.load("s") == {"a": 1}
    assert s.load("ok") == {}
    s.append(2, {"s": {"b": 2}})
    assert s.flush(timeout=TIMEOUT_S) == 2
    index_all(s)
    assert s.load("s") == {"a": 1, "b": 2}
    assert s.states() == ["s"]


@pytest.mark.parametrize("bad_key", [True, False, 1.5, ("x", 2.5), [1, True], object()])
def test_a_batch_with_a_bad_key_is_refused_whole(open_store: OpenStore, bad_key: object) -> None:
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    with pytest.raises(KeyEncodingError) as ei:
        s.append(2, {"ok": {"x": 2}, "s": (["a", bad_key, "b"], [2, 2, 2])})
    assert "'s'" in str(ei.value)
    assert s.get("s", "b", default=MISSING) is MISSING
    assert_nothing_added(s)


@pytest.mark.parametrize("bad_state", [True, 1.5, ("x", 2.5), (1, False), object()])
def test_a_batch_naming_a_bad_state_is_refused_whole(open_store: OpenStore, bad_state: object) -> None:
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    with pytest.raises(KeyEncodingError):
        s.append(2, {"ok": {"x": 2}, bad_state: {"a": 2}})
    with pytest.raises(KeyEncodingError):
        s.get(bad_state, "a")
    assert_nothing_added(s)


def test_state_names_equal_to_others_in_python_are_refused_after_those_are_read(open_store: OpenStore) -> None:
    """True == 1, 1.0 == 1 and (1, False) == (1, 0) in Python (and hash alike): once states 1
    and (1, 0) have been appended and read, the refused names must still be refused, not
    taken for them (by a cache of encoded names, say)."""
    s = open_store()
    s.append(1, {1: {"k": "one"}, (1, 0): {"k": "tuple"}})
    for _ in range(2):
        assert s.load(1) == {"k": "one"} and s.get((1, 0), "k") == "tuple"
        for bad in (True, 1.0, (1, False), (1, 0.0)):
            with pytest.raises(KeyEncodingError):
                s.load(bad)
            with pytest.raises(KeyEncodingError):
                s.get(bad, "k")
            with pytest.raises(KeyEncodingError):
                s.versions(bad, "k")
            with pytest.raises(KeyEncodingError):
                s.append(2, {bad: {"k": "refused"}})
        index_all(s)
    assert s.last_seq == 1


@pytest.mark.parametrize("bad_key", [2**64, -(2**63) - 1])
def test_an_int_key_outside_the_msgpack_range_is_refused(open_store: OpenStore, bad_key: int) -> None:
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    with pytest.raises(KeyEncodingError):
        s.append(2, {"s": {"b": 2, bad_key: 2}})
    assert s.get("s", "b", default=MISSING) is MISSING
    s.append(2, {"s": {2**64 - 1: "max", -(2**63): "min"}})
    for _ in phases(s):
        assert s.load("s") == {"a": 1, 2**64 - 1: "max", -(2**63): "min"}
        assert s.get("s", 2**64 - 1) == "max" and s.get("s", -(2**63)) == "min"


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    LOW = 1


Point = collections.namedtuple("Point", "x y")


@pytest.mark.parametrize(
    ("bad_value", "offending"),
    [
        (object(), "object"),
        (2**64, None),
        ([1, object()], "object"),
        ({1: {2: 1j}}, "complex"),
        (datetime.datetime(2024, 1, 2, 3, 4), "datetime"),
        (datetime.date(2024, 1, 2), "date"),
        (collections.defaultdict(int, {"a": 1}), "defaultdict"),
        (Point(1, 2), "Point"),
        (Color.RED, "Color"),
        (Level.LOW, "Level"),
        ((1, {"x": Point(1, 2)}), "Point"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_a_batch_with_a_value_that_cannot_be_stored_is_refused_whole(
    open_store: OpenStore, bad_value: object, offending: str | None
) -> None:
    """ValueEncodingError names the state, the key and the value's type; nothing is added,
    in any state of the batch."""
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    with pytest.raises(ValueEncodingError) as ei:
        s.append(2, {"ok": {"x": 2}, "s": (["a", "b", "c"], [2, bad_value, 3])})
    e = ei.value
    assert (e.state, e.key, e.type_name) == ("s", "b", type(bad_value).__name__)
    assert "'b'" in str(e)
    if offending is not None:
        assert offending in str(e)
    assert_nothing_added(s)


@pytest.mark.parametrize(
    "bad_updates",
    [[("a", 1)], (["a", "b"], [1]), ("a", "b", "c"), None, 7, ("a", 1)],
    ids=["list-of-pairs", "lengths-differ", "three-tuple", "none", "int", "pair-of-scalars"],
)
def test_updates_that_are_neither_a_mapping_nor_a_keys_values_pair_are_refused(
    open_store: OpenStore, bad_updates: object
) -> None:
    """append's contract: a state's updates are a mapping or a (keys, values) pair of
    sequences, and what cannot be stored is refused (LsmError) with nothing added, never left
    to fail later in the persister."""
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    with pytest.raises(LsmError):
        s.append(2, {"ok": {"x": 2}, "s": bad_updates})
    assert s.flush(timeout=TIMEOUT_S) == 1
    assert_nothing_added(s)


def test_runs_that_are_not_a_mapping_are_refused(open_store: OpenStore) -> None:
    """The old API's list of (key, value) pairs is refused, not taken for state names."""
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    with pytest.raises(LsmError):
        s.append(2, [("ok", {"x": 2})])
    assert_nothing_added(s)


def test_within_a_batch_the_later_column_wins(open_store: OpenStore) -> None:
    s = open_store(merge_fanout=2, budget=0)
    s.append(1, {"s": (["k", "k", "j", "j", "g", "g", "h"], [1, 2, TOMBSTONE, 3, 4, TOMBSTONE, TOMBSTONE])})
    s.append(2, {"s": (["k", ("t",), ["t"], "h"], [20, 1, 2, "back"])})
    s.append(3, {"s": (["k", "k"], [TOMBSTONE, 30])})
    want = {
        1: {"k": 2, "j": 3},
        2: {"k": 20, "j": 3, ("t",): 2, "h": "back"},
        3: {"k": 30, "j": 3, ("t",): 2, "h": "back"},
    }
    for phase in phases(s):
        for seq, state in want.items():
            assert s.load("s", as_of=seq) == state, (phase, seq)
        assert s.get("s", "k", as_of=1) == 2 and s.get("s", ("t",)) == 2 and s.get("s", "k") == 30, phase
        assert s.get("s", "g", default=MISSING) is MISSING, phase
        assert s.get("s", "h", as_of=1, default=MISSING) is MISSING, phase


def test_none_is_a_value_not_an_absence(open_store: OpenStore) -> None:
    s = open_store(merge_fanout=2, budget=0)
    s.append(1, {"s": {"n": None, None: "none-key"}, None: {"k": "none-state"}})
    s.append(2, {"s": {"x": 1}})
    for phase in phases(s):
        assert s.get("s", "n", default=MISSING) is None, phase
        assert s.get("s", None) == "none-key", phase
        assert s.load("s") == {"n": None, None: "none-key", "x": 1}, phase
        assert s.load(None) == {"k": "none-state"}, phase


def test_an_empty_batch_and_an_empty_run_advance_the_seq(open_store: OpenStore) -> None:
    s = open_store(merge_fanout=2, budget=0)
    s.append(1, {"s": {"a": 1}})
    s.append(2, {})
    s.append(3, {"s": {}, "e": {}})
    s.append(4, {"e": ([], [])})
    for phase in phases(s):
        assert s.last_seq == 4, phase
        assert s.load("s") == {"a": 1} and s.load("e") == {}, phase
        assert s.get("e", "a", default=MISSING) is MISSING, phase
        assert s.states() == ["e", "s"], phase
    s.close()
    s = open_store()
    assert s.last_seq == 4
    assert s.load("s") == {"a": 1} and s.load("e") == {}


# -- values keep their types ---------------------------------------------------------------------


def typed(v: object) -> object:
    """A value with every container's type spelled out (set and frozenset, Counter and dict,
    list and tuple compare equal in Python, or nearly), in an order-independent form for sets."""
    t = type(v).__name__
    if isinstance(v, set | frozenset):
        return (t, sorted(map(repr, map(typed, v))))
    if isinstance(v, dict):
        return (t, [(typed(k), typed(x)) for k, x in v.items()])
    if isinstance(v, list | tuple):
        return (t, [typed(x) for x in v])
    return (t, v)


VALUES: dict[str, object] = {
    "tuple": (1, "a", b"b", None),
    "list": [1, [2, (3, 4)], {"k": (5,)}],
    "set": {1, "a", (2, 3), b"x"},
    "frozenset": frozenset({1, frozenset({2, 3})}),
    "counter": collections.Counter({"a": 2, "b": 1, ("t",): 3}),
    "ordered": collections.OrderedDict([("z", 1), ("a", (1, [2])), (3, "three")]),
    "nested": {"t": (1, {2, 3}), "l": [frozenset(), set(), ()], (1, 2): collections.Counter(), 4: [{"x": (set(),)}]},
    "empty": ((), [], {}, set(), frozenset(), collections.OrderedDict(), collections.Counter()),
    "scalars": [None, True, False, 0, -1, 2**64 - 1, -(2**63), 1.5, "", "é", b"", b"\x00"],
    "dict-with-tuple-keys": {(1, "a"): [1], ("b",): {2}},
}


def test_values_keep_their_types_on_every_tier(open_store: OpenStore) -> None:
    """Tuples, lists, sets, frozensets, Counters, OrderedDicts, nested, come back as they were:
    from memory, LevelDB, a merged run's latest and history blocks, a reopen, and a restore
    from a base image on the remote tier."""
    s = open_store(merge_fanout=2, budget=0, uploads=True)
    # "t": columns of tuples of scalars (FORMAT.md: TUPLES), in the latest and history blocks
    t1 = {i: (i, i / 2, str(i), None, b"b", True) for i in range(40)}
    t2 = {i: (-i,) for i in range(0, 40, 2)} | {40: ()}
    s.append(1, {"v": VALUES, "t": t1})
    s.append(2, {"v": {k: [v] for k, v in VALUES.items()}, "w": VALUES, "t": t2})  # about as big: merged
    s.append(3, {"b": {"bytes": bytearray(b"ab"), "view": memoryview(b"cd")}})
    want = {k: typed(v) for k, v in VALUES.items()}

    def check_values(phase: str) -> None:
        assert {k: typed(v) for k, v in s.load("v", as_of=1).items()} == want, phase
        assert {k: typed(s.get("v", k, as_of=1)) for k in VALUES} == want, phase
        assert {k: typed(v) for k, v in s.load("w").items()} == want, phase
        assert typed(s.get("b", "bytes")) == ("bytes", b"ab") and s.get("b", "view") == b"cd", phase
        assert {k: typed(v) for k, v in s.load("t", as_of=1).items()} == {k: typed(v) for k, v in t1.items()}, phase
        assert {k: typed(v) for k, v in s.load("t").items()} == {k: typed(v) for k, v in (t1 | t2).items()}, phase
        assert typed(s.get("t", 2, as_of=1)) == typed(t1[2]) and typed(s.get("t", 2)) == typed(t2[2]), phase

    for phase in phases(s):
        check_values(phase)
    assert any(lo < hi for lo, hi, _ in s.runs("v")), "compact() merged no run"
    s.close()
    s = open_store(uploads=True)
    check_values("reopened")
    s.close()
    s = open_store(uploads=True, retention=0)
    s.compact()
    assert any(n.startswith("base-") for n in remote_files(s))
    path = s.path
    s.close()
    drop_local_tiers(path)
    s = open_store(uploads=True, retention=0)
    assert {k: typed(v) for k, v in s.load("w").items()} == want, "restored from a base image"


# -- keys and state names --------------------------------------------------------------------------


def test_list_keys_are_the_tuple_keys(open_store: OpenStore) -> None:
    s = open_store(merge_fanout=2, budget=0)
    s.append(1, {"s": {("a", ("b", 1)): "nested", ("c", 2): "flat"}})
    s.append(2, {"s": ([["c", 2], ["d", [1, [2]]]], ["flat2", "deep"])})
    for phase in phases(s):
        assert s.get("s", ("a", ("b", 1))) == "nested", phase
        assert s.get("s", ["a", ["b", 1]]) == "nested", phase
        assert s.get("s", ["c", 2]) == "flat2" and s.get("s", ["c", 2], as_of=1) == "flat", phase
        assert s.get("s", ("d", (1, (2,)))) == "deep", phase
        assert s.load("s") == {("a", ("b", 1)): "nested", ("c", 2): "flat2", ("d", (1, (2,))): "deep"}, phase
        assert s.load(["list", "state"]) == {}, phase


def test_a_tuple_key_holding_a_list_is_the_same_key(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, {"s": {("a", (1, 2)): "v"}, ("st", (1,)): {"k": "state"}})
    assert s.get("s", ("a", [1, 2])) == "v"
    assert s.load(["st", [1]]) == {"k": "state"}
    index_all(s)
    assert s.get("s", ("a", [1, 2])) == "v"
    assert s.load(("st", [1])) == {"k": "state"}


@pytest.mark.parametrize("bad_key", [True, 1.0, (1.0,), (1, False), "\ud800"])
def test_get_refuses_keys_that_append_refuses(open_store: OpenStore, bad_key: object) -> None:
    """True == 1 and 1.0 == 1 in Python: read from a run in memory (a dict index) they must
    not find key 1, which they cannot find on the disk tier (a hash search), so that the
    answer does not depend on where key 1 lives. A str that UTF-8 cannot encode (a lone
    surrogate) is refused by append, and so by get."""
    s = open_store()
    with pytest.raises(KeyEncodingError):
        s.append(1, {"s": {bad_key: "refused"}})
    s.append(1, {"s": {1: "one", (1,): "tuple-one"}})
    with pytest.raises(KeyEncodingError):
        s.get("s", bad_key)
    index_all(s)
    with pytest.raises(KeyEncodingError):
        s.get("s", bad_key)
    assert s.get("s", 1) == "one" and s.get("s", (1,)) == "tuple-one"


def test_keys_that_differ_after_a_nul_stay_apart(open_store: OpenStore) -> None:
    """str/bytes keys and their extensions by a NUL byte, in every phase."""
    s = open_store(merge_fanout=2, budget=0)
    s.append(1, {"s": {"a": 1, "a\x00": 2, b"a": 3, b"a\x00": 4, ("a",): 5, ("a\x00",): 6}})
    s.append(2, {"s": {"a": TOMBSTONE, b"a\x00": 40}})
    for phase in phases(s):
        assert s.get("s", "a", as_of=1) == 1 and s.get("s", b"a") == 3, phase
        assert s.load("s", as_of=1) == {"a": 1, "a\x00": 2, b"a": 3, b"a\x00": 4, ("a",): 5, ("a\x00",): 6}, phase
        assert s.get("s", "a", default=MISSING) is MISSING, phase
        assert s.load("s") == {"a\x00": 2, b"a": 3, b"a\x00": 40, ("a",): 5, ("a\x00",): 6}, phase


STATE_NAMES: list[object] = [
    "a",
    "a\x00",
    "ab",
    "",
    b"a",
    b"a\x00",
    b"a\x00" + b"\xff" * 6 + b"\xfa",
    ("a",),
    ("a", 1),
    ("a\x00", 1),
    ("ab",),
    (),
    1,
    -1,
    2**63,
    None,
]
"""State names whose encodings share prefixes (FORMAT.md: a run's LevelDB key is 01, the
encoded name, hi u64 BE): str and bytes extensions by a NUL, a bytes name whose escaped form
continues b"a"'s with 0xFF bytes (which could pass for a seq of b"a"'s), tuple prefixes."""


def format_order(key: object) -> tuple:
    """The order FORMAT.md's key encoding gives, written from its table: by type byte (None
    01, int 04, big int 05, bytes 06, str 07, tuple 08), then the natural order within a type,
    tuples element-wise with a shorter prefix first."""
    if key is None:
        return (1,)
    if type(key) is int:
        return (4 if key < 2**63 else 5, key)
    if type(key) is bytes:
        return (6, key)
    if type(key) is str:
        return (7, key)
    return (8, tuple(format_order(k) for k in key))


def test_states_whose_names_share_encoded_prefixes_stay_apart(open_store: OpenStore) -> None:
    s = open_store(merge_fanout=2, budget=0)
    history: History = [
        (seq, {name: {"k": (seq, i), f"only{i}": seq} for i, name in enumerate(STATE_NAMES) if (seq + i) % 3})
        for seq in range(12)
    ]
    append_all(s, history)
    for phase in phases(s):
        check(s, history, [-1, 0, 1, 5, 10, 11], phase)
        assert s.states() == sorted(STATE_NAMES, key=format_order), phase
    s.close()
    s = open_store(merge_fanout=2, budget=0)
    check(s, history, range(-1, 12), "reopened")
    assert s.states() == sorted(STATE_NAMES, key=format_order)


def test_runs_of_a_state_are_found_by_its_name_after_a_reopen(open_store: OpenStore) -> None:
    """The catalog read on open splits each LevelDB key into the state and the seq: the runs
    of b"a" must not take in those of a name whose encoding extends b"a"'s."""
    other = b"a\x00" + b"\xff" * 6 + b"\xfa"
    s = open_store()
    s.append(0, {b"a": {"k": "old"}})
    s.append(10, {b"a": {"k": "new"}, other: {"k": "other"}})
    s.close()
    s = open_store()
    assert s.get(b"a", "k", as_of=5) == "old" and s.get(b"a", "k") == "new"
    assert s.load(b"a", as_of=5) == {"k": "old"}
    assert s.load(other, as_of=5) == {} and s.load(other) == {"k": "other"}
    assert s.runs(b"a") == [(0, 0, 1), (10, 10, 1)]
    assert s.runs(other) == [(10, 10, 1)]


# -- as-of reads, versions, runs ---------------------------------------------------------------------


def long_history() -> History:
    """Keys with many versions, deletions, seq 0, keys with one version, and a state set by
    (keys, values) pairs with repeated keys."""
    history: History = []
    for seq in range(0, 40):
        s: dict = {("k", 1): seq, ("k", 10): -seq}
        if seq % 3 == 0:
            s[("k", 2)] = TOMBSTONE if seq % 6 == 0 else seq
        if seq % 13 == 0:
            s[("k", 1, "x")] = f"x{seq}"
        if seq == 7:
            s["once"] = 7
        if seq in (0, 39):
            s[b"\xff" * 3] = seq
        runs: dict = {"s": s}
        if seq % 2:
            runs["t"] = ([seq % 5, seq % 7, seq % 5], [seq, TOMBSTONE if seq % 4 == 1 else seq, -seq])
        if seq % 5 == 0:
            runs[("s",)] = {"every-fifth": seq}
        history.append((seq, runs))
    return history


@pytest.mark.parametrize("merges", ["none", "every-10", "at-the-end"])
def test_as_of_reads_over_long_histories_find_every_version(open_store: OpenStore, merges: str) -> None:
    """Every load and get as of every seq equals the replay: as appended, indexed, after
    merges into one multi-version run or several, and after a reopen."""
    history = long_history()
    s = open_store(merge_fanout=2, budget=0)
    for i, (seq, runs) in enumerate(history):
        s.append(seq, runs)
        if merges == "every-10" and i % 10 == 9:
            s.compact()
    if merges == "at-the-end":
        s.compact()
    as_ofs = [-1, *range(0, 41), None]
    check(s, history, as_ofs, "as appended")
    index_all(s)
    check(s, history, as_ofs, "indexed")
    if merges == "none":
        assert len(s.runs("s")) == 40
    else:
        assert len(s.runs("s")) <= 4 and any(lo < hi for lo, hi, _ in s.runs("s")), s.runs("s")
    s.close()
    s = open_store(merge_fanout=2, budget=0)
    check(s, history, as_ofs, "reopened")


def test_reads_at_or_after_the_horizon_survive_a_fold(open_store: OpenStore) -> None:
    history = long_history()
    s = open_store(merge_fanout=2, budget=0, retention=7)
    append_all(s, history[:20])
    s.compact()  # the newest runs merged: the fold below takes multi-version runs in
    append_all(s, history[20:])
    s.compact()
    assert s.horizon == 39 - 7
    as_ofs = [*range(32, 41), None]
    check(s, history, as_ofs, "folded")
    assert len([r for r in s.runs("s") if r[1] <= 32]) == 1, s.runs("s")
    for read in (lambda: s.load("s", as_of=31), lambda: s.get("s", ("k", 1), as_of=31)):
        with pytest.raises(RetentionError) as ei:
            read()
        assert (ei.value.seq, ei.value.horizon) == (31, 32)
    s.close()
    s = open_store(merge_fanout=2, budget=0, retention=7)
    assert s.horizon == 32
    check(s, history, as_ofs, "reopened")


def test_as_of_minus_one_is_the_state_before_any_batch(open_store: OpenStore) -> None:
    s = open_store(merge_fanout=2, budget=0)
    s.append(0, {"s": {"a": 1}})
    s.append(1, {"s": {"a": 2}})
    for phase in phases(s):
        assert s.horizon == -1, phase
        assert s.get("s", "a", as_of=-1, default=MISSING) is MISSING, phase
        assert s.load("s", as_of=-1) == {}, phase
        assert s.versions("s", "a", upto=-1) == [], phase


def test_versions_lists_each_seq_s_version_once_oldest_first(open_store: OpenStore) -> None:
    """One version per seq: the value the batch left (its last column for the key), whether
    the runs are single appends or merged."""
    s = open_store(merge_fanout=2, budget=0)
    s.append(1, {"m": (["k", "k", "j"], [1, 2, 0])})
    s.append(2, {"m": {"j": 5}})
    s.append(3, {"m": (["k", "k"], [TOMBSTONE, 3])})
    s.append(5, {"m": {"k": TOMBSTONE}, "other": {"k": "other"}})
    k = [(1, 2), (3, 3), (5, TOMBSTONE)]
    for phase in phases(s):
        assert s.versions("m", "k") == k, phase
        assert s.versions("m", "k", after=1) == k[1:], phase
        assert s.versions("m", "k", after=1, upto=4) == [(3, 3)], phase
        assert s.versions("m", "j") == [(1, 0), (2, 5)], phase
        assert s.versions("m", "never-written") == [], phase
        assert s.versions("other", "k") == [(5, "other")], phase


def test_runs_are_what_a_load_applies(open_store: OpenStore) -> None:
    """runs(state): (lo, hi, entries) oldest first; one per append until merges fold them,
    never overlapping, and together covering every seq the state was given a run at."""
    s = open_store(merge_fanout=2, budget=0)
    append_all(s, HISTORY)
    assert s.runs("s") == [(1, 1, 3), (2, 2, 2), (4, 4, 2), (8, 8, 3), (9, 9, 2)]
    assert s.runs(("o", 1)) == [(4, 4, 3), (9, 9, 1)]
    assert s.runs("never") == []
    index_all(s)
    assert s.runs("s") == [(1, 1, 3), (2, 2, 2), (4, 4, 2), (8, 8, 3), (9, 9, 2)]
    s.compact()
    runs = s.runs("s")
    assert len(runs) < 5 and runs[0][0] == 1 and runs[-1][1] == 9, runs
    assert all(a[1] < b[0] for a, b in zip(runs, runs[1:], strict=False)), runs
    assert s.states() == ["o", "s", ("o", 1)]


def test_small_batches_logged_wait_to_be_indexed_in_one_write(open_store: OpenStore) -> None:
    """Batches under `index_bytes` are durable once logged, readable from memory, and indexed
    together once `index_delay_s` has passed or a caller waits for it: one LevelDB write."""
    s = open_store(index_delay_s=3600, budget=0)  # no merge writes LevelDB meanwhile
    writes = []
    real_write = s._disk.write

    def write(*args: object, **kwargs: object) -> object:
        writes.append(args[0])
        return real_write(*args, **kwargs)

    s._disk.write = write
    for seq in range(10):
        s.append(seq, {"s": {"k": seq, f"k{seq}": seq}})
    assert s.flush("disk", timeout=TIMEOUT_S) == 9
    assert s.indexed == -1 and writes == [], "small batches were indexed before their delay"
    assert s.get("s", "k") == 9 and s.get("s", "k", as_of=3) == 3 and len(s.load("s")) == 11
    s._persister.drain_index()
    assert s.indexed == 9 and len(writes) == 1
    assert s.get("s", "k") == 9 and s.get("s", "k", as_of=3) == 3 and len(s.load("s")) == 11


def test_a_batch_of_index_bytes_is_indexed_without_waiting(open_store: OpenStore) -> None:
    s = open_store(index_delay_s=3600, index_bytes=64 << 10)
    s.append(0, {"s": {"k": 0}})
    s.append(1, {"s": {f"k{i}": i for i in range(20_000)}})  # ~200 KB of runs
    wait_until(s, lambda: s.indexed == 1, "the big batch (and the small one before it) indexed")


def test_stats_count_runs_updates_and_merges(open_store: OpenStore) -> None:
    s = open_store(merge_fanout=2, budget=0)
    append_all(s, HISTORY)
    runs = [(seq, state) for seq, batch in HISTORY for state in batch]
    updates = sum(len(columns(u)) for _, batch in HISTORY for u in batch.values())
    assert (s.stats.appended_runs, s.stats.appended_updates) == (len(runs), updates)
    index_all(s)
    assert s.stats.indexed_runs == len(runs)
    assert s.stats.merges == 0
    report = s.compact()
    assert set(report) == {"horizon", "merges", "merged_bytes", "base_image", "log_bytes_freed", "seconds"}
    assert report["horizon"] == s.horizon == -1
    assert report["merges"] > 0 and s.stats.merges == report["merges"]
    assert report["merged_bytes"] > 0 and s.stats.merged_bytes == report["merged_bytes"]
    assert report["base_image"] is None  # no uploads


# -- options, durability levels, the lock ------------------------------------------------------


@pytest.mark.parametrize(
    "option", ["bogus", "memtable_updates", "memory_updates", "flush_interval_s", "compact_every_updates"]
)
def test_unknown_or_removed_option_is_refused_and_leaves_the_directory_free(
    open_store: OpenStore,
    tmp_path,  # noqa: ANN001
    option: str,
) -> None:
    with pytest.raises(LsmError, match=option):
        Store(str(tmp_path / "store"), **{option: 1})
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    assert s.get("s", "a") == 1


def test_unknown_durability_level_is_refused(open_store: OpenStore) -> None:
    s = open_store()
    with pytest.raises(LsmError):
        s.durable("cloud")
    with pytest.raises(LsmError):
        s.flush("cloud")


def test_second_open_is_refused_until_close(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    with pytest.raises(StoreLockedError):
        open_store()
    s.append(2, {"s": {"a": 2}})
    s.close()
    s = open_store()
    assert s.get("s", "a") == 2
    s.abandon()
    s = open_store()
    assert s.get("s", "a") == 2
    with pytest.raises(StoreLockedError):
        open_store()


def test_a_closed_store_refuses_calls(open_store: OpenStore) -> None:
    s = open_store()
    s.append(1, {"s": {"a": 1}})
    s.close()
    s.close()
    for call in (
        lambda: s.append(2, {"s": {"a": 2}}),
        lambda: s.get("s", "a"),
        lambda: s.load("s"),
        lambda: s.versions("s", "a"),
        lambda: s.flush(),
    ):
        with pytest.raises(StoreClosedError):
            call()


def test_close_keeps_everything_and_abandon_keeps_a_prefix_reaching_what_is_durable(open_store: OpenStore) -> None:
    s = open_store()
    append_all(s, HISTORY[:3])
    assert s.flush("disk", timeout=TIMEOUT_S) == 4
    append_all(s, HISTORY[3:])
    durable = s.durable("disk")
    s.abandon()  # seqs 5.. may still be in memory only: they are lost, or all logged
    s = open_store()
    last = s.last_seq
    assert durable <= last <= 9 and last in (4, 5, 8, 9)
    check(s, HISTORY, [*range(-1, last + 1), None], f"after abandon at {last}")
    redo = [(seq, batch) for seq, batch in HISTORY if seq > last]
    append_all(s, redo)
    s.close()
    s = open_store()
    assert s.last_seq == 9
    check(s, HISTORY, HISTORY_SEQS, "after close")


def closed_with_bulk(open_store: OpenStore) -> History:
    """Writes HISTORY and then a bulk of 200,000 updates at seqs 10..19 (enough that LevelDB is
    still indexing them when the log has made them durable) to "store", closes it, and
    returns the bulk."""
    s = open_store()
    append_all(s, HISTORY)
    bulk: History = [(seq, {"bulk": {f"k{i}": seq for i in range(20_000)}}) for seq in range(10, 20)]
    append_all(s, bulk)
    s.close()
    return bulk


def test_close_leaves_leveldb_no_log_to_recover(open_store: OpenStore, tmp_path) -> None:  # noqa: ANN001
    bulk = closed_with_bulk(open_store)
    disk = tmp_path / "store" / "disk"
    logs = {p.name: p.stat().st_size for p in disk.iterdir() if p.suffix == ".log"}
    assert logs and all(size == 0 for size in logs.values()), logs
    assert any(p.suffix == ".ldb" for p in disk.iterdir())
    # LevelDB alone holds every run: a copy without the store's own log has them all
    shutil.copytree(tmp_path / "store", tmp_path / "copy")
    shutil.rmtree(tmp_path / "copy" / "log")
    c = open_store("copy")
    assert c.last_seq == 19
    for seq in [*range(-1, 11), 19]:
        assert {st: c.load(st, as_of=seq) for st in ("s", "o", ("o", 1), "bulk")} == {
            "bulk": {},
            **expected(HISTORY + bulk, seq),
        }, seq


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
    # the copy is written every way a store writes: its log, merges that fold every run
    # (LevelDB's tables rewritten whole), the remote tier with a base image
    c = open_store("copy", retention=0, uploads=True, merge_fanout=2)
    c.append(20, {"bulk": {"k1": "changed", "k2": TOMBSTONE}, "s": {"new": 1}})
    c.compact()
    assert c.get("bulk", "k1") == "changed" and c.get("bulk", "k3") == 19
    assert c.get("bulk", "k2", default=MISSING) is MISSING
    assert any(n.startswith("base-") for n in remote_files(c))
    c.close()
    assert contents(original) == before
    o = open_store("store")
    assert o.last_seq == 19
    assert o.load("bulk") == expected(bulk)["bulk"]
    check(o, HISTORY, [5, None], "the original")


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


def test_a_store_opened_without_uploads_writes_nothing_to_its_remote_tier(open_store: OpenStore) -> None:
    """uploads=False is the default: flush("remote") is refused, and neither the persister
    nor compact() (which would write a base image) writes to the remote tier."""
    s = open_store(seal_interval_s=0.01, segment_bytes=64, uploads=True)
    append_all(s, HISTORY[:3])
    assert s.flush("remote", timeout=TIMEOUT_S) == 4
    s.close()
    before = contents(os.path.join(s.path, "remote"))
    assert before
    s = open_store(seal_interval_s=0.01, segment_bytes=64, retention=0)
    append_all(s, HISTORY[3:])
    with pytest.raises(LsmError, match="uploads=False"):
        s.flush("remote", timeout=TIMEOUT_S)
    s.compact()
    check(s, HISTORY, [9], "without uploads")
    s.close()
    assert contents(os.path.join(s.path, "remote")) == before


def test_uploads_after_a_session_without_them_leave_no_gap_on_the_remote_tier(open_store: OpenStore) -> None:
    s = open_store(segment_bytes=1)
    for seq in range(5):
        s.append(seq, {"s": {f"k{seq}": seq}})
        s.flush(timeout=TIMEOUT_S)
    s.close()
    s = open_store(segment_bytes=1, uploads=True)
    s.append(5, {"s": {"k5": 5}})
    assert s.flush("remote", timeout=TIMEOUT_S) == 5
    path = s.path
    s.close()
    drop_local_tiers(path)
    s = open_store(uploads=True)
    assert s.last_seq == 5
    assert s.load("s") == {f"k{seq}": seq for seq in range(6)}


# -- rollback ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["memory", "disk", "merged", "folded"])
def test_rollback_restores_every_state_and_frees_later_seqs(open_store: OpenStore, where: str) -> None:
    """Rolls back into runs as appended, indexed, merged (a run covering the target is cut)
    and folded below a horizon."""
    options = dict(merge_fanout=2, budget=0, retention=5 if where == "folded" else 10_000)
    s = open_store(**options)
    append_all(s, HISTORY)
    if where != "memory":
        index_all(s)
    if where in ("merged", "folded"):
        s.compact()
        cut = [(lo, hi) for lo, hi, _ in s.runs("s") if lo < hi and (lo <= 4 < hi if where == "merged" else hi <= 4)]
        assert cut, s.runs("s")
    assert s.horizon == (4 if where == "folded" else -1)
    s.rollback(4)
    assert s.last_seq == 4
    check(s, HISTORY[:3], [*range(s.horizon, 5), None], "rolled back")
    assert s.get("s", "a") == 2
    assert s.states() == ["o", "s", ("o", 1)]
    redo: History = [(5, {"s": {"a": "again"}, "new": {"n": 5}}), (6, {"s": {"e": 6}, ("o", 1): {"z": 6}})]
    append_all(s, redo)
    history = HISTORY[:3] + redo
    check(s, history, [*range(s.horizon, 8), None], "redone")
    s.close()
    s = open_store(**options)
    assert s.last_seq == 6
    check(s, history, [*range(s.horizon, 8), None], "reopened")


def test_a_crash_inside_rollback_leaves_the_old_state_or_the_new(open_store: OpenStore) -> None:
    """rollback's docstring: a crash part-way leaves either the old state or the new one (the
    intent written first has the next open finish it).

    The crash is placed right after the disk tier's write, by making the log's cut fail (no
    write through lsm.files comes in between, and a SIGKILL cannot be aimed that closely)."""
    options = dict(segment_bytes=1, merge_fanout=100, budget=0)
    s = open_store(**options)
    history: History = [(seq, {"s": {f"k{seq}": seq, "x": seq}}) for seq in range(12)]
    for batch in history:
        append_all(s, [batch])
        s.flush(timeout=TIMEOUT_S)
    s.compact()  # every run indexed; the log segments LevelDB holds are deleted

    def crash(to_seq: int) -> None:
        raise OSError("simulated crash before the log is cut")

    s._log.truncate_after = crash
    with pytest.raises(OSError):
        s.rollback(5)
    s.abandon()
    s = open_store(**options)
    assert s.last_seq == 5, "the rollback's intent was durable: the open finishes it"
    check(s, history, range(-1, s.last_seq + 1), f"reopened at {s.last_seq}")


def test_rollback_after_reopen_into_a_gap_before_the_last_segment(open_store: OpenStore) -> None:
    """A reopened store knows an unread segment's last seq only as a bound (the next segment's
    first - 1); rolling back into that gap must still log a batch at the target, so that a
    flush to the remote tier can reach it."""
    s = open_store(uploads=True)
    s.append(2, {"s": {"a": 2}})
    s.append(5, {"s": {"b": 5}})
    s.flush("remote", timeout=TIMEOUT_S)
    s.append(8, {"s": {"a": 8}})
    s.compact()  # everything indexed and uploaded; 8 starts a new log segment
    s.close()
    s = open_store(uploads=True)
    s.rollback(7)
    assert s.last_seq == 7
    assert s.load("s") == {"a": 2, "b": 5}
    assert s.flush("remote", timeout=TIMEOUT_S) == 7
    assert s.durable("remote") >= 7
    s.close()
    s = open_store(uploads=True)
    assert s.last_seq == 7
    assert s.load("s") == {"a": 2, "b": 5}


@pytest.mark.parametrize("flushed", [False, True])
def test_rollback_to_a_seq_without_a_batch_becomes_durable(open_store: OpenStore, flushed: bool) -> None:
    """rollback(to_seq) makes last_seq == to_seq; flushing must then reach to_seq on every
    level, and a crash must not recover less than durable("disk") said."""
    s = open_store(uploads=True)
    s.append(1, {"s": {"a": 1}})
    s.append(3, {"s": {"a": 3}})
    if flushed:
        s.flush("remote", timeout=TIMEOUT_S)
    s.rollback(2)
    assert s.last_seq == 2
    assert s.get("s", "a") == 1
    assert s.flush("disk", timeout=TIMEOUT_S) == 2
    assert s.durable("disk") >= 2
    assert s.flush("remote", timeout=TIMEOUT_S) == 2
    assert s.durable("remote") >= 2
    durable = s.durable("disk")
    s.abandon()
    s = open_store(uploads=True)
    assert durable <= s.last_seq <= 2
    assert s.get("s", "a") == 1


def test_a_second_rollback_into_a_gap_claims_no_more_durable_than_a_crash_recovers(
    open_store: OpenStore,
) -> None:
    """A rollback to a seq no batch carried, below everything logged: what is durable is what
    the tiers hold at or below it (here seq 1), not the seq before it (3, never appended), which
    a crash cannot recover."""
    # indexing far away: with seq 4 indexed, LevelDB would carry it and the old claim held
    s = open_store(index_delay_s=60.0)
    for seq in (1, 5, 9):
        s.append(seq, {"s": {"a": seq}})
    s.rollback(7)
    assert s.flush("disk", timeout=TIMEOUT_S) == 7
    s.rollback(4)
    durable = s.durable("disk")
    assert durable in (1, 4)  # seq 4's empty batch may be logged in the background already
    s.abandon()
    s = open_store(index_delay_s=60.0)
    assert durable <= s.last_seq <= 4
    assert s.get("s", "a") == 1


def test_rollback_after_reopen_into_a_segment_that_open_did_not_read(open_store: OpenStore) -> None:
    """On open, a segment wholly below what LevelDB indexed is not read; its last seq is taken
    to be one below the next segment's first. Rolling back into that gap must work."""
    s = open_store(segment_bytes=1, uploads=True)
    for seq in (1, 2, 5):
        s.append(seq, {"s": {"a": seq}})
        s.flush("disk", timeout=TIMEOUT_S)
    index_all(s)
    s.close()
    s = open_store(segment_bytes=1, uploads=True)
    s.rollback(2)
    assert s.last_seq == 2
    assert s.get("s", "a") == 2
    s.append(3, {"s": {"a": 3}})
    s.close()
    s = open_store(segment_bytes=1, uploads=True)
    assert s.last_seq == 3
    assert s.get("s", "a") == 3
    assert s.get("s", "a", as_of=2) == 2


def test_rollback_below_the_horizon_is_refused(open_store: OpenStore) -> None:
    s = open_store(retention=2, merge_fanout=2)
    append_all(s, HISTORY)
    s.compact()
    assert s.horizon == 9 - 2
    with pytest.raises(RetentionError) as info:
        s.rollback(6)
    assert info.value.seq == 6 and info.value.horizon == 7
    assert s.last_seq == 9
    check(s, HISTORY, [7, 8, 9], "after a refused rollback")
    s.rollback(8)
    check(s, HISTORY, [7, 8, None], "rolled back to 8")


# -- snapshots and compaction ----------------------------------------------------------------


def test_snapshot_pins_its_seq_against_merges(open_store: OpenStore) -> None:
    s = open_store(retention=0, merge_fanout=2)
    history: History = [
        (seq, {"s": {"k": seq, f"only{seq}": seq, "gone": TOMBSTONE if seq == 4 else 1}, "t": {seq % 2: seq}})
        for seq in range(1, 7)
    ]
    append_all(s, history[:3])
    snap = s.snapshot()
    assert snap.seq == 3
    append_all(s, history[3:])
    s.compact()
    assert s.horizon == 3
    assert snap.get("s", "k") == 3
    assert {st: snap.load(st) for st in ("s", "t")} == expected(history, 3)
    assert s.get("s", "gone", as_of=3) == 1
    check(s, history, [3, 4, 5, 6], "pinned at 3")
    with pytest.raises(RetentionError):
        s.get("s", "k", as_of=2)
    snap.release()
    snap.release()
    s.compact()
    assert s.horizon == 6
    with pytest.raises(RetentionError):
        s.get("s", "k", as_of=3)
    check(s, history, [6, None], "released")
    assert len(s.runs("s")) == 1


def test_two_snapshots_of_one_seq_pin_it_until_both_are_released(open_store: OpenStore) -> None:
    s = open_store(retention=0)
    s.append(1, {"s": {"k": 1}})
    a, b = s.snapshot(), s.snapshot()
    s.append(2, {"s": {"k": 2}})
    a.release()
    s.compact()
    assert s.horizon == 1
    assert b.get("s", "k") == 1
    with b:
        pass
    s.compact()
    assert s.horizon == 2


def test_compaction_horizon_follows_retention(open_store: OpenStore) -> None:
    s = open_store(retention=3, merge_fanout=2)
    append_all(s, HISTORY)
    s.compact()
    assert s.horizon == 6
    check(s, HISTORY, [6, 7, 8, 9], "retention 3")
    with pytest.raises(RetentionError):
        s.load("s", as_of=5)


def test_a_full_compaction_leaves_no_log_the_disk_tier_covers(open_store: OpenStore) -> None:
    """The open log segment holds only what LevelDB indexed after a full compaction: it is
    sealed and deleted then, not kept until it fills; the next append starts a new one."""
    s = open_store(retention=0, merge_fanout=2, budget=0)
    append_all(s, HISTORY)
    s.flush("disk", timeout=TIMEOUT_S)  # logged: the persister writes the log in the background
    assert s.disk_bytes()["log"] > 0
    s.compact()
    assert s.disk_bytes()["log"] == 0
    s.append(10, {"s": {"after": 1}})
    s.flush(timeout=TIMEOUT_S)
    assert s.disk_bytes()["log"] > 0
    s.close()
    s = open_store()
    check(s, HISTORY, [9], "reopened after the compaction")
    assert s.get("s", "after") == 1


def test_background_merges_keep_every_read(open_store: OpenStore) -> None:
    """With a budget, merges run on their own once the persister has indexed the runs; reads
    stay exact while they run and after."""
    history = long_history()
    s = open_store(merge_fanout=2, budget=1.0)
    append_all(s, history)
    index_all(s)
    check(s, history, [0, 20, 39], "while merging")
    wait_until(s, lambda: s.stats.merges > 0 and merges_settled(s), "settled background merges")
    assert len(s.runs("s")) < 40
    assert s.horizon == -1
    check(s, history, [-1, *range(0, 41)], "after background merges")


def test_a_store_with_no_budget_merges_only_when_asked(open_store: OpenStore) -> None:
    s = open_store(merge_fanout=2, budget=0)
    append_all(s, HISTORY)
    index_all(s)
    assert not s._persister.compactor.due()
    assert s.stats.merges == 0 and len(s.runs("s")) == 5
    s.compact()
    assert s.stats.merges > 0


def test_a_read_racing_a_merge_past_its_as_of_is_refused_or_right(open_store: OpenStore) -> None:
    """A read checks its as_of against the horizon, then reads the runs. A merge that moves
    the horizon past as_of in between (on the compactor's thread) must not make the read
    answer from the merged runs, which no longer hold the versions as of as_of: it raises
    RetentionError, or answers as before the merge.

    The interleaving is arranged by running one merge right after the read's horizon check
    (wrapping the store's check)."""
    reads = {
        "get": lambda s: s.get("s", "k", as_of=5),
        "load": lambda s: s.load("s", as_of=5),
        "versions": lambda s: s.versions("s", "k", after=3, upto=5),
    }
    right = {"get": 5, "load": {"k": 5, "five": 5}, "versions": [(4, 4), (5, 5)]}
    for name, read in reads.items():
        s = open_store(name, retention=2, budget=0)
        append_all(s, [(seq, {"s": {"k": seq, **({"five": 5} if seq == 5 else {})}}) for seq in range(1, 11)])
        index_all(s)
        real_check = s._check_as_of

        def check_then_merge(as_of: object, s: Store = s, real_check: Callable = real_check) -> int:
            at = real_check(as_of)
            s._check_as_of = real_check
            s._persister.compactor.run(full=False)
            assert s.horizon == 8
            return at

        s._check_as_of = check_then_merge
        try:
            got = read(s)
        except RetentionError:
            continue
        assert got == right[name], name


# -- the remote tier -------------------------------------------------------------------------


def test_flush_remote_uploads_everything(open_store: OpenStore) -> None:
    s = open_store(uploads=True)
    append_all(s, HISTORY)
    assert remote_files(s) == []
    assert s.flush("remote", timeout=TIMEOUT_S) == 9
    assert s.durable("remote") == 9
    assert s.durable("disk") >= 9
    assert remote_files(s) != []
    s.append(10, {"s": {"z": 1}})
    assert s.flush("remote", timeout=TIMEOUT_S) == 10
    assert s.durable("remote") == 10


def drop_local_tiers(path: str) -> None:
    for part in ("disk", "log"):
        shutil.rmtree(os.path.join(path, part))
    assert sorted(os.listdir(path)) == ["LOCK", "MANIFEST", "remote"]


def test_restore_from_remote_log_segments(open_store: OpenStore) -> None:
    s = open_store(segment_bytes=64, uploads=True)
    append_all(s, HISTORY[:4])
    s.flush("remote", timeout=TIMEOUT_S)
    append_all(s, HISTORY[4:])
    s.flush("remote", timeout=TIMEOUT_S)
    path = s.path
    s.close()
    drop_local_tiers(path)
    s = open_store(segment_bytes=64, uploads=True)
    assert s.last_seq == 9
    assert s.horizon == -1
    check(s, HISTORY, HISTORY_SEQS, "restored")
    s.append(10, {"s": {"a": 10}})
    s.close()
    s = open_store(segment_bytes=64, uploads=True)
    assert s.get("s", "a") == 10


def test_restore_from_a_base_image(open_store: OpenStore) -> None:
    s = open_store(retention=0, uploads=True)
    append_all(s, HISTORY)
    s.compact()
    assert s.horizon == 9
    assert any(n.startswith("base-") for n in remote_files(s))
    path = s.path
    s.close()
    drop_local_tiers(path)
    s = open_store(retention=0, uploads=True)
    assert s.last_seq == 9
    assert s.horizon == 9
    check(s, HISTORY, [9, None], "restored")
    assert s.get("s", "d") == (1, "two")
    assert s.get("s", "a") == 9


def test_restore_from_a_base_image_and_later_segments(open_store: OpenStore) -> None:
    """budget=0: no background merge writes a newer base image than compact()'s."""
    s = open_store(retention=2, uploads=True, budget=0)
    append_all(s, HISTORY[:4])
    s.compact()
    assert s.horizon == 3
    append_all(s, HISTORY[4:])
    s.flush("remote", timeout=TIMEOUT_S)
    path = s.path
    s.close()
    drop_local_tiers(path)
    s = open_store(retention=2, uploads=True, budget=0)
    assert s.last_seq == 9
    assert s.horizon == 3
    check(s, HISTORY, range(3, 10), "restored")


# -- backpressure ------------------------------------------------------------------------------


def test_appends_under_a_small_memory_bound_all_land(open_store: OpenStore) -> None:
    s = open_store(memory_bytes=1)
    history: History = [
        (seq, {"s": {seq % 17: seq, f"s{seq % 5}": seq}, ("t", seq % 3): {(seq % 3,): seq}}) for seq in range(100)
    ]
    append_all(s, history)
    assert s.last_seq == 99
    assert isinstance(s.stats.backpressure_s, float)
    assert s.stats.backpressure_s > 0
    check(s, history, [50, 99], "under backpressure")


def test_rollback_keeps_the_remote_tier_whole_after_a_background_compaction(open_store: OpenStore) -> None:
    """One remote log segment can span several local segments (everything sealed is uploaded
    at once, here after an outage of the remote tier), and a background compaction deletes
    the local segments at or below its horizon without writing a base image when no remote
    segment is stale. A rollback into that remote segment must not lose, from the remote
    tier, the seqs at or below the rollback point: a restore must bring them back.

    The one background compaction is run through a private call, to fix when it happens."""
    s = open_store(retention=2, segment_bytes=1, seal_interval_s=60, budget=0, uploads=True)
    remote = os.path.join(s.path, "remote")
    shutil.rmtree(remote)
    open(remote, "w").close()  # the remote tier is unreachable while a file stands in its place
    history: History = [(1, {"s": {"one": 1}}), (2, {"s": {"two": 2}}), (3, {"s": {"three": 3}})]
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
    drop_local_tiers(path)
    s = open_store(retention=2, uploads=True)
    assert s.last_seq == 2
    assert s.load("s") == expected(history, 2)["s"]


def test_rollback_rechecks_the_horizon_after_waiting_for_a_compaction(open_store: OpenStore) -> None:
    """rollback waits for a running background compaction; if that compaction moves the
    horizon past to_seq, the versions rollback would need are gone: it must refuse
    (RetentionError), not roll back to the state at the new horizon.

    The interleaving is arranged by wrapping the compaction lock so that one background
    compaction runs right before rollback gets the lock."""
    s = open_store(retention=2, budget=0)
    history: History = [(seq, {"s": {"k": seq}}) for seq in range(1, 11)]
    append_all(s, history)
    index_all(s)
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
    with pytest.raises(RetentionError):
        s.rollback(7)
    assert s.horizon > 7
    assert s.last_seq == 10
    check(s, history, [8, 9, 10], "after a refused rollback")


def test_flush_remote_after_a_rollback_below_an_earlier_flush(open_store: OpenStore) -> None:
    """A flush("remote") asked for seq 3, then a rollback to 1: a later flush("remote") of
    seq 2 must upload at once, not wait for the segment to age (seal_interval_s)."""
    s = open_store(seal_interval_s=60, uploads=True)
    history: History = [(1, {"s": {"a": 1}}), (2, {"s": {"a": 2}}), (3, {"s": {"a": 3}})]
    append_all(s, history)
    assert s.flush("remote", timeout=TIMEOUT_S) == 3
    s.rollback(1)
    assert s.flush("remote", timeout=TIMEOUT_S) == 1
    s.append(2, {"s": {"a": "again"}})
    assert s.flush("remote", timeout=TIMEOUT_S) == 2
    assert s.durable("remote") == 2


def test_a_paced_remote_tier_waits_between_uploads_unless_a_flush_asks(open_store: OpenStore) -> None:
    """`pace("remote", g)`: a segment due for upload (sealed at once here) waits g seconds
    after the last upload; a flush of the remote tier does not wait; pace 0 lets it go."""
    s = open_store(uploads=True, seal_interval_s=0.0, budget=0)
    s.pace("remote", 3600.0)
    s.append(1, {"s": {"a": 1}})
    assert s.flush("remote", timeout=TIMEOUT_S) == 1  # asked for: not held back
    s.append(2, {"s": {"a": 2}})
    s.flush("disk", timeout=TIMEOUT_S)
    with s._cond:
        assert not s._persister._upload_due(), "an upload due by age went within the paced gap"
        assert s.durable("remote") == 1
    s.pace("remote", 0.0)
    wait_until(s, lambda: s.durable("remote") == 2, "upload once the pace is lifted")
    assert s.stats.upload_cpu_s > 0


def test_a_paced_disk_tier_indexes_later_and_reads_meanwhile(open_store: OpenStore) -> None:
    """`pace("disk", g)`: logged batches wait g seconds more to be indexed; they are durable
    and read from memory meanwhile (without the pace, at once: index_delay_s 0)."""
    s = open_store(budget=0, index_delay_s=0.0)
    s.pace("disk", 3600.0)
    s.append(1, {"s": {"a": 1}})
    s.append(2, {"s": {"b": 2}})
    assert s.flush("disk", timeout=TIMEOUT_S) == 2
    with s._cond:
        assert not s._persister._index_due_locked(), "logged batches went to LevelDB within the paced gap"
    assert s.indexed < 2 and s.load("s") == {"a": 1, "b": 2}
    s.pace("disk", 0.0)
    wait_until(s, lambda: s.indexed == 2, "indexing once the pace is lifted")


@pytest.mark.parametrize(("level", "gap", "said"), [("memory", 1.0, "'memory'"), ("remote", -1.0, "-1.0")])
def test_pace_refuses_a_level_or_a_gap_it_cannot_keep(open_store: OpenStore, level: str, gap: float, said: str) -> None:
    s = open_store()
    with pytest.raises(LsmError, match=re.escape(said)):
        s.pace(level, gap)
    assert s.paced == {"remote": 0.0, "disk": 0.0}


def full_history() -> History:
    """Deltas, then a run of every live key (full) that drops b and changes a, then deltas."""
    return [
        (1, {"s": {"a": 1, "b": 2}}),
        (2, {"s": {"b": 3, "x": TOMBSTONE}}),
        (3, {"s": Updates(["a", "c"], [10, 3], full=True)}),
        (4, {"s": {"d": 4, "c": TOMBSTONE}}),
        (5, {"s": {"b": 5}}),
    ]


FULL_STATES = {
    1: {"a": 1, "b": 2},
    2: {"a": 1, "b": 3},
    3: {"a": 10, "c": 3},
    4: {"a": 10, "d": 4},
    5: {"a": 10, "d": 4, "b": 5},
}
"""The state after each seq of full_history, written out by hand."""


def test_a_full_run_is_the_whole_state_a_key_it_lacks_deleted(open_store: OpenStore) -> None:
    """A run appended as every live key (`Updates(full=True)`) deletes the keys it lacks, for
    load and get alike, as appended, indexed and merged; reads before it see the runs before."""
    s = open_store(merge_fanout=2, budget=0)
    append_all(s, full_history())
    for phase in phases(s):
        for seq, want in FULL_STATES.items():
            assert s.load("s", as_of=seq) == want, (phase, seq)
            for key in "abcdx":
                assert s.get("s", key, as_of=seq) == want.get(key), (phase, seq, key)


def test_runs_older_than_a_full_run_below_the_horizon_go(open_store: OpenStore) -> None:
    """Past the retention horizon, the runs older than a full run are read by nothing: a
    compaction deletes them, and what is read at or after the horizon is unchanged."""
    s = open_store(retention=1, merge_fanout=8, budget=0)
    append_all(s, full_history())
    s.compact()  # horizon 4: the runs of seqs 1 and 2 go, the full run stays the oldest
    assert s.horizon == 4
    assert s.runs("s")[0][0] == 3, s.runs("s")
    assert s.load("s") == FULL_STATES[5] and s.load("s", as_of=4) == FULL_STATES[4]
    assert s.get("s", "b", as_of=4) is None and s.get("s", "b") == 5
    s.close()
    s = open_store(retention=1)
    assert s.load("s") == FULL_STATES[5]


def test_a_rollback_into_a_merged_full_run_keeps_it_whole(open_store: OpenStore) -> None:
    """A merge whose oldest run is full is full; a rollback into its range cuts its newer
    versions and leaves it full: the keys the full run dropped stay dropped."""
    s = open_store(merge_fanout=2, budget=0)
    append_all(s, full_history())
    index_all(s)
    s.compact()
    s.rollback(4)
    assert s.load("s") == FULL_STATES[4]
    assert s.get("s", "b") is None


# -- appends logged on the caller's thread (log_now) ------------------------------------------


class HeldTiers:
    """Holds the store's tier lock from another thread, as a persister step under way does."""

    def __init__(self, s: Store) -> None:
        self.s = s
        self.held, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        with self.s._tier_lock:
            self.held.set()
            self.release.wait(TIMEOUT_S)

    def __enter__(self) -> HeldTiers:
        self.thread.start()
        assert self.held.wait(TIMEOUT_S)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(TIMEOUT_S)


def settled(s: Store) -> None:
    """Waits until the persister is between steps: everything logged and its step over."""
    s.flush(timeout=TIMEOUT_S)
    with s._tier_lock:
        pass


def test_an_append_logged_now_is_durable_on_return_and_survives_a_crash(open_store: OpenStore) -> None:
    # merges off and indexing far away, so that no persister step holds the tiers meanwhile
    s = open_store(budget=0, index_delay_s=60.0)
    s.append(1, {"s": {"a": 1}})
    settled(s)
    s.append(2, {"s": {"a": 2, "b": 2}}, log_now=True)
    assert s.durable("disk") == 2
    assert s.stats.logged_now == 1
    s.append(3, {"s": {"a": 3}}, log_now=True)
    assert s.durable("disk") == 3
    assert s.stats.logged_now == 2
    s.abandon()
    s = open_store(budget=0)
    assert s.last_seq == 3
    assert s.load("s") == {"a": 3, "b": 2}
    assert s.get("s", "a", as_of=2) == 2


def test_an_append_logged_now_waits_its_turn_behind_a_step_or_an_earlier_append(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a step holds the tiers, or an earlier append is not logged yet, the append is the
    persister's: nothing is logged out of order, and a flush makes all of it durable."""
    s = open_store(budget=0, index_delay_s=60.0)
    s.append(1, {"s": {"a": 1}})
    settled(s)
    with HeldTiers(s):
        s.append(2, {"s": {"a": 2}}, log_now=True)  # a step is under way
        assert s.durable("disk") == 1
    assert s.stats.logged_now == 0
    settled(s)
    # the persister takes no step now: seq 3 waits in memory, not logged
    monkeypatch.setattr(s._persister, "_due_locked", lambda: False)
    s.append(3, {"s": {"a": 3}})
    s.append(4, {"s": {"a": 4}}, log_now=True)  # seq 3 is not logged: not before it
    assert s.durable("disk") == 2
    assert s.stats.logged_now == 0
    monkeypatch.undo()
    assert s.flush(timeout=TIMEOUT_S) == 4
    s.abandon()
    s = open_store(budget=0)
    assert s.last_seq == 4
    assert [s.get("s", "a", as_of=q) for q in (1, 2, 3, 4)] == [1, 2, 3, 4]


def test_a_large_append_is_not_logged_on_the_callers_thread(open_store: OpenStore) -> None:
    s = open_store(budget=0, index_delay_s=60.0)
    settled(s)
    big = {"s": {i: "x" * 64 for i in range(LOG_NOW_BYTES // 64 + 1)}}
    s.append(1, big, log_now=True)
    assert s.stats.logged_now == 0
    assert s.flush(timeout=TIMEOUT_S) == 1


# -- a rollback's stand-in record and the remote tier -----------------------------------------


def restored_from_remote(open_store: OpenStore, s: Store) -> Store:
    """Closes `s`, deletes its local tiers and opens it again: what the remote tier restores."""
    s.close()
    drop_local_tiers(s.path)
    return open_store(uploads=True, budget=0)


@pytest.mark.parametrize("remote_before", ["base image above the target", "log up to the seq before it"])
def test_a_rollback_to_a_seq_only_leveldb_holds_keeps_its_runs_on_the_remote_tier(
    open_store: OpenStore, remote_before: str
) -> None:
    """Seq 2's runs are in LevelDB alone (indexed, their log dropped by a compaction) when the
    store rolls back to 2: the empty record logged to carry seq 2 must not reach the remote
    tier in their place (by a reopen, too: the rollback is made by a store that does not
    upload, the upload by the next one)."""
    s = open_store(uploads=True, budget=0)
    s.append(1, {"s": {"x": 1}})
    if remote_before != "base image above the target":
        assert s.flush("remote", timeout=TIMEOUT_S) == 1
    s.close()
    s = open_store(uploads=False, budget=0)
    s.append(2, {"s": {"a": 2}})
    s.append(3, {"s": {"x": 3}})
    s.compact()  # indexes 2 and 3 and drops their log
    if remote_before == "base image above the target":
        s.close()
        s = open_store(uploads=True, budget=0)
        assert s.flush("remote", timeout=TIMEOUT_S) == 3  # a base image of 3: the log lacks 1..3
    s.rollback(2)
    assert s.load("s") == {"x": 1, "a": 2}
    s.close()
    s = open_store(uploads=True, budget=0)
    assert s.flush("remote", timeout=TIMEOUT_S) == 2
    s = restored_from_remote(open_store, s)
    assert s.last_seq == 2
    assert s.load("s") == {"x": 1, "a": 2}
    assert s.get("s", "x", as_of=1) == 1


def test_the_stand_in_mark_outlives_an_upload_while_its_empty_record_is_in_the_log(open_store: OpenStore) -> None:
    """The empty record of seq 2 is still in the local log after the remote tier took a base
    image above it; a rollback that removes that base image must not let the record be
    uploaded as seq 2."""
    s = open_store(uploads=True, budget=0)
    s.append(1, {"s": {"x": 1}})
    assert s.flush("remote", timeout=TIMEOUT_S) == 1
    s.close()
    s = open_store(uploads=False, budget=0)
    s.append(2, {"s": {"a": 2}})
    s.append(3, {"s": {"x": 3}})
    s.compact()
    s.rollback(2)  # the empty record of 2 opens a segment; 3 and 4 follow it
    s.append(3, {"s": {"y": 3}})
    s.append(4, {"s": {"x": 4}})
    s.close()
    s = open_store(uploads=True, budget=0, index_delay_s=60.0)
    assert s.flush("remote", timeout=TIMEOUT_S) == 4  # a base image of 4
    s.rollback(3)  # the base image goes; the log holds 2 (empty) and 3
    assert s.load("s") == {"x": 1, "a": 2, "y": 3}
    assert s.flush("remote", timeout=TIMEOUT_S) == 3
    s = restored_from_remote(open_store, s)
    assert s.last_seq == 3
    assert s.load("s") == {"x": 1, "a": 2, "y": 3}


def tier_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, "disk", f)) for f in os.listdir(os.path.join(path, "disk")))


@pytest.mark.parametrize("after", [1 << 20, 1 << 40])
def test_background_merges_free_the_space_of_the_runs_they_remove(open_store: OpenStore, monkeypatch, after) -> None:
    """A steady stream of runs of the same keys, merged in the background: the disk tier stays
    near the runs still live once LevelDB rewrites its files (`after` 1 MiB), and grows with
    everything ever written when it is never asked to (`after` 1 TiB: the limit shows the test
    can tell the two apart)."""
    import lsm.compaction

    monkeypatch.setattr(lsm.compaction, "COMPACT_AFTER_BYTES", after)
    s = open_store(merge_fanout=2, budget=0, retention=0)
    big = "v" * 2000
    for seq in range(1, 201):
        s.append(seq, {"s": {f"k{i}": big + str(seq) for i in range(200)}})
        s.flush()
        s._persister.compactor.run(full=False)
    written = 200 * 200 * 2000
    live = sum(r.nbytes for refs in s._catalog.values() for r in refs)
    assert s.load("s")["k0"] == big + "200"
    if after < written:
        assert s.stats.files_rewritten >= 1
        assert tier_bytes(s.path) < 0.25 * written and live < 0.05 * written
    else:
        assert s.stats.files_rewritten == 0 and tier_bytes(s.path) > 0.25 * written


@pytest.mark.parametrize("indexed", [False, True])
def test_a_get_with_max_decode_refuses_to_decode_more_of_a_run(open_store: OpenStore, indexed: bool) -> None:
    """An append's run of 1,000 keys, in memory or on the disk tier, then merged with a second:
    a get whose look-up would first decode more of a run than `max_decode` raises
    LookupTooDearError naming the bytes; once a plain get decoded it, the same get answers. A
    merged run decodes one block of each column for a look-up: never too dear."""
    s = open_store(retention=0)
    s.append(1, {"st": {f"k{i}": "v" * 20 for i in range(1000)}})
    if indexed:
        index_all(s)
    with pytest.raises(LookupTooDearError) as e:
        s.get("st", "k5", max_decode=1000)
    assert e.value.nbytes > 20_000
    assert s.get("st", "k5", max_decode=1 << 20) == "v" * 20  # within the bound
    assert s.get("st", "k6", max_decode=0) == "v" * 20  # its dict is built: nothing to decode
    s.append(2, {"st": {"k5": "new"}})
    s.compact()
    index_all(s)
    assert [(lo, hi) for lo, hi, _ in s.runs("st")] == [(1, 2)], "the two runs were not merged"
    assert s.get("st", "k7", max_decode=0) == "v" * 20
    assert s.get("st", "k5", max_decode=0) == "new"
    assert s.get("st", "k1000", max_decode=0) is None
