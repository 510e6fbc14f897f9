"""The judge's own arithmetic (experiments/chaos.py): lost and duplicated records of file sinks
(multisets) and upsert sinks (final maps), and where in a run its kills go (records read).
Expected numbers are counted by hand from the inputs written here."""

from __future__ import annotations

import collections
import json
import sys

import pytest

from experiments.chaos import (
    DEAD_LETTERS,
    Progress,
    _finish,
    _recovered,
    _start,
    canonical,
    compare,
    dead_letters,
    exit_code,
    kill_targets,
    reference_reads,
)
from nosync.errors import NosyncError, RunFailed


def multiset(*records) -> tuple[str, collections.Counter]:
    return "multiset", collections.Counter(canonical(r) for r in records)


def test_files_sink_counts_lost_and_duplicated_records():
    ref = {"out": multiset(["a", 1], ["a", 2], ["b", 1], ["b", 1])}
    got = {"out": multiset(["a", 1], ["a", 1], ["b", 1], ["c", 9])}
    # lost: ["a", 2] and one of the two ["b", 1]; duplicated: the second ["a", 1] and ["c", 9]
    assert compare(ref, got)["out"] == {"kind": "files", "records": 4, "lost": 2, "duplicated": 2}


def test_records_compare_as_values_not_as_text():
    """A tuple and a list, or a dict with its keys in another order, are the same record."""
    ref = {"out": multiset({"k": 1, "v": (1, 2)})}
    got = {"out": multiset({"v": [1, 2], "k": 1})}
    assert compare(ref, got)["out"]["lost"] == 0 and compare(ref, got)["out"]["duplicated"] == 0


def test_upsert_sink_counts_missing_wrong_and_extra_keys():
    ref = {"kv": ("map", {canonical("a"): canonical(3), canonical("b"): canonical(1)})}
    got = {"kv": ("map", {canonical("a"): canonical(2), canonical("z"): canonical(1)})}
    r = compare(ref, got)["kv"]
    assert (r["lost"], r["wrong_values"], r["duplicated"], r["keys"]) == (2, 1, 1, 2)


def test_a_sink_missing_from_the_run_loses_everything():
    ref = {"out": multiset(1, 2, 3)}
    assert compare(ref, {})["out"]["lost"] == 3


def test_dead_letters_of_every_worker_count_by_source_file_and_position(tmp_path):
    bad = {"source": "lines", "file": "/in/a.jsonl", "position": {"line": 3}, "error": "not JSON"}
    other = {"source": "lines", "file": "/in/b.jsonl", "position": {"line": 3}, "error": "not JSON"}
    (tmp_path / "dead-letter-w0.jsonl").write_text(json.dumps(bad) + "\n" + json.dumps(other) + "\n")
    # the same record written twice (by two workers here), and a line a crash left torn
    (tmp_path / "dead-letter-w1.jsonl").write_text(json.dumps({**bad, "error": "again"}) + "\n" + '{"sour')
    (tmp_path / "output").mkdir()  # not a worker's file: left alone
    got = dead_letters(str(tmp_path))
    assert got == collections.Counter(
        {
            canonical(["lines", "/in/a.jsonl", {"line": 3}]): 2,
            canonical(["lines", "/in/b.jsonl", {"line": 3}]): 1,
            canonical(["a torn line", "dead-letter-w1.jsonl", '{"sour']): 1,
        }
    )
    assert dead_letters(str(tmp_path / "output")) == collections.Counter()


def test_dead_letters_are_judged_as_a_multiset_and_left_out_when_no_run_has_any():
    ref = {"out": multiset(1), DEAD_LETTERS: multiset(["lines", "a", 3], ["lines", "a", 8])}
    got = {"out": multiset(1), DEAD_LETTERS: multiset(["lines", "a", 3], ["lines", "a", 3])}
    assert compare(ref, got)[DEAD_LETTERS] == {"kind": "files", "records": 2, "lost": 1, "duplicated": 1}
    # only the run with kills wrote one: a duplicate
    ref = {"out": multiset(1), DEAD_LETTERS: multiset()}
    assert compare(ref, got)[DEAD_LETTERS]["duplicated"] == 2
    assert set(compare(ref, {"out": multiset(1), DEAD_LETTERS: multiset()})) == {"out"}


def test_exit_codes_of_the_verdicts():
    judged = {"deterministic": True, "judged": True}
    assert exit_code({**judged, "exactly_once": True}) == 0
    assert exit_code({**judged, "exactly_once": False}) == 1
    assert exit_code({"deterministic": True, "judged": False, "exactly_once": False, "run_failed": "x"}) == 1
    assert exit_code({"deterministic": False, "judged": False, "exactly_once": None}) == 3
    # equal outputs, but nothing recovered: not a pass
    assert exit_code({"deterministic": True, "judged": False, "exactly_once": None, "no_recovery": True}) == 4
    # equal outputs, but fewer kills made than asked for: not a pass either
    assert exit_code({"deterministic": True, "judged": False, "exactly_once": None, "kills_short": True}) == 4
    # records lost after the kills that were made: lost all the same
    assert exit_code({"deterministic": True, "judged": True, "exactly_once": False, "kills_short": True}) == 1


