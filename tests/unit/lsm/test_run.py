"""Runs (lsm/run.py): the encoding, lookups, merges, truncation, base images, damage, and the
format version of a store directory.

Expected values come from FORMAT.md and from a brute-force model: every entry ever appended
as (seq, column, key, value), an append's pairs before its columns, the value of a key as of s
being the one of the greatest (seq, column) at or below s. Hashes are recomputed here as
FORMAT.md defines them (xxh3_64 of the key's msgpack bytes), and pairs are packed, with msgpack
and xxhash directly, never with lsm.codec.
"""

from __future__ import annotations

import itertools
import os
import struct
from typing import Any

import msgpack
import numpy as np
import plyvel
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lsm.run
from lsm import TOMBSTONE, CorruptLogError, FormatVersionError, KeyEncodingError, Store, Updates
from lsm.codec import pack_column, pack_keys
from lsm.run import MISSING, PendingRun, RunView, image, join_pairs, merge, truncate

HEADER = struct.Struct("<4sHHQQIIIIQQQII12I")
"""FORMAT.md's run header: magic, version, flags, lo, hi, n, ndel, nhist, npairs, hmin, hmax,
checksum, block, a reserved zero, twelve section lengths."""
HEADER_SIZE = 120
SECTIONS = (
    "pairs",
    "hashes",
    "order",
    "blocks",
    "keys",
    "values",
    "dels",
    "seqs",
    "h_hashes",
    "h_keys",
    "h_values",
    "h_seqs",
)
MULTI, HASHED, TUPLES, H_TUPLES = 1, 2, 8, 16
"""FORMAT.md's flags: bit 0, bit 1, bit 3, bit 4."""
SCALAR_TYPES = (int, float, str, bytes, bool, type(None))
ALL_HASHES = (0, 2**64 - 1)
"""hmin, hmax of a run that is not HASHED: every key hash may be in it."""
WHERE = "test-store: run of state 's' at seq 7"

UNIVERSE: list[object] = [None, 0, -1, 7, 2**64 - 1, "", "a", "a\x00", "b", b"a", b"a\x00", ("a",), ("a", 1), ("b", -1)]
"""Keys of every type, with equality traps: "a" / "a\x00" / b"a", ("a",) / ("a", 1)."""

keys_st = st.sampled_from(UNIVERSE)
values_st = st.one_of(
    st.integers(-3, 3),
    st.text(max_size=3),
    st.none(),
    st.tuples(st.integers(0, 2)),
    st.lists(st.integers(0, 2), max_size=2),
    st.just(TOMBSTONE),
)
columns_st = st.lists(st.tuples(keys_st, values_st), max_size=10)
"""One append's columns: keys may repeat, the later column being the newer version."""
plain_values_st = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none(), st.binary(max_size=2))
"""FORMAT.md: what a pair's value may be (plain msgpack; no deletion, no container)."""
pairs_st = st.one_of(st.just([]), st.lists(st.tuples(keys_st, plain_values_st), min_size=1, max_size=8))
"""One append's pairs: keys may repeat (the later pair wins), and a column may set them again."""


def spec_hash(key: object) -> int:
    """FORMAT.md: the key hash is xxh3_64 of msgpack(key) (a list packs as the tuple)."""
    return xxhash.xxh3_64_intdigest(msgpack.packb(key, use_bin_type=True))


def pack_pairs(pairs: list[tuple[object, object]]) -> bytes:
    """FORMAT.md's pairs section, by msgpack alone: an array of [key, value] arrays."""
    return msgpack.packb([[k, v] for k, v in pairs], use_bin_type=True)


def pending(seq: int, columns: list[tuple[object, object]], pairs: list[tuple[object, object]] = ()) -> PendingRun:
    """A run as `append` builds it: the pairs as their writer packed them, the key and value
    columns packed, and the columns of the deletions that are their key's last column."""
    keys = [k for k, _ in columns]
    values = [v for _, v in columns]
    last = {k: i for i, k in enumerate(keys)}
    dels = [i for i, v in enumerate(values) if v is TOMBSTONE and last[keys[i]] == i]
    values_b, _, tuples = pack_column(values)
    if not pairs:
        return PendingRun(seq, len(keys), pack_keys(keys), values_b, dels, tuples=tuples)
    return PendingRun(seq, len(keys), pack_keys(keys), values_b, dels, pack_pairs(pairs), len(pairs), tuples=tuples)


def view(run: PendingRun | bytes) -> RunView:
    return RunView(run.encode() if isinstance(run, PendingRun) else run, WHERE)


def applied(
    pairs: list[tuple[object, object]], columns: list[tuple[object, object]], keep: bool = False, onto: dict = ()
) -> dict:
    """The plain dict model of one append over `onto`: each pair set in order, then each column
    (a deletion pops its key; with `keep`, it is left as TOMBSTONE)."""
    d = dict(onto)
    for k, v in pairs:
        d[k] = v
    for k, v in columns:
        if v is TOMBSTONE and not keep:
            d.pop(k, None)
        else:
            d[k] = v
    return d


Batch = tuple[int, list[tuple[object, object]], list[tuple[object, object]]]
"""(seq, columns, pairs) of one append."""


class Versions:
    """The brute-force model: every entry ever written, an append's pairs before its columns."""

    def __init__(self, batches: list[Batch] = ()) -> None:
        self.rows: list[tuple[int, int, object, object]] = []
        for seq, columns, pairs in batches:
            self.add(seq, columns, pairs)

    def add(self, seq: int, columns: list[tuple[object, object]], pairs: list[tuple[object, object]] = ()) -> None:
        self.rows.extend((seq, col, k, v) for col, (k, v) in enumerate([*pairs, *columns]))

    def value(self, key: object, as_of: int) -> object:
        """The key's value as of `as_of`, MISSING when absent (never written, or deleted)."""
        best = max(
            ((s, c, v) for s, c, k, v in self.rows if k == key and s <= as_of), default=None, key=lambda r: r[:2]
        )
        return MISSING if best is None or best[2] is TOMBSTONE else best[2]

    def state(self, as_of: int) -> dict:
        out = {}
        for key in {k for _, _, k, _ in self.rows}:
            v = self.value(key, as_of)
            if v is not MISSING:
                out[key] = v
        return out

    def chain(self, key: object) -> list[tuple[int, object]]:
        """The key's versions, one per seq (the last entry of that seq), newest first."""
        per_seq: dict[int, tuple[int, object]] = {}
        for s, c, k, v in self.rows:
            if k == key and (s not in per_seq or c > per_seq[s][0]):
                per_seq[s] = (c, v)
        return [(s, per_seq[s][1]) for s in sorted(per_seq, reverse=True)]


def read(runs: list, key: object, as_of: int, hash_of: Any = spec_hash) -> object:
    """What the store's get does over runs newest first: the first answer, absent as MISSING."""
    h = hash_of(key)
    for r in runs:
        v = r.lookup(key, h, as_of)
        if v is not MISSING:
            return MISSING if v is TOMBSTONE else v
    return MISSING


def load(runs_oldest_first: list, as_of: int) -> dict:
    """What the store's load does: each run applied, oldest first."""
    d: dict = {}
    for r in runs_oldest_first:
        r.apply(d, None if as_of >= r.hi else as_of)
    return d


def fields(data: bytes) -> dict[str, Any]:
    f = HEADER.unpack_from(data, 0)
    names = (
        "magic",
        "version",
        "flags",
        "lo",
        "hi",
        "n",
        "ndel",
        "nhist",
        "npairs",
        "hmin",
        "hmax",
        "checksum",
        "block",
        "reserved",
    )
    out = dict(zip(names, f[:14], strict=True))
    out["lengths"] = dict(zip(SECTIONS, f[14:], strict=True))
    return out


