"""Runs (lsm/run.py): the encoding, lookups, merges, truncation, base images, damage, and the
format version of a store directory.

Expected values come from FORMAT.md and from a brute-force model: every column ever appended
as (seq, column, key, value), the value of a key as of s being the one of the greatest
(seq, column) at or below s. Hashes are recomputed here as FORMAT.md defines them
(xxh3_64 of the key's msgpack bytes), with msgpack and xxhash directly, never with lsm.codec.
"""

from __future__ import annotations

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
from lsm import TOMBSTONE, CorruptLogError, FormatVersionError, Store
from lsm.codec import pack_keys, pack_values
from lsm.run import MISSING, PendingRun, RunView, image, merge, truncate

HEADER = struct.Struct("<4sHHQQIIIIQQQ10I")
"""FORMAT.md's run header: magic, version, flags, lo, hi, n, ndel, nhist, reserved, hmin,
hmax, checksum, ten section lengths."""
HEADER_SIZE = 104
SECTIONS = ("hashes", "order", "keys", "values", "dels", "seqs", "h_hashes", "h_keys", "h_values", "h_seqs")
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


def spec_hash(key: object) -> int:
    """FORMAT.md: the key hash is xxh3_64 of msgpack(key) (a list packs as the tuple)."""
    return xxhash.xxh3_64_intdigest(msgpack.packb(key, use_bin_type=True))


def pending(seq: int, columns: list[tuple[object, object]]) -> PendingRun:
    """A run as `append` builds it: the key and value columns packed, and the columns of the
    deletions that are their key's last column."""
    keys = [k for k, _ in columns]
    values = [v for _, v in columns]
    last = {k: i for i, k in enumerate(keys)}
    dels = [i for i, v in enumerate(values) if v is TOMBSTONE and last[keys[i]] == i]
    return PendingRun(seq, keys, pack_keys(keys), pack_values(values), dels)


def view(run: PendingRun | bytes) -> RunView:
    return RunView(run.encode() if isinstance(run, PendingRun) else run, WHERE)


class Versions:
    """The brute-force model: every column ever written."""

    def __init__(self, batches: list[tuple[int, list[tuple[object, object]]]] = ()) -> None:
        self.rows: list[tuple[int, int, object, object]] = []
        for seq, columns in batches:
            self.add(seq, columns)

    def add(self, seq: int, columns: list[tuple[object, object]]) -> None:
        self.rows.extend((seq, col, k, v) for col, (k, v) in enumerate(columns))

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
        """The key's versions, one per seq (the last column of that seq), newest first."""
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
    names = ("magic", "version", "flags", "lo", "hi", "n", "ndel", "nhist", "reserved", "hmin", "hmax", "checksum")
    out = dict(zip(names, f[:12], strict=True))
    out["lengths"] = dict(zip(SECTIONS, f[12:], strict=True))
    return out


def section(data: bytes, name: str) -> bytes:
    lengths = fields(data)["lengths"]
    pos = HEADER_SIZE
    for s in SECTIONS:
        if s == name:
            return data[pos : pos + lengths[s]]
        pos += lengths[s]
    raise KeyError(name)


# -- encoding ---------------------------------------------------------------------------------


def test_header_size_matches_format_md() -> None:
    assert HEADER.size == HEADER_SIZE


def test_a_run_of_one_append_is_laid_out_as_format_md_says() -> None:
    columns = [("k", 1), ("j", TOMBSTONE), (("t", 1), "x"), ("k", 2), ("g", TOMBSTONE), ("g", 3)]
    data = pending(7, columns).encode()
    f = fields(data)
    keys = [k for k, _ in columns]
    assert f["magic"] == b"NSRN" and f["version"] == 2 and f["flags"] == 0 and f["reserved"] == 0
    assert (f["lo"], f["hi"], f["n"], f["ndel"], f["nhist"]) == (7, 7, 6, 1, 0)
    # the checksum covers the header's other bytes (0..56, 64..104), then the body
    assert f["checksum"] == xxhash.xxh3_64_intdigest(data[:56] + data[64:HEADER_SIZE] + data[HEADER_SIZE:])
    hashes = np.frombuffer(section(data, "hashes"), "<u8").tolist()
    order = np.frombuffer(section(data, "order"), "<u4").tolist()
    assert hashes == sorted(spec_hash(k) for k in keys)
    assert (f["hmin"], f["hmax"]) == (hashes[0], hashes[-1])
    assert [spec_hash(keys[c]) for c in order] == hashes
    assert msgpack.unpackb(section(data, "keys"), use_list=False) == ("k", "j", ("t", 1), "k", "g", "g")
    assert np.frombuffer(section(data, "dels"), "<u4").tolist() == [1]  # "g" is set again after its deletion
    assert [f["lengths"][s] for s in SECTIONS[5:]] == [0] * 5
    assert len(data) == HEADER_SIZE + sum(f["lengths"].values())


