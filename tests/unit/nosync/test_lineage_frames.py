"""Lineage entries travel with the frames of mode nosync (causal logging). A backlog of them
(a peer that reconnected, a link that carries little) does not fit in a frame's header, whose
size is bounded: it goes in a LINEAGE frame of its own, just before the frame, on the same
link, so the receiver holds every entry before it processes the frame. Real frames over a
real socket pair; the workers at both ends are stand-ins for what the hooks use of them."""

from __future__ import annotations

import socket
from pathlib import Path

import msgpack
import pytest

from nosync.errors import RunFailed
from nosync.modes.nosync import HEADER_LINEAGE, NosyncHooks
from nosync.modes.nosync.messages import NosyncOp
from nosync.modes.nosync.outlog import OutputLog
from nosync.runtime import channels, frames

RECORDS = msgpack.packb([["a", 1]])
"""The packed body of a data frame."""


class StandInWorker:
    def __init__(self, index: int, out: dict | None = None) -> None:
        self.index = index
        self.out = out or {}
        self.credited: list[int] = []

    def credit(self, j: int) -> None:
        self.credited.append(j)


def sending_hooks(spill_dir: Path) -> NosyncHooks:
    """Hooks of a worker that sends: with the output log `on_start` gives them (in memory;
    the spill file, under `spill_dir`, is never needed at this size)."""
    hooks = NosyncHooks({})
    hooks.outlog = OutputLog(str(spill_dir / "outlog.spill"), hooks.max_out_mem)
    return hooks


def entries(first_step: int, n: int, peer: int) -> list[tuple]:
    """n lineage entries of frames from `peer`, at steps and chan_seqs of a long run."""
    return [(first_step + k, ("i", peer, first_step + k)) for k in range(n)]


def send_and_receive(
    held: dict[int, list[tuple]], spill_dir: Path
) -> tuple[list[frames.Frame], NosyncHooks, StandInWorker]:
    """Worker 0 of 4, holding `held` (origin -> entries), sends worker 3 one data frame;
    returns the frames that arrive, and worker 3's hooks after it accepted them."""
    a, b = socket.socketpair()
    try:
        conn = channels.Connection(a, "w3", credits=channels.INITIAL_CREDITS)
        sender = sending_hooks(spill_dir)
        for origin, got in held.items():
            sender.stash.add(origin, got)
        sender.up[3] = True
        sender.send_frame(StandInWorker(0, {3: conn}), 3, frames.DATA, {"e": 0}, RECORDS)
        while not conn.flush():
            pass
        a.shutdown(socket.SHUT_WR)
        reader, got = frames.FrameReader(), []
        while chunk := b.recv(1 << 20):
            got += reader.feed(chunk)
    finally:
        a.close()
        b.close()
    me = StandInWorker(3)
    receiver = NosyncHooks({})
    receiver.w = me
    for f in got:
        receiver.accept_frame(me, 0, f)
    return got, receiver, me


def test_a_backlog_goes_in_a_lineage_frame_just_before_the_data_frame(tmp_path):
    held = {0: entries(70_001, 2500, 3), 1: entries(90_001, 2500, 2), 2: entries(80_001, 2500, 1)}
    got, receiver, me = send_and_receive(held, tmp_path)
    assert [f.kind for f in got] == [frames.LINEAGE, frames.DATA]
    assert got[0].header == {"more": 1}
    assert "lin" not in got[1].header and got[1].header["s"] == 1
    for origin in (0, 1, 2):
        assert receiver.stash.entries(origin) == held[origin]
    # the lineage frame took a credit like a data frame, and is returned like one
    assert me.credited == [0]
    assert receiver.consumed == {0: 1}


def test_a_few_entries_ride_in_the_header(tmp_path):
    held = {0: entries(70_001, 40, 3), 2: entries(80_001, HEADER_LINEAGE - 40, 1)}
    got, receiver, _ = send_and_receive(held, tmp_path)
    assert [f.kind for f in got] == [frames.DATA]
    assert sorted(got[0].header["lin"]) == [0, 2]
    for origin in (0, 2):
        assert receiver.stash.entries(origin) == held[origin]


def test_a_broadcast_gives_each_destination_its_own_lineage(tmp_path):
    """A marker goes to every peer with one header: the lineage handed to the first must not
    ride on to the next, which had been handed it already."""
    sender = sending_hooks(tmp_path)  # worker 0 of 3; no link up, so the frames stay in its output log
    me = StandInWorker(0)
    sender.stash.add(0, entries(501, 10, 1))
    sender.send_frame(me, 2, frames.DATA, {"e": 0}, RECORDS)  # worker 2 is handed them now
    header = {"edge": 0, "epoch": 1}
    for dest in (1, 2):
        sender.send_frame(me, dest, frames.MARKER, header, msgpack.packb(None))

    def last_header(dest: int) -> dict:
        (f,) = frames.FrameReader().feed(sender.outlog.since(dest, 1)[-1])
        return f.header

    assert last_header(1)["lin"] == {0: tuple(entries(501, 10, 1))}
    assert "lin" not in last_header(2)
    assert (last_header(1)["s"], last_header(2)["s"]) == (1, 2)


def test_a_durable_point_drops_the_fingerprints_it_covers_and_keeps_the_rest(tmp_path):
    """A receiver keeps the fingerprint of every frame it processed from a peer, to check a
    frame the peer re-produces after a recovery; once the peer's durable point covers a frame,
    the peer never re-produces it, and its fingerprint goes."""
    sender = sending_hooks(tmp_path)  # worker 0; no link up: the frames stay in its output log
    for k in range(5):
        sender.send_frame(StandInWorker(0), 3, frames.DATA, {"e": 0}, msgpack.packb([["a", k]]))
    sent = frames.FrameReader().feed(b"".join(sender.outlog.since(3, 1)))
    me = StandInWorker(3)
    me.sinks = []
    receiver = NosyncHooks({})
    receiver.w = me
    receiver.outlog = OutputLog(str(tmp_path / "receiver.spill"), receiver.max_out_mem)
    assert [receiver.accept_frame(me, 0, f) for f in sent] == [True] * 5
    point = {"step": 0, "consumed": {}, "produced": {3: 3}}
    receiver.on_control(me, {"op": NosyncOp.POINTS, "points": {0: point, 3: point}, "safe": -1})
    assert sorted(receiver.fps[0]) == [4, 5]
    # a frame not covered yet, re-produced with other records, is still caught
    (other,) = frames.FrameReader().feed(frames.encode_packed(frames.DATA, {**sent[3].header, "fp": 1}, RECORDS))
    with pytest.raises(RunFailed, match="re-produced with different records"):
        receiver.accept_frame(me, 0, other)
