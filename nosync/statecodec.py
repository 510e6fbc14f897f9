"""Operator state as bytes: msgpack that keeps Python's container types apart.

Plain msgpack has one array type and one map type, so a list saved and restored would come back
a tuple (or the other way round), a set would not be saved at all, and a restored `JoinOp`
could no longer append to its sides. Here a tuple, a set, a frozenset, a Counter and an
OrderedDict are extension types holding the msgpack of their items; a list is a plain array and
a dict a plain map, and decoding builds lists from arrays: what `unpack(pack(v))` returns
behaves as `v` did (those types, and str, bytes, int, float, bool and None, nested). Other
types are refused with a TypeError naming the type, including subclasses of the types above
that this module does not name (a defaultdict's factory, a namedtuple's class, an enum cannot
be written as data), except bytearray and memoryview, which msgpack writes as bytes and which
therefore come back as bytes. A set's items are written in its iteration order: equal sets can
give different bytes, and come back equal. Never pickle: these bytes land on disk and travel
between processes.
"""

from __future__ import annotations

import collections
from typing import Any

import msgpack

TUPLE_EXT = 1
SET_EXT = 2
FROZENSET_EXT = 3
COUNTER_EXT = 4
ORDERED_DICT_EXT = 5

_ARRAYS = {tuple: TUPLE_EXT, set: SET_EXT, frozenset: FROZENSET_EXT}
_MAPS = {collections.Counter: COUNTER_EXT, collections.OrderedDict: ORDERED_DICT_EXT}
_BUILD = {
    TUPLE_EXT: tuple,
    SET_EXT: set,
    FROZENSET_EXT: frozenset,
    COUNTER_EXT: collections.Counter,
    ORDERED_DICT_EXT: collections.OrderedDict,
}


def _default(obj: object) -> object:
    t = type(obj)
    code = _ARRAYS.get(t)
    if code is not None:
        return msgpack.ExtType(code, _packer().pack(list(obj)))
    code = _MAPS.get(t)
    if code is not None:
        return msgpack.ExtType(code, _packer().pack(dict(obj)))
    raise TypeError(f"cannot save state of type {t.__name__}: {obj!r:.80}")


def _packer() -> msgpack.Packer:
    return msgpack.Packer(default=_default, use_bin_type=True, strict_types=True)


def _ext_hook(code: int, data: bytes) -> object:
    build = _BUILD.get(code)
    if build is None:
        raise ValueError(f"unknown extension type {code} in saved state")
    return build(unpack(data))


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