def test_an_empty_run_holds_no_hash_range() -> None:
    r = view(pending(3, []))
    assert (r.n, r.hmin, r.hmax) == (0, 1, 0)
    for key in UNIVERSE:
        assert r.lookup(key, spec_hash(key), 3) is MISSING
    d = {"x": 1}
    r.apply(d)
    assert d == {"x": 1}


@settings(max_examples=200)
@given(columns_st, st.integers(0, 2**40))
def test_encode_then_read_round_trip(columns: list[tuple[object, object]], seq: int) -> None:
    """The hash column is sorted and holds each key's FORMAT.md hash; `order` maps it to the
    columns, stably; reads of the encoded run and of the pending one equal the model."""
    p = pending(seq, columns)
    r = view(p)
    keys = [k for k, _ in columns]
    assert r.lo == r.hi == seq and r.n == len(columns)
    assert list(r.keys) == keys and r.values == [v for _, v in columns]
    hashes = r.hashes.tolist()
    assert hashes == sorted(spec_hash(k) for k in keys)
    order = r.order.tolist()
    assert sorted(order) == list(range(len(keys)))
    assert [spec_hash(keys[c]) for c in order] == hashes
    for a, b in zip(order, order[1:], strict=False):
        if spec_hash(keys[a]) == spec_hash(keys[b]):
            assert a < b, "equal hashes out of column order"
    model = Versions([(seq, columns)])
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


# -- merges -----------------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn, min_batches: int = 1) -> list[tuple[int, list[tuple[object, object]]]]:
    """Appends at strictly increasing seqs from 1 (seq 0 is left for an older run)."""
    steps = draw(st.lists(st.integers(1, 3), min_size=min_batches, max_size=8))
    seq, out = 0, []
    for step in steps:
        seq += step
        out.append((seq, draw(columns_st)))
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
        history = [(0, OLDER), *history]
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
    """FORMAT.md: the latest block's hashes sorted with `order` pointing at their keys; the
    history block sorted by hash, then newest first within a key."""
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
    merged = view(merge([view(pending(seq, cols)) for seq, cols in history], horizon, base))
    model = Versions(history)
    assert merged.flags & 1, "a merged run is MULTI"
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
        group = [view(pending(seq, cols)) for seq, cols in history[a:b]]
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
    merged = view(merge([view(pending(seq, cols)) for seq, cols in history], horizon, base))
    to_seq = data.draw(st.integers(max(lo, horizon), hi), label="to_seq")
    t = view(truncate(merged, to_seq, horizon, base))
    assert (t.lo, t.hi) == (lo, to_seq)
    assert all(s <= to_seq for s in t.entries()[2].tolist())
    check_block_order(t)
    check_reads(t, [(s, c) for s, c in history if s <= to_seq], horizon, base)


def test_truncate_of_a_run_of_one_append_at_its_seq_keeps_it() -> None:
    cols = [("a", 1), ("a", TOMBSTONE), ("b", 2)]
    t = view(truncate(view(pending(4, cols)), 4, -1, base=False))
    assert (t.lo, t.hi) == (4, 4)
    assert read([t], "a", 4) is MISSING and t.lookup("a", spec_hash("a"), 4) is TOMBSTONE
    assert read([t], "b", 4) == 2


