"""Control messages (`nosync.runtime.control`): every kind crosses msgpack as itself, and a map
that is no message is a FrameError naming what is wrong, never a crash or a guess."""

from __future__ import annotations

import msgpack
import pytest

from nosync.errors import FrameError
from nosync.runtime import control

MESSAGES = [
    control.Register(worker=1, attempt=2, addr=["127.0.0.1", 4242], gen=3, pid=99, read=1000),
    control.Register(worker=0, attempt=0, addr=["h", 1]),
    control.Ready(4),
    control.Heartbeat(4, {"worker": 1, "read": 10, "committed": 5, "frontier": 2, "idle": False}),
    control.Heartbeat(4, {"read": 10}, beat=31),
    control.Lease(31),
    control.Zombie(commits=2, writes=1),
    control.Replaced("no heartbeat for 1.6 s"),
    control.Done(4, {"read": 10, "operators": {}}, 1.5),
    control.Error("worker 1: bad frame"),
    control.Peers(5, [["a", 1], ["b", 2]], {"restore": {"checkpoint": 3}, "alone": True}),
    control.Rejoin(6),
    control.Hold(),
    control.Finish(),
    control.Abort("worker 0 was lost"),
    control.ModeMessage("ack", 7, {"n": 3, "read": 12}),
    control.ModeMessage("points", None, {}),
]


def _through_msgpack(d: dict) -> dict:
    return msgpack.unpackb(msgpack.packb(d, use_bin_type=True), raw=False, use_list=True, strict_map_key=False)


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_crosses_the_wire_as_itself(msg):
    assert control.from_wire(_through_msgpack(control.to_wire(msg))) == msg


def test_the_wire_form_is_a_map_with_its_type():
    assert control.to_wire(control.Rejoin(6)) == {"type": "rejoin", "gen": 6}
    assert control.to_wire(control.Heartbeat(2, {"read": 5}, 8)) == {
        "type": "heartbeat",
        "gen": 2,
        "read": 5,
        "beat": 8,
    }
    assert control.to_wire(control.Lease(8)) == {"type": "lease", "beat": 8}
    assert control.to_wire(control.mode_message("trigger", gen=1, n=4)) == {
        "type": "mode",
        "op": "trigger",
        "gen": 1,
        "n": 4,
    }


@pytest.mark.parametrize(
    ("wire", "says"),
    [
        ([1, 2], "not a map"),
        ({"type": "reboot"}, "unknown type 'reboot'"),
        ({}, "unknown type None"),
        ({"type": "rejoin"}, "malformed rejoin"),
        ({"type": "ready", "gen": 1, "extra": 2}, "malformed ready"),
        ({"type": "register", "worker": 0}, "malformed register"),
        ({"type": "peers", "gen": 1}, "malformed peers"),
        ({"type": "mode", "gen": 1}, "malformed mode"),
        ({"type": "heartbeat", "gen": "x"}, "malformed heartbeat"),
    ],
)
def test_a_map_that_is_no_message_is_refused_naming_why(wire, says):
    with pytest.raises(FrameError, match=says):
        control.from_wire(wire)
