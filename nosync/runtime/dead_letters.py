"""Dead letters: the source records a run could not read, each kept once with where it was.

A worker (or a batch job's task) does not write them itself: its host may be lost, and a file
there is out of the tools' reach. `DeadLetters` hands each one over (`send`: a worker's
control message to the coordinator, flushed at once; a batch task's result row), and the
driver appends it to `dead-letter-w<i>.jsonl` in the run directory (`DeadLetterFile`), one
JSON line each, written once however often the record is read: a restarted worker, or one
that rolled back, reads some input again, and a resumed run may read a file the last run
wrote.

Both sides keep the keys of the records they hold, in memory, so each is bounded by
`max_dead_letters` (`--max-dead-letters`, per worker): a worker's next bad record past it
fails the run, saying how many and naming the option, rather than the set growing with the
input's faults for as long as the run lasts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from nosync.errors import BadRecord, RunFailed
from nosync.options import MAX_DEAD_LETTERS


class DeadLetters:
    """The dead letters of one worker: each bad record goes to `send` (as a map: source, file,
    position, error) once; with `fail`, a bad record fails the run instead, and so does one past
    `max_dead_letters` (None: no bound)."""

    def __init__(
        self, send: Callable[[dict], None], fail: bool, max_dead_letters: int | None = MAX_DEAD_LETTERS
    ) -> None:
        self.send = send
        self.fail = fail
        self.max_dead_letters = max_dead_letters
        self.count = 0
        self._seen: set = set()

    @classmethod
    def of_spec(cls, send: Callable[[dict], None], spec: dict) -> DeadLetters:
        """The dead letters a worker's (or a batch task's) spec asks for: its `on_bad_record`
        and `max_dead_letters`."""
        fail = spec.get("on_bad_record", "deadletter") == "fail"
        return cls(send, fail, spec.get("max_dead_letters", MAX_DEAD_LETTERS))

    def write(self, op_name: str, bad: BadRecord) -> None:
        """Hands over `bad`, read by source `op_name`, unless this worker did already."""
        if self.fail:
            raise RunFailed(f"bad record in source '{op_name}': {bad}")
        key = _dead_letter_key(op_name, bad.source, bad.position)
        if key in self._seen:
            return
        _check_bound(len(self._seen) + 1, self.max_dead_letters, f"source '{op_name}': {bad}")
        self._seen.add(key)
        self.send({"source": op_name, "file": bad.source, "position": bad.position, "error": str(bad)})
        self.count += 1


class DeadLetterFile:
    """One worker's dead-letter file in the run directory, written by the driver: `add` appends
    a dead letter the file does not hold yet (the file opened, and the letters in it read, at
    the first one); one that would make the file hold more than `max_dead_letters` (None: no
    bound) fails the run instead."""

    def __init__(self, path: str, max_dead_letters: int | None = MAX_DEAD_LETTERS) -> None:
        self.path = path
        self.max_dead_letters = max_dead_letters
        self.count = 0
        self._file: Any = None
        self._seen: set = set()

    def add(self, letter: dict) -> bool:
        """Appends `letter` (source, file, position, error) unless the file holds it; True if
        it was new."""
        if self._file is None:
            self._file, self._seen = open_dead_letters(self.path)
        key = _dead_letter_key(letter["source"], letter["file"], letter["position"])
        if key in self._seen:
            return False
        _check_bound(len(self._seen) + 1, self.max_dead_letters, f"source '{letter['source']}': {letter['error']}")
        self._seen.add(key)
        line = {k: letter[k] for k in ("source", "file", "position", "error")}
        self._file.write(json.dumps(line, default=str) + "\n")
        self._file.flush()
        self.count += 1
        return True

    def close(self) -> None:
        """Closes the file, if a dead letter opened it."""
        if self._file is not None:
            self._file.close()
            self._file = None


def dead_letter_path(run_dir: str, worker: int) -> str:
    """The dead-letter file of worker `worker` in the run directory `run_dir`."""
    return os.path.join(run_dir, f"dead-letter-w{worker}.jsonl")


def _check_bound(count: int, limit: int | None, last: str) -> None:
    """Fails the run if `count` dead letters are more than `limit`; `last`: the one that made it."""
    if limit is not None and count > limit:
        raise RunFailed(
            f"{count} dead letters, more than --max-dead-letters {limit} allows (records a source could "
            f"not read; the last: {last}): fix the input, or raise the limit"
        )


def _dead_letter_key(source: str, file: str, position: Any) -> tuple:
    return source, file, json.dumps(position, sort_keys=True, default=str)


def open_dead_letters(path: str) -> tuple[Any, set]:
    """Opens a worker's dead-letter file for appending, and the keys of the records it holds.

    A last line that a crash of the driver left without its newline is ended if it holds a
    whole record, and cut off otherwise (its worker hands the record over again when it reads
    it again), so that the next record starts a line of its own."""
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
