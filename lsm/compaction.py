"""Compaction: merge the layers, drop what the retention window no longer needs.

Horizon h = min(last seq - retention, pinned snapshots, what the disk tier has indexed). One
compaction
1. drops, on the disk tier, every version no read at or after h can see (per key: all
   versions above h, plus the newest at or below h unless it is a deletion);
2. writes a base image of the state at h to the remote tier and deletes the remote log
   segments it makes redundant (so the remote tier stays bounded as well);
3. deletes local log segments that are uploaded and entirely at or below h;
4. (a full compaction, `Store.compact()`) has LevelDB rewrite its files so deleted versions
   give their space back.

It runs on a thread of its own, beside the persister: LevelDB takes concurrent writers, and
versions indexed meanwhile are all above h, so neither can disturb the other. Rollback takes
`lock` to keep compaction out while it rewrites history.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lsm.store import Store


class Compactor:
    def __init__(self, store: Store) -> None:
        self.s = store
        self.lock = threading.Lock()
        self.busy = False
        self._thread: threading.Thread | None = None
        self.last_report: dict = {}

    def request(self) -> None:
        """Starts a background compaction unless one is running."""
        if self.busy:
            return
        self.busy = True
        self._thread = threading.Thread(target=self._background, name=f"lsm-compactor:{self.s.path}", daemon=True)
        self._thread.start()

    def _background(self) -> None:
        try:
            self.run(full=False)
        except Exception as e:  # noqa: BLE001 - reported as the store's error, retried later
            from lsm.errors import PersistError

            s = self.s
            with s._cond:
                s._error = e if isinstance(e, PersistError) else PersistError("disk", s.path, e)
                s._failures += 1
                s._cond.notify_all()
        finally:
            self.busy = False

    def run(self, full: bool) -> dict:
        """One compaction; returns what it did."""
        s = self.s
        with self.lock:
            start = time.perf_counter()
            h = s.compaction_horizon()
            report = {"horizon": h, "versions_dropped": 0, "base_image": None, "log_bytes_freed": 0}
            if h > s._disk.horizon:
                report["versions_dropped"] = s._disk.collect(h)
            if full:
                s._disk.compact_files()
            remote = s.remote
            stale = [f for f in remote.files if not f.base and f.last <= h]
            base = remote.base
            if h >= 0 and (stale or (full and (base is None or base.last < h))):
                keys, values = s._disk.image(h)
                with s._tier_lock:
                    remote.write_base(h, keys, values)
                    for f in list(remote.files):
                        if (f.base and f.last < h) or (not f.base and f.last <= h):
                            remote.delete(f)
                    with s._cond:
                        s._durable_remote = remote.durable()
                report["base_image"] = {"seq": h, "keys": len(keys)}
            with s._tier_lock:
                report["log_bytes_freed"] = s._log.drop_through(
                    min(s._durable_remote, s._disk.horizon, s._disk.applied)
                )
            with s._cond:
                s.stats.compactions += 1
                s.stats.versions_dropped += report["versions_dropped"]
            report["seconds"] = time.perf_counter() - start
            self.last_report = report
            return report

    def stop(self) -> None:
        t = self._thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join()
