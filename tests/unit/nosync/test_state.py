"""Operator state survives a snapshot: the value codec, `take_updates` and `take_increments`
into a real store, and the metadata.

Snapshots go into a real `lsm.Store` in a temporary directory as mode abs appends them
(`take_keyed` at the store's next seq, under `STATE`) and come back as its recovery reads them
(`restore_keyed`): from the store that took them, as a survivor restores in place, and from the
store closed and reopened, as a restarted process does; and, as mode replay does, from
`saved_state`. The metadata comes back both as `snapshot_meta` returned it and from a real
checkpoint file. A restored operator must then behave exactly as the one that was never
stopped, and every snapshot must read back as the state was when it was taken.
"""

from __future__ import annotations

import collections
import copy
import datetime
import enum
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.operators import source, wire

import lsm
import nosync as ns
from lsm import TOMBSTONE
from nosync import codec
from nosync.errors import RunFailed
from nosync.modes.abs import RETENTION, STATE, restore_keyed, take_keyed
from nosync.runtime.graph import make_op
from nosync.runtime.keyed import MISSING_STATE, JoinOp
from nosync.runtime.operators import EOS
from nosync.state import checkpoints

SETTINGS = settings(max_examples=60, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])


def same_shape(a: object, b: object) -> bool:
    """Whether `b` has the container types of `a` at every depth (dict items in order)."""
    if type(a) is not type(b):
        return False
    if type(a) in (dict, collections.Counter, collections.OrderedDict):
        return len(a) == len(b) and all(
            same_shape(ka, kb) and same_shape(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same_shape(x, y) for x, y in zip(a, b, strict=True))
    if type(a) in (set, frozenset):
        # equal sets; each item has the shape of the item equal to it
        return len(a) == len(b) and all(any(x == y and same_shape(x, y) for y in b) for x in a)
    return True


def assert_same_state(expected: dict, got: dict) -> None:
    assert got == expected
    for k, v in expected.items():
        assert same_shape(v, got[k]), (k, v, got[k])


# -- state codec ------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
hashable_keys = st.recursive(
    st.text(max_size=4) | st.integers(-(2**63), 2**64 - 1),
    lambda inner: st.tuples(inner) | st.tuples(inner, inner),
    max_leaves=4,
)
nested = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(hashable_keys, inner, max_size=4)
        | st.sets(hashable_keys, max_size=4)
        | st.frozensets(hashable_keys, max_size=3)
        | st.dictionaries(hashable_keys, st.integers(-5, 5), max_size=4).map(collections.Counter)
        | st.dictionaries(hashable_keys, inner, max_size=4).map(collections.OrderedDict)
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None, print_blob=True)
@given(value=nested)
def test_pack_unpack_round_trip_keeps_container_types(value):
    data = codec.pack_state(value)
    assert type(data) is bytes
    back = codec.unpack_state(data)
    assert back == value
    assert same_shape(value, back)


def test_lists_and_tuples_stay_apart_at_every_depth():
    value = {("k", 1): [(1, [2, (3,)]), [()], ([],)], 2: {"t": ((), [])}}
    back = codec.unpack_state(codec.pack_state(value))
    assert back == value
    assert type(back[("k", 1)]) is list
    assert type(back[("k", 1)][0]) is tuple and type(back[("k", 1)][0][1]) is list
    assert type(back[("k", 1)][0][1][1]) is tuple
    assert type(back[("k", 1)][1][0]) is tuple and type(back[("k", 1)][2][0]) is list
    assert type(next(iter(back))) is tuple
    back[("k", 1)].append("still a list")  # what a restored JoinOp does to its sides


def test_sets_counters_and_ordered_dicts_come_back_as_they_were():
    value = {
        "seen": {"a", ("b", 1), frozenset({2})},
        "frozen": frozenset({(1, 2)}),
        "words": collections.Counter({"x": 3, ("y",): 1}),
        "order": collections.OrderedDict([("z", [1]), ("a", (2,))]),
    }
    back = codec.unpack_state(codec.pack_state(value))
    assert back == value
    assert type(back["seen"]) is set and type(back["frozen"]) is frozenset
    assert type(back["words"]) is collections.Counter and type(back["order"]) is collections.OrderedDict
    assert list(back["order"]) == ["z", "a"] and type(back["order"]["z"]) is list
    back["seen"].add("still a set")
    back["words"].update(["x"])  # a Counter's own method
    assert back["words"]["x"] == 4 and back["words"]["never seen"] == 0


