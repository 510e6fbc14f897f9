"""The output log's residue: what a snapshot writes of it under `OUT` and what a restored
sender serves from it (`nosync.modes.nosync.outlog`, `nosync.state.layout`)."""

from __future__ import annotations

import os
import tracemalloc

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


def spill_on_disk(path) -> int:
    """Bytes the spill holds on disk: its segment files (or the one file of a spill that is one)."""
    if not os.path.exists(path):
        return 0
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(e.stat().st_size for e in os.scandir(path))


def test_spilled_segments_go_as_their_frames_are_trimmed_and_the_log_serves_exactly_the_rest(tmp_path):
    """Two receivers trimmed at their own pace, over a run twenty times longer than what stays
    untrimmed: the spill's disk stays within the untrimmed frames plus one segment a receiver,
    and `since` and the residue hold exactly the frames not trimmed."""
    seg = 8_000
    path = tmp_path / "spill"
    log = OutputLog(str(path), 6_000, segment_bytes=seg)
    kept: dict[int, list[tuple[int, bytes]]] = {1: [], 2: []}
    next_seq = {1: 1, 2: 1}
    written = 0
    peak_disk = 0
    for _ in range(200):
        for d in (1, 2):
            for s, f in frames_of(10, start=next_seq[d]):
                log.add(d, s, f)
                kept[d].append((s, f))
                written += len(f)
            next_seq[d] += 10
        # receiver 1 keeps about 30 frames back, receiver 2 about 60: trimmed unevenly
        for d, lag in ((1, 30), (2, 60)):
            upto = kept[d][-1][0] - lag - (next_seq[d] // 10) % 7
            log.trim(d, upto)
            kept[d] = [(s, f) for s, f in kept[d] if s > upto]
        untrimmed = sum(len(f) for fs in kept.values() for _, f in fs)
        disk = spill_on_disk(path)
        peak_disk = max(peak_disk, disk)
        assert disk <= untrimmed + 2 * seg, (disk, untrimmed)
        assert disk == log.spill_bytes
    assert log.spilled > 1000 and written > 20 * peak_disk  # the spill was written to all along, and reclaimed
    for d in (1, 2):
        start = kept[d][5][0]
        assert log.since(d, start) == [f for s, f in kept[d] if s >= start]
    again = OutputLog(str(tmp_path / "again"), 1 << 30)
    again.restore(log.residue())
    for d in (1, 2):
        assert again.since(d, 0) == [f for _, f in kept[d]]
    for d in (1, 2):
        log.trim_all(d)
    assert spill_on_disk(path) == 0 and log.spill_bytes == 0


def test_a_frame_larger_than_a_segment_has_one_alone(tmp_path):
    path = tmp_path / "spill"
    log = OutputLog(str(path), 1_000, segment_bytes=500)
    big = [(s, bytes([s]) * 2_000) for s in range(1, 6)]
    for s, f in big:
        log.add(1, s, f)
    assert log.spilled == 5  # each past the bound alone
    assert [e.stat().st_size for e in os.scandir(path)] == [2_000] * 5
    assert log.since(1, 2) == [f for s, f in big if s >= 2]
    log.trim(1, 3)
    assert [e.stat().st_size for e in os.scandir(path)] == [2_000] * 2
    assert log.since(1, 0) == [f for s, f in big if s > 3]


def test_the_residue_reads_the_spill_one_receiver_at_a_time(tmp_path):
    """32 receivers' frames, nearly all spilled: making the residue holds one receiver's frames
    at once (a few times their size, packed) beside the compressed values, not the whole spill
    (which would take more than all of it)."""
    log = OutputLog(str(tmp_path / "spill"), 64_000, segment_bytes=1 << 20)
    sent = {d: frames_of(200, start=d * 1000) for d in range(32)}
    for d, fs in sent.items():
        for s, f in fs:
            log.add(d, s, f)
    spilled = log.spill_bytes
    assert spilled > 0.9 * sum(len(f) for fs in sent.values() for _, f in fs)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        residue = log.residue()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < spilled / 2, (peak, spilled)
    again = OutputLog(str(tmp_path / "again"), 1 << 30)
    again.restore(residue)
    for d, fs in sent.items():
        assert again.since(d, 0) == [f for _, f in fs]


def test_a_restored_or_closed_log_deletes_its_spill(tmp_path):
    path = tmp_path / "spill"
    fs = frames_of(100)
    log = OutputLog(str(path), 5_000, segment_bytes=4_000)
    for s, f in fs:
        log.add(1, s, f)
    residue = log.residue()
    assert spill_on_disk(path) > 0
    log.restore(residue)
    assert spill_on_disk(path) == 0
    assert log.since(1, 0) == [f for _, f in fs]
    for s, f in frames_of(100, start=101):
        log.add(1, s, f)
    assert spill_on_disk(path) > 0
    log.close()
    assert not path.exists()
