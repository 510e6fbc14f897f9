"""`nosync bench lsm` reads settled files: its `settle` must really compact a database whole
(plyvel's `compact_range` without bounds compacts nothing)."""

from __future__ import annotations

import random

import plyvel

from experiments.bench.lsm_bench import settle


def test_settle_leaves_level_0_empty_and_every_key_readable(tmp_path):
    path = str(tmp_path / "db")
    rng = random.Random(3)
    written = {rng.randbytes(16): rng.randbytes(32) for _ in range(40_000)}
    # a small write buffer: the writes land in many level-0 files
    db = plyvel.DB(path, create_if_missing=True, write_buffer_size=64 << 10)
    for i, (k, v) in enumerate(written.items()):
        db.put(k, v)
        if i % 1000 == 999:
            db.compact_range(start=b"", stop=b"")  # writes the memtable out, compacts nothing
    before = int(db.get_property(b"leveldb.num-files-at-level0"))
    db.close()
    assert before > 0, "the test needs files in level 0 to begin with"

    _, files = settle(path)

    assert files[0] == 0, files
    db = plyvel.DB(path)
    assert sum(1 for _ in db.iterator(include_value=False)) == len(written)
    assert all(db.get(k) == v for k, v in written.items())
    db.close()