class Point(tuple):
    pass


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (datetime.datetime(2026, 1, 1), "datetime"),
        ([1, {"k": object()}], "object"),
        (collections.defaultdict(int, a=1), "defaultdict"),
        (collections.namedtuple("P", "x y")(1, 2), "P"),
        (Point((1,)), "Point"),
        ({"k": [enum.IntEnum("E", "A").A]}, "E"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_types_that_cannot_be_written_as_data_are_refused_naming_the_type(value, name):
    """A defaultdict's factory, a namedtuple's class or an enum would not come back: refused,
    not saved as something that behaves differently once restored."""
    with pytest.raises(TypeError, match=f"cannot store a value of type {name}:"):
        codec.pack_state(value)


def test_a_failed_pack_does_not_spoil_the_next_one():
    with pytest.raises(TypeError):
        codec.pack_state([1, 2, {3: object()}])
    assert codec.unpack_state(codec.pack_state([1, (2,)])) == [1, (2,)]


def test_ints_beyond_msgpack_are_refused_with_type_error():
    for big in (2**64, -(2**63) - 1):
        with pytest.raises(TypeError):
            codec.pack_state({"n": big})


def test_bytearray_and_memoryview_come_back_as_bytes():
    """msgpack writes them as bin, which decodes to bytes: the documented exception to
    'behaves as it did' (the docstring of `nosync.codec`)."""
    for value in (bytearray(b"ab"), memoryview(b"ab")):
        back = codec.unpack_state(codec.pack_state(value))
        assert type(back) is bytes and back == b"ab"


# -- operators: take_updates / take_increments into a store, restore, snapshot_meta --------------


C0, C1 = ("x", 3, 0), ("x", 3, 1)  # channels named as the worker names exchange inputs
CHANNELS = (C0, C1)
KIND_NAMES = ("reduce", "aggregate", "stateful_map", "window", "join")


def _counted_list(state, v):
    """stateful_map: keeps (n, [values]) and forgets the key at its third record; appends to
    the list it got back, so a restored tuple would fail."""
    n, values = state if state is not None else (0, [])
    values.append(v)
    if n + 1 == 3:
        return None, [("reset", v)]
    return (n + 1, values), [(n + 1, tuple(values))]


def _append(acc, v):
    acc.append(v)
    return acc


def build(kind: str):
    """A keyed operator of `kind` from a real pipeline, with inputs C0 and C1."""
    p = ns.Pipeline("p")
    keyed = source(p, "s").key_by(lambda r: r[0])
    if kind == "reduce":
        op = make_op(keyed.reduce(lambda acc, v: (acc + v)[-4:], name="r").node)
    elif kind == "aggregate":
        stream = keyed.aggregate(lambda: {"n": 0, "last": ()}, lambda a, v: {"n": a["n"] + 1, "last": (*a["last"], v)})
        op = make_op(stream.node)
    elif kind == "stateful_map":
        op = make_op(keyed.stateful_map(_counted_list, name="sm").node)
    elif kind == "window":
        op = make_op(keyed.window(5, lambda v: v, list, _append, name="w").node)
    else:
        other = source(p, "o").key_by(lambda r: r[0])
        op = JoinOp(keyed.join(other, name="j").node, {C0})
    return op, wire(op, CHANNELS)


def track(op) -> None:
    """Has `op` collect its updates as `graph.build_ops` does for a mode that persists them:
    the keys it changes, or for a join, what each batch appended to its sides."""
    if isinstance(op, JoinOp):
        op.incremental = True
    else:
        op.track_dirty = True


def value_for(kind: str, v: int) -> object:
    return (v,) if kind == "reduce" else v


def sides_of(increments: dict) -> dict:
    """A join's state as its logged increments ((key, side, index) -> value) describe it,
    checking that each side's indices are 0, 1, 2... with none missing."""
    state: dict = {}
    for (k, side, i), v in sorted(increments.items(), key=lambda kv: kv[0][2]):
        sides = state.setdefault(k, ([], []))
        assert i == len(sides[side]), f"increment {i} of side {side} of key {k!r} after {len(sides[side])}"
        sides[side].append(v)
    return state


def applied(base: dict, updates) -> dict:
    """The state a store holds after applying a snapshot's updates to `base`: a full run
    replaces it, changes update it (TOMBSTONE deletes)."""
    out = {} if getattr(updates, "full", False) else dict(base)
    for k, v in changes(updates).items():
        if v is lsm.TOMBSTONE:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def changes(updates) -> dict:
    """What a snapshot's updates set, key -> value (TOMBSTONE: deleted), as the store applies
    them: a join's increments as they are; a keyed operator's logged pairs in order, then its
    columns. Each key once: a key twice in one snapshot's columns fails here."""
    if not isinstance(updates, lsm.Updates):
        keys_, values = updates
        assert len(keys_) == len(set(keys_)), "a key twice in one snapshot's updates"
        return dict(zip(keys_, values, strict=True))
    out: dict = {}
    for _, chunk in updates.pairs:
        out.update(msgpack.unpackb(chunk, use_list=False, raw=False, strict_map_key=False))
    assert len(updates.keys) == len(set(updates.keys)), "a key twice in one snapshot's columns"
    out.update(zip(updates.keys, updates.values, strict=True))
    return out


def stored_state(store: lsm.Store, op, as_of: int | None = None) -> dict:
    """The keyed state of `op` its store holds right after seq `as_of` (None: the last)."""
    held = store.load(STATE, as_of=as_of)
    return sides_of(held) if isinstance(op, JoinOp) else held


def snapshot_into(op, store: lsm.Store, taken: dict) -> None:
    """Appends the updates of `op` at the store's next seq, as mode abs does at a barrier;
    checks that the store now holds the whole state, and keeps a copy of it in `taken`."""
    seq = store.last_seq + 1
    store.append(seq, {STATE: take_keyed(op)})
    taken[seq] = copy.deepcopy(op.state)
    assert_same_state(op.state, stored_state(store, op))


def assert_snapshots_read_back(store: lsm.Store, op, taken: dict, when: str) -> None:
    """Every snapshot in `taken` (seq -> the state then) reads back from `store` as it was."""
    for seq, state in taken.items():
        got = stored_state(store, op, as_of=seq)
        assert got == state, f"{when}: the snapshot at seq {seq} reads back as {got!r}, not {state!r}"
        assert_same_state(state, got)


def meta_through_checkpoint_file(meta: dict) -> dict:
    """The metadata as recovery reads it: written to and read from a real checkpoint file."""
    with tempfile.TemporaryDirectory() as d:
        path = checkpoints.write(d, 1, checkpoints.body("p", 1, {0: {"ops": {"op": meta}}}))
        return checkpoints.read(path)["workers"][0]["ops"]["op"]


def restored(kind: str, meta: dict, restore_state: Callable) -> tuple:
    """A fresh operator of `kind` given its keyed state by `restore_state(op)`, then `meta`;
    checked to hold no update of its own (a restore is not an update)."""
    op, out = build(kind)
    track(op)
    restore_state(op)
    op.restore_meta(meta)
    assert changes(take_keyed(op)) == {}
    return op, out


keys = st.sampled_from(["a", "b", ("t", 1), 7])
push_step = st.tuples(
    st.just("push"), st.sampled_from(CHANNELS), st.lists(st.tuples(keys, st.integers(0, 30)), min_size=1, max_size=5)
)
marker_step = st.tuples(st.just("marker"), st.sampled_from(CHANNELS), st.none())
snap_step = st.just(("snap", None, None))


def calls_of(kind: str, steps: list, epochs: dict) -> list:
    """Concrete pushes and markers; each channel's epoch advances after its marker."""
    out = []
    for what, ch, recs in steps:
        if what == "push":
            out.append(("push", ch, [(k, value_for(kind, v)) for k, v in recs], epochs[ch]))
        elif what == "marker":
            out.append(("marker", ch, epochs[ch], False))
            epochs[ch] += 1
        else:
            out.append(("snap",))
    return out


def apply_call(op, call: tuple) -> None:
    if call[0] == "push":
        op.push(list(call[2]), call[3], call[1])
    else:
        op.marker(call[1], call[2], None, call[3])


def normalized(kind: str, batches: list) -> list:
    """Window output per batch grouped by key (stable: per-key order kept): which key a
    window closes first follows the state dict's order, which a restore does not keep."""
    if kind != "window":
        return batches
    return [(sorted(recs, key=lambda r: repr(r[0])), e) for recs, e in batches]


@pytest.mark.parametrize("kind", KIND_NAMES)
@SETTINGS
@given(
    before=st.lists(st.one_of(push_step, marker_step, snap_step), max_size=14),
    after=st.lists(st.one_of(push_step, marker_step), max_size=14),
)
def test_restored_operator_behaves_as_the_original(kind, before, after):
    epochs = dict.fromkeys(CHANNELS, 0)
    orig, out = build(kind)
    track(orig)
    taken: dict = {}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        store = lsm.Store(path, retention=RETENTION)
        try:
            for call in calls_of(kind, before, epochs):
                if call[0] == "snap":
                    snapshot_into(orig, store, taken)
                else:
                    apply_call(orig, call)
            snapshot_into(orig, store, taken)
            assert changes(take_keyed(orig)) == {}  # nothing new since
            raw_meta = orig.snapshot_meta()
            file_meta = meta_through_checkpoint_file(raw_meta)
            # a survivor restores in place, from the store that took the snapshots
            copies = [restored(kind, raw_meta, lambda op: restore_keyed(op, store))]
        finally:
            store.close()
        with lsm.Store(path, retention=RETENTION) as reopened:
            assert_snapshots_read_back(reopened, orig, taken, "reopened")
            # a restarted process, from the store reopened; mode replay, from `saved_state`
            copies.append(restored(kind, file_meta, lambda op: restore_keyed(op, reopened)))
            saved = orig.saved_state()
            copies.append(restored(kind, file_meta, lambda op: op.restore_keyed(saved)))
            for op, _ in copies:
                assert_same_state(orig.state, op.state)
                if kind == "join":
                    for sides in op.state.values():
                        assert type(sides) is tuple and all(type(s) is list for s in sides)

            n_batches, n_markers = len(out.batches), len(out.markers)
            base = dict(orig.state)
            rest = calls_of(kind, after, epochs) + [("marker", ch, epochs[ch], True) for ch in CHANNELS]
            for call in rest:
                apply_call(orig, call)
                for op, _ in copies:
                    apply_call(op, call)
            orig_take = take_keyed(orig)
            expected_updates = changes(orig_take)
            if kind != "join":
                # what the store holds once it applied the take (a join's increments aside)
                expected_updates = applied(base, orig_take)
                assert expected_updates == orig.state
            for op, op_out in copies:
                assert normalized(kind, op_out.batches) == normalized(kind, out.batches[n_batches:])
                assert op_out.markers == out.markers[n_markers:]
                assert op_out.markers[-1][0] == EOS
                assert_same_state(orig.state, op.state)
                assert op.frontier == orig.frontier and op.last_epoch == orig.last_epoch
                assert op.metrics()["keys"] == len(orig.state)
                # the same changes, or (an original that could not take its state whole, and
                # wrote every key instead) the same state once applied
                got = take_keyed(op)
                assert (changes(got) if kind == "join" else applied(base, got)) == expected_updates
            if kind == "window":
                for op, _ in copies:
                    assert op.late == orig.late
            assert_snapshots_read_back(reopened, orig, taken, "after the restored operators ran on")


def test_take_updates_twice_without_input_returns_nothing():
    op, _ = build("aggregate")
    track(op)
    op.full_after = math.inf  # changes only: taking the state whole is tested below
    op.push([("a", 1), ("b", 2), ("a", 3)], 0, C0)
    assert changes(op.take_updates()) == {
        "a": {"n": 2, "last": (1, 3)},
        "b": {"n": 1, "last": (2,)},
    }
    assert changes(op.take_updates()) == {}
    op.push([("b", 4)], 1, C1)
    assert changes(op.take_updates()) == {"b": {"n": 2, "last": (2, 4)}}


def test_stateful_map_forgotten_key_is_a_tombstone():
    op, _ = build("stateful_map")
    track(op)
    op.push([("a", 1), ("b", 1), ("a", 2)], 0, C0)
    assert changes(op.take_updates()) == {"a": (2, [1, 2]), "b": (1, [1])}
    op.push([("a", 3)], 0, C0)  # a's third record: fn returns None, the key is forgotten
    assert "a" not in op.state
    assert changes(op.take_updates()) == {"a": TOMBSTONE}
    op.push([("c", 1), ("c", 2), ("c", 3)], 1, C1)  # created and forgotten between two snapshots
    assert changes(op.take_updates()) == {"c": TOMBSTONE}


def test_window_key_whose_windows_all_closed_is_a_tombstone():
    op, out = build("window")
    track(op)
    op.push([("a", 1), ("b", 2), ("b", 7)], 0, C0)
    op.push([("a", 12)], 0, C1)
    assert changes(op.take_updates()) == {"a": {0: [1], 10: [12]}, "b": {0: [2], 5: [7]}}
    op.marker(C0, 0, None, False)
    op.marker(C1, 0, None, False)  # watermark min(7, 12) = 7: [0, 5) closes for a and b
    assert sorted(r for recs, _ in out.batches for r in recs) == [("a", (0, [1])), ("b", (0, [2]))]
    assert changes(op.take_updates()) == {"a": {10: [12]}, "b": {5: [7]}}
    op.push([("a", 20)], 1, C0)
    op.push([("a", 21)], 1, C1)
    op.take_updates()
    op.marker(C0, 1, None, False)
    op.marker(C1, 1, None, False)  # watermark 20: b's [5, 10) and a's [10, 15) close, b is empty
    assert changes(op.take_updates()) == {"a": {20: [20, 21]}, "b": TOMBSTONE}
    op.marker(C0, 2, None, True)
    op.marker(C1, 2, None, True)  # end of input: everything closes
    assert changes(op.take_updates()) == {"a": TOMBSTONE}
    assert op.state == {}


def restored_copy(kind: str, op, path: Path) -> tuple:
    """A fresh operator restored from a snapshot of `op` taken now (its first one), as a
    restarted process restores: from its store reopened, and a real checkpoint file."""
    with lsm.Store(str(path)) as store:
        store.append(1, {STATE: take_keyed(op)})
    meta = meta_through_checkpoint_file(op.snapshot_meta())
    twin, out = build(kind)
    with lsm.Store(str(path)) as store:
        restore_keyed(twin, store)
    twin.restore_meta(meta)
    return twin, out


def test_restored_window_drops_records_of_windows_closed_before_the_snapshot(tmp_path):
    op, out = build("window")
    track(op)
    op.push([("a", 1), ("a", 6)], 0, C0)
    op.push([("a", 8)], 0, C1)
    op.marker(C0, 0, None, False)
    op.marker(C1, 0, None, False)  # watermark 6: [0, 5) closed
    assert [r for recs, _ in out.batches for r in recs] == [("a", (0, [1]))]
    twin, twin_out = restored_copy("window", op, tmp_path / "store")
    for o in (op, twin):
        o.push([("a", 2), ("a", 9)], 1, C0)  # 2 is late: its window closed before the snapshot
        o.marker(C0, 1, None, True)
        o.marker(C1, 1, None, True)
    assert twin.late == op.late == 1
    assert twin_out.batches == out.batches[1:] == [([("a", (5, [6, 8, 9]))], 2)]


def test_restored_window_remembers_times_seen_since_the_last_marker(tmp_path):
    op, out = build("window")
    track(op)
    op.push([("a", 3)], 0, C0)
    op.push([("a", 4)], 0, C1)
    op.marker(C0, 0, None, False)
    op.marker(C1, 0, None, False)  # watermark 3: nothing closes
    op.push([("a", 12)], 1, C0)
    op.push([("b", 11)], 1, C1)  # snapshot here: the times 12 and 11 are in no watermark yet
    twin, twin_out = restored_copy("window", op, tmp_path / "store")
    for o in (op, twin):
        o.marker(C0, 1, None, False)
        o.marker(C1, 1, None, False)  # watermark 11: [0, 5) closes
    assert out.batches == [([("a", (0, [3, 4]))], 1)]
    assert twin_out.batches == out.batches
    assert twin_out.markers == out.markers[1:] == [(1, 11, False)]


def test_join_increments_are_the_values_each_side_appended():
    op, _ = build("join")
    track(op)
    op.push([("k", "l1"), ("j", "l1"), ("k", "l2")], 0, C0)
    op.push([("k", "r1")], 0, C1)
    assert op.take_increments() == ([("k", 0, 0), ("j", 0, 0), ("k", 0, 1), ("k", 1, 0)], ["l1", "l1", "l2", "r1"])
    assert op.take_increments() == ([], [])
    op.push([("j", "r1")], 1, C1)
    assert op.take_increments() == ([("j", 1, 0)], ["r1"])


def test_restored_join_sides_are_lists_to_append_to(tmp_path):
    op, _ = build("join")
    track(op)
    op.push([("k", "l1"), ("k", "l2")], 0, C0)
    op.push([("k", "r1")], 0, C1)
    twin, out = restored_copy("join", op, tmp_path / "store")
    assert twin.state == {"k": (["l1", "l2"], ["r1"])}
    twin.push([("k", "l3")], 1, C0)
    twin.push([("k", "r2")], 1, C1)
    assert [r for recs, _ in out.batches for r in recs] == [
        ("k", ("l3", "r1")),
        ("k", ("l1", "r2")),
        ("k", ("l2", "r2")),
        ("k", ("l3", "r2")),
    ]
    assert twin.state == {"k": (["l1", "l2", "l3"], ["r1", "r2"])}


def test_a_restored_operator_running_on_leaves_its_snapshot_as_it_was(tmp_path):
    """The state a restore takes from a store is the operator's own from then on: what it
    processes next changes it in place (a window's windows, a list a user function appends
    to), never what the store holds, which a later recovery, a rollback or a rewind reads."""
    op, _ = build("window")
    track(op)
    op.push([("a", 1)], 0, C0)
    path = str(tmp_path / "store")
    with lsm.Store(path) as store:
        store.append(1, {STATE: take_keyed(op)})
    with lsm.Store(path) as store:
        twin, _ = restored("window", op.snapshot_meta(), lambda o: restore_keyed(o, store))
        twin.push([("a", 2), ("a", 7)], 1, C0)
        assert twin.state == {"a": {0: [1, 2], 5: [7]}}
        assert store.load(STATE) == {"a": {0: [1]}}
        assert store.get(STATE, "a") == {0: [1]}


# -- key_by refuses keys the store cannot hold ----------------------------------------------


@pytest.mark.parametrize(
    "bad_key",
    [1.5, True, False, ("a", 2.0), ("ok", (None, True))],
    ids=["float", "true", "false", "tuple-float", "deep"],
)
def test_key_by_refuses_keys_the_store_cannot_hold(bad_key):
    p = ns.Pipeline("p")
    op = make_op(source(p).key_by(lambda r: bad_key if r == "bad" else r, name="by_bad").node)
    out = wire(op, ["in"])
    op.push(["x", "y"], 0, "in")
    with pytest.raises(RunFailed) as ei:
        op.push(["z", "bad"], 0, "in")
    assert "'by_bad'" in str(ei.value)
    assert out.batches == [([("x", "x"), ("y", "y")], 0)]  # nothing of the refused batch


def test_key_by_passes_every_key_type_the_store_holds():
    p = ns.Pipeline("p")
    good = [None, 0, -(2**63), 2**64 - 1, "s", b"b", ("t", (1, None, b"x")), ()]
    op = make_op(source(p).key_by(lambda i: good[i], name="by_good").node)
    out = wire(op, ["in"])
    op.push(list(range(len(good))), 0, "in")
    assert out.batches == [([(k, i) for i, k in enumerate(good)], 0)]


# -- outputs carry non-decreasing epochs -----------------------------------------------------


def test_outputs_carry_the_greatest_epoch_seen():
    p = ns.Pipeline("p")
    op = make_op(source(p).key_by(str).aggregate(int, lambda n, _: n + 1).node)
    out = wire(op, ["a", "b"])
    op.push([("k", 0)], 5, "a")
    op.push([("k", 0), ("j", 0)], 3, "b")
    assert out.batches == [([("k", 1)], 5), ([("k", 2), ("j", 1)], 5)]


@SETTINGS
@given(pushes=st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 20)), min_size=1, max_size=20))
def test_output_epochs_are_the_running_max(pushes):
    p = ns.Pipeline("p")
    op = make_op(source(p).key_by(str).aggregate(int, lambda n, _: n + 1).node)
    out = wire(op, ["a", "b"])
    expected = []
    top = -1
    for ch, epoch in pushes:
        op.push([("k", 0)], epoch, ch)
        top = max(top, epoch)
        expected.append(top)
    assert [e for _, e in out.batches] == expected


