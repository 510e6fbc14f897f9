"""Store.reader: point reads as of one seq through one index of every run's key hashes answer
what a plain dict model of the appends answers, whatever the runs are (appended, merged in
blocks, merged across the seq read, taken whole), and keep answering it while merges replace
the runs."""

from __future__ import annotations

import random

import msgpack
import pytest

from lsm import TOMBSTONE, KeyEncodingError, Store, Updates

KEYS = [*range(-5, 300), *(f"k{i}" for i in range(300)), *((i, "t") for i in range(100)), b"b", None, ""]


def model_as_of(batches: list[tuple[int, dict]], seq: int) -> dict:
    """The state after `seq`: each batch's updates in order, a deletion popping its key."""
    out: dict = {}
    for s, updates in batches:
        if s > seq:
            break
        for k, v in updates.items():
            if v is TOMBSTONE:
                out.pop(k, None)
            else:
                out[k] = v
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_reader_answers_as_the_model_at_every_seq_of_many_runs(tmp_path, seed: int) -> None:  # noqa: ANN001
    """40 appends of random updates, deletions and values of several types, merged in the
    background (small tiers, retention of 10 seqs, so that merged runs straddle the seqs read):
    at every seq still readable, the reader answers every key as the model does, and as
    `get` does; a merge of everything afterwards changes none of its answers."""
    rnd = random.Random(seed)
    s = Store(str(tmp_path / "s"), merge_min_bytes=0, merge_fanout=3, retention=10)
    batches = []
    for seq in range(1, 41):
        updates = {}
        for k in rnd.sample(KEYS, rnd.randrange(1, 120)):
            kind = rnd.random()
            updates[k] = TOMBSTONE if kind < 0.15 else (seq, str(k)) if kind < 0.6 else [seq] if kind < 0.8 else seq
        batches.append((seq, updates))
        s.append(seq, {"st": updates})
    s.flush(timeout=60)
    s._persister.drain_index()
    probes = [*KEYS, "absent", (1, "absent")]
    readers = {}
    for at in range(31, 41):  # the horizon, moving in the background, stays at or below 30
        want = model_as_of(batches, at)
        r = readers[at] = s.reader("st", at)
        got = {k: r.get(k, "none") for k in probes}
        assert got == {k: want.get(k, "none") for k in probes}, at
        assert got == {k: s.get("st", k, as_of=at, default="none") for k in probes}, at
    s.compact()
    assert len(s.runs("st")) < 40 / 3, "the runs were not merged"
    for at, r in readers.items():
        want = model_as_of(batches, at)
        assert {k: r.get(k, "none") for k in probes} == {k: want.get(k, "none") for k in probes}, at
    s.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_reader_over_appends_not_merged_answers_as_the_model(tmp_path, seed: int) -> None:  # noqa: ANN001
    """Appends' runs as a restore finds them when merges fell behind (no merge at all, read
    back from the disk tier): columns of keys written once, columns with a key written twice
    (the later wins), logged pairs with columns after them, deletions; at every seq the reader
    answers every key as the model does, and what it returns is the caller's."""
    rnd = random.Random(seed)
    s = Store(str(tmp_path / "s"), budget=0.0)
    batches = []
    for seq in range(1, 31):
        keys = rnd.sample(KEYS, rnd.randrange(1, 80))
        values = [TOMBSTONE if rnd.random() < 0.15 else rnd.choice([seq, f"v{seq}", (seq, [seq]), [seq]]) for _ in keys]
        kind = seq % 3
        if kind == 0:  # columns, each key once
            s.append(seq, {"st": dict(zip(keys, values, strict=True))})
            model = dict(zip(keys, values, strict=True))
        elif kind == 1:  # a key written twice: the later entry wins
            keys, values = [*keys, keys[0]], [*values, ("again", seq)]
            s.append(seq, {"st": (keys, values)})
            model = dict(zip(keys, values, strict=True))
        else:  # pairs logged (plain values), then columns
            plain = {k: seq * 10 for k in rnd.sample(KEYS, 20)}
            s.append(seq, {"st": Updates(keys, values, pairs=[(len(plain), msgpack.packb(plain))])})
            model = {**plain, **dict(zip(keys, values, strict=True))}
        batches.append((seq, model))
    s.flush(timeout=60)
    s._persister.drain_index()
    s.close()
    s = Store(str(tmp_path / "s"), budget=0.0)
    assert len(s.runs("st")) == 30, "the runs were merged"
    probes = [*KEYS, "absent"]
    for at in range(1, 31):
        want = model_as_of(batches, at)
        r = s.reader("st", at)
        got = {k: r.get(k, "none") for k in probes}
        assert got == {k: want.get(k, "none") for k in probes}, at
        for v in got.values():
            if isinstance(v, list):
                v.append("mine")
            elif isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], list):
                v[1].append("mine")
        assert {k: r.get(k, "none") for k in probes} == {k: want.get(k, "none") for k in probes}, at
    s.close()


