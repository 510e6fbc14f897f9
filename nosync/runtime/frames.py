"""Channel frames: the one wire format between workers and with the coordinator.

    length u32 LE | version u8 | kind u8 | header length h u16 LE | header (msgpack map, h bytes) | body (msgpack)

`length` counts everything after itself and is bounded by MAX_FRAME. The header is a map so
that fields can be added without a new format (the nosync mode carries its lineage entries
there); a reader ignores fields it does not know, and a frame of a newer major version is
refused. Decoding never executes anything: msgpack only, with its container limits bounded, and
any malformed frame raises FrameError, on which the connection that sent it is closed.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack

from nosync.errors import FrameError, RunFailed

VERSION = 1
MAX_FRAME = 64 << 20
MAX_HEADER = 0xFFFF
"""The header length is a u16."""
PREFIX = struct.Struct("<IBBH")
PREFIX_SIZE = PREFIX.size
MAX_BODY = MAX_FRAME - 4 - MAX_HEADER
"""The largest body a frame takes whatever its header: a sender splits its records to fit."""

DATA = 1
"""Records of one batch on an exchange edge. Header: edge, epoch, ts (ingest time), n."""
MARKER = 2
"""A channel's progress: every record of epochs <= header['epoch'] was sent (EOS: epoch -1 means
none yet; header['eos'] true means the channel is finished). Header: edge, epoch, wm, eos."""
CREDIT = 3
"""Flow control: the receiver lets the sender send header['frames'] more frames."""
CONTROL = 4
"""Coordinator <-> worker messages; the body is a msgpack map with a 'type'."""
EVENT = 5
"""An in-band event on an exchange edge, after every record sent before it (a checkpoint
barrier). Header: edge; body: the event (a map)."""

LINEAGE = 6
"""Sent once each way when two workers (re)connect in mode nosync: header 'resume' (the first
chan_seq the receiver should send again) and 'lin' (lineage entries the sender holds for the
receiver, by origin)."""

REPLICA = 7
"""The replicated level (mode nosync, `nosync.state.replicas`): a part of a message between a
worker and a holder of copies of its store - records, a base image, an acknowledgement, a
fetch and its answer. Header: op, and what the op needs; body: bytes of the message's blob.
Needs no credit."""

KINDS = frozenset({DATA, MARKER, CREDIT, CONTROL, EVENT, LINEAGE, REPLICA})


class Frame(NamedTuple):
    """One decoded frame: its kind (DATA, MARKER...), its header map and its body."""

    kind: int
    header: dict
    body: Any


def encode(kind: int, header: dict, body: Any = None) -> bytes:
    """The bytes of one frame."""
    return encode_packed(kind, header, msgpack.packb(body, use_bin_type=True))


def encode_packed(kind: int, header: dict, body: bytes) -> bytes:
    """The bytes of one frame whose body is already msgpack (so that it can be fingerprinted)."""
    h = msgpack.packb(header, use_bin_type=True)
    if len(h) > MAX_HEADER:
        raise FrameError(f"frame header of {len(h)} bytes exceeds the {MAX_HEADER}-byte limit")
    n = 4 + len(h) + len(body)
    if n > MAX_FRAME:
        raise FrameError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
    return PREFIX.pack(n, VERSION, kind, len(h)) + h + body


RECORD_TYPES = "None, bool, int (-2**63 .. 2**64-1), float, str, bytes, and lists, tuples and dicts of them"


def pack_records(records: list, sender: str) -> bytes:
    """The body of a DATA frame. A record msgpack cannot encode (a set, a datetime, an int past
    64 bits) fails the run naming `sender`, the operator the records come from, and the record."""
    try:
        return msgpack.packb(records, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        error, bad = e, records
    for rec in records:
        try:
            msgpack.packb(rec, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as e:
            error, bad = e, rec
            break
    raise RunFailed(
        f"{sender} emitted a record that cannot cross an exchange ({type(error).__name__}: {error}): "
        f"{bad!r:.200}; records on their way to a keyed operator must be {RECORD_TYPES}"
    )


def wire_records(records: list, sender: str) -> tuple:
    """`records` as a keyed operator receives them from another worker: every list a tuple,
    bytearray bytes, a subclass of int, float or str its base type. The share of an exchange
    that stays on its worker goes through this too, so an operator sees the same records
    whichever worker sent them and however many workers run."""
    return msgpack.unpackb(pack_records(records, sender), use_list=False, raw=False, strict_map_key=False)


def _unpack(data: bytes | memoryview, what: str) -> Any:
    try:
        return msgpack.unpackb(
            data,
            use_list=False,
            raw=False,
            strict_map_key=False,
        )
    except Exception as e:  # msgpack raises several types for malformed input
        raise FrameError(f"malformed {what}: {type(e).__name__}: {e}") from None


def frame_length(prefix: bytes | memoryview) -> int:
    """The total size of the frame starting with these PREFIX_SIZE bytes (prefix included).

    Raises FrameError for an impossible length, an unknown version or kind.
    """
    n, version, kind, hlen = PREFIX.unpack(prefix[:PREFIX_SIZE])
    if version != VERSION:
        raise FrameError(f"frame version {version}, this build speaks {VERSION}")
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if n < 4 + hlen or n > MAX_FRAME:
        raise FrameError(f"impossible frame length {n} (header {hlen})")
    return 4 + n


def decode(frame: bytes | memoryview) -> Frame:
    """Decodes one whole frame (as delimited by frame_length)."""
    if len(frame) < PREFIX_SIZE:
        raise FrameError(f"truncated frame: {len(frame)} bytes")
    total = frame_length(frame)
    if len(frame) != total:
        raise FrameError(f"frame length {total} does not match the {len(frame)} bytes given")
    _, _, kind, hlen = PREFIX.unpack_from(frame)
    header = _unpack(frame[PREFIX_SIZE : PREFIX_SIZE + hlen], "frame header")
    if not isinstance(header, dict):
        raise FrameError(f"frame header is a {type(header).__name__}, not a map")
    body = _unpack(frame[PREFIX_SIZE + hlen :], "frame body")
    return Frame(kind, header, body)


class FrameReader:
    """Cuts a byte stream into frames; feed() what arrives, take frames from it."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by `data`. Raises FrameError on a malformed one."""
        buf = self._buf
        buf += data
        out = []
        pos = 0
        size = len(buf)
        view = memoryview(buf)
        try:
            while size - pos >= PREFIX_SIZE:
                total = frame_length(view[pos : pos + PREFIX_SIZE])
                if size - pos < total:
                    break
                out.append(decode(view[pos : pos + total]))
                pos += total
        finally:
            view.release()
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        """The bytes fed that are not yet part of a complete frame."""
        return len(self._buf)
