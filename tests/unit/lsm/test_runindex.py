"""Index entries (`lsm.runindex`): the sorted key hashes of a run, kept beside it on the disk
tier. A reader built from them reads no run until a look-up lands in it, and answers as the
runs do; an entry that is not its run's (a run written again at its seq, a damaged entry) is
not used; entries go with their runs."""

from __future__ import annotations

import numpy as np
import pytest

from lsm import TOMBSTONE, Store, Updates
from lsm.codec import key_hash
from lsm.disk import CATALOG, INDEX, RUN
from lsm.runindex import ENTRY


def entries_of(s: Store) -> dict[bytes, bytes]:
    return {k[1:]: v for k, v in s._disk.db.iterator(prefix=INDEX)}


def fill(path: str, seqs: int = 12, keys: int = 400) -> tuple[Store, dict]:
    """A store of `seqs` appends of `keys` keys each (str and int keys, some deleted), merges
    off, every run indexed; and the model of its state as of each seq."""
    s = Store(path, budget=0.0)
    model: dict = {}
    states = {}
    for seq in range(1, seqs + 1):
        updates = {}
        for i in range(keys):
            k = f"k{(seq * 37 + i * 11) % 3000}" if i % 2 else (seq * 53 + i * 7) % 3000
            updates[k] = TOMBSTONE if (i + seq) % 17 == 0 else (seq, i, "v" * (i % 5))
        s.append(seq, {"st": updates})
        for k, v in updates.items():
            if v is TOMBSTONE:
                model.pop(k, None)
            else:
                model[k] = v
        states[seq] = dict(model)
    s.flush(timeout=60)
    s._persister.drain_index()
    return s, states


def test_an_append_s_entry_is_its_keys_hashes_sorted_with_their_columns(tmp_path) -> None:  # noqa: ANN001
    s, _ = fill(str(tmp_path / "s"), seqs=1)
    ref = s._catalog[next(iter(s._catalog))][0]
    view = s._run_view(ref, None)
    hashes, order = s._disk.read_index(ref)
    column = [key_hash(k) for k in view.keys]
    assert hashes.tolist() == sorted(column)
    assert [column[c] for c in order.tolist()] == hashes.tolist()
    s.close()


def test_a_reader_reads_runs_only_where_look_ups_land_and_answers_as_the_model(tmp_path) -> None:  # noqa: ANN001
    s, states = fill(str(tmp_path / "s"))
    assert len(entries_of(s)) == 12
    s.close()
    s = Store(str(tmp_path / "s"), budget=0.0)
    r = s.reader("st", 12)
    assert not s._views, "the reader read runs to build its index"
    want = states[12]
    probes = [*want, "absent", 10**6]
    assert {k: r.get(k, "none") for k in probes} == {k: want.get(k, "none") for k in probes}
    assert 0 < len(s._views) <= 12
    # at an older seq: the runs after it are not indexed
    r6 = s.reader("st", 6)
    assert {k: r6.get(k, "none") for k in probes} == {k: states[6].get(k, "none") for k in probes}
    s.close()


def test_a_prefetch_reads_every_run_indexed_from_its_entry_and_stops_when_asked(tmp_path) -> None:  # noqa: ANN001
    s, states = fill(str(tmp_path / "s"))
    s.close()
    s = Store(str(tmp_path / "s"), budget=0.0)
    r = s.reader("st", 12)
    asked = []
    r.prefetch(lambda: len(asked.append(1) or asked) > 3)
    assert len(s._views) == 3
    r.prefetch(lambda: False)
    assert len(s._views) == 12
    assert {k: r.get(k) for k in states[12]} == states[12]
    s.close()


@pytest.mark.parametrize("damage", ["body", "checksum", "short"])
def test_an_entry_that_is_not_its_run_s_is_not_used(tmp_path, damage: str) -> None:  # noqa: ANN001
    """A damaged entry, or one naming another run, leaves the run to be indexed from its own
    bytes: the reader answers as the model does."""
    s, states = fill(str(tmp_path / "s"))
    key, entry = sorted(entries_of(s).items())[-1]
    if damage == "body":  # a hash changed: its checksum no longer holds
        bad = bytearray(entry)
        bad[ENTRY.size + 8 * 5] ^= 0xFF
    elif damage == "checksum":  # the entry of another run (a run written again at its seq)
        magic, version, zero, n, of, body = ENTRY.unpack_from(entry, 0)
        bad = bytearray(ENTRY.pack(magic, version, zero, n, of ^ 1, body) + entry[ENTRY.size :])
    else:
        bad = bytearray(entry[:-4])
    s._disk.db.put(INDEX + key, bytes(bad))
    s.close()
    s = Store(str(tmp_path / "s"), budget=0.0)
    r = s.reader("st", 12)
    assert len(s._views) == 1, "the run of the bad entry was not indexed from its bytes"
    probes = [*states[12], *states[1], "absent"]
    assert {k: r.get(k, "none") for k in probes} == {k: states[12].get(k, "none") for k in probes}
    s.close()