def counting(tmp_path):
    """An aggregate counting per key, tracked for persistence; the counts pushed to it, kept
    apart; a store; and `push(records, epoch)`, which feeds both."""
    p = ns.Pipeline("p")
    op = make_op(source(p, "s").key_by(lambda r: r[0]).aggregate(lambda: 0, lambda a, v: a + v, name="c").node)
    wire(op, CHANNELS)
    track(op)
    counts: collections.Counter = collections.Counter()
    store = lsm.Store(str(tmp_path / "s"))

    def push(records, epoch):
        op.push(records, epoch, C0)
        for k, v in records:
            counts[k] += v

    return op, counts, store, push


def test_a_count_logs_pairs_while_keys_are_new_and_changed_keys_while_they_repeat(tmp_path):
    """An aggregate of ints logs its updates as pairs; an interval that updated its keys more
    than twice each on average makes it note changed keys instead, and an interval whose keys
    are mostly new makes it log pairs again. The store holds the same counts either way."""
    op, counts, store, push = counting(tmp_path)
    op.full_after = math.inf  # changes only: the state taken whole is the next test's

    def snapshot(seq):
        u = op.take_updates()
        store.append(seq, {"c": u})
        return u

    push([(f"k{i % 10}", 1) for i in range(100)], 0)  # 100 updates of 10 keys
    u = snapshot(1)
    assert sum(n for n, _ in u.pairs) == 100 and not u.keys and op.by_keys
    push([(f"k{i % 10}", 2) for i in range(50)], 1)
    u = snapshot(2)
    assert not u.pairs and sorted(u.keys) == [f"k{i}" for i in range(10)] and op.by_keys
    assert store.load("c") == dict(counts)
    push([(f"n{i}", 1) for i in range(40)], 2)  # 40 new keys: most updates of keys not noted before
    u = snapshot(3)
    assert len(u.keys) == 40 and not op.by_keys
    push([(f"m{i}", 1) for i in range(30)] + [("k1", 5)], 3)
    u = snapshot(4)
    assert sum(n for n, _ in u.pairs) == 31 and not u.keys
    assert store.load("c") == dict(counts)
    # after seq 2: 10 updates of 1 and 5 of 2 per key
    assert store.load("c", as_of=2) == {f"k{i}": 20 for i in range(10)}
    store.close()


