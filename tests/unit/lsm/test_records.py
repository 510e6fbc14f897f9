"""Log segment framing (lsm/records.py): round trip, torn tails, corruption in the middle.

A record's body is opaque to the framing; here it is what the store writes (FORMAT.md): a
msgpack map of encoded state names to run bytes, with arbitrary bytes standing in for runs.
"""

from __future__ import annotations

import struct

import msgpack
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from lsm import CorruptLogError, FormatVersionError, LsmError
from lsm.records import encode_record, scan_segment, segment_header

PATH = "/store/log/00000000000000000001.log"

bodies = st.dictionaries(st.binary(min_size=1, max_size=6), st.binary(max_size=40), max_size=3)
"""The runs of one seq: encoded state name -> run bytes (opaque to the framing)."""


def pack(runs: dict[bytes, bytes]) -> bytes:
    return msgpack.packb(runs, use_bin_type=True)


@st.composite
def segments(draw: st.DrawFn, min_records: int = 0) -> list[tuple[int, bytes]]:
    """(seq, record body) pairs with strictly increasing seqs."""
    steps = draw(st.lists(st.integers(1, 2**40), min_size=min_records, max_size=6))
    first = draw(st.integers(0, 2**20))
    out = []
    seq = first
    for step in steps:
        out.append((seq, pack(draw(bodies))))
        seq += step
    return out


def build(records: list[tuple[int, bytes]]) -> tuple[bytes, list[int]]:
    """A segment's bytes and the offset of each record, computed from the documented layout:
    a 16-byte header, then per record 16 bytes of header and a payload of seq u64 + body."""
    data = segment_header()
    offsets = []
    for seq, packed in records:
        offsets.append(len(data))
        data += encode_record(seq, packed)
    return data, offsets


def test_header_and_record_layout() -> None:
    """FORMAT.md's layout: the checksum is xxh3_64 of the payload seeded with its length."""

    assert segment_header() == b"NSLSMLOG" + struct.pack("<II", 4, 0)
    packed = pack({b"\x07s\x00\x01": b"NSRN..."})
    rec = encode_record(7, packed)
    payload = struct.pack("<Q", 7) + packed
    assert rec == b"LSMR" + struct.pack("<IQ", len(payload), xxhash.xxh3_64_intdigest(payload, len(payload))) + payload


@given(segments())
def test_encode_scan_round_trip(records: list[tuple[int, bytes]]) -> None:
    data, offsets = build(records)
    scan = scan_segment(PATH, data)
    assert not scan.torn
    assert scan.valid_end == len(data)
    assert [(r.seq, r.packed) for r in scan.records] == records
    assert [r.offset for r in scan.records] == offsets
    for (_, packed), r in zip(records, scan.records, strict=True):
        assert msgpack.unpackb(r.packed) == msgpack.unpackb(packed)