def section(data: bytes, name: str) -> bytes:
    lengths = fields(data)["lengths"]
    pos = HEADER_SIZE
    for s in SECTIONS:
        if s == name:
            return data[pos : pos + lengths[s]]
        pos += lengths[s]
    raise KeyError(name)


def blocks(data: bytes, name: str) -> list[bytes]:
    """FORMAT.md: the keys or values section of a blocked run (`block` > 0) as its blocks, cut
    where the blocks section says (n/block rounded up, plus one, u64 starts of the key column's
    blocks, then as many of the value column's); an unblocked one as one block."""
    f = fields(data)
    if not f["block"]:
        return [section(data, name)] if f["lengths"][name] else []
    nb = -(-f["n"] // f["block"])
    starts = np.frombuffer(section(data, "blocks"), "<u8").tolist()
    assert len(starts) == 2 * (nb + 1)
    mine = starts[: nb + 1] if name == "keys" else starts[nb + 1 :]
    raw = section(data, name)
    assert mine[0] == 0 and mine[-1] == len(raw)
    return [raw[a:b] for a, b in itertools.pairwise(mine)]


def column(data: bytes, name: str, use_list: bool = False) -> list:
    """The keys or values of the latest block, decoded block by block (`blocks`); every block
    but the last holds `block` entries."""
    f = fields(data)
    out: list = []
    parts = [msgpack.unpackb(b, use_list=use_list, raw=False, strict_map_key=False) for b in blocks(data, name)]
    if f["block"]:
        assert all(len(p) == f["block"] for p in parts[:-1]), name
        assert not parts or 0 < len(parts[-1]) <= f["block"], name
    for p in parts:
        out.extend(p)
    return out


def check_tuple_flags(data: bytes) -> None:
    """FORMAT.md: a values (h_values) section flagged TUPLES (H_TUPLES) is a plain msgpack array
    of arrays whose items are scalars, read back as tuples."""
    f = fields(data)
    for flag, name in ((TUPLES, "values"), (H_TUPLES, "h_values")):
        if f["flags"] & flag:
            got = (
                column(data, name, use_list=True)
                if name == "values"
                else msgpack.unpackb(section(data, name), use_list=True, raw=False, strict_map_key=False)
            )
            assert got and all(type(v) is list for v in got), name
            assert all(type(x) in SCALAR_TYPES for v in got for x in v), name


def check_append_layout(data: bytes) -> None:
    """FORMAT.md: a run written by `append` is one seq, neither MULTI nor HASHED: no hash, order,
    seq or history section, and every key hash in its range."""
    f = fields(data)
    assert f["flags"] & ~TUPLES == 0 and f["lo"] == f["hi"] and f["nhist"] == 0
    assert f["block"] == 0 and f["reserved"] == 0
    check_tuple_flags(data)
    assert (f["hmin"], f["hmax"]) == ALL_HASHES
    empty = ("hashes", "order", "blocks", "seqs", "h_hashes", "h_keys", "h_values", "h_seqs")
    assert [f["lengths"][s] for s in empty] == [0] * len(empty)
    assert len(data) == HEADER_SIZE + sum(f["lengths"].values())


def check_merged_layout(data: bytes) -> None:
    """FORMAT.md: a merged run is MULTI and HASHED, holds no pairs, and its hash column is the
    sorted key hash of its key column (recomputed here), hmin/hmax its ends (1, 0 when empty)."""
    f = fields(data)
    assert f["flags"] & ~(TUPLES | H_TUPLES) == MULTI | HASHED
    check_tuple_flags(data)
    assert f["npairs"] == 0 and f["lengths"]["pairs"] == 0
    assert f["reserved"] == 0 and (f["block"] > 0 or f["n"] == 0)
    keys = column(data, "keys")
    assert len(keys) == f["n"] == len(column(data, "values"))
    hashes = np.frombuffer(section(data, "hashes"), "<u8").tolist()
    assert hashes == sorted(spec_hash(k) for k in keys)
    assert (f["hmin"], f["hmax"]) == ((hashes[0], hashes[-1]) if hashes else (1, 0))
    order = np.frombuffer(section(data, "order"), "<u4").tolist()
    assert [spec_hash(keys[c]) for c in order] == hashes


# -- encoding ---------------------------------------------------------------------------------


def test_header_size_matches_format_md() -> None:
    assert HEADER.size == HEADER_SIZE == lsm.run.HEADER.size
    assert lsm.run.SECTIONS == SECTIONS


def test_a_run_of_one_append_is_laid_out_as_format_md_says() -> None:
    columns = [("k", 1), ("j", TOMBSTONE), (("t", 1), "x"), ("k", 2), ("g", TOMBSTONE), ("g", 3)]
    pairs = [("p", 1), (("t", 2), b"\x00"), ("k", None), ("p", "two")]
    p = pending(7, columns, pairs)
    data = p.encode()
    f = fields(data)
    assert f["magic"] == b"NSRN" and f["version"] == 4
    assert (f["lo"], f["hi"], f["n"], f["ndel"], f["nhist"], f["npairs"]) == (7, 7, 6, 1, 0, 4)
    # the checksum covers the header's other 112 bytes (0..56, 64..120), then the body
    assert f["checksum"] == xxhash.xxh3_64_intdigest(data[:56] + data[64:HEADER_SIZE] + data[HEADER_SIZE:])
    check_append_layout(data)
    assert section(data, "pairs") == pack_pairs(pairs)
    assert msgpack.unpackb(section(data, "pairs"), use_list=False) == (
        ("p", 1),
        (("t", 2), b"\x00"),
        ("k", None),
        ("p", "two"),
    )
    assert msgpack.unpackb(section(data, "keys"), use_list=False) == ("k", "j", ("t", 1), "k", "g", "g")
    assert np.frombuffer(section(data, "dels"), "<u4").tolist() == [1]  # "g" is set again after its deletion
    assert p.nbytes == len(data)


def test_a_run_of_one_append_without_pairs_has_an_empty_pairs_section() -> None:
    data = pending(3, [("a", 1)]).encode()
    f = fields(data)
    assert (f["npairs"], f["lengths"]["pairs"]) == (0, 0)
    check_append_layout(data)
    assert view(data).pairs() == ()


def test_an_empty_run_holds_nothing_and_an_empty_merged_run_no_hash_range() -> None:
    """FORMAT.md: an append's run is not HASHED (every hash in its range, even with no key);
    a merged run of no key holds the empty range hmin 1, hmax 0."""
    r = view(pending(3, []))
    assert (r.flags, r.n, r.npairs, r.hmin, r.hmax) == (0, 0, 0, *ALL_HASHES)
    m = view(merge([r], -1, base=True))
    check_merged_layout(m.data)
    assert (m.n, m.nhist, m.hmin, m.hmax) == (0, 0, 1, 0)
    for run in (r, m):
        for key in UNIVERSE:
            assert run.lookup(key, spec_hash(key), 3) is MISSING
        d = {"x": 1}
        run.apply(d)
        assert d == {"x": 1}


def test_a_column_of_tuples_of_scalars_is_plain_arrays_flagged_tuples() -> None:
    """FORMAT.md: a value column whose every value is a tuple of scalars is a plain msgpack
    array of arrays, flagged TUPLES, and reads back as tuples; as a merge's latest and history
    blocks too (TUPLES, H_TUPLES)."""
    one = [("a", (1, 2.5)), ("b", ("x", None, b"y", True)), ("c", ())]
    data = pending(1, one).encode()
    check_append_layout(data)
    assert fields(data)["flags"] == TUPLES
    assert section(data, "values") == msgpack.packb([list(v) for _, v in one], use_bin_type=True)
    r = view(data)
    assert [(type(v), v) for v in r.values] == [(tuple, v) for _, v in one]
    assert all(type(r.lookup(k, spec_hash(k), 1)) is tuple for k, _ in one)
    two = [("a", (3, 4.5)), ("d", (5,))]
    merged = view(merge([r, view(pending(2, two))], -1, base=True))
    check_merged_layout(merged.data)
    assert merged.flags == MULTI | HASHED | TUPLES | H_TUPLES
    assert merged.as_of(1) == dict(one) and merged.as_of(2) == dict(one) | dict(two)
    assert all(type(v) is tuple for v in [*merged.values, *merged.history[1]])


def many_keys(n: int) -> list[object]:
    """n distinct keys of every key type."""
    kinds = (lambda i: i, lambda i: f"k{i}", lambda i: f"k{i}".encode(), lambda i: ("t", i), lambda i: -i - 1)
    return [kinds[i % len(kinds)](i) for i in range(n)]


@pytest.mark.parametrize("n", [63, 64, 65, 1000])
def test_a_merged_run_of_many_blocks_reads_as_its_model_block_by_block(n: int) -> None:
    """FORMAT.md: a merged run's latest key and value columns are blocks of `block` entries,
    cut where the blocks section says; every key, every deletion (in any block) and every
    as-of read comes back as the model says, and a look-up decodes neither whole column."""
    keys = many_keys(n)
    first = [(k, (i, "v" * (i % 7))) for i, k in enumerate(keys)]
    second = [(k, TOMBSTONE if i % 11 == 0 else (i, "w")) for i, k in enumerate(keys) if i % 3 == 0]
    model = Versions([(1, first, []), (2, second, [])])
    runs = [view(pending(1, first)), view(pending(2, second))]
    data = merge(runs, 1, base=False)
    f = fields(data)
    assert f["block"] == lsm.run.BLOCK and len(blocks(data, "keys")) == -(-n // f["block"])
    check_merged_layout(data)
    r = view(data)
    for key in keys:
        for as_of in (1, 2):
            got = r.lookup(key, spec_hash(key), as_of)
            want = model.value(key, as_of)
            assert (MISSING if got is TOMBSTONE else got) == want, (key, as_of)
    assert r._keys is None, "a look-up decoded the whole key column"
    assert r.lookup_cost() == 0
    assert load([r], 2) == model.state(2) and load([r], 1) == model.state(1)
    assert r.as_of(2) == applied([], [*first, *second], keep=True)
    with_deletions: dict = {}
    r.apply(with_deletions, keep_deletions=True)
    assert with_deletions == applied([], [*first, *second], keep=True)


def test_one_block_that_is_no_tuple_column_makes_every_block_plain() -> None:
    """FORMAT.md: TUPLES holds for every block of a column or for none; a list in one block
    of tuples stays a list, the tuples stay tuples."""
    keys = many_keys(300)
    column_ = [(k, (i, "x")) for i, k in enumerate(keys)]
    column_[150] = (keys[150], [150, "x"])
    data = merge([view(pending(1, column_))], -1, base=True)
    check_merged_layout(data)
    r = view(data)
    assert not r.flags & TUPLES
    got = {k: r.lookup(k, spec_hash(k), 1) for k in keys}
    assert got == dict(column_)
    assert type(got[keys[150]]) is list and type(got[keys[0]]) is tuple and type(got[keys[299]]) is tuple
    assert view(merge([view(pending(1, column_[:150]))], -1, base=True)).flags & TUPLES


def test_block_starts_that_do_not_cover_their_column_are_corrupt() -> None:
    """The blocks section is read before any block: starts past the column's end, going back,
    or a section of the wrong length are CorruptLogError, even with a valid checksum."""
    data = merge([view(pending(1, [(k, 1) for k in many_keys(200)]))], -1, base=True)
    f = fields(data)
    pos = HEADER_SIZE + sum(f["lengths"][s] for s in SECTIONS[: SECTIONS.index("blocks")])
    starts = np.frombuffer(section(data, "blocks"), "<u8").copy()
    for damage in ("past", "back"):
        bad = starts.copy()
        if damage == "past":
            bad[len(bad) // 2 - 1] += 1  # the key column's last start is its length
        else:
            bad[1], bad[2] = bad[2], bad[1]
        body = bytearray(data)
        body[pos : pos + len(bad) * 8] = bad.tobytes()
        sealed = reseal(bytes(body))
        with pytest.raises(CorruptLogError) as ei:
            RunView(sealed, WHERE)
        assert WHERE in str(ei.value) and "block" in str(ei.value), damage


def test_a_merged_run_with_no_block_size_is_corrupt() -> None:
    """Every merged (hashed) run of format 4 is blocked: one whose block size and blocks section
    are both gone is CorruptLogError at open, not a division by zero at its first look-up."""
    data = merge([view(pending(1, [(k, 1) for k in many_keys(100)]))], -1, base=True)
    f = fields(data)
    lengths = dict(f["lengths"], blocks=0)
    body = b"".join(section(data, s) if s != "blocks" else b"" for s in SECTIONS)
    head = [f[name] for name in ("magic", "version", "flags", "lo", "hi", "n", "ndel", "nhist", "npairs")]
    head += [f["hmin"], f["hmax"], 0, 0, 0, *(lengths[s] for s in SECTIONS)]
    sealed = reseal(HEADER.pack(*head) + body)
    with pytest.raises(CorruptLogError) as ei:
        RunView(sealed, WHERE)
    assert WHERE in str(ei.value) and "100 keys has no block size" in str(ei.value)


def reseal(data: bytes) -> bytes:
    """The run with its checksum made right for its bytes (FORMAT.md: xxh3_64 of the header's
    other bytes, then the body)."""
    digest = xxhash.xxh3_64_intdigest(data[:56] + data[64:HEADER_SIZE] + data[HEADER_SIZE:])
    return data[:56] + struct.pack("<Q", digest) + data[64:]


@pytest.mark.parametrize("n", [15, 16, 2500, 70_000])
def test_a_long_tuple_column_is_one_msgpack_array(n: int) -> None:
    """Whatever its length (the writer packs it in chunks), a tuple column is one msgpack array
    of plain arrays; one list anywhere in it, even after thousands of tuples, makes it an
    ordinary column."""
    column = [(i, i / 3, str(i), None) for i in range(n)]
    data = pending(1, [(i, v) for i, v in enumerate(column)]).encode()
    assert fields(data)["flags"] == TUPLES
    assert section(data, "values") == msgpack.packb([list(v) for v in column], use_bin_type=True)
    assert view(data).values == column
    column[-1] = list(column[-1])
    data = pending(1, [(i, v) for i, v in enumerate(column)]).encode()
    assert fields(data)["flags"] == 0
    got = view(data).values
    assert got == column and type(got[-1]) is list and type(got[0]) is tuple


@pytest.mark.parametrize(
    "column",
    [
        [(1, (2,))],  # a tuple in a tuple
        [(1,), [2]],  # a list among tuples
        [(1,), TOMBSTONE],  # a deletion among tuples
        [(frozenset({1}),)],  # a container in a tuple
        [(1, [2])],
        [],
    ],
    ids=["nested-tuple", "list", "deletion", "frozenset", "list-in-tuple", "empty"],
)
def test_a_column_that_is_not_all_tuples_of_scalars_keeps_its_extension_types(column: list) -> None:
    """FORMAT.md: any other column is not flagged TUPLES; its tuples are ext 2 and read back as
    tuples, its lists as lists."""
    columns = [(f"k{i}", v) for i, v in enumerate(column)]
    data = pending(1, columns).encode()
    assert fields(data)["flags"] == 0
    assert repr(view(data).values) == repr(column)


@settings(max_examples=200)
@given(columns_st, pairs_st, st.integers(0, 2**40))
def test_encode_then_read_round_trip(
    columns: list[tuple[object, object]], pairs: list[tuple[object, object]], seq: int
) -> None:
    """The run holds its pairs and columns as given, unhashed; reads of the encoded run and of
    the pending one equal the model."""
    p = pending(seq, columns, pairs)
    data = p.encode()
    check_append_layout(data)
    r = view(data)
    keys = [k for k, _ in columns]
    assert r.lo == r.hi == seq and r.n == len(columns) and r.npairs == len(pairs)
    assert list(r.keys) == keys and r.values == [v for _, v in columns]
    assert list(r.pairs()) == [tuple(kv) for kv in pairs]
    assert p.nbytes == len(data)
    model = Versions([(seq, columns, pairs)])
    for run in (p, r):
        assert load([run], seq) == model.state(seq)
        for key in UNIVERSE:
            assert read([run], key, seq) == model.value(key, seq)
            assert read([run], key, seq + 5) == model.value(key, seq)
            assert run.lookup(key, spec_hash(key), seq - 1) is MISSING


def test_a_key_repeated_in_one_append_reads_as_its_last_column() -> None:
    columns = [("k", 1), ("k", 2), ("j", TOMBSTONE), ("j", 3), ("g", 4), ("g", TOMBSTONE), ("d", TOMBSTONE)]
    for run in (pending(5, columns), view(pending(5, columns))):
        assert run.lookup("k", spec_hash("k"), 5) == 2
        assert run.lookup("j", spec_hash("j"), 5) == 3
        assert run.lookup("g", spec_hash("g"), 5) is TOMBSTONE
        assert run.lookup("d", spec_hash("d"), 5) is TOMBSTONE
        assert run.lookup("e", spec_hash("e"), 5) is MISSING
        d = {"g": "older", "d": "older", "e": "older"}
        run.apply(d)
        assert d == {"k": 2, "j": 3, "e": "older"}


def test_a_deletion_hides_older_runs_and_a_missing_key_does_not() -> None:
    older = view(pending(1, [("a", 1), ("b", 1), ("c", 1)]))
    newer = view(pending(2, [("a", TOMBSTONE), ("c", 2)]))
    assert read([newer, older], "a", 2) is MISSING
    assert read([newer, older], "a", 1) == 1
    assert read([newer, older], "b", 2) == 1
    assert read([newer, older], "c", 2) == 2
    assert load([older, newer], 2) == {"b": 1, "c": 2}
    assert load([older, newer], 1) == {"a": 1, "b": 1, "c": 1}


# -- pairs ------------------------------------------------------------------------------------


def pair_at(i: int) -> list:
    """The i-th of many distinct pairs, of every key type and several value types."""
    key = (i, f"k{i}", (i % 7, "t"), i.to_bytes(3, "big"))[i % 4]
    value = (i, f"v{i}", None, b"\xff" * (i % 3))[i // 4 % 4]
    return [key, value]


def msgpack_array_head(n: int) -> bytes:
    """The msgpack spec's array header, written by hand: fixarray, array 16, array 32."""
    if n <= 15:
        return bytes([0x90 | n])
    if n <= 0xFFFF:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


@pytest.mark.parametrize(
    "sizes",
    [
        [],
        [0],
        [1],
        [15],
        [16],
        [65535],
        [65536],
        [0, 0],
        [14, 1],
        [15, 1],
        [15, 0, 1],
        [65534, 1],
        [65535, 1],
        [0, 1, 15, 16, 65535, 65536],
    ],
)
def test_join_pairs_is_one_msgpack_array_of_every_chunk_s_pairs_in_order(sizes: list[int]) -> None:
    """Chunks of 0, 1, 15, 16, 65535 and 65536 pairs cross every array header size (1, 3, 5
    bytes), in the chunks and in the joined array."""
    packer = msgpack.Packer(use_bin_type=True)
    chunks, everything = [], []
    for n in sizes:
        batch = [pair_at(len(everything) + i) for i in range(n)]
        everything += batch
        chunks.append((n, packer.pack(batch)))
    assert all(b[: len(msgpack_array_head(n))] == msgpack_array_head(n) for n, b in chunks)
    total, joined = join_pairs(chunks)
    assert total == len(everything) == sum(sizes)
    by_hand = msgpack_array_head(total) + b"".join(msgpack.packb(p, use_bin_type=True) for p in everything)
    assert joined == by_hand
    assert joined == msgpack.packb(everything, use_bin_type=True)
    assert msgpack.unpackb(joined, use_list=False, raw=False) == tuple((k, v) for k, v in everything)


def test_a_run_of_one_append_applies_its_pairs_then_its_columns() -> None:
    """A key in the pairs and the columns: the column wins; a key twice in the pairs: the later;
    a column deletion of a key the pairs set: deleted."""
    pairs = [("both", "pair"), ("twice", 1), ("gone", "pair"), ("twice", 2), ("only", 3), (("t", 1), "t")]
    columns = [("both", "column"), ("gone", TOMBSTONE), ("col", [1]), ("never", TOMBSTONE)]
    want = {"both": "column", "twice": 2, "only": 3, ("t", 1): "t", "col": [1]}
    assert applied(pairs, columns) == want
    p = pending(4, columns, pairs)
    for run in (p, view(p)):
        d = {"gone": "older", "never": "older", "kept": "older"}
        run.apply(d)
        assert d == {**want, "kept": "older"}
        for key, v in want.items():
            assert run.lookup(key, spec_hash(key), 4) == v
            assert run.lookup(key, spec_hash(key), 3) is MISSING
        assert run.lookup("gone", spec_hash("gone"), 4) is TOMBSTONE
        assert run.lookup("never", spec_hash("never"), 4) is TOMBSTONE
        assert run.lookup("kept", spec_hash("kept"), 4) is MISSING


@settings(max_examples=300)
@given(pairs_st, columns_st, st.integers(0, 2**40))
def test_apply_and_lookup_of_pairs_and_columns_equal_a_dict_model(
    pairs: list[tuple[object, object]], columns: list[tuple[object, object]], seq: int
) -> None:
    want, with_deletions = applied(pairs, columns), applied(pairs, columns, keep=True)
    p = pending(seq, columns, pairs)
    r = view(p)
    for run in (p, r):
        older = {key: ("older", key) for key in UNIVERSE}
        d = dict(older)
        run.apply(d)
        assert d == applied(pairs, columns, onto=older)
        fresh: dict = {}
        run.apply(fresh)
        assert fresh == want
        kept: dict = {}
        run.apply(kept, keep_deletions=True)
        assert kept == with_deletions
        for key in UNIVERSE:
            assert run.lookup(key, spec_hash(key), seq) == with_deletions.get(key, MISSING)
            assert run.lookup(key, spec_hash(key), seq + 1) == with_deletions.get(key, MISSING)
            assert run.lookup(key, spec_hash(key), seq - 1) is MISSING
        keys, values, seqs, hashes = run.entries()
        # each key once, at its last entry (a deletion as TOMBSTONE): what a merge needs
        assert dict(zip(keys, values, strict=True)) == with_deletions and len(keys) == len(with_deletions)
        assert seqs.tolist() == [seq] * len(keys)
        assert hashes.tolist() == [spec_hash(k) for k in keys]
    assert r.as_of(seq) == with_deletions and r.as_of(seq - 1) == {}


def updates(chunks: list[list[tuple[object, object]]], columns: list[tuple[object, object]]) -> Updates:
    """`Updates` as a writer hands them over: each chunk of pairs packed by one msgpack call, as
    a map (as keyed operators pack them) or as an array of pairs (as older writers did), by
    turns, so that STORE_HISTORY's appends hold maps only, arrays only, and both."""
    packer = msgpack.Packer(use_bin_type=True)
    packed = [
        (len(c), packer.pack_map_pairs(c) if (len(c) + i) % 2 == 0 else packer.pack([[k, v] for k, v in c]))
        for i, c in enumerate(chunks)
    ]
    return Updates([k for k, _ in columns], [v for _, v in columns], packed, checked=False)


StoreBatch = tuple[int, dict[str, tuple[list, list]]]
"""(seq, state -> (chunks of pairs, columns)) of one append to a store."""

STORE_HISTORY: list[StoreBatch] = [
    (1, {"s": ([[("a", 1), ("b", 1), ("c", 1)], [("a", 2)]], [("b", 10), ("d", TOMBSTONE)])}),
    (2, {"s": ([[("c", 2), ("e", "x")]], [("c", TOMBSTONE)]), "o": ([[(("t", 1), "o1")]], [])}),
    (4, {"s": ([], [("a", (1, "tuple")), ("f", [1, 2])]), "o": ([], [("z", 1)])}),
    (5, {"s": ([[("a", 5), ("c", 5)], [], [("a", 6)]], [("f", TOMBSTONE), ("f", 7)])}),
    (7, {"s": ([[("b", None), (7, b"\x00"), (["t", 2], "list key")]], [("b", TOMBSTONE), ("e", TOMBSTONE)])}),
    (8, {"s": ([[(i, i) for i in range(20)]], [(3, TOMBSTONE), ("a", 8)]), "o": ([[("z", 2)]], [("z", 3)])}),
]
"""Pairs and columns of every kind: a key in both, twice in the pairs, deleted by a column
after the pairs set it, a list key in the pairs, an empty chunk, a chunk of 20 (array 16)."""
STORE_LAST = STORE_HISTORY[-1][0]
STORE_STATES = ("s", "o")


def canonical(key: object) -> object:
    return tuple(key) if type(key) is list else key


def store_model(as_of: int) -> dict[str, dict]:
    """Each state as of `as_of`: the plain dict model of every append up to it, in order."""
    out: dict[str, dict] = {state: {} for state in STORE_STATES}
    for seq, runs in STORE_HISTORY:
        if seq <= as_of:
            for state, (chunks, columns) in runs.items():
                pairs = [(canonical(k), v) for c in chunks for k, v in c]
                out[state] = applied(pairs, columns, onto=out[state])
    return out


def entries(updates: tuple[list, list]) -> int:
    """What `Store.runs` counts of a run of one append: its pairs and its columns."""
    chunks, columns = updates
    return sum(map(len, chunks)) + len(columns)


def store_keys() -> set:
    return {canonical(k) for _, runs in STORE_HISTORY for c, cols in runs.values() for k, _ in [*sum(c, []), *cols]}


def check_store(s: Store, as_ofs: list, where: str) -> None:
    """load and get of every state and key ever written (and one never written) equal the model,
    as of each seq (None: now)."""
    for as_of in as_ofs:
        want = store_model(STORE_LAST if as_of is None else as_of)
        for state in STORE_STATES:
            assert s.load(state, as_of=as_of) == want[state], f"{where}: load({state!r}, as_of={as_of})"
            for key in [*store_keys(), "never"]:
                got = s.get(state, key, as_of=as_of, default=MISSING)
                assert got == want[state].get(key, MISSING), f"{where}: get({state!r}, {key!r}, as_of={as_of})"


EVERY_SEQ = [None, *range(-1, STORE_LAST + 2)]


def append_history(s: Store) -> None:
    for seq, runs in STORE_HISTORY:
        s.append(seq, {state: updates(chunks, columns) for state, (chunks, columns) in runs.items()})


def index_all(s: Store) -> None:
    s.flush(timeout=5.0)
    s._persister.drain_index()
    assert s.indexed == s.last_seq


def disk_runs(path: str, state: str) -> dict[int, bytes]:
    """hi -> the bytes of each run of `state` in the disk tier (FORMAT.md's `01` entries), and
    their `02` catalog entries checked: the 120-byte header, then the run's length u64 BE."""
    prefix = b"\x07" + state.encode() + b"\x00\x01"
    db = plyvel.DB(os.path.join(path, "disk"))
    try:
        runs = {struct.unpack(">Q", k[-8:])[0]: v for k, v in db.iterator(prefix=b"\x01" + prefix)}
        catalog = {struct.unpack(">Q", k[-8:])[0]: v for k, v in db.iterator(prefix=b"\x02" + prefix)}
    finally:
        db.close()
    assert catalog.keys() == runs.keys()
    for hi, data in runs.items():
        assert catalog[hi] == data[:HEADER_SIZE] + struct.pack(">Q", len(data)), hi
    return runs


def test_pairs_and_columns_read_as_the_model_through_a_store(tmp_path) -> None:  # noqa: ANN001
    """load and get as of every seq equal the model: as appended, indexed, reopened, merged
    directly (`merge`), merged by compact() with a large retention, then folded by compact()
    with retention 0."""
    path = str(tmp_path / "store")
    options = dict(retention=1000, merge_fanout=2, budget=0)
    s = Store(path, **options)
    append_history(s)
    check_store(s, EVERY_SEQ, "as appended")
    assert s.runs("s")[0] == (1, 1, entries(STORE_HISTORY[0][1]["s"])) == (1, 1, 2 + 4)
    index_all(s)
    check_store(s, EVERY_SEQ, "indexed")
    s.close()

    runs = {hi: RunView(data, WHERE) for hi, data in disk_runs(path, "s").items()}
    assert sorted(runs) == [seq for seq, batch in STORE_HISTORY if "s" in batch]
    for hi, r in runs.items():
        check_append_layout(r.data)
        ((chunks, _),) = [batch["s"] for seq, batch in STORE_HISTORY if seq == hi]
        assert r.npairs == sum(map(len, chunks)), hi
    oldest_first = [runs[hi] for hi in sorted(runs)]
    want = {as_of: store_model(as_of)["s"] for as_of in range(-1, STORE_LAST + 2)}
    for horizon in (-1, 1, 4, STORE_LAST):
        merged = view(merge(oldest_first, horizon, base=True))
        check_merged_layout(merged.data)
        for as_of in range(max(horizon, 1), STORE_LAST + 2):
            assert load([merged], as_of) == want[as_of], (horizon, as_of)
            for key in [*store_keys(), "never"]:
                assert read([merged], key, as_of) == want[as_of].get(key, MISSING), (horizon, key, as_of)

    s = Store(path, **options)
    check_store(s, EVERY_SEQ, "reopened")
    assert s.runs("s") == [(seq, seq, entries(batch["s"])) for seq, batch in STORE_HISTORY if "s" in batch]
    merges = 0
    while s.compact()["merges"]:
        merges += 1
        check_store(s, EVERY_SEQ, f"after {merges} merges")
    assert merges and any(lo < hi for lo, hi, _ in s.runs("s")), s.runs("s")
    s.close()

    s = Store(path, **{**options, "retention": 0})
    s.compact()
    assert s.horizon == STORE_LAST and [(lo, hi) for lo, hi, _ in s.runs("s")] == [(1, STORE_LAST)]
    check_store(s, [STORE_LAST, STORE_LAST + 1, None], "folded")
    s.close()
    for data in disk_runs(path, "s").values():
        check_merged_layout(data)


def test_a_merge_counts_the_pairs_among_the_versions_it_drops(tmp_path) -> None:  # noqa: ANN001
    with Store(str(tmp_path / "store"), retention=0, merge_fanout=2, budget=0) as s:
        append_history(s)
        index_all(s)
        before = {state: sum(e for _, _, e in s.runs(state)) for state in STORE_STATES}
        assert before == {
            state: sum(entries(batch[state]) for _, batch in STORE_HISTORY if state in batch) for state in STORE_STATES
        }
        s.compact()
        after = {state: sum(e for _, _, e in s.runs(state)) for state in STORE_STATES}
        assert after == {state: len(store_model(STORE_LAST)[state]) for state in STORE_STATES}
        assert s.stats.versions_dropped == sum(before.values()) - sum(after.values())


def test_a_run_logged_with_pairs_is_replayed(tmp_path) -> None:  # noqa: ANN001
    """A log written by hand from FORMAT.md, its run holding pairs: an open replays it."""
    run = pending(1, [("b", 2), ("c", TOMBSTONE)], [("a", 1), ("b", 1), ("c", 1)]).encode()
    path = store_with_log(tmp_path, log_segment((1, {b"\x07s\x00\x01": run})))
    with Store(path) as s:
        assert s.last_seq == 1 and s.load("s") == {"a": 1, "b": 2}
        assert s.get("s", "b") == 2 and s.get("s", "c", default=MISSING) is MISSING


def test_updates_checked_skips_the_key_check_and_unchecked_refuses_a_bad_key(tmp_path) -> None:  # noqa: ANN001
    """`checked=False`: a float key is refused with KeyEncodingError and nothing of the batch
    is added; `checked=True` is the caller's promise (REQUIRES) and is not checked again."""
    with Store(str(tmp_path / "store")) as s:
        s.append(1, {"s": {"a": 1}})
        with pytest.raises(KeyEncodingError) as ei:
            s.append(2, {"ok": Updates(["x"], [2]), "s": Updates(["b", 1.5], [2, 2], updates([[("p", 1)]], []).pairs)})
        assert "'s'" in str(ei.value)
        assert s.last_seq == 1 and s.states() == ["s"]
        assert s.load("s") == {"a": 1} and s.load("ok") == {}
        s.append(2, {"s": Updates([["t", 1]], ["list key"])})
        assert s.get("s", ("t", 1)) == "list key", "unchecked keys are made store keys (a list is the tuple)"
        s.append(3, {"s": Updates([1.5], [3], checked=True)})
        assert s.last_seq == 3


# -- merges -----------------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn, min_batches: int = 1) -> list[Batch]:
    """Appends at strictly increasing seqs from 1 (seq 0 is left for an older run)."""
    steps = draw(st.lists(st.integers(1, 3), min_size=min_batches, max_size=8))
    seq, out = 0, []
    for step in steps:
        seq += step
        out.append((seq, draw(columns_st), draw(pairs_st)))
    return out


def expected_entries(model: Versions, horizon: int, base: bool) -> set[tuple[object, int]]:
    """FORMAT.md/merge: the newest version of each key (a deletion at or below the horizon
    dropped when nothing older is left), and each older version whose next newer version is
    above the horizon."""
    out = set()
    for key in {k for _, _, k, _ in model.rows}:
        chain = model.chain(key)
        (s0, v0), older = chain[0], chain[1:]
        if not (base and v0 is TOMBSTONE and s0 <= horizon):
            out.add((key, s0))
        for (newer_seq, _), (s, _) in zip(chain, older, strict=False):
            if newer_seq > horizon:
                out.add((key, s))
    return out


OLDER = [(k, ("old", i)) for i, k in enumerate(UNIVERSE)]
"""An older run at seq 0 holding every key: what a merge that is not a base must keep hiding."""


def check_reads(merged: RunView, history: list, horizon: int, base: bool, hash_of: Any = spec_hash) -> None:
    """Every read at or after the horizon equals the model: of the merged run alone (a base),
    or over the OLDER run (not a base: the merged run's deletions must still hide it)."""
    runs = [merged]
    if not base:
        runs.append(view(pending(0, OLDER)))
        history = [(0, OLDER, []), *history]
    model = Versions(history)
    for as_of in range(max(horizon, 0), merged.hi + 2):
        for key in UNIVERSE:
            assert read(runs, key, as_of, hash_of) == model.value(key, as_of), (key, as_of)
        assert load(runs[::-1], as_of) == model.state(as_of), as_of


def kept(run: RunView) -> dict[object, list[tuple[int, object]]]:
    """key -> the versions a run holds (latest block and history), newest first."""
    keys, values, seqs, _ = run.entries()
    out: dict[object, list[tuple[int, object]]] = {}
    for k, v, s in zip(keys, values, seqs.tolist(), strict=True):
        out.setdefault(k, []).append((s, v))
    return {k: sorted(vs, key=lambda sv: -sv[0]) for k, vs in out.items()}


def check_block_order(run: RunView) -> None:
    """FORMAT.md: a merged run is MULTI and HASHED, its latest block's hashes sorted with
    `order` pointing at their keys; the history block sorted by hash, then newest first within
    a key."""
    check_merged_layout(run.data)
    keys = run.keys
    assert run.hashes.tolist() == sorted(spec_hash(k) for k in keys)
    assert [spec_hash(keys[c]) for c in run.order.tolist()] == run.hashes.tolist()
    assert len(set(keys)) == len(keys), "a key twice in a merged run's latest block"
    hkeys, _, hseqs, hhashes = run.history
    assert hhashes.tolist() == [spec_hash(k) for k in hkeys]
    assert hhashes.tolist() == sorted(hhashes.tolist())
    for i in range(1, len(hkeys)):
        if hkeys[i] == hkeys[i - 1]:
            assert hseqs[i] < hseqs[i - 1], "history of a key not newest first"


@settings(max_examples=300, deadline=None)
@given(histories(), st.data(), st.booleans())
def test_merge_keeps_exactly_the_versions_a_read_at_or_after_the_horizon_can_see(
    history: list, data: st.DataObject, base: bool
) -> None:
    hi = history[-1][0]
    horizon = data.draw(st.integers(-1, hi + 1), label="horizon")
    merged = view(merge([view(pending(*batch)) for batch in history], horizon, base))
    model = Versions(history)
    assert merged.flags & ~(TUPLES | H_TUPLES) == MULTI | HASHED, "a merged run is MULTI and HASHED"
    assert (merged.lo, merged.hi) == (history[0][0], hi)
    versions = kept(merged)
    assert {(k, s) for k, vs in versions.items() for s, _ in vs} == expected_entries(model, horizon, base)
    for k, vs in versions.items():
        chain = dict(model.chain(k))
        assert all(v == chain[s] for s, v in vs), k
    assert merged.ndel == sum(1 for v in merged.values if v is TOMBSTONE)
    check_block_order(merged)
    check_reads(merged, history, horizon, base)


@st.composite
def merged_groups(draw: st.DrawFn, history: list, horizon: int, base: bool) -> list[RunView]:
    """The history's runs, some consecutive groups of them merged first at an older horizon
    (as the compactor's size-tiered merges leave them)."""
    n = len(history)
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=3)))) if n > 1 else []
    bounds = [0, *cuts, n]
    earlier = draw(st.integers(-1, horizon), label="earlier horizon")
    runs = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        group = [view(pending(*batch)) for batch in history[a:b]]
        if len(group) > 1 or draw(st.booleans()):
            runs.append(view(merge(group, earlier, base and i == 0)))
        else:
            runs.append(group[0])
    return runs


