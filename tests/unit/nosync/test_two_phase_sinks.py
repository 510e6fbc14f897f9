"""Two-phase commit of the sinks (nosync/api/sinks.py), driven part by part on real files and a real
LevelDB: a pre-commit shows nothing, survives a crash of its writer, is committed exactly once
however often the commit is repeated, and `recover(c)` forgets everything after checkpoint c.

A "crash" is a part dropped (`del`) without `close()`; the writer that takes over is a new part of the
same worker on the same directory. Handles go through msgpack as a checkpoint file stores them
(nosync/state/checkpoints.py). Expected outputs and file names are written out from the test's input.
"""

from __future__ import annotations

import os
import re

import msgpack
import pytest

import nosync as ns
from nosync.errors import RunFailed

FILE_FORMATS = ["jsonl", "parquet"]


def stored(handle):
    """`handle` as it comes back from a checkpoint file (same msgpack options)."""
    return msgpack.unpackb(msgpack.packb(handle, use_bin_type=True), raw=False, use_list=False, strict_map_key=False)


def visible(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n != "_staging")


def staging(directory) -> list[str]:
    return sorted(os.listdir(os.path.join(directory, "_staging")))


def cname(epoch: int, worker: int, checkpoint: int, fmt: str) -> str:
    """The file name of a checkpoint commit, written out as documented."""
    return f"part-{epoch:010d}-w{worker:04d}-c{checkpoint:010d}.{fmt}"


def rows(tag: str, n: int) -> list[dict]:
    """Dict records (one schema, so that Parquet stores them as rows)."""
    return [{"tag": tag, "i": i} for i in range(n)]


# -- Files: a pre-commit is invisible, durable, and committed once --------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_files_precommit_is_invisible_survives_a_crash_and_commits_once(tmp_path, fmt):
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out), format=fmt)
    earlier = rows("earlier", 2)
    a, b = rows("a", 3), rows("b", 2)

    part = sink.open_part(2, "run-1")
    part.write(1, earlier)
    h4 = stored(part.precommit(4))
    part.commit_precommit(4, h4)
    assert sink.read_committed() == earlier

    part.write(3, a)
    part.write(6, b)
    assert part.has_staged()
    handle = stored(part.precommit(7))
    assert not part.has_staged()
    # staged durably, outside the committed output
    assert sink.read_committed() == earlier
    assert visible(out) == [cname(1, 2, 4, fmt)]
    assert staging(out) == [cname(3, 2, 7, fmt), cname(6, 2, 7, fmt)]

    del part  # a crash: the writer is gone without close()
    assert sink.read_committed() == earlier

    part = sink.open_part(2, "run-2")
    assert part.recover(7, [(7, handle)]) == len(a) + len(b)
    assert sink.read_committed() == earlier + a + b
    assert visible(out) == [cname(1, 2, 4, fmt), cname(3, 2, 7, fmt), cname(6, 2, 7, fmt)]
    assert staging(out) == []

    # repeated after it took effect: nothing is written twice
    part.commit_precommit(7, handle)
    part.recover(7, [(4, h4), (7, handle)])
    part.commit_precommit(7, handle)
    assert sink.read_committed() == earlier + a + b
    assert visible(out) == [cname(1, 2, 4, fmt), cname(3, 2, 7, fmt), cname(6, 2, 7, fmt)]
    part.close()


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_files_commit_precommit_after_a_crash_commits_once(tmp_path, fmt):
    """The other way back from a crash: the new writer commits the handle itself (the
    checkpoint completed while the old one was going down)."""
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out), format=fmt)
    a = rows("a", 4)
    part = sink.open_part(0, "run-1")
    part.write(0, a)
    handle = stored(part.precommit(1))
    del part  # a crash: the writer is gone without close()
    assert sink.read_committed() == []

    part = sink.open_part(0, "run-2")
    assert part.commit_precommit(1, handle) == len(a)
    part.commit_precommit(1, handle)
    part.recover(1, [(1, handle)])
    assert sink.read_committed() == a
    assert visible(out) == [cname(0, 0, 1, fmt)]
    part.close()


# -- LevelDB: the same -----------------------------------------------------------------------------


