"""The generator's input at a rate and unbounded, its random keys and values
(nosync/api/sources.py Generator), and a source operator's pace and stop
(nosync/runtime/source_op.py SourceOp): driven poll by poll with a stand-in worker, no Spark.

Expected values come from the definitions: record j of a partition is due j / rate after the
source clock's start; a uniform draw over K keys gives each about N / K; a Zipf(s) draw gives
rank 1 about 2^s times as often as rank 2."""

from __future__ import annotations

import itertools
import types
from collections import Counter

import msgpack
import pytest

import nosync as ns
from nosync.errors import PipelineError
from nosync.runtime.source_op import SourceOp


class StandIn:
    """What a SourceOp uses of its worker."""

    def __init__(self, batch_size: int, epoch_records: int, t0: float = 0.0) -> None:
        self.batch_size = batch_size
        self.epoch_records = epoch_records
        self.epoch_ms = 0
        self.slow_s = 0.0
        self.spec = {"source_t0": t0}
        self.clock = types.SimpleNamespace(ts=0.0)
        self.first_read_at = None

    def dead_letter(self, op_name: str, bad) -> None:
        raise AssertionError(f"no bad record expected: {bad}")


def source_op(src, worker: StandIn):
    p = ns.Pipeline("t")
    s = p.source(src)
    s.sink(ns.sinks.Null())
    op = SourceOp(s.node, src.partitions(1), worker)
    got = {"records": [], "markers": [], "ts": []}

    def push(records, epoch, chan):
        got["records"].extend((r, epoch) for r in records)
        got["ts"].append(worker.clock.ts)

    op.connect(push, lambda chan, epoch, wm, eos: got["markers"].append((epoch, eos)), "chan")
    return op, got


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"rate": 0}, "rate"),
        ({"rate": -5}, "rate"),
        ({"value_bytes": -1}, "value_bytes"),
        ({"records": -1}, "records"),
        ({"draw": "sorted"}, "draw"),
        ({"partitions": 0}, "partitions"),
    ],
)
def test_bad_generator_arguments_are_refused_by_name(kwargs, names):
    with pytest.raises(PipelineError, match=names):
        ns.sources.Generator(**kwargs)


def test_an_unbounded_generator_reads_on_past_any_count():
    gen = ns.sources.Generator(records=None, keys=7)
    it = gen.read({"p": 0, "of": 1}, 0, 1000)
    chunks = [next(it) for _ in range(50)]
    assert chunks[-1][1] == 50_000
    assert chunks[-1][0][-1] == str(49_999 % 7)


def test_random_keys_are_the_same_from_any_position():
    gen = ns.sources.Generator(records=5000, keys=300, draw="random", value_bytes=12)
    part = {"p": 1, "of": 3}
    whole = [r for recs, _ in gen.read(part, 0, 64) for r in recs]
    later = [r for recs, _ in gen.read(part, 777, 50) for r in recs]
    assert later == whole[777:]
    assert len(whole) == len(range(1, 5000, 3))
    assert all(len(v) == 12 and v.isascii() for _, v in whole)
    assert len({v for _, v in whole}) > len(whole) // 2  # values vary from record to record


def test_uniform_draw_spreads_evenly_over_the_keys():
    n, keys = 200_000, 20
    gen = ns.sources.Generator(records=n, keys=keys, draw="random")
    counts = Counter(r for recs, _ in gen.read({"p": 0, "of": 1}, 0, 4096) for r in recs)
    assert set(counts) == {str(k) for k in range(keys)}
    for c in counts.values():
        assert abs(c - n / keys) < 0.05 * n / keys


def test_zipf_draw_follows_its_exponent():
    n, skew = 300_000, 1.2
    gen = ns.sources.Generator(records=n, keys=1000, skew=skew)
    counts = Counter(r for recs, _ in gen.read({"p": 0, "of": 1}, 0, 4096) for r in recs)
    # ranks 1 and 2 are keys "0" and "1": P(1) / P(2) = 2^skew
    assert counts["0"] / counts["1"] == pytest.approx(2**skew, rel=0.05)
    assert counts["0"] > counts["10"] > counts["500"]


