"""msgpack encoding of keys and values (never pickle: these bytes land on disk).

Values keep Python's container types apart. Plain msgpack has one array type and one map type,
so a tuple saved and restored would come back a list, and a set could not be saved at all. Here
a tuple, a set, a frozenset, a Counter and an OrderedDict are extension types holding the
msgpack of their items; a list is a plain array, a dict a plain map, and decoding builds lists
from arrays: what `unpack_values(pack_values(v))` returns behaves as `v` did (those types, and
str, bytes, int, float, bool and None, nested). Other types are refused with a TypeError naming
the type, subclasses of the types above included (a defaultdict's factory, a namedtuple's class,
an enum cannot be written as data), except bytearray and memoryview, which come back as bytes.
A deletion is the extension type 1 with empty data, decoded as `TOMBSTONE`.

Keys are None, ints, str, bytes and tuples of them (`keys.py`); a key column decodes arrays as
tuples, so that decoded keys are hashable and a list key is the tuple key. `key_hash` is the
xxh3-64 of a key's own msgpack bytes: stable across processes and Python versions (Python's
`hash` of a str is not), and computed for a whole column with C calls only.

A column is packed by one call, so a run's columns cost C time, not Python time per key. A
value column of tuples of scalars (a keyed average's (sum, count)) is packed as plain arrays
and marked so (`pack_column`'s third result, a run flag): decoding it makes every array a
tuple, so neither side calls Python per value, where an extension type would.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any

import msgpack
import numpy as np
import xxhash

TOMBSTONE_EXT = 1
TUPLE_EXT = 2
SET_EXT = 3
FROZENSET_EXT = 4
COUNTER_EXT = 5
ORDERED_DICT_EXT = 6


class _Tombstone:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TOMBSTONE"

    def __reduce__(self) -> str:
        return "TOMBSTONE"


TOMBSTONE = _Tombstone()
"""The value of an update that deletes its key."""

_TOMB_EXT = msgpack.ExtType(TOMBSTONE_EXT, b"")
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
    if obj is TOMBSTONE:
        _local.tombstones = True
        return _TOMB_EXT
    t = type(obj)
    code = _ARRAYS.get(t)
    if code is not None:
        return msgpack.ExtType(code, _nested(list(obj)))
    code = _MAPS.get(t)
    if code is not None:
        return msgpack.ExtType(code, _nested(dict(obj)))
    raise TypeError(f"cannot store a value of type {t.__name__}: {obj!r:.80}")


def _nested(obj: object) -> bytes:
    """The bytes of a container's items, packed while the outer packer is mid-way: with a
    packer of the next depth (a Packer keeps its buffer until its call returns)."""
    stack = _local.__dict__.setdefault("nested", [])
    depth = _local.__dict__.get("depth", 0)
    if depth == len(stack):
        stack.append(msgpack.Packer(default=_default, use_bin_type=True, strict_types=True))
    _local.depth = depth + 1
    p = stack[depth]
    try:
        return p.pack(obj)
    except BaseException:
        p.reset()
        raise
    finally:
        _local.depth = depth


def _ext_hook(code: int, data: bytes) -> object:
    if code == TOMBSTONE_EXT:
        return TOMBSTONE
    build = _BUILD.get(code)
    if build is None:
        raise ValueError(f"unknown extension type {code} in a stored value")
    return build(unpack_values(data))


_local = threading.local()


def _packer() -> msgpack.Packer:
    """The value packer of this thread (a Packer keeps a buffer between calls: not shareable)."""
    p = getattr(_local, "values", None)
    if p is None:
        p = _local.values = msgpack.Packer(default=_default, use_bin_type=True, strict_types=True)
    return p


def _key_packer() -> msgpack.Packer:
    p = getattr(_local, "keys", None)
    if p is None:
        p = _local.keys = msgpack.Packer(use_bin_type=True)
    return p


def pack_values(value: Any) -> bytes:
    """The bytes of `value` (a column is a list of values); TypeError for a type that cannot
    be stored."""
    p = _packer()
    try:
        return p.pack(value)
    except BaseException:
        p.reset()
        raise


SCALARS = frozenset({int, float, str, bytes, bool, type(None)})
"""The exact types a tuple column's items may have (`pack_column`)."""


def _tuple_packer() -> msgpack.Packer:
    """A packer that writes tuples as plain arrays (no `default`: nothing else reaches it)."""
    p = getattr(_local, "tuples", None)
    if p is None:
        p = _local.tuples = msgpack.Packer(use_bin_type=True, strict_types=False)
    return p


TUPLE_CHUNK = 1024
"""Values a tuple column is checked and packed by at a time: their objects, scattered over
the heap, are fetched into the cache once by the check and packed while they are there
(one pass over the whole column, then another, took four times as long)."""