def write_events(path, events) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_kill_targets_fall_in_order_one_in_each_slice_of_the_middle_of_the_run():
    import random

    # 10% to 80% of 1000 records in 5 slices of 140: [100, 240), [240, 380), ... [660, 800)
    for seed in range(200):
        targets = kill_targets(1000, 5, random.Random(seed))
        assert len(targets) == 5
        for k, t in enumerate(targets):
            assert 100 + 140 * k <= t < 100 + 140 * (k + 1), (seed, targets)
    assert kill_targets(1000, 5, random.Random(7)) == kill_targets(1000, 5, random.Random(7))
    assert all(100 <= t < 800 for t in kill_targets(1000, 1, random.Random(3)))
    # a run that read nothing: every kill as soon as the run can be killed at all
    assert kill_targets(0, 3, random.Random(1)) == [0, 0, 0]


def test_reference_reads_are_the_fewest_a_summary_or_the_progress_events_show(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.mkdir()
    (a / "summary.json").write_text(json.dumps({"records_read": 5000}))
    b.mkdir()
    (b / "summary.json").write_text(json.dumps({"records_read": 4990}))
    # no summary: the most its progress events showed (the sum drops after a restore)
    write_events(c / "events.jsonl", [{"event": "progress", "read": n} for n in (100, 4000, 3000, 4500)])
    assert reference_reads([str(a), str(b)]) == 4990
    assert reference_reads([str(a), str(c)]) == 4500


def test_progress_is_the_most_records_read_any_progress_event_showed(tmp_path):
    path = tmp_path / "events.jsonl"
    p = Progress(str(path))
    lines = [
        {"event": "registered", "worker": 0, "pid": 11},
        {"event": "running"},
        {"event": "progress", "read": 300},
        {"event": "safe_point", "epoch": 0},
        {"event": "progress", "read": 900},
        {"event": "worker_lost", "worker": 0},
        {"event": "registered", "worker": 0, "pid": 12},
        {"event": "progress", "read": 400},  # the retry counts from its restored position
    ]
    write_events(path, lines[:2])
    p.poll()
    assert (p.running, p.armed, p.read, p.over) == (True, False, 0, False)
    write_events(path, lines)
    p.poll()
    assert (p.running, p.armed, p.read) == (True, True, 900)
    assert p.pid_of(0) == 12
    write_events(path, [*lines, {"event": "progress", "read": 950}, {"event": "finished"}])
    p.poll()
    assert (p.read, p.over) == (950, True)


def test_a_kill_waits_until_every_victim_recovered_or_every_worker_regrouped():
    seen = [{"event": "running"}, {"event": "regroup"}, {"event": "running"}]
    # a regroup before the kill (at index 3) is not its recovery
    assert not _recovered(seen, 3, [1])
    seen.append({"event": "worker_lost", "worker": 1})
    seen.append({"event": "recovered", "worker": 1})
    assert _recovered(seen, 3, [1])
    # two lost workers, each recovering alone: both must be back
    assert not _recovered(seen, 3, [1, 2])
    assert _recovered([*seen, {"event": "recovered", "worker": 2}], 3, [1, 2])
    # or every worker after a regroup, once running again
    assert not _recovered([*seen, {"event": "regroup"}], 3, [1, 2])
    assert _recovered([*seen, {"event": "regroup"}, {"event": "generation"}, {"event": "running"}], 3, [1, 2])


def _ended(tmp_path, code: str, timeout: float = 60.0) -> None:
    """_finish on a real process running `code`, in place of a run (it leaves no summary)."""
    run_dir = str(tmp_path / "run")
    _finish(_start([sys.executable, "-c", code], run_dir + ".log"), run_dir, timeout)


def test_a_failed_run_is_named_by_its_error_line_not_its_stack_trace(tmp_path):
    code = (
        "import sys; print('error: run failed: worker 1: operator x raised ValueError: boom'); "
        "print('\\tat java.base/java.lang.Thread.run(Thread.java:840)'); sys.exit(1)"
    )
    with pytest.raises(RunFailed) as e:
        _ended(tmp_path, code)
    assert str(e.value).endswith("failed (exit 1): worker 1: operator x raised ValueError: boom"), str(e.value)


def test_a_run_that_refused_its_command_line_is_a_usage_error_not_a_failed_run(tmp_path):
    with pytest.raises(NosyncError) as e:
        _ended(tmp_path, "import sys; print('error: no pipeline here'); sys.exit(2)")
    assert not isinstance(e.value, RunFailed)
    assert str(e.value).endswith("refused its command line: no pipeline here")


def test_a_run_past_its_timeout_is_stopped_and_counts_as_failed(tmp_path):
    with pytest.raises(RunFailed, match="had not ended at the timeout, and was stopped"):
        _ended(tmp_path, "import time; time.sleep(600)", timeout=0.5)


def test_a_run_that_ended_without_a_summary_failed(tmp_path):
    with pytest.raises(RunFailed, match=r"failed \(exit 0\): no summary written"):
        _ended(tmp_path, "print('no summary written')")
