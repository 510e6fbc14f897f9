"""Flow control between workers: a worker's sources read at most MAX_EPOCHS_AHEAD epochs past
what its peers have closed on their exchange channels to it (nosync/runtime/flow.py)."""

from __future__ import annotations

import collections
import os

import pyarrow.parquet as pq
from support.paths import WORKLOADS
from support.runs import committed_pairs
from support.workloads import keyed_count_expected

import nosync as ns
from nosync.runtime.flow import MAX_EPOCHS_AHEAD


def test_a_worker_reads_a_bounded_number_of_epochs_ahead_of_a_slow_peer(spark, tmp_path):
    """Worker 0 waits 20 ms after every batch it reads (about 50,000 records/s); worker 1 alone
    would read its 200,000 records in a fraction of a second. Sampled every 0.1 s, worker 1's
    records read stay within MAX_EPOCHS_AHEAD epochs, the epoch under way and what worker 0
    reads between two of its reports (0.2 s at most) of worker 0's."""
    records, keys, per_epoch = 400_000, 1000, 1000
    run_dir, out = tmp_path / "run", tmp_path / "out"
    ns.run(
        os.path.join(WORKLOADS, "keyed_count.py"),
        mode="none",
        workers=2,
        spark=spark,
        run_dir=str(run_dir),
        epoch_records=per_epoch,
        slow_worker=(0, 20),
        params={"records": str(records), "keys": str(keys), "output": str(out)},
    )
    assert committed_pairs(str(out)) == keyed_count_expected(records, keys)
    by_t: dict = collections.defaultdict(dict)
    for r in pq.read_table(run_dir / "progress.parquet").to_pylist():
        by_t[r["t"]][r["worker"]] = r["read"]
    gaps = [w[1] - w[0] for w in by_t.values() if len(w) == 2 and w[0] < records // 2]
    assert len(gaps) >= 10, "worker 0 read its input in too few samples to judge"
    bound = (MAX_EPOCHS_AHEAD + 2) * per_epoch + 10_000
    assert max(gaps) <= bound, (max(gaps), bound)