def test_a_paced_source_is_due_chunk_by_chunk_and_stamped_when_due():
    t0 = 1000.0
    w = StandIn(batch_size=10, epoch_records=1_000_000, t0=t0)
    op, got = source_op(ns.sources.Generator(records=None, keys=5, rate=100.0), w)
    # the first chunk (records 0..9) is whole when record 9 is due: t0 + 9 / 100
    assert op.due_at() == pytest.approx(t0 + 0.09)
    op.poll()
    assert [r for r, _ in got["records"]] == [str(i % 5) for i in range(10)]
    # event time: when the batch's middle record (5) was due
    assert got["ts"] == [pytest.approx(t0 + 0.05)]
    assert op.due_at() == pytest.approx(t0 + 0.19)
    op.poll()
    assert got["ts"][1] == pytest.approx(t0 + 0.15)


def test_an_unpaced_source_is_always_due():
    w = StandIn(batch_size=10, epoch_records=100)
    op, _ = source_op(ns.sources.Generator(records=50, keys=5), w)
    assert op.due_at() == 0.0


def test_a_stopped_source_closes_its_epoch_and_a_restored_one_reads_on_exactly():
    w = StandIn(batch_size=8, epoch_records=20)
    gen = ns.sources.Generator(records=None, keys=1000, draw="random")
    op, got = source_op(gen, w)
    for _ in range(7):  # epochs 0 and 1 (20 records each), and 2 records... of epoch 2
        op.poll()
    read = len(got["records"])
    epoch = op.epoch
    op.stop(None)
    assert op.stopped and not op.finished
    assert got["markers"][-1] == (epoch, False)
    op.stop(epoch + 3)  # the run ends at a later boundary: closed without reading
    assert got["markers"][-1] == (epoch + 3, False)
    assert len(got["records"]) == read
    meta = msgpack.unpackb(msgpack.packb(op.snapshot_meta(), use_bin_type=True), raw=False, use_list=False)
    assert meta["finished"] is False
    # the resumed run: a fresh operator restored from the last snapshot reads the next records
    again, more = source_op(gen, StandIn(batch_size=8, epoch_records=20))
    again.restore_meta(meta)
    for _ in range(3):
        again.poll()
    n = read + len(more["records"])
    whole = [r for recs, _ in itertools.islice(gen.read({"p": 0, "of": 1}, 0, 1000), n // 1000 + 1) for r in recs][:n]
    assert [r for r, _ in got["records"]] + [r for r, _ in more["records"]] == whole
    assert {e for _, e in more["records"]} == {epoch + 4}


def test_a_resumed_clock_goes_on_after_a_stop_and_keeps_its_start_after_a_kill(tmp_path):
    import json
    import time

    from nosync.driver.stopping import CLOCK_FILE, SourceClock

    # the run in tmp_path started its clock, then stopped cleanly 12.5 s into it
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "a"}))
    (tmp_path / CLOCK_FILE).write_text(json.dumps({"source_t0": 1000.0}))
    (tmp_path / "summary.json").write_text(json.dumps({"run_id": "a", "source_clock_s": 12.5}))
    clock = SourceClock.resumed(str(tmp_path))
    before = time.time()
    t0 = clock.t0()
    assert before - 12.5 <= t0 <= time.time() - 12.5
    assert json.loads((tmp_path / CLOCK_FILE).read_text()) == {"source_t0": t0}
    # the resumed run (b) was killed: no summary of its own, its clock's start stands
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "b"}))
    assert SourceClock.resumed(str(tmp_path)).t0() == t0
    # a run that never started its clock: a new one starts now
    empty = tmp_path / "empty"
    empty.mkdir()
    assert SourceClock.resumed(str(empty)).t0() >= before