def test_entries_go_with_their_runs_and_a_run_written_again_gets_its_own(tmp_path) -> None:  # noqa: ANN001
    """Merged runs get entries (their hash sections); the runs they replace lose theirs; a
    rollback that writes a seq's run again leaves no entry of the run it replaced."""
    s, states = fill(str(tmp_path / "s"))
    s.compact()
    runs = {k[1:] for k in s._disk.db.iterator(prefix=RUN, include_value=False)}
    catalog = {k[1:] for k in s._disk.db.iterator(prefix=CATALOG, include_value=False)}
    assert runs == catalog
    assert set(entries_of(s)) == runs, "an entry without its run, or a merged run without one"
    r = s.reader("st", 12)
    assert {k: r.get(k) for k in states[12]} == states[12]
    s.close()

    s, states = fill(str(tmp_path / "t"), seqs=4)
    s.rollback(2)
    s.append(3, {"st": Updates(["k1", 5], [("again", 3), TOMBSTONE])})
    s.flush(timeout=60)
    s._persister.drain_index()
    s.close()
    s = Store(str(tmp_path / "t"), budget=0.0)
    want = {**states[2], "k1": ("again", 3)}
    want.pop(5, None)
    r = s.reader("st", 3)
    probes = [*states[4], "k1", 5]
    assert {k: r.get(k, "none") for k in probes} == {k: want.get(k, "none") for k in probes}
    for key, entry in entries_of(s).items():
        n = ENTRY.unpack_from(entry, 0)[3]
        assert len(entry) == ENTRY.size + 12 * n
        assert bool(np.all(np.diff(np.frombuffer(entry[ENTRY.size : ENTRY.size + 8 * n], "<u8")) >= 0)), key
    s.close()


def test_an_entry_made_from_the_keys_given_is_the_one_made_from_the_run_s_bytes(tmp_path) -> None:  # noqa: ANN001
    """The persister hashes the key column as the caller gave it (lists made tuples), not
    decoded again: the entry is byte for byte the one the run's own key column gives."""
    from lsm import runindex

    s = Store(str(tmp_path / "s"), budget=0.0)
    keys = [*range(-300, 300), *(f"k{i}é" for i in range(300)), *([i, "t"] for i in range(50)), b"b", 2**63 + 5]
    run = s._pending(1, "st", keys, [[i] for i in range(len(keys))])
    data = run.encode()
    assert run.given is not None and len(run.given) == len(keys)
    made = runindex.of_run(data, run.given)
    assert made is not None and made == runindex.of_run(data)
    hashes, order = runindex.read(made, ENTRY.unpack_from(made, 0)[4], len(keys))
    assert hashes.tolist() == sorted(key_hash(k) for k in keys)
    s.close()


def test_a_store_without_index_entries_makes_none_for_appends_and_still_reads_right(tmp_path) -> None:  # noqa: ANN001
    """`index_entries=False` (a store only loads read, as abs's): no append's run gets an
    entry, no key column is kept for one; a merged run still gets its own; reads answer as
    the model does."""
    s = Store(str(tmp_path / "s"), budget=0.0, index_entries=False)
    model: dict = {}
    with s._tier_lock:  # nothing logged nor indexed meanwhile
        for seq in range(1, 6):
            updates = {f"k{(seq * 7 + i) % 500}": (seq, i) for i in range(200)}
            s.append(seq, {"st": updates})
            model.update(updates)
        assert len(s._batches) == 5
        assert all(r.given is None for b in s._batches for r in b.runs.values())
    s.flush(timeout=60)
    s._persister.drain_index()
    assert not entries_of(s)
    r = s.reader("st", 5)
    assert {k: r.get(k) for k in model} == model
    s.compact()
    assert len(entries_of(s)) == len(s._catalog[next(iter(s._catalog))]) >= 1
    s.close()
    s = Store(str(tmp_path / "s"), budget=0.0, index_entries=False)
    assert s.load("st") == model
    assert {k: s.reader("st", 5).get(k) for k in model} == model
    s.close()


def test_entries_past_their_budget_are_not_made_and_the_runs_still_read_right(tmp_path) -> None:  # noqa: ANN001
    """With a budget of 10^-6 of a core (a credit of 10 us), only an entry of a few keys is
    made: a run of 5,000 keys goes without one, and the reader indexes it from its bytes."""
    s = Store(str(tmp_path / "s"), budget=0.0, index_budget=1e-6)
    s.append(1, {"st": {f"k{i}": i for i in range(5_000)}})
    s.append(2, {"st": {"k1": "one"}})
    s.flush(timeout=60)
    s._persister.drain_index()
    made = {ENTRY.unpack_from(e, 0)[3] for e in entries_of(s).values()}
    assert made == {1}, made
    s.close()
    s = Store(str(tmp_path / "s"), budget=0.0)
    r = s.reader("st", 2)
    assert (r.get("k1"), r.get("k4999"), r.get("k5000", "none")) == ("one", 4999, "none")
    s.close()