@given(segments(min_records=1), st.data())
def test_truncating_the_last_record_anywhere_is_a_torn_tail(
    records: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    blob, offsets = build(records)
    start = offsets[-1]
    cut = data.draw(st.integers(start + 1, len(blob) - 1), label="cut")
    scan = scan_segment(PATH, blob[:cut])
    assert scan.torn
    assert scan.valid_end == start
    assert [(r.seq, r.packed) for r in scan.records] == records[:-1]


@given(segments(min_records=1), st.data())
def test_cutting_at_a_record_boundary_leaves_a_whole_segment(
    records: list[tuple[int, bytes]], data: st.DataObject
) -> None:
    blob, offsets = build(records)
    n = data.draw(st.integers(0, len(records) - 1), label="records kept")
    scan = scan_segment(PATH, blob[: offsets[n]])
    assert not scan.torn
    assert scan.valid_end == offsets[n]
    assert [(r.seq, r.packed) for r in scan.records] == records[:n]


@given(segments(min_records=1), st.data())
def test_damaging_the_last_record_is_a_torn_tail(records: list[tuple[int, bytes]], data: st.DataObject) -> None:
    blob, offsets = build(records)
    start = offsets[-1]
    pos = data.draw(st.integers(start, len(blob) - 1), label="pos")
    flip = data.draw(st.integers(1, 255), label="xor")
    damaged = bytearray(blob)
    damaged[pos] ^= flip
    scan = scan_segment(PATH, bytes(damaged))
    assert scan.torn
    assert scan.valid_end == start
    assert [(r.seq, r.packed) for r in scan.records] == records[:-1]


@given(segments(min_records=3), st.data())
def test_a_flipped_byte_in_a_middle_record_is_corruption(records: list[tuple[int, bytes]], data: st.DataObject) -> None:
    blob, offsets = build(records)
    victim = data.draw(st.integers(0, len(records) - 2), label="victim")
    start, end = offsets[victim], offsets[victim + 1]
    pos = data.draw(st.integers(start, end - 1), label="pos")
    flip = data.draw(st.integers(1, 255), label="xor")
    damaged = bytearray(blob)
    damaged[pos] ^= flip
    with pytest.raises(CorruptLogError) as info:
        scan_segment(PATH, bytes(damaged))
    assert info.value.offset == start
    assert info.value.path == PATH
    assert PATH in str(info.value) and str(start) in str(info.value)


def test_corruption_before_a_torn_tail_is_still_corruption() -> None:
    records = [(1, pack({b"a": b"1"})), (2, pack({b"b": b"2"})), (3, pack({b"c": b"3"}))]
    blob, offsets = build(records)
    damaged = bytearray(blob[:-3])
    damaged[offsets[0] + 20] ^= 0x40
    with pytest.raises(CorruptLogError) as info:
        scan_segment(PATH, bytes(damaged))
    assert info.value.offset == offsets[0]


def test_a_record_whose_seq_does_not_increase_is_corruption() -> None:
    records = [(5, pack({})), (5, pack({b"a": b"1"}))]
    blob, offsets = build(records)
    with pytest.raises(CorruptLogError) as info:
        scan_segment(PATH, blob)
    assert info.value.offset == offsets[1]


@pytest.mark.parametrize("size", range(0, 16))
def test_a_file_shorter_than_its_header_is_torn_and_empty(size: int) -> None:
    scan = scan_segment(PATH, segment_header()[:size])
    assert scan.torn
    assert scan.records == []
    assert scan.valid_end == 0


def test_header_only_segment_is_empty_and_whole() -> None:
    scan = scan_segment(PATH, segment_header())
    assert not scan.torn
    assert scan.records == []
    assert scan.valid_end == 16


def test_wrong_file_magic_raises_corrupt_log_error() -> None:
    blob, _ = build([(1, pack({b"a": b"1"}))])
    with pytest.raises(CorruptLogError) as info:
        scan_segment(PATH, b"XXLSMLOG" + blob[8:])
    assert info.value.path == PATH
    assert info.value.offset == 0


@pytest.mark.parametrize("version", [0, 1, 2, 3, 5, 0xFFFFFFFF])
def test_other_format_versions_raise_format_version_error(version: int) -> None:
    blob, _ = build([(1, pack({b"a": b"1"}))])
    other = b"NSLSMLOG" + struct.pack("<I", version) + blob[12:]
    with pytest.raises(FormatVersionError) as info:
        scan_segment(PATH, other)
    assert isinstance(info.value, LsmError)
    assert info.value.path == PATH
    assert f"format version {version}," in str(info.value)


@pytest.mark.parametrize("states", [0, 1, 15, 16, 65_536])
@pytest.mark.parametrize("size", [0, 255, 256, 65_535, 65_536])
def test_a_body_in_parts_is_the_msgpack_map_byte_for_byte(states, size):
    """The persister writes a record's body as parts (the runs' bytes are not copied): laid
    end to end they are what msgpack packs for the map, at every header size boundary."""
    from lsm.codec import pack_map_parts
    from lsm.records import record_parts

    n = states if size < 1000 or states < 20 else 2
    runs = {i.to_bytes(4, "big"): bytes([i % 251]) * size for i in range(n)}
    parts = pack_map_parts(runs)
    assert b"".join(parts) == pack(runs)
    payload = struct.pack("<Q", 9) + pack(runs)
    header = b"LSMR" + struct.pack("<IQ", len(payload), xxhash.xxh3_64_intdigest(payload, len(payload)))
    assert b"".join(record_parts(9, parts)) == header + payload


def test_writev_writes_every_part_past_the_iov_limit(tmp_path):
    import os

    from lsm import files

    parts = [bytes([i % 256]) * (i % 7) for i in range(5000)]  # more parts than IOV_MAX
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"head")
        files.writev(fd, parts)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"head" + b"".join(parts)


def test_write_durable_writes_every_part_at_its_offset_past_the_iov_limit(tmp_path):
    import os

    from lsm import files

    parts = [bytes([i % 256]) * (i % 7) for i in range(5000)]  # more parts than IOV_MAX
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"head" + b"x" * 10)
        files.write_durable(fd, parts, 4)  # over the x's, then past the end
        files.write_durable(fd, [b"tail"], 4 + sum(map(len, parts)))
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"head" + b"".join(parts) + b"tail"
