"""msgpack, the one encoding of what nosync writes to disk or sends between processes
(nothing is pickled).

`pack`/`unpack` are plain msgpack: arrays come back as tuples (as a frame's records do, so a
tuple key stays hashable), strings as str, maps with any keys. Operator state, where it crosses
a process outside the store (batch and span jobs hand keyed state back to the driver), goes
through the store's own value codec (`pack_state`/`unpack_state`, `lsm.codec`), which keeps
Python's container types apart."""

from __future__ import annotations

from typing import Any

import msgpack

from lsm.codec import pack_values as pack_state
from lsm.codec import unpack_values as unpack_state
from nosync import storage

__all__ = ["pack", "pack_state", "read_file", "unpack", "unpack_state", "write_file"]


def pack(obj: Any) -> bytes:
    """`obj` as msgpack bytes (bytes stay bytes)."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes | memoryview) -> Any:
    """What `pack` gave `data` of, arrays as tuples; raises msgpack's errors on bad input."""
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)


def read_file(path: str) -> Any:
    """The object a file written by `write_file` holds (`path`: a path or a URI, `storage`)."""
    return unpack(storage.read_bytes(path))


def write_file(path: str, obj: Any) -> str:
    """Writes `obj` packed to `path` (a path or a URI, `storage`), atomically: a reader on
    another host sees all of it or nothing; returns `path`. It survives the writer's process,
    not a crash of its host (what batch jobs hand each other is made again then)."""
    storage.write_bytes(path, pack(obj), durable=False)
    return path
