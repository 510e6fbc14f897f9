"""The input log: a source that cannot restart from a position (TcpLines), made replayable.

Every chunk it delivers is appended to the worker's input store and made durable (fsynced)
before any record of it is processed, so a replay reads the same chunks back from the log, and
past its end the source goes on live. Lines the server had sent that the lost process had not
logged yet are gone with its connection.
"""

from __future__ import annotations

import time
from typing import Any

from nosync.codec import pack


class InputLog:
    """A source whose chunks are logged, keyed (source, partition) then first record, and
    durable before they are handed on; `read` from a position serves the logged chunks from
    there, then the live source. With `live` False (a batch job reading a copy of a run's log)
    it ends where the log ends; `tier` is then unused."""

    replayable = True

    def __init__(self, inner: Any, index: int, store: Any, tier: str | None, live: bool = True) -> None:
        self.inner, self.index, self.store, self.tier, self.live = inner, index, store, tier, live
        self.log_s = 0.0
        self.logged_records = 0

    def partitions(self, workers: int | None = None) -> list[dict]:
        """The live source's partitions."""
        return self.inner.partitions(workers)

    def describe(self) -> str:
        """The live source's description."""
        return self.inner.describe()

    def read(self, part: dict, offset: Any, chunk: int, on_bad: Any) -> Any:
        """The logged chunks of partition `part` from `offset` on, then, when `live`, what the live
        source delivers, each chunk durable in the log before it is handed on."""
        pid = pack(part)
        pos = int(offset or 0)
        logged = self.store.load((self.index, pid))
        for start in sorted(logged):
            recs = logged[start]
            if recs is None:
                return  # the live source had ended: it ends here again
            if start + len(recs) <= pos:
                continue
            if start < pos:
                # positions are chunk starts; a chunk is never split, but be exact anyway
                recs = recs[pos - start :]
            pos += len(recs)
            yield list(recs), pos
        if not self.live:
            return  # a killed run's log has no end mark: what it logged is all there is
        # past the log: the source live, from what its new connection delivers
        for recs, _ in self.inner.read(part, None, chunk, on_bad):
            self._append(pid, pos, recs)
            self.logged_records += len(recs)
            pos += len(recs)
            yield recs, pos
        self._append(pid, pos, None)  # its end too: a replay must not read past it

    def _append(self, pid: bytes, pos: int, recs: list | None) -> None:
        t0 = time.perf_counter()
        self.store.append(self.store.last_seq + 1, {(self.index, pid): {pos: recs}})
        self.store.flush(self.tier)
        self.log_s += time.perf_counter() - t0