def test_a_count_whose_updates_outnumber_its_keys_is_taken_whole(tmp_path):
    """Once the updates since the state was last taken whole outnumber its keys, the next
    snapshot writes every live key as one full run (a key column and a value column: a restore
    reads it alone), whatever the values' type (tuples come back as tuples). A snapshot with
    no update since the state was taken whole writes nothing. The store holds the counts, and
    a load reads the full run and what came after it only."""
    op, counts, store, push = counting(tmp_path)

    push([(f"k{i}", 1) for i in range(20)], 0)  # 20 updates of 20 new keys: not more
    u = op.take_updates()
    assert not u.full and sum(n for n, _ in u.pairs) == 20
    store.append(1, {"c": u})
    push([(f"k{i % 5}", 1) for i in range(30)], 1)  # 50 updates since, of 20 keys
    u = op.take_updates()
    assert u.full and not u.pairs and sorted(u.keys) == sorted(f"k{i}" for i in range(20))
    store.append(2, {"c": u})
    # the interval before had more updates (30) than keys (20): the next is taken whole too,
    # once something changed
    assert changes(op.take_updates()) == {}
    push([("k1", 4), ("new", 1)], 2)
    u = op.take_updates()
    assert u.full and not u.pairs and len(u.keys) == 21
    store.append(3, {"c": u})
    push([("k2", 1)], 3)  # 2 updates in the interval before: changes again
    u = op.take_updates()
    assert not u.full and sum(n for n, _ in u.pairs) == 1
    store.append(4, {"c": u})
    assert store.load("c") == dict(counts)
    assert [lo for lo, _, _ in store.runs("c")] == [3, 4], "a load reads from the full run on"
    assert store.load("c", as_of=1) == {f"k{i}": 1 for i in range(20)}
    # values whose type must come back (tuples): taken whole too, and they come back
    q = ns.Pipeline("q")
    op = make_op(source(q, "s").key_by(lambda r: r[0]).aggregate(tuple, lambda a, v: (*a, v), name="t").node)
    wire(op, CHANNELS)
    track(op)
    op.push([(f"t{i % 3}", i) for i in range(30)], 0, C0)
    u = op.take_updates()
    assert u.full and sorted(u.keys) == ["t0", "t1", "t2"]
    store.append(5, {"t": u})
    assert store.load("t") == {f"t{j}": tuple(range(j, 30, 3)) for j in range(3)}
    store.close()