@settings(max_examples=300, deadline=None)
@given(histories(min_batches=2), st.data(), st.booleans())
def test_merging_merged_runs_reads_as_the_history_and_keeps_no_hidden_version(
    history: list, data: st.DataObject, base: bool
) -> None:
    hi = history[-1][0]
    horizon = data.draw(st.integers(-1, hi + 1), label="horizon")
    runs = data.draw(merged_groups(history, horizon, base), label="runs")
    merged = view(merge(runs, horizon, base))
    assert (merged.lo, merged.hi) == (history[0][0], hi)
    check_block_order(merged)
    check_reads(merged, history, horizon, base)
    for k, vs in kept(merged).items():
        if base:
            assert not (vs[0][1] is TOMBSTONE and vs[0][0] <= horizon), f"{k!r}: a deletion kept with nothing to hide"
        for (newer, _), (older, _) in zip(vs, vs[1:], strict=False):
            assert newer > horizon, f"{k!r}: version {older} kept though no read at or after {horizon} sees it"


@settings(max_examples=200, deadline=None)
@given(histories(min_batches=2), st.data(), st.booleans())
def test_truncate_keeps_every_version_up_to_its_seq_and_none_above(
    history: list, data: st.DataObject, base: bool
) -> None:
    lo, hi = history[0][0], history[-1][0]
    horizon = data.draw(st.integers(-1, hi), label="horizon")
    merged = view(merge([view(pending(*batch)) for batch in history], horizon, base))
    to_seq = data.draw(st.integers(max(lo, horizon), hi), label="to_seq")
    t = view(truncate(merged, to_seq, horizon, base))
    assert (t.lo, t.hi) == (lo, to_seq)
    assert all(s <= to_seq for s in t.entries()[2].tolist())
    check_block_order(t)
    check_reads(t, [batch for batch in history if batch[0] <= to_seq], horizon, base)


