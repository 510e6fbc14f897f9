"""Log segment framing: the file header, record framing and checksums, and the reader.

A segment is a file header followed by records. Each record is

    magic "LSMR" | length u32 LE | checksum u64 LE | payload (length bytes)

with checksum = xxh3_64(payload, seed=length), so a damaged length is caught as surely as a
damaged payload, and payload = seq u64 LE + the runs of that seq (FORMAT.md). The magic lets the
reader look past a damaged record for intact ones, which is how it tells a torn tail (nothing
valid after the damage: cut it) from corruption in the middle (valid records after it: raise
CorruptLogError, never skip). FORMAT.md has the byte layout.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import xxhash

from lsm.errors import CorruptLogError, FormatVersionError

FORMAT_VERSION = 4
SEGMENT_MAGIC = b"NSLSMLOG"
SEGMENT_HEADER = struct.Struct("<8sII")
RECORD_MAGIC = b"LSMR"
RECORD_HEADER = struct.Struct("<4sIQ")
HEADER_SIZE = RECORD_HEADER.size
SEQ = struct.Struct("<Q")
MAX_RECORD = 1 << 30

_hash = xxhash.xxh3_64_intdigest


def segment_header() -> bytes:
    """The first bytes of every log segment."""
    return SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0)


def encode_record(seq: int, packed_updates: bytes) -> bytes:
    """One framed record holding the runs of `seq` (their encoded body)."""
    return b"".join(record_parts(seq, [packed_updates]))


def record_parts(seq: int, body: list[bytes]) -> list[bytes]:
    """`encode_record` of the body laid end to end from `body`'s parts, as parts (written
    with one writev: the body's bytes are not copied)."""
    head = SEQ.pack(seq)
    n = len(head) + sum(map(len, body))
    h = xxhash.xxh3_64(head, seed=n)  # the payload's length seeds its hash, as in one piece
    for part in body:
        h.update(part)
    return [RECORD_HEADER.pack(RECORD_MAGIC, n, h.intdigest()), head, *body]


class Record(NamedTuple):
    """One record of a log: its seq, where it starts (byte offset in a segment, row in a remote
    segment) and its body, the runs of that seq."""

    seq: int
    offset: int
    packed: bytes


class SegmentScan(NamedTuple):
    """What `scan_segment` read: the intact records, the offset where they end, and whether a torn
    tail follows them."""

    records: list[Record]
    valid_end: int
    torn: bool


def _intact_at(data: bytes, pos: int) -> int:
    """The end offset of an intact record starting at `pos`, or -1."""
    if pos + HEADER_SIZE > len(data):
        return -1
    magic, n, checksum = RECORD_HEADER.unpack_from(data, pos)
    if magic != RECORD_MAGIC or n < SEQ.size or n > MAX_RECORD or pos + HEADER_SIZE + n > len(data):
        return -1
    start = pos + HEADER_SIZE
    if _hash(data[start : start + n], n) != checksum:
        return -1
    return start + n


def _damage(data: bytes, pos: int) -> str:
    if pos + HEADER_SIZE > len(data):
        return "truncated record header"
    magic, n, _ = RECORD_HEADER.unpack_from(data, pos)
    if magic != RECORD_MAGIC:
        return "bad record magic"
    if n < SEQ.size or n > MAX_RECORD:
        return f"impossible record length {n}"
    if pos + HEADER_SIZE + n > len(data):
        return "record runs past the end of the file"
    return "checksum mismatch"


def scan_segment(path: str, data: bytes) -> SegmentScan:
    """Reads every intact record of a segment's bytes.

    A damaged record followed by nothing intact is a torn tail: the scan stops before it and
    says so (`torn`, `valid_end`). A damaged record followed by an intact one is corruption in
    the middle: CorruptLogError with the damaged record's offset.
    """
    if len(data) < SEGMENT_HEADER.size:
        return SegmentScan([], 0, True)
    magic, version, _ = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise CorruptLogError(path, 0, "not a log segment (bad file magic)")
    if version != FORMAT_VERSION:
        raise FormatVersionError(path, version, FORMAT_VERSION)
    records: list[Record] = []
    pos = SEGMENT_HEADER.size
    last_seq = -1
    size = len(data)
    while pos < size:
        end = _intact_at(data, pos)
        if end < 0:
            reason = _damage(data, pos)
            probe = data.find(RECORD_MAGIC, pos + 1)
            while probe >= 0:
                if _intact_at(data, probe) >= 0:
                    raise CorruptLogError(path, pos, reason + " (intact records follow)")
                probe = data.find(RECORD_MAGIC, probe + 1)
            return SegmentScan(records, pos, True)
        (seq,) = SEQ.unpack_from(data, pos + HEADER_SIZE)
        if seq <= last_seq:
            raise CorruptLogError(path, pos, f"seq {seq} does not follow seq {last_seq}")
        records.append(Record(seq, pos, data[pos + HEADER_SIZE + SEQ.size : end]))
        last_seq = seq
        pos = end
    return SegmentScan(records, pos, False)