def test_a_state_still_loading_is_not_taken_whole(tmp_path):
    """A restore that loads its state in the background: until it is installed, the state
    holds only the keys records touched, so a snapshot then writes their changes, never a
    full run (which would hide every key not loaded yet)."""
    op, counts, store, push = counting(tmp_path)
    push([(f"k{i}", 1) for i in range(100)], 0)
    store.append(1, {"c": op.take_updates()})
    restored_op, _, _, _ = counting(tmp_path / "again")
    restored_op.lazy(lambda key: store.get("c", key, default=MISSING_STATE), raw=True)
    restored_op.push([(f"k{i % 3}", 1) for i in range(30)], 1, C0)  # 30 updates of 3 keys
    for i in range(3):
        counts[f"k{i}"] += 10
    u = restored_op.take_updates()
    assert not u.full
    store.append(2, {"c": u})
    assert store.load("c") == dict(counts)
    store.close()


def test_updates_are_not_noted_while_the_state_is_to_be_taken_whole(tmp_path):
    """From the start, and once the state was taken whole, while the next snapshot is to take
    it whole processing notes nothing per record (no pairs, no changed keys); that snapshot
    writes every key with its value then, a tuple among them, and the store holds every
    count."""
    op, counts, store, push = counting(tmp_path)
    push([(f"k{i % 10}", 1) for i in range(40)], 0)
    # more updates than keys since the start: the first snapshot takes the state whole, and
    # nothing was noted meanwhile either
    assert not op.pairs and not op.dirty
    u = op.take_updates()
    assert u.full and not u.pairs and sorted(u.keys) == sorted(counts)
    store.append(1, {"c": u})
    push([(f"k{i % 10}", 1) for i in range(40)], 1)  # 40 updates: the next is whole too
    assert not op.pairs and not op.dirty
    op.state["k3"] = counts["k3"] = (1, 2)  # a tuple must come back
    u = op.take_updates()
    assert u.full and sorted(u.keys) == sorted(counts)
    store.append(2, {"c": u})
    assert store.load("c") == dict(counts)
    store.close()


