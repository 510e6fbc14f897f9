"""msgpack encoding of update batches and values (never pickle: these bytes land on disk).

A batch is a msgpack array of [key, value] pairs; a deletion's value is the extension type 1
with empty data, decoded as `TOMBSTONE`. Arrays decode as tuples, so decoded keys are hashable.
"""

from __future__ import annotations

import msgpack

TOMBSTONE_EXT = 1


class _Tombstone:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TOMBSTONE"

    def __reduce__(self) -> str:
        return "TOMBSTONE"


TOMBSTONE = _Tombstone()
"""The value of an update that deletes its key."""

_TOMB_EXT = msgpack.ExtType(TOMBSTONE_EXT, b"")


def _default(obj: object) -> object:
    if obj is TOMBSTONE:
        return _TOMB_EXT
    raise TypeError(f"cannot store a value of type {type(obj).__name__}: {obj!r:.80}")


def _ext_hook(code: int, data: bytes) -> object:
    if code == TOMBSTONE_EXT:
        return TOMBSTONE
    return msgpack.ExtType(code, data)


def make_packer() -> msgpack.Packer:
    """A packer for one thread: a Packer is not safe to share, it keeps its buffer between calls."""
    return msgpack.Packer(default=_default, use_bin_type=True)


def pack(obj: object) -> bytes:
    """msgpack bytes of `obj` (tombstones included), with a packer of its own."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes) -> object:
    """Decodes bytes written by `pack`/`pack_batch`."""
    return msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def pack_value(value: object) -> bytes:
    """A value as stored on the disk tier: empty bytes for a tombstone, else msgpack."""
    return b"" if value is TOMBSTONE else pack(value)


def unpack_value(data: bytes) -> object:
    """The inverse of `pack_value`."""
    return TOMBSTONE if not data else unpack(data)