def test_leveldb_precommit_is_invisible_survives_a_crash_and_commits_once(tmp_path):
    kv = tmp_path / "kv"
    sink = ns.sinks.LevelDB(str(kv))
    part = sink.open_part(1, "run-1")
    part.write(0, [("a", 0), ("z", "kept")])
    part.commit_precommit(3, part.precommit(3))

    part.write(2, [("a", 1), ("b", [1, 2])])
    part.write(5, [(("t", 1), {"m": 1})])
    assert part.has_staged()
    handle = stored(part.precommit(4))
    assert not part.has_staged()
    assert staging(kv) == ["w0001-c0000000004.msgpack"]
    del part  # a crash: the writer is gone without close()
    # the pre-commit is not in the database: the value of checkpoint 3 is still there
    assert sink.read_committed() == {"a": 0, "z": "kept"}

    part = sink.open_part(1, "run-2")
    assert part.recover(4, [(4, handle)]) == 3
    part.close()
    expected = {"a": 1, "z": "kept", "b": [1, 2], ("t", 1): {"m": 1}}
    assert sink.read_committed() == expected
    assert staging(kv) == []

    part = sink.open_part(1, "run-3")
    part.commit_precommit(4, handle)
    part.recover(4, [(4, handle)])
    part.close()
    assert sink.read_committed() == expected


def test_leveldb_later_checkpoint_wins_and_a_repeated_earlier_commit_does_not_roll_back(tmp_path):
    sink = ns.sinks.LevelDB(str(tmp_path / "kv"))
    batches = {
        1: [("a", 1), ("b", 1), ("c", 1)],
        2: [("a", 2), ("a", 22)],  # the same key twice in one checkpoint: the last one wins
        3: [("b", 3), ("d", 3)],
    }
    model: dict = {}
    part = sink.open_part(0, "run")
    handles = []
    for c, recs in batches.items():
        part.write(c, recs)
        handles.append((c, stored(part.precommit(c))))
    for c, h in handles:
        part.commit_precommit(c, h)
    for c in sorted(batches):
        for k, v in batches[c]:
            model[k] = v
    assert model == {"a": 22, "b": 3, "c": 1, "d": 3}
    part.close()
    assert sink.read_committed() == model

    # a commit repeated after a later one (a replay after a crash) must not put older values back
    part = sink.open_part(0, "run")
    part.commit_precommit(1, handles[0][1])
    part.recover(3, handles)
    part.close()
    assert sink.read_committed() == model


def test_leveldb_staging_does_not_break_read_committed(tmp_path):
    kv = tmp_path / "kv"
    sink = ns.sinks.LevelDB(str(kv))
    part = sink.open_part(0, "run")
    part.write(0, [("k", "committed")])
    part.commit_precommit(1, part.precommit(1))
    part.write(1, [("k", "staged"), ("new", 1)])
    part.precommit(2)
    part.close()
    # a torn pre-commit of another worker, too
    (kv / "_staging" / "w0003-c0000000009.msgpack.tmp").write_bytes(b"\x93\x01")
    assert sorted(os.listdir(kv)) == ["_staging", "part-0"]
    assert sink.read_committed() == {"k": "committed"}


# -- a checkpoint that cuts an epoch in two ---------------------------------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_files_checkpoint_cutting_an_epoch_gives_two_files(tmp_path, fmt):
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out), format=fmt)
    a, b = rows("a", 3), rows("b", 2)
    part = sink.open_part(0, "run")
    part.write(5, a)
    h1 = stored(part.precommit(1))
    part.write(5, b)
    h2 = stored(part.precommit(2))
    assert staging(out) == [cname(5, 0, 1, fmt), cname(5, 0, 2, fmt)]
    assert sink.read_committed() == []

    assert part.commit_precommit(1, h1) == len(a)
    assert sink.read_committed() == a
    assert part.commit_precommit(2, h2) == len(b)
    assert sink.read_committed() == a + b
    assert visible(out) == [cname(5, 0, 1, fmt), cname(5, 0, 2, fmt)]
    part.close()


def test_leveldb_checkpoint_cutting_an_epoch_keeps_both_halves(tmp_path):
    kv = tmp_path / "kv"
    sink = ns.sinks.LevelDB(str(kv))
    part = sink.open_part(0, "run")
    part.write(5, [("a", 1), ("b", 1)])
    h1 = stored(part.precommit(1))
    part.write(5, [("b", 2), ("c", 2)])
    h2 = stored(part.precommit(2))
    assert staging(kv) == ["w0000-c0000000001.msgpack", "w0000-c0000000002.msgpack"]
    part.commit_precommit(1, h1)
    part.close()
    assert sink.read_committed() == {"a": 1, "b": 1}

    part = sink.open_part(0, "run")
    part.commit_precommit(2, h2)
    part.close()
    assert sink.read_committed() == {"a": 1, "b": 2, "c": 2}