# two int keys whose key hashes share their 46 high bits (found by hashing 2^25 ints): in an
# index of 2^17 to 2^18 entries an entry keeps 46 bits of its hash
TWINS = (14298902, 17112647)


def test_keys_whose_hashes_share_the_index_s_high_bits_are_told_apart(tmp_path) -> None:  # noqa: ANN001
    """In an index of 200,000 entries, two keys whose hashes differ in their low bits only:
    each reads its own value, in whichever runs they lie (appended, merged), and a deletion
    of one leaves the other."""
    from lsm.codec import key_hash

    a, b = TWINS
    assert key_hash(a) != key_hash(b) and key_hash(a) >> 18 == key_hash(b) >> 18
    s = Store(str(tmp_path / "s"), budget=0.0)
    filler = {k: k for k in range(100_000)}
    s.append(1, {"st": {**filler, a: "a1", b: "b1"}})
    s.append(2, {"st": {k + 100_000: -k for k in range(100_000)}})
    s.append(3, {"st": {b: "b3"}})
    s.append(4, {"st": {a: TOMBSTONE}})
    s.flush(timeout=60)
    s._persister.drain_index()
    for merged in (False, True):
        r1, r3, r4 = s.reader("st", 1), s.reader("st", 3), s.reader("st", 4)
        assert 1 << 17 < r4.entries <= 1 << 18, r4.entries
        assert (r1.get(a), r1.get(b)) == ("a1", "b1"), merged
        assert (r3.get(a), r3.get(b)) == ("a1", "b3"), merged
        assert (r4.get(a, "gone"), r4.get(b)) == ("gone", "b3"), merged
        assert (r4.get(99_999), r4.get(150_000)) == (99_999, -50_000), merged
        s.compact()
    s.close()


def test_a_reader_over_a_state_taken_whole_reads_no_older_run(tmp_path) -> None:  # noqa: ANN001
    """A run of every live key (FULL) hides the older runs: a key it lacks has no value, though
    an older run holds one."""
    s = Store(str(tmp_path / "s"), retention=100)
    s.append(1, {"st": {"a": 1, "b": 2}})
    s.append(2, {"st": Updates(["a"], [5], full=True)})
    s.append(3, {"st": {"c": 3}})
    r = s.reader("st", 3)
    assert (r.get("a"), r.get("b", "gone"), r.get("c")) == (5, "gone", 3)
    assert s.reader("st", 1).get("b") == 2
    s.close()


def test_what_a_reader_returns_is_the_caller_s(tmp_path) -> None:  # noqa: ANN001
    s = Store(str(tmp_path / "s"), retention=0, merge_min_bytes=0)
    s.append(1, {"st": {"a": [1], "b": {"x": 1}}})
    s.append(2, {"st": {"c": (1, [2])}})
    s.compact()
    r = s.reader("st", 2)
    for k in ("a", "b", "c"):
        got = r.get(k)
        if isinstance(got, tuple):
            got[1].append(9)
        elif isinstance(got, list):
            got.append(9)
        else:
            got["y"] = 2
    assert (r.get("a"), r.get("b"), r.get("c")) == ([1], {"x": 1}, (1, [2]))
    s.close()


@pytest.mark.parametrize("key", [1.5, True, [1, {2}], "\ud800", 2**64])
def test_a_reader_refuses_a_key_as_get_does(tmp_path, key: object) -> None:  # noqa: ANN001
    s = Store(str(tmp_path / "s"))
    s.append(1, {"st": {"a": 1}})
    with pytest.raises(KeyEncodingError) as by_get:
        s.get("st", key, as_of=1)
    with pytest.raises(KeyEncodingError) as by_reader:
        s.reader("st", 1).get(key)
    assert str(by_reader.value) == str(by_get.value)
    s.close()
