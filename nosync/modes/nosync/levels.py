"""The persistence levels of a nosync worker (`NosyncHooks`, which holds the state): memory,
the replicated level (copies of its store in peers' memory, `nosync.state.replicas`), the
local disk and the remote tier.

`--checkpoint-tier` names the level an append must reach before it counts (the worker's
durable point, what sinks commit by). The others are kept as far as the persistence budget
lets them (`LevelPacer`): when persistence takes more of the worker's time than its budget,
the slowest of them falls behind first (remote, then the disk tier's indexing, then the
replicated level's sends), and they catch up in the reverse order when there is room. Each
level's durable seq, how far it lagged behind the appends (the longest an append waited to
reach it) and the longest gap its pacing kept are reported. A worker that restarts without
its local store (a lost machine) seeds it from the best copy its holders have before it
opens it; its remote tier adds what it holds beyond.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import lsm
from nosync.runtime import frames
from nosync.state.layout import STORE as STORE_NAME
from nosync.state.replicas import Replicas

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

STORE = "nosync"
"""The name the worker's store goes by among its replicas."""


FALLBACK_ORDER = ("remote", "disk", "replicated")
"""The levels beyond the one a snapshot waits for, in the order they fall behind when
persistence takes more than its budget: the slowest first."""
FIRST_GAP_S = {"remote": 1.0, "disk": 0.5, "replicated": 0.05}
"""A level's gap when it first falls behind: the least time between two of its rounds (an
upload; an indexing of logged batches in LevelDB, beyond the store's own delay; a send of
logged records to the holders)."""
MAX_GAP_S = {"remote": 60.0, "disk": 8.0, "replicated": 1.0}
"""The longest gap of each level: past it, the next level falls behind."""
PACE_EVERY_S = 1.0
"""How often a worker hands its pacer the share persistence took."""


class LevelPacer:
    """Which levels fall behind, and how far (`FALLBACK_ORDER`). Every PACE_EVERY_S the worker
    hands it the share of its time persistence took meanwhile (snapshots, the persister,
    merges, the sends to the holders). Over
    the budget, the first level of FALLBACK_ORDER below its longest gap has its gap doubled
    (from FIRST_GAP_S); under half the budget, the last level that fell behind has its gap
    halved (to 0 below FIRST_GAP_S). The level a snapshot waits for, and a level the worker
    does not keep, never fall behind."""

    def __init__(self, levels: Iterable[str], commit: str, budget: float) -> None:
        kept = set(levels)
        self.budget = budget
        self.gaps = {name: 0.0 for name in FALLBACK_ORDER if name in kept and name != commit}
        """The gap of each level that can fall behind, now."""
        self.peak = dict(self.gaps)
        """The longest gap of each."""

    def update(self, share: float) -> str | None:
        """Takes the share of the worker's time persistence took; returns the level whose gap
        changed (None: none did)."""
        if share > self.budget:
            for name in FALLBACK_ORDER:
                gap = self.gaps.get(name)
                if gap is not None and gap < MAX_GAP_S[name]:
                    self.gaps[name] = min(MAX_GAP_S[name], max(FIRST_GAP_S[name], 2 * gap))
                    self.peak[name] = max(self.peak[name], self.gaps[name])
                    return name
        elif share < self.budget / 2:
            for name in reversed(FALLBACK_ORDER):
                gap = self.gaps.get(name)
                if gap:
                    self.gaps[name] = gap / 2 if gap / 2 >= FIRST_GAP_S[name] else 0.0
                    return name
        return None


