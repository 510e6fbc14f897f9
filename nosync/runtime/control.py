"""Control messages between the coordinator and the workers, typed: one frozen dataclass per
kind, a msgpack map with a "type" on the wire (`to_wire`, `from_wire`).

A worker registers (`Register`), says it runs a generation (`Ready`), beats (`Heartbeat`, with
its counters), hands over a record its sources could not read (`DeadLetter`: the driver keeps
the run's dead letters), reports the end of its input (`Done`) or why it stops (`Error`). The coordinator
sends the peers of a generation (`Peers`), moves everyone to a new one (`Rejoin`), holds a
generation back (`Hold`), stops the sources at an epoch boundary (`Stop`), ends the run
(`Finish`) or aborts it (`Abort`), and tells a worker it
suspected that it was replaced (`Replaced`). It answers every beat with a `Lease`: the worker
may commit only while the beat it last heard answered is recent (`Links.fence`). A replaced
process that wakes reports what it refused (`Zombie`) and stops. A spare process is told it
stands by (`Standby`), and later which worker it becomes (`Promote`). A mode's own messages travel
both ways as `ModeMessage`: its operation (each mode names its operations in an enum)
and a map of what goes with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from nosync.errors import FrameError


class Kind(StrEnum):
    """The "type" of a control message on the wire."""

    REGISTER = "register"
    READY = "ready"
    HEARTBEAT = "heartbeat"
    DONE = "done"
    ERROR = "error"
    DEAD_LETTER = "dead_letter"
    PEERS = "peers"
    REJOIN = "rejoin"
    HOLD = "hold"
    FINISH = "finish"
    ABORT = "abort"
    REPLACED = "replaced"
    STANDBY = "standby"
    PROMOTE = "promote"
    LEASE = "lease"
    ZOMBIE = "zombie"
    STOP = "stop"
    MODE = "mode"


@dataclass(frozen=True)
class Register:
    """A worker joins generation `gen` (-1: whichever the coordinator is in) from `addr`; `read`
    counts the records it had read when its last generation ended (None: nothing restored yet);
    `task`: Spark's id of its task attempt (-1: not a Spark task), by which the driver has Spark
    kill a worker it suspects."""

    worker: int
    attempt: int
    addr: list
    gen: int = -1
    pid: int = 0
    read: int | None = None
    task: int = -1


@dataclass(frozen=True)
class Ready:
    """The worker runs generation `gen`: its operators are built and restored."""

    gen: int


@dataclass(frozen=True)
class Heartbeat:
    """The worker is alive in generation `gen`; `counters`: what it read and committed so far;
    `beat`: its number, which the coordinator's `Lease` names (-1: none asked for)."""

    gen: int
    counters: dict = field(default_factory=dict)
    beat: int = -1


@dataclass(frozen=True)
class Done:
    """The worker's input is exhausted and committed in generation `gen`: its metrics."""

    gen: int
    metrics: dict
    seconds: float


@dataclass(frozen=True)
class Error:
    """Why the worker stops, or what it refused (a malformed frame from a peer)."""

    message: str


@dataclass(frozen=True)
class DeadLetter:
    """A record source `source` of the worker could not read: its file, its position there and
    why (`error`), for the run's dead-letter file of worker `worker`."""

    worker: int
    source: str
    file: str
    position: Any
    error: str


@dataclass(frozen=True)
class Peers:
    """The members of generation `gen` (an address per worker) and what the mode adds for them
    (`extra`: which snapshot or checkpoint to restore, whether the worker recovers alone)."""

    gen: int
    addresses: list
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Rejoin:
    """Drop every data connection and register for generation `gen`."""

    gen: int


@dataclass(frozen=True)
class Hold:
    """The next generation is held back (state being recomputed): keep waiting."""


@dataclass(frozen=True)
class Finish:
    """Every worker is done: stop."""


@dataclass(frozen=True)
class Abort:
    """The run failed, for `reason`: stop now."""

    reason: str


@dataclass(frozen=True)
class Replaced:
    """This attempt was suspected (silent past the failure timeout) and is replaced, for
    `reason`: a process that reads this woke from a hang or a pause, a zombie; it stops."""

    reason: str


@dataclass(frozen=True)
class Lease:
    """The coordinator heard beat `beat` of this attempt: it suspects it no sooner than the
    failure timeout after that beat was sent."""

    beat: int