def _tuple_column(values: list) -> bytes | None:
    """The bytes of `values` as a tuple column, or None if it is not one: every value a tuple
    whose items are of `SCALARS` (exact types, two passes over the types at C speed), packed
    as plain arrays, chunk by chunk, the chunks' own array headers cut."""
    p = _tuple_packer()
    items = itertools.chain.from_iterable
    try:
        parts = [p.pack_array_header(len(values))]
        for i in range(0, len(values), TUPLE_CHUNK):
            chunk = values[i : i + TUPLE_CHUNK]
            if set(map(type, chunk)) != {tuple} or not set(map(type, items(chunk))) <= SCALARS:
                return None
            b = p.pack(chunk)
            parts.append(b[len(p.pack_array_header(len(chunk))) :])
    except BaseException:
        p.reset()
        raise
    return b"".join(parts)


def pack_column(values: list) -> tuple[bytes, bool, bool]:
    """The bytes of a value column, whether it holds a deletion (seen while packing: no second
    pass over the values), and whether it is a tuple column: every value a tuple whose items
    are scalars (exact types, `SCALARS`), packed as plain arrays for `unpack_column(b, True)`,
    which makes every array a tuple. Any other column goes through the value packer, its
    tuples as extension types."""
    if values and type(values[0]) is tuple:
        b = _tuple_column(values)
        if b is not None:
            return b, False, True
    _local.tombstones = False
    return pack_values(values), _local.tombstones, False


def pack_blocks(values: list, block: int) -> tuple[list[bytes], bool]:
    """A value column as blocks of `block` values, each a column of its own (`pack_column`),
    and whether they are all tuple columns: one block that is not makes every block a plain
    one, so that one flag tells how to read any of them."""
    parts = []
    for i in range(0, len(values), block):
        b = _tuple_column(values[i : i + block]) if type(values[i]) is tuple else None
        if b is None:
            return [pack_values(values[j : j + block]) for j in range(0, len(values), block)], False
        parts.append(b)
    return parts, bool(parts)


def unpack_values(data: bytes) -> Any:
    """The value `pack_values` wrote: lists as lists, tuples as tuples, TOMBSTONE for a deletion."""
    return msgpack.unpackb(data, use_list=True, raw=False, strict_map_key=False, ext_hook=_ext_hook)


STREAM_BYTES = 1 << 23
"""A column larger than this is decoded item by item (`_unpack_items`)."""


def _unpack_items(data: bytes, use_list: bool) -> list:
    """A msgpack array decoded one item at a time, so that other threads run in between: one C
    call over a column of hundreds of MB holds the GIL for over a second (a worker's heartbeat
    thread among those it holds back), for about a fifth less time in all."""
    u = msgpack.Unpacker(
        use_list=use_list,
        raw=False,
        strict_map_key=False,
        ext_hook=_ext_hook,
        max_buffer_size=len(data),
    )
    u.feed(data)
    unpack = u.unpack
    return [unpack() for _ in range(u.read_array_header())]


def unpack_column(data: bytes, tuples: bool) -> list:
    """A value column `pack_column` wrote; `tuples`: what it said of the column (every array
    is then a tuple)."""
    if len(data) > STREAM_BYTES:
        return _unpack_items(data, not tuples)
    if tuples:
        return list(msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False, ext_hook=_ext_hook))
    return unpack_values(data)


def pack_keys(keys: Any) -> bytes:
    """The bytes of a key column (or of one key)."""
    p = _key_packer()
    try:
        return p.pack(keys)
    except BaseException:
        p.reset()
        raise


def joined(body: bytes | list[bytes]) -> bytes:
    """A log record's body, in bytes or in parts laid end to end (`pack_map_parts`), as bytes."""
    return body if type(body) is bytes else b"".join(body)


def pack_map_parts(items: dict[bytes, bytes]) -> list[bytes]:
    """`pack_keys(items)` (a map of bytes to bytes) as parts laid end to end: the values'
    bytes themselves, not copies of them."""
    n = len(items)
    parts = [
        bytes([0x80 | n])
        if n < 16
        else (b"\xde" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdf" + n.to_bytes(4, "big"))
    ]
    for k, v in items.items():
        parts.append(pack_keys(k))
        m = len(v)
        parts.append(
            b"\xc4" + bytes([m])
            if m < 256
            else (b"\xc5" + m.to_bytes(2, "big") if m < 1 << 16 else b"\xc6" + m.to_bytes(4, "big"))
        )
        parts.append(v)
    return parts


def unpack_keys(data: bytes) -> Any:
    """A key column (or one key) as `pack_keys` wrote it, arrays as tuples."""
    return msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False)


def key_hash(key: Any) -> int:
    """The key's hash as the runs store it: xxh3-64 of its msgpack bytes."""
    return xxhash.xxh3_64_intdigest(pack_keys(key))


def key_hashes(keys: Any) -> np.ndarray:
    """`key_hash` of every key of a column, as uint64, by C calls only."""
    return np.fromiter(map(xxhash.xxh3_64_intdigest, map(_key_packer().pack, keys)), dtype=np.uint64, count=len(keys))


def pack(obj: Any) -> bytes:
    """msgpack bytes of a small structure (metadata), tombstones included."""
    return pack_values(obj)


def unpack(data: bytes) -> Any:
    """Decodes bytes written by `pack`, arrays as tuples (hashable, for metadata and keys)."""
    return msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False, ext_hook=_ext_hook)
