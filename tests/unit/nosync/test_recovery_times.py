"""The recovery times a run derives from its progress samples (nosync.metrics)."""

from nosync.driver import metrics


def _row(t, worker, read, attempt=0, positioned=True):
    return {"t": t, "worker": worker, "attempt": attempt, "positioned": positioned, "read": read, "committed": 0}


def _caught_up(rows, **rec):
    recs = [{"worker": 1, "attempt": 0, "lost_at": 10.05, **rec}]
    metrics.add_recovery_times(recs, [], 0.0, rows)
    return recs[0]["caught_up_s"]


def test_stale_count_of_the_lost_attempt_does_not_count_as_caught_up():
    rows = [_row(10.0, 0, 500), _row(10.0, 1, 400)]
    # after the loss the samples keep worker 1's last count (its lost attempt's)
    rows += [_row(10.1, 0, 520), _row(10.1, 1, 400)]
    # its retry registers, not yet restored
    rows += [_row(10.2, 0, 540), _row(10.2, 1, 400, attempt=1, positioned=False)]
    # restored at 300, reads on
    rows += [_row(10.3, 0, 560), _row(10.3, 1, 300, attempt=1)]
    rows += [_row(10.4, 0, 580), _row(10.4, 1, 399, attempt=1)]
    rows += [_row(10.5, 0, 600), _row(10.5, 1, 400, attempt=1)]
    assert abs(_caught_up(rows) - 0.45) < 1e-9


def test_a_rollback_waits_for_every_worker_and_for_the_restore():
    rows = [_row(10.0, 0, 500), _row(10.0, 1, 400)]
    rows += [_row(10.1, 0, 500), _row(10.1, 1, 300, attempt=1)]
    # worker 0 has not yet reported its rolled-back position: restored_at says when it had
    rows += [_row(10.2, 0, 501), _row(10.2, 1, 450, attempt=1)]
    rows += [_row(10.3, 0, 200), _row(10.3, 1, 460, attempt=1)]
    rows += [_row(10.4, 0, 500), _row(10.4, 1, 470, attempt=1)]
    assert abs(_caught_up(rows, restored_at=10.25) - 0.35) < 1e-9


def test_a_run_that_ends_before_catching_up_has_none():
    rows = [_row(10.0, 0, 500), _row(10.0, 1, 400), _row(10.1, 0, 600), _row(10.1, 1, 100, attempt=1)]
    assert _caught_up(rows) is None