class Levels:
    """The levels of `NosyncHooks`; its attributes are the hooks'."""

    replicas: Replicas | None = None
    pacer: LevelPacer | None = None
    _paced_at: float | None = None
    _paced_spent = 0.0
    replicate_cpu_s = 0.0
    """The processing thread's time in sending logged records to the holders."""
    held_back: list | None = None
    """Frames that arrived while a restarting worker fetched its copies: taken after its restore."""

    @property
    def store_tier(self) -> str:
        """The level of the store a snapshot waits for: the replicated level's records leave
        once they are on the local disk."""
        return "disk" if self.tier == "replicated" else self.tier

    def _levels_start(self, worker: Worker) -> None:
        """Makes the worker's replicas (once per process: a holder's copies outlast a
        generation) and, for a restart whose local store is gone, seeds it from them."""
        o = self.options
        if o.replica_count and self.replicas is None:
            self.replicas = Replicas(worker.index, worker.workers, o.replica_count, o.replica_memory_mb << 20)
        for name in self._level_names():
            self.level_lag_s.setdefault(name, 0.0)
        self.pacer = LevelPacer(self._level_names(), self.tier, self.budget)
        path = worker.places.store(worker.index, STORE_NAME)
        self.lost_store = self.restoring and not (
            os.path.exists(os.path.join(path, "MANIFEST")) and os.path.exists(os.path.join(path, "disk"))
        )
        if self.replicas is not None and self.lost_store:
            self._seed_from_replicas(worker, path)

    def restored_from(self) -> str:
        """Where a restoring worker's store came from: its own disk, a peer's copy (a lost
        machine), the remote tier, or nowhere (it starts over)."""
        if not self.lost_store:
            return "disk"
        if self.seeded_from is not None:
            return "replica"
        return "remote" if self.store is not None and self.store.last_seq >= 0 else "nothing"

    def _level_names(self) -> list[str]:
        names = ["disk"]
        if self.replicas is not None:
            names.append("replicated")
        if self.tier == "remote":
            names.append("remote")
        return names

    def _seed_from_replicas(self, worker: Worker, path: str) -> None:
        """Asks the holders for their copies (frames of other kinds that arrive meanwhile are
        held back) and seeds the store directory from the one that goes furthest."""
        t0 = time.perf_counter()
        self.held_back = []

        def pump(wait: float) -> None:
            worker.pump(wait)
            worker.flush_peers()
            worker.keepalive()

        best = self.replicas.fetch(worker, pump)
        got = best.get(STORE)
        if got is not None:
            img, records = got
            # what is left of the lost store (a manifest without its tiers) goes first
            shutil.rmtree(path, ignore_errors=True)
            remote = worker.places.store_remote(worker.index, STORE_NAME) if self.tier == "remote" else None
            last = lsm.seed(path, img, records, remote=remote)
            self.seeded_from = {"seq": last, "records": len(records), "seconds": time.perf_counter() - t0}

    def take_held_back(self, worker: Worker) -> None:
        """Takes the frames held back during a fetch, in their order (after the restore)."""
        held, self.held_back = self.held_back, None
        for j, f in held or ():
            if self.accept_frame(worker, j, f):
                worker.process_frame(j, f)

    def replica_frame(self, worker: Worker, j: int, f: Any) -> bool:
        """Whether `accept_frame` is done with frame `f` from worker `j`: a REPLICA frame, or
        one held back while copies are fetched."""
        if f.kind == frames.REPLICA:
            if self.replicas is not None:
                self.replicas.on_frame(worker, j, f)
            return True
        if self.held_back is not None:
            self.held_back.append((j, f))
            return True
        return False

    def _replicate(self, worker: Worker) -> None:
        """Sends the records logged since the last poll to the holders, and measures how far
        each level lags."""
        if self.replicas is not None:
            t0 = time.thread_time()
            self.replicas.poll(worker, lambda j: bool(self.up.get(j)))
            self.replicate_cpu_s += time.thread_time() - t0
        self._pace_tick()
        marks = self.level_marks
        if not marks:
            return
        if not self.level_lag_s:
            marks.clear()  # no level measured (hooks driven without a start, as in tests)
            return
        now = time.monotonic()
        low = None
        for name in self.level_lag_s:
            d = self._durable_at(name)
            low = d if low is None else min(low, d)
            for seq, t in marks:
                if seq > d:
                    self.level_lag_s[name] = max(self.level_lag_s[name], now - t)
                    break
        while marks and marks[0][0] <= low:
            marks.popleft()

    def _pace_tick(self) -> None:
        """Every PACE_EVERY_S, the share of the worker's time persistence took meanwhile goes
        to the pacer."""
        if self.pacer is None or not self.pacer.gaps or self.store is None:
            return
        now = time.monotonic()
        if self._paced_at is not None and now - self._paced_at < PACE_EVERY_S:
            return
        spent = self.background_cpu_s() + self.snapshot_cpu_s
        if self._paced_at is not None:
            self._pace_levels((spent - self._paced_spent) / (now - self._paced_at))
        self._paced_at, self._paced_spent = now, spent

    def background_cpu_s(self) -> float:
        """The time persistence took off the snapshots' own path: the store's persister and
        merges, and the sends to the holders."""
        st = self.store.stats
        return st.persist_cpu_s + st.merge_cpu_s + self.replicate_cpu_s

    def _pace_levels(self, share: float) -> None:
        """Lets the levels beyond the one a snapshot waits for fall behind, or catch up, by the
        share of the worker's time persistence took (`LevelPacer`)."""
        name = self.pacer.update(share) if self.pacer is not None else None
        if name is None:
            return
        gap = self.pacer.gaps[name]
        if name == "replicated":
            self.replicas.gap_s = gap
        else:
            self.store.pace(name, gap)

    def _durable_at(self, level: str) -> int:
        if level == "replicated":
            return self.replicas.durable(STORE)
        return self.store.durable(level)

    def durable_seq_now(self) -> int:
        """The seq of the store that reached the level a snapshot waits for."""
        return self._durable_at(self.tier)

    def levels_metrics(self) -> dict:
        """Each level's durable seq, how long an append waited at most to reach it, what the
        replicated level sent and holds, and where persistence's CPU went."""
        out: dict = {"level_lag_s": dict(self.level_lag_s)}
        if self.pacer is not None:
            out["level_gap_s_max"] = dict(self.pacer.peak)
        if self.store is not None:
            st = self.store.stats
            # where persistence's CPU went: what the snapshot interval is stretched by
            out["persist_cpu_s"] = {
                "snapshots": self.snapshot_cpu_s,
                "store": st.persist_cpu_s,
                "merges": st.merge_cpu_s,
                "replicas": self.replicate_cpu_s,
            }
            out["durable_seqs"] = {"memory": self.store.last_seq} | {
                name: self._durable_at(name) for name in self._level_names()
            }
        if self.replicas is not None:
            out.update(self.replicas.metrics())
        out["seeded_from_replica"] = self.seeded_from
        return out
