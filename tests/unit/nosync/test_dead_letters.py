"""A worker's dead-letter file, opened again after a crash (`dead_letters.open_dead_letters`): the
records it holds are known, so none is written twice; a last line the crash left without
its newline is ended when whole and cut off when not, so the next record starts its own line."""

from __future__ import annotations

import json

from nosync.runtime.dead_letters import open_dead_letters

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
