"""`nosync bench lsm` runs end to end on a small state: every limit and store figure is there,
and the store's own answers are checked inside it (every as-of read finds its key, the merge
changes no state). No timing is judged here: figures belong to the benchmark."""

from __future__ import annotations

from experiments.bench import lsm_bench


def test_bench_lsm_measures_every_figure_on_a_small_state(tmp_path):
    r = lsm_bench.run(str(tmp_path), keys=2000, rounds=3, probes=500, seed=3)
    for field, (limit, _) in lsm_bench.BARS.items():
        assert r[field] > 0 and r[limit] > 0, field
        assert f"{field}_ok" in r
    assert r["merges"] == 1
    assert r["run_bytes"] > 2000 * 2  # every key and value is in the run
    assert "BELOW BAR" in lsm_bench.render(r) or "ok" in lsm_bench.render(r)
