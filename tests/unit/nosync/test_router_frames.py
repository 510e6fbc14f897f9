"""The sending end of an exchange (`router.Router`) cuts its buffer into frames by record
count; records large enough that a buffer's frame would pass the frame's size limit go in
more frames, in their order, and a single record that cannot fit fails the run naming the
operator it was going to. The share of an exchange that stays on its worker reaches the
operator as the frames' records do, and a record msgpack cannot encode fails naming the operator
it comes from. The frames are encoded and decoded for real; the worker is a stand-in for what
the router uses of it."""

from __future__ import annotations

import types

import pytest

from nosync.errors import RunFailed
from nosync.runtime import frames
from nosync.runtime.graph import partition_of
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.router import Router


class RecordingHooks(WorkerHooks):
    """Encodes every frame as a connection would send it, and keeps it decoded."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int, frames.Frame]] = []

    def send_frame(self, worker, dest, kind, header, data) -> None:
        self.sent.append((dest, frames.decode(frames.encode_packed(kind, header, data))))


def router(batch_size: int, workers: int = 2) -> tuple[Router, RecordingHooks, list]:
    """A router on worker 0 of `workers`; the third item collects what the local operator gets."""
    hooks = RecordingHooks()
    worker = types.SimpleNamespace(
        workers=workers, index=0, hooks=hooks, batch_size=batch_size, clock=types.SimpleNamespace(ts=0.0)
    )
    local: list = []
    src = types.SimpleNamespace(name="by_doc", node=types.SimpleNamespace(where="docs.py:7"))
    dst = types.SimpleNamespace(name="count_docs", push=lambda recs, epoch, chan: local.extend(recs))
    return Router(worker, 0, src, dst), hooks, local


KEY = next(f"k{i}" for i in range(100) if partition_of(f"k{i}", 2) == 1)
"""A key worker 1 owns: its records leave worker 0 in frames."""
MINE = next(f"k{i}" for i in range(100) if partition_of(f"k{i}", 2) == 0)
"""A key worker 0 owns: its records stay there."""


def test_records_too_large_for_one_frame_go_in_several_in_their_order():
    docs = [(KEY, chr(97 + i) * (17 << 20)) for i in range(5)]  # 85 MiB in all
    r, hooks, _ = router(batch_size=5)
    r.push(docs, 0, None)
    assert [d for d, _ in hooks.sent] == [1, 1]
    got = [rec for _, f in hooks.sent for rec in f.body]
    assert [(k, v[0], len(v)) for k, v in got] == [(KEY, chr(97 + i), 17 << 20) for i in range(5)]
    assert all(f.header["epoch"] == 0 and f.header["edge"] == 0 for _, f in hooks.sent)


def test_records_that_fit_go_in_one_frame():
    r, hooks, _ = router(batch_size=3)
    r.push([(KEY, "a"), (KEY, "b"), (KEY, "c")], 0, None)
    assert [(d, f.body) for d, f in hooks.sent] == [(1, ((KEY, "a"), (KEY, "b"), (KEY, "c")))]


def test_a_record_larger_than_a_frame_fails_naming_the_operator():
    r, _, _ = router(batch_size=1)
    with pytest.raises(RunFailed, match=r"record of 73,400,3\d\d bytes on its way to operator 'count_docs'"):
        r.push([(KEY, "x" * (70 << 20))], 0, None)


def test_the_local_share_reaches_the_operator_as_the_sent_share_does():
    value = {"tags": ["a", ["b", 1]], "pair": ("x", 0), "raw": bytearray(b"z")}
    r, hooks, local = router(batch_size=1)
    r.push([(MINE, value), (KEY, value)], 0, None)
    ((_, frame),) = hooks.sent
    sent = frame.body[0]
    here = local[0]
    # what arrives from another worker: every array a tuple, bytes for bytearray
    assert sent == (KEY, {"tags": ("a", ("b", 1)), "pair": ("x", 0), "raw": b"z"})
    assert here == (MINE, sent[1])
    assert type(here) is tuple and type(here[1]["tags"]) is tuple and type(here[1]["raw"]) is bytes


def test_one_worker_hands_on_records_as_several_would():
    r, _, local = router(batch_size=1, workers=1)
    r.push([(MINE, ["a", [1, 2]])], 0, None)
    assert local == [(MINE, ("a", (1, 2)))]
    assert type(local[0][1]) is tuple and type(local[0][1][1]) is tuple


def test_a_key_holding_a_list_goes_where_its_tuple_goes():
    key = next(["k", i] for i in range(100) if partition_of(("k", i), 2) == 1)
    r, hooks, local = router(batch_size=1)
    r.push([(key, 1), (("k", key[1]), 2)], 0, None)
    assert [(d, f.body) for d, f in hooks.sent] == [(1, ((("k", key[1]), 1), (("k", key[1]), 2)))]
    assert local == []


@pytest.mark.parametrize(
    ("value", "error"),
    [({1, 2}, "can not serialize 'set' object"), (2**70, "Integer value out of range"), (object(), "object")],
)
def test_a_record_msgpack_cannot_encode_fails_naming_the_operator_it_comes_from(value, error):
    for key in (MINE, KEY):  # the share that stays and the share that leaves alike
        r, hooks, local = router(batch_size=1)
        with pytest.raises(RunFailed) as e:
            r.push([(key, "fine"), (key, value)], 0, None)
        msg = str(e.value)
        assert msg.startswith(
            "operator 'by_doc' (declared at docs.py:7) emitted a record that cannot cross an exchange"
        )
        assert error in msg and repr((key, value))[:40] in msg
        assert "None, bool, int" in msg
