"""Operator state as bytes: msgpack that keeps lists and tuples apart.

Plain msgpack has one array type, so a list saved and restored would come back a tuple (or the
other way round) and a restored `JoinOp` could no longer append to its sides. Here a tuple is
the extension type 1 holding the msgpack of its items, a list is a plain array, and decoding
builds lists from arrays: what `unpack(pack(v))` returns behaves as `v` did (dicts, lists,
tuples, str, bytes, int, float, bool and None, nested). Sets and other types are refused with
a TypeError naming the type, except bytearray and memoryview, which msgpack writes as bytes
and which therefore come back as bytes. Never pickle: these bytes land on disk and travel between
processes.
"""

from __future__ import annotations

from typing import Any

import msgpack

TUPLE_EXT = 1


def _default(obj: object) -> object:
    if type(obj) is tuple:
        return msgpack.ExtType(TUPLE_EXT, _packer().pack(list(obj)))
    raise TypeError(f"cannot save state of type {type(obj).__name__}: {obj!r:.80}")


def _packer() -> msgpack.Packer:
    return msgpack.Packer(default=_default, use_bin_type=True, strict_types=True)


def _ext_hook(code: int, data: bytes) -> object:
    if code == TUPLE_EXT:
        return tuple(unpack(data))
    raise ValueError(f"unknown extension type {code} in saved state")


_PACKER = _packer()


def pack(value: Any) -> bytes:
    """The bytes of `value`; raises TypeError for a type state cannot hold."""
    try:
        return _PACKER.pack(value)
    except BaseException:
        _PACKER.reset()
        raise


def unpack(data: bytes) -> Any:
    """The value `pack` saved, with lists as lists and tuples as tuples."""
    return msgpack.unpackb(data, use_list=True, raw=False, strict_map_key=False, ext_hook=_ext_hook)