def test_truncate_of_a_run_of_one_append_at_its_seq_keeps_it() -> None:
    cols = [("a", 1), ("a", TOMBSTONE), ("b", 2), ("c", TOMBSTONE)]
    pairs = [("c", 3), ("d", 4), ("b", 1)]
    t = view(truncate(view(pending(4, cols, pairs)), 4, -1, base=False))
    assert (t.lo, t.hi) == (4, 4)
    check_block_order(t)
    assert read([t], "a", 4) is MISSING and t.lookup("a", spec_hash("a"), 4) is TOMBSTONE
    assert read([t], "c", 4) is MISSING and t.lookup("c", spec_hash("c"), 4) is TOMBSTONE
    assert read([t], "b", 4) == 2 and read([t], "d", 4) == 4


@settings(max_examples=200, deadline=None)
@given(histories(), st.data())
def test_image_holds_every_live_key_as_of_its_seq_and_nothing_else(history: list, data: st.DataObject) -> None:
    lo, hi = history[0][0], history[-1][0]
    seq = data.draw(st.integers(lo, hi), label="seq")
    model = Versions(history)
    whole = view(merge([view(pending(*batch)) for batch in history], -1, True))
    singles = [view(pending(*batch)) for batch in history if batch[0] <= seq]
    for runs in ([whole], singles):
        img = view(image(runs, seq))
        assert (img.lo, img.hi, img.ndel, img.nhist) == (lo, seq, 0, 0)
        assert dict(zip(img.keys, img.values, strict=True)) == model.state(seq)
        assert img.n == len(model.state(seq))
        check_block_order(img)
        for key in UNIVERSE:
            assert read([img], key, seq) == model.value(key, seq)


