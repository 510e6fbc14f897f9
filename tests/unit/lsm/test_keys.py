"""Properties of the key encoding (lsm/keys.py) checked against Python's own order and equality.

Expected orders come from Python comparisons of the keys themselves (ints numerically, str by
code point, bytes bytewise, tuples element-wise), never from the encoder's output.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lsm import KeyEncodingError
from lsm.keys import decode_key, encode_key

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1

ints = st.integers(min_value=INT_MIN, max_value=INT_MAX)
texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=8) | st.sampled_from(
    ["", "\x00", "a", "a\x00", "a\x00b", "ab", "\U0010ffff", "\ud800"]
)
blobs = st.binary(max_size=8) | st.sampled_from([b"", b"\x00", b"\x00\xff", b"a", b"a\x00", b"a\x00\xff", b"\xff"])
flat_keys = st.none() | ints | texts | blobs
keys = st.recursive(flat_keys, lambda inner: st.tuples(inner) | st.lists(inner, max_size=3).map(tuple), max_leaves=6)


def canonical(key: object) -> object:
    """The key as the store returns it: lists become tuples, recursively."""
    if isinstance(key, list | tuple):
        return tuple(canonical(k) for k in key)
    return key


# -- prefix-freeness --------------------------------------------------------------------------


@given(keys, keys)
@example("", "\x00")
@example("a", "a\x00")
@example(b"a", b"a\x00\xff")
def test_no_encoding_is_a_proper_prefix_of_another(a: object, b: object) -> None:
    ea, eb = encode_key(a), encode_key(b)
    if canonical(a) != canonical(b):
        assert not eb.startswith(ea), f"{a!r} encodes to a prefix of {b!r}'s encoding"
        assert not ea.startswith(eb), f"{b!r} encodes to a prefix of {a!r}'s encoding"
    else:
        assert ea == eb


def test_str_key_encoding_is_not_a_prefix_of_its_nul_extension() -> None:
    """The minimal case of the prefix-freeness the disk tier's layout relies on (FORMAT.md: a
    run's key is 01, the encoded state name, its seq; one state's runs must lie together)."""
    assert not encode_key("a\x00").startswith(encode_key("a"))
    assert not encode_key(b"a\x00").startswith(encode_key(b"a"))


# -- order ----------------------------------------------------------------------------------


def _same_type_pairs(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.tuples(strategy, strategy)


@given(_same_type_pairs(ints))
@example((2**63 - 1, 2**63))
@example((-1, 0))
@example((INT_MIN, INT_MAX))
def test_int_order_is_numeric(pair: tuple[int, int]) -> None:
    a, b = pair
    assert (encode_key(a) < encode_key(b)) == (a < b)
    assert (encode_key(a) == encode_key(b)) == (a == b)


@given(_same_type_pairs(texts))
@example(("a", "a\x00"))
@example(("\uffff", "\U00010000"))
def test_str_order_is_by_code_point(pair: tuple[str, str]) -> None:
    a, b = pair
    assert (encode_key(a) < encode_key(b)) == (a < b)
    assert (encode_key(a) == encode_key(b)) == (a == b)


@given(_same_type_pairs(blobs))
@example((b"a", b"a\x00"))
@example((b"a\x00", b"a\x01"))
def test_bytes_order_is_bytewise(pair: tuple[bytes, bytes]) -> None:
    a, b = pair
    assert (encode_key(a) < encode_key(b)) == (a < b)
    assert (encode_key(a) == encode_key(b)) == (a == b)


# Tuples whose positions hold one type each, so that Python can compare them element-wise.
uniform_tuples = st.tuples(texts, ints, blobs).flatmap(lambda full: st.integers(0, 3).map(lambda n: full[:n]))


@given(uniform_tuples, uniform_tuples)
@example(("a",), ("a", 0))
@example(("a",), ("a\x00",))
@example(("a", 5), ("a\x00",))
@example((), ("",))
def test_tuple_order_is_element_wise(a: tuple, b: tuple) -> None:
    assert (encode_key(a) < encode_key(b)) == (a < b)
    assert (encode_key(a) == encode_key(b)) == (a == b)


@given(st.lists(st.one_of(st.none(), ints, texts, blobs, uniform_tuples), min_size=2, max_size=12))
def test_keys_of_one_type_are_contiguous(items: list) -> None:
    """Different types never interleave in encoded order (they are grouped by type)."""

    def group(k: object) -> str:
        if k is None:
            return "none"
        return type(k).__name__

    ordered = sorted(items, key=encode_key)
    seen: list[str] = []
    for k in ordered:
        g = group(k)
        if not seen or seen[-1] != g:
            assert g not in seen, f"type {g} appears in two runs of {ordered!r}"
            seen.append(g)


# -- round trip -----------------------------------------------------------------------------


@given(keys)
def test_decode_inverts_encode(key: object) -> None:
    enc = encode_key(key)
    decoded, end = decode_key(enc)
    assert decoded == canonical(key)
    assert type(decoded) is type(canonical(key))
    assert end == len(enc)


@given(st.lists(st.none() | ints | texts | blobs, max_size=4))
def test_list_key_is_the_same_key_as_the_tuple(items: list) -> None:
    assert encode_key(items) == encode_key(tuple(items))
    assert decode_key(encode_key(items))[0] == tuple(items)


@given(keys, keys)
def test_decode_stops_at_the_end_of_the_first_key(a: object, b: object) -> None:
    """Self-delimiting: a key decodes the same when other bytes follow it."""
    ea = encode_key(a)
    decoded, end = decode_key(ea + encode_key(b))
    assert decoded == canonical(a)
    assert end == len(ea)


# -- refused keys ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", [-(2**63), -1, 0, 2**63 - 1, 2**63, 2**64 - 1])
def test_int_range_edges_are_keys(key: int) -> None:
    assert decode_key(encode_key(key))[0] == key


@pytest.mark.parametrize("key", [2**64, -(2**63) - 1, 2**100, -(2**100)])
def test_ints_outside_the_msgpack_range_are_refused(key: int) -> None:
    with pytest.raises(KeyEncodingError):
        encode_key(key)


@pytest.mark.parametrize(
    "key",
    [
        True,
        False,
        1.0,
        0.5,
        float("nan"),
        (1, True),
        ("a", 2.5),
        [1, [False]],
        object(),
        {1: 2},
        {1},
    ],
)
def test_bools_floats_and_other_types_are_refused(key: object) -> None:
    with pytest.raises(KeyEncodingError):
        encode_key(key)
