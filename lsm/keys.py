"""Order-preserving key encoding: the names of states on the disk tier, and key checks.

A key (and a state's name) is None, an int (msgpack's range: -2**63 to 2**64 - 1), a str, bytes,
or a tuple (or list) of those. Bools and floats are refused: True == 1 and 1.0 == 1 in Python,
so they would be one key in memory and three on disk. `encode_key` maps it to bytes such that

- the encoding is prefix-free: no key's encoding is a proper prefix of another's, so the runs of
  one state (`encode_key(name) + hi seq` in LevelDB) are contiguous and never mixed with
  another state's;
- keys of one type sort in their natural order (ints numerically, str by code point, tuples
  element-wise).

Strings and bytes are escaped (0x00 -> 0x00 0xFF) and end in 0x00 0x01, so that after a 0x00
comes 0xFF (more of the string) or 0x01 (its end), never the first byte of what follows the
name (a seq, whose first byte may be 0xFF); tuples end in 0x00, which no element's type byte can
be. The byte layout is written down in FORMAT.md.
"""

from __future__ import annotations

import struct

from lsm.errors import KeyEncodingError

T_NONE = 0x01
T_INT = 0x04
T_UINT = 0x05
T_BYTES = 0x06
T_STR = 0x07
T_TUPLE = 0x08

MAX_SEQ = (1 << 64) - 2
_UINT_MAX = (1 << 64) - 1
_INT_BIAS = 1 << 63
_U64 = struct.Struct(">Q")


def encode_key(key: object) -> bytes:
    """The order-preserving, prefix-free encoding of `key`."""
    t = type(key)
    if t is bytes:
        return b"\x06" + key.replace(b"\x00", b"\x00\xff") + b"\x00\x01"
    if t is str:
        return b"\x07" + key.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff") + b"\x00\x01"
    if t is int:
        if -_INT_BIAS <= key < _INT_BIAS:
            return b"\x04" + _U64.pack(key + _INT_BIAS)
        if _INT_BIAS <= key <= _UINT_MAX:
            return b"\x05" + _U64.pack(key)
        raise KeyEncodingError(f"int key {key} is outside -2**63 .. 2**64-1")
    if t is tuple or t is list:
        return b"\x08" + b"".join([encode_key(k) for k in key]) + b"\x00"
    if key is None:
        return b"\x01"
    raise KeyEncodingError(
        f"key {key!r} of type {t.__name__} is not a store key; use None, int, str, bytes or tuples of them"
    )


KEY_TYPES = frozenset((bytes, str, int, type(None)))
_FLAT_OR_TUPLE = KEY_TYPES | {tuple}


def check_keys(updates: list | tuple) -> None:
    """Raises KeyEncodingError naming the first key of `updates` that is not a store key.

    The common cases (flat keys, tuples of flat keys) cost a set comprehension or two; other
    tuple keys are checked deeply.
    An update that is not a (key, value) pair raises ValueError or TypeError.
    """
    types = {type(k) for k, _ in updates}
    if types <= KEY_TYPES:
        return
    if types <= _FLAT_OR_TUPLE and {type(x) for k, _ in updates if type(k) is tuple for x in k} <= KEY_TYPES:
        return  # tuples of flat keys (a prefixed key): as cheap as flat keys
    for i, (key, _) in enumerate(updates):
        try:
            encode_key(key)
        except KeyEncodingError as e:
            raise KeyEncodingError(f"update {i}: {e}") from None


def check_key_column(keys: list | tuple) -> bool:
    """Raises KeyEncodingError naming the first key of a column that is not a store key.
    True when every key is flat or a tuple of flat keys (the common case, checked by a set
    comprehension or two); False when some key holds a list, which is a tuple as a key."""
    types = set(map(type, keys))
    if types <= KEY_TYPES:
        return True
    if types <= _FLAT_OR_TUPLE and {type(x) for k in keys if type(k) is tuple for x in k} <= KEY_TYPES:
        return True
    for i, key in enumerate(keys):
        try:
            encode_key(key)
        except KeyEncodingError as e:
            raise KeyEncodingError(f"key {i}: {e}") from None
    return False


def decode_key(buf: bytes, pos: int = 0) -> tuple[object, int]:
    """Decodes one key starting at `pos`; returns it and the position after it."""
    t = buf[pos]
    pos += 1
    if t == T_BYTES or t == T_STR:
        end = buf.index(b"\x00", pos)
        if end + 1 < len(buf) and buf[end + 1] == 0x01:
            # no escaped NUL in it (the common case): one slice
            raw = buf[pos:end]
            return (raw if t == T_BYTES else raw.decode("utf-8", "surrogatepass")), end + 2
        out = bytearray()
        while True:
            end = buf.index(b"\x00", pos)
            out += buf[pos:end]
            nxt = buf[end + 1] if end + 1 < len(buf) else -1
            if nxt == 0xFF:
                out += b"\x00"
                pos = end + 2
            elif nxt == 0x01:
                pos = end + 2
                break
            else:
                raise KeyEncodingError(f"bad string terminator at offset {end}")
        raw = bytes(out)
        return (raw if t == T_BYTES else raw.decode("utf-8", "surrogatepass")), pos
    if t == T_INT:
        return _U64.unpack_from(buf, pos)[0] - _INT_BIAS, pos + 8
    if t == T_TUPLE:
        return decode_items(buf, pos)
    if t == T_NONE:
        return None, pos
    if t == T_UINT:
        return _U64.unpack_from(buf, pos)[0], pos + 8
    raise KeyEncodingError(f"unknown key type byte 0x{t:02x} at offset {pos - 1}")


def decode_items(buf: bytes, pos: int) -> tuple[tuple, int]:
    """Decodes the elements of a tuple from `pos` (after its type byte, or after a tuple
    prefix's `encode_prefix`) to its end; returns them and the position after the end."""
    items = []
    while buf[pos] != 0:
        item, pos = decode_key(buf, pos)
        items.append(item)
    return tuple(items), pos + 1
