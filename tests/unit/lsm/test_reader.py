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