@settings(max_examples=200, deadline=None)
@given(histories(), st.data())
def test_image_holds_every_live_key_as_of_its_seq_and_nothing_else(history: list, data: st.DataObject) -> None:
    lo, hi = history[0][0], history[-1][0]
    seq = data.draw(st.integers(lo, hi), label="seq")
    model = Versions(history)
    whole = view(merge([view(pending(s, c)) for s, c in history], -1, True))
    singles = [view(pending(s, c)) for s, c in history if s <= seq]
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
        singles = [view(pending(seq, cols)) for seq, cols in history]
        model = Versions(history)
        for r, (seq, _) in zip(singles, history, strict=True):
            for key in UNIVERSE:
                assert read([r], key, seq, weak_hash) == Versions([h for h in history if h[0] == seq]).value(key, seq)
        merged = view(merge(singles, horizon, base))
        assert {(k, s) for k, vs in kept(merged).items() for s, _ in vs} == expected_entries(model, horizon, base)
        check_reads(merged, history, horizon, base, weak_hash)
        again = view(merge([merged], horizon, base))
        check_reads(again, history, horizon, base, weak_hash)


# -- damage -----------------------------------------------------------------------------------


def sample_run() -> bytes:
    """A merged run with every section non-empty: deletions in its latest block, history."""
    r1 = view(pending(1, [("a", 1), ("b", 1), ("c", 1)]))
    r2 = view(pending(2, [("a", 2), ("b", TOMBSTONE)]))
    data = merge([r1, r2], -1, base=False)
    assert all(fields(data)["lengths"].values()), fields(data)
    return data


def test_every_byte_of_a_run_is_checked() -> None:
    """The header's fields (seqs, counts, the key-hash range) as well as the body: a flipped bit
    anywhere is an error, never a run read wrong (the version field is FormatVersionError)."""
    data = sample_run()
    for pos in range(0, len(data)):
        if pos in (4, 5):
            continue  # the version: FormatVersionError, tested apart
        damaged = bytearray(data)
        damaged[pos] ^= 0x20
        with pytest.raises(CorruptLogError) as ei:
            RunView(bytes(damaged), WHERE)
        assert ei.value.path == WHERE and WHERE in str(ei.value), (pos, ei.value)


@pytest.mark.parametrize("cut", [0, 3, 50, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 5, -1])
def test_a_run_cut_short_is_corrupt(cut: int) -> None:
    data = sample_run()
    with pytest.raises(CorruptLogError) as ei:
        RunView(data[:cut], WHERE)
    assert WHERE in str(ei.value)


def test_a_section_length_that_does_not_add_up_is_corrupt() -> None:
    data = bytearray(sample_run())
    struct.pack_into("<I", data, 64, fields(bytes(data))["lengths"]["hashes"] + 8)
    with pytest.raises(CorruptLogError) as ei:
        RunView(bytes(data), WHERE)
    assert WHERE in str(ei.value)


def test_a_run_with_another_magic_is_corrupt() -> None:
    data = b"NSRX" + sample_run()[4:]
    with pytest.raises(CorruptLogError) as ei:
        RunView(data, WHERE)
    assert ei.value.offset == 0 and WHERE in str(ei.value)


@pytest.mark.parametrize("version", [0, 1, 3, 0xFFFF])
def test_a_run_of_another_format_version_is_refused_naming_it(version: int) -> None:
    data = bytearray(sample_run())
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
    out = b"NSLSMLOG" + struct.pack("<II", 2, 0)
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


def test_a_store_directory_of_format_version_1_is_refused(tmp_path) -> None:  # noqa: ANN001
    """A version 1 store (one LevelDB entry per key version) is refused, never migrated: the
    manifest is written by hand with FORMAT.md's header layout."""
    path = tmp_path / "v1"
    path.mkdir()
    body = msgpack.packb({"store_id": "0" * 32, "remote": ""})
    manifest = b"NSLSMMAN" + struct.pack("<IIQ", 1, len(body), xxhash.xxh3_64_intdigest(body)) + body
    (path / "MANIFEST").write_bytes(manifest)
    for attempt in (1, 2):  # a refused open leaves the directory unlocked
        with pytest.raises(FormatVersionError) as ei:
            Store(str(path))
        assert ei.value.path == str(path / "MANIFEST"), attempt
        assert "format version 1," in str(ei.value), attempt
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