@dataclass(frozen=True)
class Zombie:
    """A replaced attempt that woke (it read `Replaced`) says what its fence refused meanwhile
    (`Links.fence`): commits of its sinks (`commits`) and writes to the shared tier (`writes`),
    before it stops."""

    commits: int = 0
    writes: int = 0


@dataclass(frozen=True)
class Stop:
    """The run is being stopped (`nosync stop`, a signal, `--duration`): the sources stop
    reading at the end of the epoch they are in (`upto` None), or, once every worker has said
    where its sources stopped, close every epoch up to `upto` too, so that the whole run ends at
    one epoch boundary."""

    upto: int | None = None


@dataclass(frozen=True)
class Standby:
    """This process holds no partition: it waits, beating, until it is promoted or the run
    ends (a spare task of `--standbys`, or Spark's retry of a worker a standby replaced)."""


@dataclass(frozen=True)
class Promote:
    """This process is now worker `worker`, attempt `attempt` (an attempt number the
    coordinator gives, above every earlier one of that worker): register as it."""

    worker: int
    attempt: int


@dataclass(frozen=True)
class ModeMessage:
    """A mode's own message: operation `op` in generation `gen` (None: any), with `body`."""

    op: str
    gen: int | None = None
    body: dict = field(default_factory=dict)

    def as_map(self) -> dict:
        """The message as the mode reads it: its body with "op" and "gen"."""
        return {**self.body, "op": self.op, "gen": self.gen}


Message = (
    Register
    | Ready
    | Heartbeat
    | Done
    | Error
    | DeadLetter
    | Peers
    | Rejoin
    | Hold
    | Finish
    | Abort
    | Replaced
    | Standby
    | Promote
    | Lease
    | Zombie
    | Stop
    | ModeMessage
)

_KINDS: dict[type, Kind] = {
    Register: Kind.REGISTER,
    Ready: Kind.READY,
    Heartbeat: Kind.HEARTBEAT,
    Done: Kind.DONE,
    Error: Kind.ERROR,
    DeadLetter: Kind.DEAD_LETTER,
    Peers: Kind.PEERS,
    Rejoin: Kind.REJOIN,
    Hold: Kind.HOLD,
    Finish: Kind.FINISH,
    Abort: Kind.ABORT,
    Replaced: Kind.REPLACED,
    Standby: Kind.STANDBY,
    Promote: Kind.PROMOTE,
    Lease: Kind.LEASE,
    Zombie: Kind.ZOMBIE,
    Stop: Kind.STOP,
    ModeMessage: Kind.MODE,
}


def mode_message(op: str, gen: int | None = None, **body: Any) -> ModeMessage:
    """A mode's message of operation `op` (a mode's enum member or its string)."""
    return ModeMessage(str(op), gen, body)


def to_wire(msg: Message) -> dict:
    """The msgpack map of `msg`."""
    kind = _KINDS[type(msg)]
    if isinstance(msg, Heartbeat):
        return {**msg.counters, "type": kind.value, "gen": msg.gen, "beat": msg.beat}
    if isinstance(msg, Peers):
        return {**msg.extra, "type": kind.value, "gen": msg.gen, "addresses": msg.addresses}
    if isinstance(msg, ModeMessage):
        return {**msg.body, "type": kind.value, "op": msg.op, "gen": msg.gen}
    return {"type": kind.value, **{k: getattr(msg, k) for k in msg.__dataclass_fields__}}


def from_wire(d: Any) -> Message:
    """The message a map from `to_wire` holds; anything else is a FrameError naming what is wrong."""
    if not isinstance(d, dict):
        raise FrameError(f"control message is a {type(d).__name__}, not a map")
    try:
        kind = Kind(d.get("type"))
    except ValueError:
        raise FrameError(f"control message of unknown type {d.get('type')!r}") from None
    rest = {k: v for k, v in d.items() if k != "type"}
    try:
        if kind is Kind.HEARTBEAT:
            gen = rest.pop("gen")
            beat = rest.pop("beat", -1)
            return Heartbeat(int(gen), rest, int(beat))
        if kind is Kind.PEERS:
            return Peers(int(rest.pop("gen")), list(rest.pop("addresses")), rest)
        if kind is Kind.MODE:
            return ModeMessage(str(rest.pop("op")), rest.pop("gen", None), rest)
        cls = next(c for c, k in _KINDS.items() if k is kind)
        return cls(**rest)
    except (KeyError, TypeError, ValueError) as e:
        raise FrameError(f"malformed {kind.value} message: {type(e).__name__}: {e}") from None
