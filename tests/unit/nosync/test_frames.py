"""Channel frames: round trips, stream reassembly and hostile input.

Wire format (nosync/runtime/frames.py): length u32 LE | version u8 | kind u8 | header length u16 LE |
header (msgpack map) | body (msgpack), `length` counting everything after itself.

Decoding turns msgpack arrays into tuples (use_list=False), in the header and in the body:
a list sent comes back as a tuple; maps come back as dicts. The model below (`as_decoded`) says
exactly that, independently of the code.
"""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nosync.errors import FrameError
from nosync.runtime import frames

SETTINGS = settings(max_examples=100, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=25,
)
headers = st.dictionaries(st.text(max_size=12), values, max_size=6)
kinds = st.sampled_from(sorted(frames.KINDS))


def as_decoded(v):
    """What a value looks like after a round trip: every list or tuple becomes a tuple."""
    if isinstance(v, list | tuple):
        return tuple(as_decoded(x) for x in v)
    if isinstance(v, dict):
        return {k: as_decoded(x) for k, x in v.items()}
    return v


def a_frame(kind: int = frames.DATA, header: dict | None = None, body=None) -> bytes:
    return frames.encode(
        kind, {"edge": 3, "epoch": 7} if header is None else header, [1, "two", b"3"] if body is None else body
    )


# -- round trips -----------------------------------------------------------------------------


@SETTINGS
@given(kind=kinds, header=headers, body=values)
def test_encode_decode_round_trip(kind, header, body):
    data = frames.encode(kind, header, body)
    got = frames.decode(data)
    assert got == frames.Frame(kind, as_decoded(header), as_decoded(body))
    # the prefix as the format says, checked with struct directly
    length, version, k, hlen = struct.unpack_from("<IBBH", data)
    assert length == len(data) - 4
    assert (version, k) == (1, kind)
    assert msgpack.unpackb(data[8 : 8 + hlen], raw=False, use_list=False, strict_map_key=False) == got.header
    assert frames.frame_length(data[:8]) == len(data)


def test_lists_come_back_as_tuples():
    got = frames.decode(frames.encode(frames.DATA, {"path": [1, [2, 3]]}, [[1, 2], ("a", ["b"])]))
    assert got.header == {"path": (1, (2, 3))}
    assert got.body == ((1, 2), ("a", ("b",)))
    assert isinstance(got.body, tuple)


def test_unknown_header_fields_are_kept_for_the_reader_to_ignore():
    got = frames.decode(frames.encode(frames.MARKER, {"edge": 1, "epoch": 2, "future": {"x": 1}}))
    assert got.header["future"] == {"x": 1}
    assert got.body is None


def test_oversized_frame_is_refused_at_encode():
    with pytest.raises(FrameError, match="exceeds"):
        frames.encode(frames.DATA, {}, b"\0" * frames.MAX_FRAME)


def test_header_over_64_kib_is_a_frame_error_not_a_struct_error():
    """The header length is a u16: a bigger header (many lineage entries) must be refused with
    FrameError, like any other frame the format cannot carry."""
    with pytest.raises(FrameError):
        frames.encode(frames.DATA, {"lineage": "x" * 70_000}, [])
    # just under the limit still goes through: 65535 bytes of header in all
    pad = 65535 - len(msgpack.packb({"lineage": ""})) - 2  # a str of this size has a 3-byte head
    blob = frames.encode(frames.DATA, {"lineage": "x" * pad}, [])
    assert struct.unpack_from("<H", blob, 6)[0] == 65535
    assert frames.decode(blob).header == {"lineage": "x" * pad}


# -- reassembly ------------------------------------------------------------------------------


