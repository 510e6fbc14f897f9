"""The output log's residue: what a snapshot writes of it under `OUT` and what a restored
sender serves from it (`nosync.modes.nosync.outlog`, `nosync.state.layout`)."""

from __future__ import annotations

import msgpack
import pytest

import lsm
from nosync.modes.nosync.outlog import OutputLog
from nosync.state.layout import OUT, logged_frames


def frames_of(n: int, start: int = 1) -> list[tuple[int, bytes]]:
    """n frames as keyed_count sends them: (key, 1) records, msgpack-framed."""
    return [(s, msgpack.packb([[s * 7919 % 100_003, 1] for _ in range(50)])) for s in range(start, start + n)]


def test_a_restored_log_serves_the_frames_the_residue_held_in_order(tmp_path):
    log = OutputLog(str(tmp_path / "spill"), 1 << 20)
    sent = {1: frames_of(40), 2: frames_of(5, start=100)}
    for d, fs in sent.items():
        for s, f in fs:
            log.add(d, s, f)
    log.trim(1, 10)  # worker 1's durable point covers its first ten frames
    residue = log.residue()

    again = OutputLog(str(tmp_path / "spill2"), 1 << 20)
    again.restore(residue)
    assert again.since(1, 0) == [f for s, f in sent[1] if s > 10]
    assert again.since(2, 101) == [f for s, f in sent[2] if s >= 101]
    assert again.restored == {1: 40, 2: 104}


def test_frames_spilled_to_the_file_are_in_the_residue_too(tmp_path):
    fs = frames_of(200)
    log = OutputLog(str(tmp_path / "spill"), 20_000)  # far less than the frames take
    for s, f in fs:
        log.add(1, s, f)
    assert log.spilled > 0
    again = OutputLog(str(tmp_path / "spill2"), 1 << 30)
    again.restore(log.residue())
    assert again.since(1, 0) == [f for _, f in fs]


def test_the_residue_is_written_compressed(tmp_path):
    fs = frames_of(100)
    log = OutputLog(str(tmp_path / "spill"), 1 << 30)
    for s, f in fs:
        log.add(3, s, f)
    value = log.residue()[3]
    raw = sum(len(f) for _, f in fs)
    assert len(value["zstd"]) * 3 < raw


def test_a_residue_written_uncompressed_is_read_as_it_is(tmp_path):
    """A store written before the residue was compressed holds the msgpack array itself."""
    fs = frames_of(8)
    old = msgpack.packb([[s, f] for s, f in fs], use_bin_type=True)
    log = OutputLog(str(tmp_path / "spill"), 1 << 20)
    log.restore({1: old})
    assert log.since(1, 0) == [f for _, f in fs]


@pytest.mark.parametrize("compressed", [True, False])
def test_tools_read_the_frames_of_a_snapshot_from_a_real_store(tmp_path, compressed):
    fs = frames_of(12)
    log = OutputLog(str(tmp_path / "spill"), 1 << 20)
    for s, f in fs:
        log.add(1, s, f)
    value = log.residue()[1] if compressed else msgpack.packb([[s, f] for s, f in fs], use_bin_type=True)
    store = lsm.Store(str(tmp_path / "store"))
    try:
        store.append(5, {OUT: {1: value}})
        store.flush()
        assert logged_frames(store, 1, as_of=5) == dict(fs)
        assert logged_frames(store, 2, as_of=5) == {}
    finally:
        store.close()
