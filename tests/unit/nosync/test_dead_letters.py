"""A worker's dead-letter file, opened again after a crash (`dead_letters.open_dead_letters`): the
records it holds are known, so none is written twice; a last line the crash left without
its newline is ended when whole and cut off when not, so the next record starts its own line.
Both the worker's dead letters and the driver's file are bounded (`--max-dead-letters`): the
record past the bound fails the run, saying how many, and not one before it does."""

from __future__ import annotations

import json

import pytest

from nosync.errors import BadRecord, RunFailed
from nosync.runtime.dead_letters import DeadLetterFile, DeadLetters, open_dead_letters

A = {"source": "lines", "file": "/in/a.jsonl", "position": {"line": 3}, "error": "not JSON"}
B = {"source": "lines", "file": "/in/b.jsonl", "position": {"line": 9}, "error": "not JSON"}
C = {"source": "lines", "file": "/in/a.jsonl", "position": {"line": 40}, "error": "not JSON"}


def _line(d: dict) -> str:
    return json.dumps(d) + "\n"


def _records(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_a_file_that_does_not_exist_is_created_empty(tmp_path):
    path = tmp_path / "run" / "dead-letter-w0.jsonl"
    f, seen = open_dead_letters(str(path))
    f.close()
    assert seen == set()
    assert path.read_bytes() == b""


def test_the_records_held_are_known_by_source_file_and_position(tmp_path):
    path = tmp_path / "dead-letter-w1.jsonl"
    path.write_text(_line(A) + _line(B), encoding="utf-8")
    f, seen = open_dead_letters(str(path))
    f.close()
    assert seen == {
        ("lines", "/in/a.jsonl", '{"line": 3}'),
        ("lines", "/in/b.jsonl", '{"line": 9}'),
    }


def test_a_torn_last_line_is_cut_off_and_the_next_record_gets_its_own_line(tmp_path):
    path = tmp_path / "dead-letter-w0.jsonl"
    torn = _line(B)[:25]
    path.write_text(_line(A) + torn, encoding="utf-8")
    f, seen = open_dead_letters(str(path))
    f.write(_line(C))
    f.close()
    assert seen == {("lines", "/in/a.jsonl", '{"line": 3}')}  # B is read again, and written then
    assert _records(path) == [A, C]


def test_a_whole_record_without_its_newline_is_kept_and_ended(tmp_path):
    path = tmp_path / "dead-letter-w0.jsonl"
    path.write_text(_line(A) + _line(B).rstrip("\n"), encoding="utf-8")
    f, seen = open_dead_letters(str(path))
    f.write(_line(C))
    f.close()
    assert ("lines", "/in/b.jsonl", '{"line": 9}') in seen
    assert _records(path) == [A, B, C]


def _letter(i: int) -> dict:
    return {"source": "lines", "file": "/in/a.jsonl", "position": {"line": i}, "error": "not JSON"}


def test_a_workers_dead_letters_past_the_bound_fail_the_run_with_the_count():
    sent: list[dict] = []
    letters = DeadLetters(sent.append, fail=False, max_dead_letters=3)
    for i in range(3):
        letters.write("lines", BadRecord("not JSON", "/in/a.jsonl", {"line": i}))
        letters.write("lines", BadRecord("not JSON", "/in/a.jsonl", {"line": i}))  # read again: once
    assert [x["position"] for x in sent] == [{"line": 0}, {"line": 1}, {"line": 2}]
    with pytest.raises(RunFailed) as e:
        letters.write("lines", BadRecord("not JSON", "/in/a.jsonl", {"line": 3}))
    msg = str(e.value)
    assert "4 dead letters" in msg and "--max-dead-letters 3" in msg and "line" in msg, msg
    assert len(sent) == 3 and letters.count == 3
    letters.write("lines", BadRecord("not JSON", "/in/a.jsonl", {"line": 1}))  # one it holds: no failure


def test_unbounded_dead_letters_take_any_number():
    sent: list[dict] = []
    letters = DeadLetters(sent.append, fail=False, max_dead_letters=None)
    for i in range(20_050):
        letters.write("lines", BadRecord("not JSON", "/in/a.jsonl", {"line": i}))
    assert len(sent) == 20_050


def test_the_default_bound_is_ten_thousand():
    letters = DeadLetters(lambda _: None, fail=False)
    for i in range(10_000):
        letters.write("lines", BadRecord("not JSON", "/in/a.jsonl", {"line": i}))
    with pytest.raises(RunFailed, match="10001 dead letters, more than --max-dead-letters 10000"):
        letters.write("lines", BadRecord("not JSON", "/in/a.jsonl", {"line": -1}))


def test_the_drivers_file_past_the_bound_fails_and_holds_the_letters_before_it(tmp_path):
    path = tmp_path / "dead-letter-w0.jsonl"
    path.write_text(_line(A) + _line(B), encoding="utf-8")  # a resumed run: the file holds two
    f = DeadLetterFile(str(path), max_dead_letters=4)
    try:
        assert f.add(_letter(100)) and f.add(_letter(101))
        assert not f.add(A)  # held already: no failure
        with pytest.raises(RunFailed) as e:
            f.add(_letter(102))
        assert "5 dead letters" in str(e.value) and "--max-dead-letters 4" in str(e.value)
    finally:
        f.close()
    assert _records(path) == [A, B, _letter(100), _letter(101)]
