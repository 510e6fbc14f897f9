"""The judge's own arithmetic (experiments/chaos.py): lost and duplicated records of file sinks
(multisets) and upsert sinks (final maps), and how far into a run its kills may go. Expected
numbers are counted by hand from the inputs written here."""

from __future__ import annotations

import collections
import json
import sys

import pytest

from experiments.chaos import (
    DEAD_LETTERS,
    _finish,
    _start,
    advanced,
    canonical,
    compare,
    dead_letters,
    exit_code,
    kill_plan,
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


def write_events(path, events) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_kill_plan_leaves_the_end_of_the_run_out(tmp_path):
    def run(name, progress_times, end):
        events = [{"t": 0.0, "event": "running"}]
        events += [{"t": t, "event": "checkpoint_completed", "checkpoint": n} for n, t in enumerate(progress_times, 1)]
        events += [
            {"t": end, "event": "finished"},
            {"t": end + 0.1, "event": "checkpoint_completed", "checkpoint": len(progress_times) + 1},
        ]
        write_events(tmp_path / name / "events.jsonl", events)
        return str(tmp_path / name)

    a = run("a", [1.0, 2.0, 3.0, 4.0, 5.0, 5.1], 5.2)  # 6 before the end (the one after it does not count)
    b = run("b", [1.0, 3.0, 5.0, 7.0, 9.0, 9.5, 9.6], 9.7)  # 7
    # the fewest (6), less the two that come with the end (4), shared by kills + 1, less one
    assert kill_plan([a, b], 1)["skip"] == 4 // 2 - 1
    assert kill_plan([a, b], 3)["skip"] == 0
    gaps = sorted([1.0, 1.0, 1.0, 1.0, 0.1] + [2.0, 2.0, 2.0, 2.0, 0.5, 0.1])
    assert kill_plan([a, b], 1)["gap_s"] == gaps[len(gaps) // 2]


def test_kill_plan_counts_epochs_of_the_safe_point_not_its_events(tmp_path):
    """A safe point that jumps (10 epochs in 4 events) is progress of 10 units; the end of the
    input (the epoch of a finished channel) is not progress."""
    events = [{"t": 0.0, "event": "running"}]
    events += [{"t": t, "event": "safe_point", "epoch": e} for t, e in [(1, 0), (2, 1), (3, 5), (4, 9)]]
    events += [{"t": 5.0, "event": "safe_point", "epoch": 1 << 62}, {"t": 5.1, "event": "finished"}]
    write_events(tmp_path / "a" / "events.jsonl", events)
    # epochs 0..9: 10 units, less 2, shared by 1 kill + 1, less one
    assert kill_plan([str(tmp_path / "a")], 1)["skip"] == 8 // 2 - 1


def test_a_kill_after_a_recovery_counts_the_epochs_the_safe_point_jumped():
    safe = [{"event": "safe_point", "epoch": e} for e in (0, 1, 2)]
    events = [{"event": "running"}, *safe, {"event": "recovered"}, {"event": "running"}]
    start = 5
    assert advanced(events, start) == 0
    events.append({"event": "safe_point", "epoch": 3})
    assert advanced(events, start) == 1
    events.append({"event": "safe_point", "epoch": 13})
    # from epoch 2, the last safe point before the restart, to 13; one event but 11 epochs
    assert advanced(events, start) == 11
    # with no progress before the start, the first event after it counts as one
    assert advanced([{"event": "running"}, {"event": "committed", "epoch": 4}], 0) == 1


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