def test_a_state_of_more_keys_than_full_max_keys_is_never_taken_whole(tmp_path, monkeypatch):
    """Past FULL_MAX_KEYS (lowered here to 10), updates that outnumber the keys many times over
    still make snapshots of changes, never a run of the whole state; the store holds the counts."""
    monkeypatch.setattr("nosync.runtime.keyed.FULL_MAX_KEYS", 10)
    op, counts, store, push = counting(tmp_path)
    for seq in range(1, 4):
        push([(f"k{i % 20}", 1) for i in range(100)], seq - 1)  # 100 updates of 20 keys
        u = op.take_updates()
        assert not u.full
        store.append(seq, {"c": u})
    assert store.load("c") == dict(counts) == {f"k{i}": 15 for i in range(20)}
    store.close()


def bulk_loading(tmp_path):
    """A count of 5,000 keys saved at seq 1 (every key at 7), and a restored count whose state a
    BulkLoader loads (nothing loaded yet)."""
    from nosync.modes.nosync import recovery

    _, _, store, _ = counting(tmp_path)
    store.append(1, {0: lsm.Updates([f"k{i}" for i in range(5000)], [7] * 5000)})
    restored, _, _, _ = counting(tmp_path / "again")
    return recovery.BulkLoader(store, [(0, restored)], as_of=1), restored, store