# -- recover(c): later checkpoints are forgotten -----------------------------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_files_recover_discards_later_checkpoints_of_this_worker_only(tmp_path, fmt):
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out), format=fmt)
    a, b, c3 = rows("w0-c1", 2), rows("w0-c2", 3), rows("w0-c3", 1)
    d, e = rows("w1-c2", 2), rows("w1-c3", 2)

    w0 = sink.open_part(0, "run-1")
    w1 = sink.open_part(1, "run-1")
    w0.write(0, a)
    h1 = stored(w0.precommit(1))
    w0.commit_precommit(1, h1)
    w0.write(1, b)
    w0.commit_precommit(2, w0.precommit(2))  # committed, then recovery falls back past it
    w0.write(2, c3)
    h3 = stored(w0.precommit(3))  # staged only
    w1.write(1, d)
    w1.commit_precommit(2, w1.precommit(2))
    w1.write(2, e)
    h3_w1 = stored(w1.precommit(3))
    assert sink.read_committed() == a + b + d
    del w0  # a crash: the writer is gone without close()

    w0 = sink.open_part(0, "run-2")
    assert w0.recover(1, [(1, h1)]) == len(a)
    assert visible(out) == [cname(0, 0, 1, fmt), cname(1, 1, 2, fmt)]  # worker 1's file stays
    assert staging(out) == [cname(2, 1, 3, fmt)]  # worker 1's pre-commit stays
    assert sink.read_committed() == a + d

    # what was discarded never comes back: committing c again shows the same, and the
    # discarded pre-commit of checkpoint 3 is gone for good
    w0.commit_precommit(1, h1)
    with pytest.raises(RunFailed):
        w0.commit_precommit(3, h3)
    assert sink.read_committed() == a + d

    # worker 1 is untouched: its pre-commit still commits
    assert w1.commit_precommit(3, h3_w1) == len(e)
    assert sink.read_committed() == a + d + e
    w0.close()
    w1.close()


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_files_recover_removes_torn_staging_and_keeps_mode_none_output(tmp_path, fmt):
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out), format=fmt)
    plain = rows("none", 2)
    part = sink.open_part(0, "run")
    part.write(0, plain)
    part.commit(0)
    part.write(1, rows("x", 1))
    part.precommit(5)
    torn = out / "_staging" / (cname(1, 0, 6, fmt) + ".tmp")
    torn.write_bytes(b"half")
    del part  # a crash: the writer is gone without close()

    part = sink.open_part(0, "run")
    assert part.recover(4, []) == 0
    assert staging(out) == []
    assert visible(out) == [f"part-{0:010d}-w{0:04d}.{fmt}"]
    assert sink.read_committed() == plain
    part.close()


def test_leveldb_recover_discards_later_staging_and_keeps_committed_values(tmp_path):
    kv = tmp_path / "kv"
    sink = ns.sinks.LevelDB(str(kv))
    w0 = sink.open_part(0, "run-1")
    w1 = sink.open_part(1, "run-1")
    w0.write(0, [("k", 1), ("j", 1)])
    h1 = stored(w0.precommit(1))
    w0.commit_precommit(1, h1)
    w0.write(1, [("k", 2), ("x", 2)])
    h2 = stored(w0.precommit(2))
    w0.write(2, [("k", 3)])
    h3 = stored(w0.precommit(3))
    w1.write(1, [("y", 2)])
    h2_w1 = stored(w1.precommit(2))
    assert staging(kv) == ["w0000-c0000000002.msgpack", "w0000-c0000000003.msgpack", "w0001-c0000000002.msgpack"]
    del w0  # a crash: the writer is gone without close()

    w0 = sink.open_part(0, "run-2")
    assert w0.recover(1, [(1, h1)]) == 2
    assert staging(kv) == ["w0001-c0000000002.msgpack"]
    # the discarded pre-commits never become visible, even when their handles are committed
    w0.commit_precommit(1, h1)
    w0.commit_precommit(2, h2)
    w0.commit_precommit(3, h3)
    w0.close()
    w1.commit_precommit(2, h2_w1)
    w1.close()
    assert sink.read_committed() == {"k": 1, "j": 1, "y": 2}