@SETTINGS
@given(
    msgs=st.lists(st.tuples(kinds, headers, values), min_size=1, max_size=6),
    data=st.data(),
)
def test_reader_reassembles_any_chunking(msgs, data):
    blobs = [frames.encode(k, h, b) for k, h, b in msgs]
    stream = b"".join(blobs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    reader = frames.FrameReader()
    got = []
    fed = 0
    for piece in pieces:
        got.extend(reader.feed(piece))
        fed += len(piece)
        # exactly the frames wholly contained in what was fed so far have come out
        complete = 0
        end = 0
        for b in blobs:
            if end + len(b) > fed:
                break
            end += len(b)
            complete += 1
        assert len(got) == complete
        assert reader.buffered == fed - end
    assert got == [frames.Frame(k, as_decoded(h), as_decoded(b)) for k, h, b in msgs]
    assert reader.buffered == 0


def test_reader_byte_by_byte():
    blobs = [a_frame(), a_frame(frames.CREDIT, {"frames": 16}, None), a_frame(frames.CONTROL, {}, {"type": "x"})]
    reader = frames.FrameReader()
    got = []
    for byte in b"".join(blobs):
        got.extend(reader.feed(bytes([byte])))
    assert [f.kind for f in got] == [frames.DATA, frames.CREDIT, frames.CONTROL]
    assert got[1].header == {"frames": 16}
    assert got[2].body == {"type": "x"}


# -- hostile input ---------------------------------------------------------------------------


@SETTINGS
@given(blob=st.binary(max_size=200))
def test_random_bytes_decode_to_a_frame_or_frame_error(blob):
    try:
        got = frames.decode(blob)
    except FrameError:
        return
    assert isinstance(got, frames.Frame)
    assert got.kind in frames.KINDS
    assert isinstance(got.header, dict)


@SETTINGS
@given(blob=st.binary(max_size=200), data=st.data())
def test_random_bytes_into_the_reader(blob, data):
    reader = frames.FrameReader()
    cut = data.draw(st.integers(0, len(blob)))
    try:
        got = reader.feed(blob[:cut]) + reader.feed(blob[cut:])
    except FrameError:
        return
    assert all(isinstance(f, frames.Frame) and isinstance(f.header, dict) for f in got)
    if len(blob) < frames.PREFIX_SIZE:
        assert got == [] and reader.buffered == len(blob)


@SETTINGS
@given(header=headers, body=values, data=st.data())
def test_truncated_frame(header, body, data):
    blob = frames.encode(frames.DATA, header, body)
    k = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(FrameError):
        frames.decode(blob[:k])
    reader = frames.FrameReader()
    assert reader.feed(blob[:k]) == []  # no frame yet, and no error
    assert reader.buffered == k
    assert reader.feed(blob[k:]) == [frames.Frame(frames.DATA, as_decoded(header), as_decoded(body))]


@pytest.mark.parametrize("version", [0, 2, 255])
def test_wrong_version(version):
    blob = bytearray(a_frame())
    blob[4] = version
    with pytest.raises(FrameError, match="version"):
        frames.decode(bytes(blob))
    with pytest.raises(FrameError, match="version"):
        frames.FrameReader().feed(bytes(blob[:8]))  # refused as soon as the prefix is in


@pytest.mark.parametrize("kind", [0, 8, 200])
def test_wrong_kind(kind):
    blob = bytearray(a_frame())
    blob[5] = kind
    with pytest.raises(FrameError, match="kind"):
        frames.decode(bytes(blob))
    with pytest.raises(FrameError, match="kind"):
        frames.FrameReader().feed(bytes(blob))


def test_wrong_lengths():
    blob = a_frame()
    length, _, _, hlen = struct.unpack_from("<IBBH", blob)

    def with_length(n: int) -> bytes:
        return struct.pack("<I", n) + blob[4:]

    # shorter than its own header, or over the limit: impossible, for decode and reader alike
    for n in (0, 3, 4 + hlen - 1, frames.MAX_FRAME + 1, 2**32 - 1):
        with pytest.raises(FrameError, match="impossible frame length"):
            frames.decode(with_length(n))
        with pytest.raises(FrameError, match="impossible frame length"):
            frames.FrameReader().feed(with_length(n))
    # possible but not what was given: decode refuses
    for n in (length - 1, length + 1, 4 + hlen):
        with pytest.raises(FrameError, match="does not match"):
            frames.decode(with_length(n))
    # longer: the reader waits for bytes that are not there (no frame yet)
    reader = frames.FrameReader()
    assert reader.feed(with_length(length + 10)) == []
    # shorter: the body is cut, and msgpack is self-delimiting, so it is malformed
    with pytest.raises(FrameError, match="malformed frame body"):
        frames.FrameReader().feed(with_length(length - 1))


def test_header_that_is_not_a_map():
    h = msgpack.packb([1, 2])
    b = msgpack.packb(None)
    blob = struct.pack("<IBBH", 4 + len(h) + len(b), 1, frames.DATA, len(h)) + h + b
    with pytest.raises(FrameError, match="not a map"):
        frames.decode(blob)


def test_max_frame_length_is_accepted_by_the_prefix():
    prefix = struct.pack("<IBBH", frames.MAX_FRAME, 1, frames.DATA, 10)
    assert frames.frame_length(prefix) == frames.MAX_FRAME + 4


@SETTINGS
@given(kind=kinds, header=headers, body=values, data=st.data())
def test_bit_flips(kind, header, body, data):
    blob = bytearray(frames.encode(kind, header, body))
    pos = data.draw(st.integers(0, len(blob) - 1))
    bit = data.draw(st.integers(0, 7))
    blob[pos] ^= 1 << bit
    flipped = bytes(blob)
    if pos < 4 or pos == 4 or pos in (6, 7):
        # length, version, header length: always detected (msgpack is self-delimiting, so
        # moving the header/body split leaves an incomplete or over-long header)
        with pytest.raises(FrameError):
            frames.decode(flipped)
        return
    if pos == 5:
        if flipped[5] in frames.KINDS:
            assert frames.decode(flipped) == frames.Frame(flipped[5], as_decoded(header), as_decoded(body))
        else:
            with pytest.raises(FrameError, match="kind"):
                frames.decode(flipped)
        return
    # header or body bytes: either still well-formed msgpack (with a map header) or FrameError
    try:
        got = frames.decode(flipped)
    except FrameError:
        return
    assert got.kind == kind
    assert isinstance(got.header, dict)