def test_a_key_read_alone_while_the_state_loads_costs_no_load(tmp_path):
    loader, op, store = bulk_loading(tmp_path)
    op.push([("k3", 1), ("new", 1)], 0, C0)
    assert op.state == {"k3": 8, "new": 1}
    assert loader.loading and not loader.done and loader.seconds == 0.0
    assert loader.keys_read_alone() == 2
    store.close()


def test_keys_read_alone_see_the_state_as_of_the_snapshot_not_later_appends(tmp_path):
    """The reader is the store as of the restored snapshot's seq: what the restored worker
    appends afterwards (its own new snapshots) is not read back as restored state."""
    loader, op, store = bulk_loading(tmp_path)
    store.append(2, {0: lsm.Updates(["k3", "k4"], [100, lsm.TOMBSTONE])})
    op.push([("k3", 1), ("k4", 1)], 0, C0)
    assert op.state == {"k3": 8, "k4": 8}
    store.close()


def test_a_reader_that_could_not_be_built_raises_on_the_processing_thread(tmp_path):
    """The reader is built on a thread of its own as the load starts; when the store cannot
    give it (a seq merged away), the first key read alone raises the store's error where the
    record is processed, not nothing on a thread nobody joins."""
    from nosync.modes.nosync import recovery

    op, _, _, _ = counting(tmp_path)
    store = lsm.Store(str(tmp_path / "merged"), retention=0)
    store.append(1, {0: lsm.Updates(["k1"], [7])})
    store.append(2, {0: lsm.Updates(["k1"], [8])})
    store.compact()
    recovery.BulkLoader(store, [(0, op)], as_of=1)
    with pytest.raises(lsm.RetentionError):
        op.push([("k1", 1)], 0, C0)
    store.close()


