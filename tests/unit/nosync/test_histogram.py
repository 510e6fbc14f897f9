"""The latency histogram (nosync.runtime.histogram): its quantiles against the exact ones of known
data, merging, its msgpack wire form, its fixed size; and the run summary's latency from the
workers' histograms (nosync.driver.metrics.summarize)."""

from __future__ import annotations

import sys

import msgpack
import numpy as np
import pytest

from nosync.driver import metrics
from nosync.runtime.histogram import BUCKETS, SUB, Histogram, bucket_bounds, bucket_of

QS = (0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0)
REL = 1 / (2 * SUB)
"""The relative error the module states for a quantile (0.39%), for values of 2·SUB µs and up."""
ABS_S = 0.5e-6
"""The absolute error it states below that."""


def exact(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """The least value v with at least q of the count <= v, computed apart from the histogram."""
    return float(np.percentile(np.repeat(values, counts), q * 100, method="inverted_cdf"))


def assert_close(got: float | None, want: float, what: str) -> None:
    assert got is not None, what
    # 1e-9: a value on a bucket's edge may land in the bucket below by float rounding
    assert abs(got - want) <= max(REL * want, ABS_S) + 1e-9 * want, f"{what}: {got} against {want}"


def filled(values: np.ndarray, counts: np.ndarray) -> Histogram:
    h = Histogram()
    for v, n in zip(values.tolist(), counts.tolist(), strict=True):
        h.record(v, n)
    return h


@pytest.mark.parametrize(
    ("name", "draw"),
    [
        # latencies as a run sees them: a lognormal body around 20 ms with a tail
        ("lognormal", lambda rng, n: rng.lognormal(np.log(0.02), 1.0, n)),
        # every scale the histogram covers, 1 µs to an hour, equally often
        ("log-uniform", lambda rng, n: np.exp(rng.uniform(np.log(1e-6), np.log(3600.0), n))),
        # below 2·SUB µs, where buckets are a microsecond wide
        ("microseconds", lambda rng, n: rng.uniform(0.0, 300e-6, n)),
    ],
)
def test_quantiles_are_the_exact_ones_within_the_stated_error(name, draw):
    seed = 55
    rng = np.random.default_rng(seed)
    values = draw(rng, 50_000)
    counts = rng.integers(1, 20, values.size)
    h = filled(values, counts)
    assert h.count == int(counts.sum())
    assert h.min == values.min() and h.max == values.max()
    assert h.mean == pytest.approx(float((values * counts).sum() / counts.sum()), rel=1e-9)
    for q in QS:
        assert_close(h.quantile(q), exact(values, counts, q), f"{name}, seed {seed}, q={q}")
    assert h.quantile(1.0) == values.max()


def test_a_quantile_is_exact_when_every_value_is_the_same():
    h = Histogram()
    h.record(0.0123456, 1000)
    assert [h.quantile(q) for q in (0.0, 0.5, 0.999, 1.0)] == [0.0123456] * 4


def test_an_empty_histogram_has_no_quantile_and_a_bad_q_is_refused():
    h = Histogram()
    assert h.quantile(0.5) is None and h.mean is None and h.max is None
    h.record(1.0)
    for q in (-0.1, 1.5):
        with pytest.raises(ValueError):
            h.quantile(q)


def test_values_out_of_range_are_counted_and_min_and_max_stay_exact():
    h = Histogram()
    h.record(-0.002)  # clocks that disagree
    h.record(0.010, 10)
    h.record(100 * 86400.0)  # past MAX_S
    assert h.count == 12
    assert h.min == -0.002 and h.max == 100 * 86400.0
    assert h.quantile(0.0) == -0.002
    assert h.quantile(0.5) == pytest.approx(0.010, rel=REL)
    assert h.quantile(1.0) == 100 * 86400.0


def test_every_value_falls_in_its_bucket_and_a_bucket_is_at_most_1_in_SUB_wide():
    rng = np.random.default_rng(7)
    for v in np.exp(rng.uniform(np.log(1e-6), np.log(30 * 86400.0), 20_000)).tolist():
        i = bucket_of(v)
        low, high = bucket_bounds(i)
        assert low <= v * (1 + 1e-12) and v < high * (1 + 1e-12), (v, i, low, high)
        assert high - low <= max(low / SUB, 1e-6) * (1 + 1e-9), (v, i, low, high)
    edges = [bucket_bounds(i) for i in range(BUCKETS)]
    assert all(a[1] == pytest.approx(b[0], rel=1e-12) for a, b in zip(edges, edges[1:], strict=False))


def test_merging_is_recording_everything_in_one():
    rng = np.random.default_rng(11)
    values = rng.lognormal(np.log(0.05), 1.5, 30_000)
    counts = rng.integers(1, 5, values.size)
    whole = filled(values, counts)
    parts = [filled(values[i::3], counts[i::3]) for i in range(3)]
    merged = Histogram()
    for p in parts:
        merged.merge(p)
    merged.merge(Histogram())  # an empty one changes nothing
    assert merged.counts == whole.counts
    assert (merged.count, merged.min, merged.max) == (whole.count, whole.min, whole.max)
    assert merged.total_s == pytest.approx(whole.total_s, rel=1e-12)
    assert [merged.quantile(q) for q in QS] == [whole.quantile(q) for q in QS]


def test_the_wire_form_round_trips_through_msgpack_with_only_the_nonzero_buckets():
    rng = np.random.default_rng(3)
    h = filled(rng.lognormal(np.log(0.01), 0.5, 5_000), rng.integers(1, 100, 5_000))
    wire = h.to_wire()
    assert len(wire["index"]) == len(wire["count"]) == h.nonzero() < BUCKETS
    assert all(isinstance(x, int) for x in [*wire["index"], *wire["count"], wire["n"]])
    # as the frames decode a Done: lists arrive as tuples
    packed = msgpack.packb(wire, use_bin_type=True)
    back = Histogram.from_wire(msgpack.unpackb(packed, use_list=False, raw=False, strict_map_key=False))
    assert back.counts == h.counts
    assert (back.count, back.total_s, back.min, back.max) == (h.count, h.total_s, h.min, h.max)
    assert [back.quantile(q) for q in QS] == [h.quantile(q) for q in QS]
    empty = Histogram.from_wire(msgpack.unpackb(msgpack.packb(Histogram().to_wire()), raw=False))
    assert empty.count == 0 and empty.quantile(0.5) is None


def test_a_wire_form_of_another_layout_or_with_wrong_counts_is_refused():
    h = Histogram()
    h.record(0.5, 3)
    wire = h.to_wire()
    with pytest.raises(ValueError, match="layout"):
        Histogram.from_wire({**wire, "sub_bits": 5})
    with pytest.raises(ValueError, match="add up"):
        Histogram.from_wire({**wire, "n": 4})
    with pytest.raises(ValueError, match="outside"):
        Histogram.from_wire({**wire, "index": [BUCKETS]})


def test_memory_is_fixed_however_many_records():
    h = Histogram()
    size = sys.getsizeof(h.counts)
    rng = np.random.default_rng(1)
    # a million distinct values over every scale
    for v in np.exp(rng.uniform(np.log(1e-6), np.log(86400.0), 1_000_000)).tolist():
        h.record(v)
    assert h.count == 1_000_000
    assert len(h.counts) == BUCKETS and sys.getsizeof(h.counts) == size
    wire = h.to_wire()
    assert len(wire["index"]) <= BUCKETS
    assert len(msgpack.packb(wire)) < 20 * BUCKETS


def test_the_summary_merges_the_workers_histograms():
    rng = np.random.default_rng(5)
    per_worker = [rng.lognormal(np.log(0.02), 1.0, 20_000), rng.lognormal(np.log(0.2), 0.3, 5_000)]
    counts = [rng.integers(1, 50, v.size) for v in per_worker]
    done = {
        w: {
            "metrics": {
                "operators": {},
                "committed": int(c.sum()),
                "read": int(c.sum()),
                "dead_letters": 0,
                "latency": msgpack.unpackb(msgpack.packb(filled(v, c).to_wire()), use_list=False, raw=False),
            }
        }
        for w, (v, c) in enumerate(zip(per_worker, counts, strict=True))
    }
    s = metrics.summarize({"mode": "none"}, done)
    values, all_counts = np.concatenate(per_worker), np.concatenate(counts)
    for key, q in (("latency_p50_ms", 0.5), ("latency_p99_ms", 0.99), ("latency_p999_ms", 0.999)):
        assert_close(s[key] / 1000, exact(values, all_counts, q), key)
    assert s["latency_max_ms"] == values.max() * 1000
    assert s["records_committed"] == int(all_counts.sum())


def test_a_summary_without_latency_has_none():
    done = {0: {"metrics": {"operators": {}, "committed": 0, "read": 0, "dead_letters": 0}}}
    s = metrics.summarize({}, done)
    assert [s[k] for k in ("latency_p50_ms", "latency_p99_ms", "latency_p999_ms", "latency_max_ms")] == [None] * 4
