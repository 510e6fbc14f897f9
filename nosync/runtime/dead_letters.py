"""A worker's dead letters: the source records it could not read, one JSON line each in
`dead-letter-w<i>.jsonl` of the run directory, each written once however often it is read."""

from __future__ import annotations

import json
import os
from typing import Any

from nosync.errors import BadRecord, RunFailed


class DeadLetters:
    """The dead-letter file of one worker, opened at its first bad record; with `fail`, a bad
    record fails the run instead."""

    def __init__(self, path: str, fail: bool) -> None:
        self.path = path
        self.fail = fail
        self.count = 0
        self._file: Any = None
        self._seen: set = set()

    def write(self, op_name: str, bad: BadRecord) -> None:
        """Records `bad`, read by source `op_name`, unless the file holds it already."""
        if self.fail:
            raise RunFailed(f"bad record in source '{op_name}': {bad}")
        if self._file is None:
            self._file, self._seen = open_dead_letters(self.path)
        key = _dead_letter_key(op_name, bad.source, bad.position)
        if key in self._seen:
            return
        self._seen.add(key)
        line = {"source": op_name, "file": bad.source, "position": bad.position, "error": str(bad)}
        self._file.write(json.dumps(line, default=str) + "\n")
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        """Closes the dead-letter file, if a bad record opened it."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _dead_letter_key(source: str, file: str, position: Any) -> tuple:
    return source, file, json.dumps(position, sort_keys=True, default=str)


def open_dead_letters(path: str) -> tuple[Any, set]:
    """Opens a worker's dead-letter file for appending, and the keys of the records it holds.

    A restarted worker, or one that rolled back, reads some input again: a record already in
    the file is not written twice. A last line that a crash left without its newline is ended
    if it holds a whole record, and cut off otherwise (its record is in the input the worker
    reads again), so that the next record starts a line of its own."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    seen: set = set()
    with open(path, "a+b") as f:
        f.seek(0)
        lines = f.read().split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        if tail:
            if dead_letter_record(tail) is None:
                f.truncate(f.tell() - len(tail))
            else:
                f.write(b"\n")
                lines.append(tail)
    for line in lines:
        d = dead_letter_record(line)
        if d is not None:
            seen.add(_dead_letter_key(d["source"], d["file"], d["position"]))
    return open(path, "a", encoding="utf-8"), seen  # noqa: SIM115 - the caller closes it


def dead_letter_record(line: bytes | str) -> dict | None:
    """The record a line of a dead-letter file holds; None for a line that holds no whole one."""
    try:
        d = json.loads(line)
    except ValueError:
        return None
    return d if isinstance(d, dict) and {"source", "file", "position"} <= d.keys() else None