def test_what_a_load_made_is_frozen_part_by_part(tmp_path):
    """Each part a restore's load applies (between records) is frozen as it is made: the
    collector's full passes would otherwise walk the growing state again and again."""
    import gc

    from nosync.modes.nosync import recovery

    op, _, _, _ = counting(tmp_path)
    store = lsm.Store(str(tmp_path / "lists"), retention=0)
    store.append(1, {0: lsm.Updates([f"k{i}" for i in range(5000)], [[i] for i in range(5000)])})
    store.flush(timeout=60)
    store._persister.drain_index()  # read from the disk tier, as a restore reads it
    loader = recovery.BulkLoader(store, [(0, op)], as_of=1)
    try:
        parts = applied = 0
        while loader.loading:
            loader.advance(0)
            parts += 1
            made = loader._part
            applied = max(applied, len(made))
            # gc.get_objects lists what the collector walks: nothing frozen
            walked = {id(o) for o in gc.get_objects()}
            assert not [k for k, v in made.items() if id(v) in walked], f"part {parts} not frozen"
        assert applied == len(loader.done[0]) == 5000
        assert parts > 1, "loaded in one part"
    finally:
        gc.unfreeze()
        store.close()


def test_a_stopped_load_leaves_no_reader_being_built(tmp_path):
    """A replaced attempt stops its load and then closes its store: `stop` waits for the
    readers still being built on their threads, so that none reads a store being closed."""
    import threading

    from nosync.modes.nosync import recovery

    op, _, _, _ = counting(tmp_path)
    store = lsm.Store(str(tmp_path / "big"), budget=0.0)
    for seq in range(1, 21):
        store.append(seq, {0: lsm.Updates([f"k{seq}-{i}" for i in range(20_000)], [seq] * 20_000)})
    store.flush(timeout=60)
    store._persister.drain_index()
    loader = recovery.BulkLoader(store, [(0, op)], as_of=20)
    loader.stop()
    assert not [t for t in threading.enumerate() if t.name == "nosync-index"]
    assert not loader.loading
    store.close()


def test_a_state_loads_in_parts_with_records_between_them(tmp_path):
    """A merged run of 5,000 keys loads a block at a time (`advance` with no time to spare
    does one part); records between two parts read their keys alone, and the state installed
    at the end holds every saved key and what the records did, a key they deleted included."""
    from nosync.modes.nosync import recovery

    op, _, _, _ = counting(tmp_path)
    store = lsm.Store(str(tmp_path / "merged"), retention=0)
    store.append(1, {0: lsm.Updates([f"k{i}" for i in range(5000)], [7] * 5000)})
    store.append(2, {0: lsm.Updates(["k1", "k2"], [8, 8])})
    store.compact()
    assert [(lo, hi) for lo, hi, _ in store.runs(0)] == [(1, 2)], "the runs were not merged"
    loader = recovery.BulkLoader(store, [(0, op)], as_of=2)
    parts = 0
    while loader.loading:
        loader.advance(0)
        parts += 1
        if parts == 2:
            op.push([("k1", 1), ("k2", 1), ("k4999", 1), ("new", 1)], 0, C0)
            del op.state["k2"]  # as a deletion by a record leaves it: looked up, not there
    assert parts >= 5000 // lsm.run.BLOCK, f"loaded in {parts} parts"
    assert op.state == {"k1": 9, "k4999": 8, "new": 1}

    class Hooks:
        loader = None

    class W:
        hooks = Hooks()

    W.hooks.loader = loader
    assert loader.install_done(W) and W.hooks.loader is None
    want = {f"k{i}": 7 for i in range(5000)} | {"k1": 9, "k4999": 8, "new": 1}
    del want["k2"]
    assert op.state == want
    store.close()