# -- several workers in one directory ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_files_workers_in_one_directory_do_not_collide(tmp_path, fmt):
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out), format=fmt)
    data = {w: rows(f"w{w}", w + 1) for w in range(3)}
    parts = {w: sink.open_part(w, "run") for w in data}
    handles = {}
    for w, part in parts.items():
        part.write(4, data[w])
        handles[w] = stored(part.precommit(9))  # the same epoch and checkpoint on every worker
    assert staging(out) == [cname(4, w, 9, fmt) for w in range(3)]
    for w in (2, 0, 1):
        parts[w].commit_precommit(9, handles[w])
    assert visible(out) == [cname(4, w, 9, fmt) for w in range(3)]
    assert sink.read_committed() == data[0] + data[1] + data[2]  # part files in name order

    plain = {w: rows(f"plain{w}", 2) for w in range(2)}  # mode none, the same epoch too
    for w in plain:
        parts[w].write(6, plain[w])
        parts[w].commit(6)
    assert sink.read_committed() == data[0] + data[1] + data[2] + plain[0] + plain[1]
    for part in parts.values():
        part.close()


def test_leveldb_workers_in_one_directory_do_not_collide(tmp_path):
    kv = tmp_path / "kv"
    sink = ns.sinks.LevelDB(str(kv))
    parts = [sink.open_part(w, "run") for w in range(3)]
    handles = []
    for w, part in enumerate(parts):
        part.write(0, [(f"k{w}", w), (f"shared-by-{w}", [w])])
        handles.append(stored(part.precommit(1)))
    assert staging(kv) == [f"w{w:04d}-c0000000001.msgpack" for w in range(3)]
    for w in (1, 2, 0):
        parts[w].commit_precommit(1, handles[w])
        parts[w].close()
    assert sorted(os.listdir(kv)) == ["_staging", "part-0", "part-1", "part-2"]
    assert sink.read_committed() == {
        "k0": 0,
        "k1": 1,
        "k2": 2,
        "shared-by-0": [0],
        "shared-by-1": [1],
        "shared-by-2": [2],
    }


# -- mode none ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_files_mode_none_commit_has_no_checkpoint_in_names(tmp_path, fmt):
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out), format=fmt)
    e0, e1, e2 = rows("e0", 2), rows("e1", 1), rows("e2", 3)
    part = sink.open_part(3, "run")
    part.write(0, e0)
    part.write(2, e2)
    part.write(1, e1)
    assert part.commit(1) == len(e0) + len(e1)
    assert sink.read_committed() == e0 + e1
    assert visible(out) == [f"part-{0:010d}-w{3:04d}.{fmt}", f"part-{1:010d}-w{3:04d}.{fmt}"]
    assert part.has_staged()
    assert part.commit(2) == len(e2)
    assert visible(out) == [f"part-{e:010d}-w{3:04d}.{fmt}" for e in range(3)]
    assert not any("-c" in n for n in visible(out))
    assert staging(out) == []
    assert sink.read_committed() == e0 + e1 + e2
    part.close()


def test_leveldb_mode_none_commit(tmp_path):
    kv = tmp_path / "kv"
    sink = ns.sinks.LevelDB(str(kv))
    part = sink.open_part(0, "run")
    part.write(0, [("a", 1)])
    part.write(1, [("a", 2), ("b", 2)])
    assert part.commit(0) == 1
    part.close()
    assert sink.read_committed() == {"a": 1}
    assert staging(kv) == []


# -- a pre-commit that lost its staged file -----------------------------------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_files_commit_of_a_missing_staged_file_fails_naming_it(tmp_path, fmt):
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out), format=fmt)
    part = sink.open_part(1, "run")
    part.write(2, rows("x", 2))
    part.write(3, rows("y", 1))
    handle = stored(part.precommit(4))
    lost = cname(3, 1, 4, fmt)
    os.unlink(out / "_staging" / lost)
    with pytest.raises(RunFailed, match=re.escape(lost)):
        part.commit_precommit(4, handle)
    with pytest.raises(RunFailed, match=re.escape(lost)):
        sink.open_part(1, "run-2").recover(4, [(4, handle)])
    assert lost not in visible(out)


def test_precommit_with_nothing_staged_commits_nothing(tmp_path):
    files = ns.sinks.Files(str(tmp_path / "out"))
    part = files.open_part(0, "run")
    h = stored(part.precommit(1))
    assert part.commit_precommit(1, h) == 0
    assert visible(tmp_path / "out") == [] and staging(tmp_path / "out") == []

    kv = ns.sinks.LevelDB(str(tmp_path / "kv"))
    part = kv.open_part(0, "run")
    h = stored(part.precommit(1))
    assert part.commit_precommit(1, h) == 0
    part.close()
    assert staging(tmp_path / "kv") == []
    assert kv.read_committed() == {}
