"""The sending end of an exchange (`worker.Router`) cuts its buffer into frames by record
count; records large enough that a buffer's frame would pass the frame's size limit go in
more frames, in their order, and a single record that cannot fit fails the run naming the
operator it was going to. The frames are encoded and decoded for real; the worker is a
stand-in for what the router uses of it."""

from __future__ import annotations

import types

import pytest

from nosync import frames
from nosync.errors import RunFailed
from nosync.modes import WorkerHooks
from nosync.worker import Router, partition_of


class RecordingHooks(WorkerHooks):
    """Encodes every frame as a connection would send it, and keeps it decoded."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int, frames.Frame]] = []

    def send_frame(self, worker, dest, kind, header, data) -> None:
        self.sent.append((dest, frames.decode(frames.encode_packed(kind, header, data))))


def router(batch_size: int) -> tuple[Router, RecordingHooks]:
    hooks = RecordingHooks()
    worker = types.SimpleNamespace(
        workers=2, index=0, hooks=hooks, batch_size=batch_size, clock=types.SimpleNamespace(ts=0.0)
    )
    dst = types.SimpleNamespace(name="count_docs", push=lambda *a: None)
    return Router(worker, 0, dst), hooks


KEY = next(f"k{i}" for i in range(100) if partition_of(f"k{i}", 2) == 1)
"""A key worker 1 owns: its records leave worker 0 in frames."""


def test_records_too_large_for_one_frame_go_in_several_in_their_order():
    docs = [(KEY, chr(97 + i) * (17 << 20)) for i in range(5)]  # 85 MiB in all
    r, hooks = router(batch_size=5)
    r.push(docs, 0, None)
    assert [d for d, _ in hooks.sent] == [1, 1]
    got = [rec for _, f in hooks.sent for rec in f.body]
    assert [(k, v[0], len(v)) for k, v in got] == [(KEY, chr(97 + i), 17 << 20) for i in range(5)]
    assert all(f.header["epoch"] == 0 and f.header["edge"] == 0 for _, f in hooks.sent)


def test_records_that_fit_go_in_one_frame():
    r, hooks = router(batch_size=3)
    r.push([(KEY, "a"), (KEY, "b"), (KEY, "c")], 0, None)
    assert [(d, f.body) for d, f in hooks.sent] == [(1, ((KEY, "a"), (KEY, "b"), (KEY, "c")))]


def test_a_record_larger_than_a_frame_fails_naming_the_operator():
    r, _ = router(batch_size=1)
    with pytest.raises(RunFailed, match=r"record of 73,400,3\d\d bytes on its way to operator 'count_docs'"):
        r.push([(KEY, "x" * (70 << 20))], 0, None)
