"""How the recovering worker merges what the span job's tasks wrote (`load_results`).

Task files are written here as a task writes them (msgpack); the expectations are the order a
streaming worker stages records in: by step, then by the keyed push that produced them, each
task's records of one push in their own order."""

from __future__ import annotations

import msgpack
import pytest

from nosync import codec
from nosync.errors import RunFailed
from nosync.modes.nosync.span import load_results


def write_task(d, t: int, sinks: dict, keyed: dict | None = None, meta: dict | None = None) -> None:
    body = {
        "task": t,
        "keyed": keyed or {},
        "meta": meta or {"count": {"last_epoch": 3}, "out": {"last_epoch": 3}},
        "sinks": {
            name: [(step, ordinal, epoch, codec.pack_state(recs)) for step, ordinal, epoch, recs in rows]
            for name, rows in sinks.items()
        },
        "read": 100,
        "folded": 50,
        "seconds": 0.1,
    }
    (d / f"t{t}.msgpack").write_bytes(msgpack.packb(body, use_bin_type=True))


def test_sink_records_come_back_in_step_then_push_order(tmp_path):
    write_task(tmp_path, 0, {"out": [(5, 1, 0, [("a", 1)]), (9, 4, 1, [("a", 2)])]})
    write_task(tmp_path, 1, {"out": [(5, 2, 0, [("b", 1)]), (7, 3, 0, [("c", 1), ("b", 2)])]})
    got = load_results(str(tmp_path), 2, ordered=set())
    assert got["sinks"]["out"] == [
        (0, [("a", 1)]),
        (0, [("b", 1)]),
        (0, [("c", 1), ("b", 2)]),
        (1, [("a", 2)]),
    ]
    assert got["read"] == 100  # every task reads the whole span: counted once
    assert got["folded"] == 100


def test_an_operator_takes_the_latest_epoch_any_task_reached(tmp_path):
    write_task(tmp_path, 0, {"out": []}, meta={"count": {"last_epoch": 3, "frontier": 2}})
    write_task(tmp_path, 1, {"out": []}, meta={"count": {"last_epoch": 5, "frontier": 2}})
    got = load_results(str(tmp_path), 2, ordered=set())
    assert got["meta"]["count"] == {"last_epoch": 5, "frontier": 2}


def test_keyed_state_of_every_task_is_kept(tmp_path):
    write_task(tmp_path, 0, {}, keyed={2: [("a", 3, False)]})
    write_task(tmp_path, 1, {}, keyed={2: [("b", None, True)]})
    got = load_results(str(tmp_path), 2, ordered=set())
    assert sorted(got["keyed"][2]) == [("a", 3, False), ("b", None, True)]


def test_one_key_written_by_two_tasks_in_one_push_is_refused_where_order_matters(tmp_path):
    # a keyed push whose outputs, re-keyed, write key 7 from both tasks: which came last is lost
    write_task(tmp_path, 0, {"kv": [(5, 1, 0, [(7, "x")])]})
    write_task(tmp_path, 1, {"kv": [(5, 1, 0, [(7, "y")])]})
    with pytest.raises(RunFailed, match="sink 'kv': key 7 was written by two tasks in one step"):
        load_results(str(tmp_path), 2, ordered={"kv"})
    # a sink whose output is a multiset per epoch takes them in either order
    assert len(load_results(str(tmp_path), 2, ordered=set())["sinks"]["kv"]) == 2


def test_one_key_written_by_two_tasks_in_different_pushes_is_ordered(tmp_path):
    write_task(tmp_path, 0, {"kv": [(5, 1, 0, [(7, "x")])]})
    write_task(tmp_path, 1, {"kv": [(5, 2, 0, [(7, "y")])]})
    got = load_results(str(tmp_path), 2, ordered={"kv"})
    assert got["sinks"]["kv"] == [(0, [(7, "x")]), (0, [(7, "y")])]