def test_an_image_of_no_run_is_empty() -> None:
    img = view(image([], 9))
    assert (img.lo, img.hi, img.n, img.nhist) == (9, 9, 0, 0)
    check_merged_layout(img.data)


def weak_hash(key: object) -> int:
    return spec_hash(key) % 3


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(min_batches=2), st.data(), st.booleans())
def test_keys_sharing_a_hash_stay_apart(history: list, data: st.DataObject, base: bool) -> None:
    """xxh3-64 collisions cannot be found for a test: the run module's hash is replaced by
    one with three values, so that most keys share a hash with others."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            lsm.run, "key_hashes", lambda keys: np.fromiter(map(weak_hash, keys), dtype=np.uint64, count=len(keys))
        )
        hi = history[-1][0]
        horizon = data.draw(st.integers(-1, hi + 1), label="horizon")
        singles = [view(pending(*batch)) for batch in history]
        model = Versions(history)
        for r, batch in zip(singles, history, strict=True):
            for key in UNIVERSE:
                assert read([r], key, batch[0], weak_hash) == Versions([batch]).value(key, batch[0])
        merged = view(merge(singles, horizon, base))
        assert {(k, s) for k, vs in kept(merged).items() for s, _ in vs} == expected_entries(model, horizon, base)
        check_reads(merged, history, horizon, base, weak_hash)
        again = view(merge([merged], horizon, base))
        check_reads(again, history, horizon, base, weak_hash)


# -- damage -----------------------------------------------------------------------------------


def merged_sample() -> bytes:
    """A merged run with every section but the pairs non-empty: deletions in its latest block,
    history."""
    r1 = view(pending(1, [("a", 1), ("b", 1), ("c", 1)]))
    r2 = view(pending(2, [("a", 2), ("b", TOMBSTONE)]))
    return merge([r1, r2], -1, base=False)


def append_sample() -> bytes:
    """A run of one append with pairs, columns and a deletion."""
    return pending(7, [("a", 2), ("b", TOMBSTONE)], [("a", 1), ("c", "x")]).encode()


SAMPLES = {"merged": merged_sample, "appended": append_sample}


def test_the_samples_have_every_section_non_empty_between_them() -> None:
    merged, appended = fields(merged_sample())["lengths"], fields(append_sample())["lengths"]
    assert all(merged[s] for s in SECTIONS if s != "pairs"), merged
    assert all(appended[s] for s in ("pairs", "keys", "values", "dels")), appended


@pytest.mark.parametrize("sample", SAMPLES)
def test_every_byte_of_a_run_is_checked(sample: str) -> None:
    """The header's fields (seqs, counts, npairs, the key-hash range) as well as the body: a
    flipped bit anywhere is an error, never a run read wrong (the version field is
    FormatVersionError)."""
    data = SAMPLES[sample]()
    for pos in range(0, len(data)):
        if pos in (4, 5):
            continue  # the version: FormatVersionError, tested apart
        damaged = bytearray(data)
        damaged[pos] ^= 0x20
        with pytest.raises(CorruptLogError) as ei:
            RunView(bytes(damaged), WHERE)
        assert ei.value.path == WHERE and WHERE in str(ei.value), (pos, ei.value)


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("cut", [0, 3, 50, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 5, -1])
def test_a_run_cut_short_is_corrupt(sample: str, cut: int) -> None:
    data = SAMPLES[sample]()
    with pytest.raises(CorruptLogError) as ei:
        RunView(data[:cut], WHERE)
    assert WHERE in str(ei.value)


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("name", SECTIONS)
def test_a_section_length_that_does_not_add_up_is_corrupt(sample: str, name: str) -> None:
    data = bytearray(SAMPLES[sample]())
    at = 72 + 4 * SECTIONS.index(name)
    struct.pack_into("<I", data, at, fields(bytes(data))["lengths"][name] + 8)
    with pytest.raises(CorruptLogError) as ei:
        RunView(bytes(data), WHERE)
    assert WHERE in str(ei.value)


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_run_with_another_magic_is_corrupt(sample: str) -> None:
    data = b"NSRX" + SAMPLES[sample]()[4:]
    with pytest.raises(CorruptLogError) as ei:
        RunView(data, WHERE)
    assert ei.value.offset == 0 and WHERE in str(ei.value)


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("version", [0, 1, 2, 3, 5, 0xFFFF])
def test_a_run_of_another_format_version_is_refused_naming_it(sample: str, version: int) -> None:
    data = bytearray(SAMPLES[sample]())
    struct.pack_into("<H", data, 4, version)
    with pytest.raises(FormatVersionError) as ei:
        RunView(bytes(data), WHERE)
    assert ei.value.path == WHERE
    assert f"format version {version}" in str(ei.value)


def state_entry(state: str, hi: int) -> bytes:
    """FORMAT.md's disk tier key of a run, by hand: 01, the str state's encoding, hi u64 BE."""
    return b"\x01" + b"\x07" + state.encode() + b"\x00\x01" + struct.pack(">Q", hi)


def test_a_damaged_run_on_the_disk_tier_names_the_store_the_state_and_the_seq(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "store")
    with Store(path) as s:
        s.append(3, {"ok": {"a": 1}, "bad": {"a": 1, "b": 2}})
        s.append(4, {"bad": {"a": 2}})
    db = plyvel.DB(os.path.join(path, "disk"))
    data = bytearray(db.get(state_entry("bad", 4)))
    data[HEADER_SIZE + 3] ^= 0x01
    db.put(state_entry("bad", 4), bytes(data))
    db.close()
    with Store(path) as s:
        assert s.load("ok") == {"a": 1}
        assert s.get("bad", "b", as_of=3) == 2  # the damaged run is not needed as of 3
        for read_ in (lambda: s.load("bad"), lambda: s.get("bad", "a")):
            with pytest.raises(CorruptLogError) as ei:
                read_()
            msg = str(ei.value)
            assert path in msg and "'bad'" in msg and "seq 4" in msg, msg


def log_segment(*records: tuple[int, dict[bytes, bytes]]) -> bytes:
    """A log segment written by hand from FORMAT.md: header, then framed records."""
    out = b"NSLSMLOG" + struct.pack("<II", 4, 0)
    for seq, runs in records:
        payload = struct.pack("<Q", seq) + msgpack.packb(runs, use_bin_type=True)
        out += b"LSMR" + struct.pack("<IQ", len(payload), xxhash.xxh3_64_intdigest(payload, len(payload))) + payload
    return out


def store_with_log(tmp_path, segment: bytes) -> str:  # noqa: ANN001
    """A store directory holding only a log (nothing indexed: everything is replayed)."""
    path = tmp_path / "store"
    (path / "log").mkdir(parents=True)
    (path / "log" / f"{1:020d}.log").write_bytes(segment)
    return str(path)


def test_a_run_logged_by_hand_is_read_back(tmp_path) -> None:  # noqa: ANN001
    """The log format as FORMAT.md writes it, without lsm.records: the control for the next test."""
    state = b"\x07s\x00\x01"
    path = store_with_log(tmp_path, log_segment((1, {state: pending(1, [("a", 1)]).encode()})))
    with Store(path) as s:
        assert s.last_seq == 1 and s.load("s") == {"a": 1}


@pytest.mark.parametrize("damage", ["checksum", "version"])
def test_a_damaged_run_in_an_intact_log_record_names_the_store_the_state_and_the_seq(
    tmp_path,  # noqa: ANN001
    damage: str,
) -> None:
    data = bytearray(pending(1, [("a", 1)]).encode())
    if damage == "checksum":
        data[HEADER_SIZE] ^= 0x01
    else:
        struct.pack_into("<H", data, 4, 1)
    path = store_with_log(tmp_path, log_segment((1, {b"\x07s\x00\x01": bytes(data)})))
    with pytest.raises(CorruptLogError if damage == "checksum" else FormatVersionError) as ei:
        Store(path)
    msg = str(ei.value)
    assert path in msg and "'s'" in msg and "seq 1" in msg, msg


# -- the format version of a store directory -------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_store_directory_of_an_older_format_version_is_refused(tmp_path, version) -> None:  # noqa: ANN001
    """A version 1 store (one LevelDB entry per key version), version 2 store (tuple columns
    as extension types, no TUPLES flag) or version 3 store (merged runs' columns not in
    blocks) is refused, never migrated: the manifest is written by hand with FORMAT.md's
    header layout."""
    path = tmp_path / f"v{version}"
    path.mkdir()
    body = msgpack.packb({"store_id": "0" * 32, "remote": ""})
    manifest = b"NSLSMMAN" + struct.pack("<IIQ", version, len(body), xxhash.xxh3_64_intdigest(body)) + body
    (path / "MANIFEST").write_bytes(manifest)
    for attempt in (1, 2):  # a refused open leaves the directory unlocked
        with pytest.raises(FormatVersionError) as ei:
            Store(str(path))
        assert ei.value.path == str(path / "MANIFEST"), attempt
        assert f"format version {version}," in str(ei.value), attempt
    assert (path / "MANIFEST").read_bytes() == manifest
    assert sorted(os.listdir(path)) == ["LOCK", "MANIFEST"], "a refused store was written to"


def test_a_log_segment_of_format_version_1_is_refused(tmp_path) -> None:  # noqa: ANN001
    segment = b"NSLSMLOG" + struct.pack("<II", 1, 0)
    path = store_with_log(tmp_path, segment)
    with pytest.raises(FormatVersionError) as ei:
        Store(path)
    assert ei.value.path.endswith(f"{1:020d}.log") and "format version 1," in str(ei.value)
    with open(os.path.join(path, "log", f"{1:020d}.log"), "rb") as f:
        assert f.read() == segment


def test_a_remote_tier_of_format_version_1_is_refused(tmp_path) -> None:  # noqa: ANN001
    import pyarrow as pa
    import pyarrow.ipc as ipc

    path = tmp_path / "store"
    (path / "remote").mkdir(parents=True)
    schema = pa.schema(
        [("state", pa.binary()), ("run", pa.binary())], metadata={"nosync.lsm.format": "1", "kind": "base"}
    )
    with ipc.new_file(str(path / "remote" / f"base-{5:020d}.arrow"), schema) as w:
        w.write_table(pa.table({"state": [b"\x07s\x00\x01"], "run": [b"old"]}, schema=schema))
    with pytest.raises(FormatVersionError) as ei:
        Store(str(path))
    assert "base-" in ei.value.path and "format version b'1'" in str(ei.value)


def test_a_column_past_the_streaming_size_decodes_to_what_was_packed():
    # over STREAM_BYTES, a column is decoded item by item (other threads run in between):
    # the values must come back the same, tuple columns and value columns alike
    from lsm.codec import STREAM_BYTES, pack_column, unpack_column

    tuples = [(i, "v" * 40) for i in range(STREAM_BYTES // 40)]
    mixed = [[i, {"k": i}] if i % 3 else ("t", [i]) for i in range(STREAM_BYTES // 12)]
    for values in (tuples, mixed):
        data, _, is_tuples = pack_column(values)
        assert len(data) > STREAM_BYTES
        assert unpack_column(data, is_tuples) == values


def test_a_run_of_more_pairs_than_one_slice_applies_every_pair():
    from lsm.run import APPLY_SLICE

    n = APPLY_SLICE * 2 + 17
    r = view(merge([view(pending(3, [(f"k{i}", i) for i in range(n)]))], -1, base=True))
    d = {"other": -1, "k5": "old"}
    r.apply(d)
    assert len(d) == n + 1 and d["other"] == -1
    assert all(d[f"k{i}"] == i for i in range(n))
