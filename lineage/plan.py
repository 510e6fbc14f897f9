"""Safe points, the lineage stash, recovery plans and rewind plans of a nosync run.

A run's processes (workers) 0..W-1 each execute numbered steps 1, 2, ...; a directed link
(src, dst) carries frames numbered 1, 2, ... (`chan_seq`). A process's lineage entry
`(step, entry)` says what that step did, so that replaying the entries in order re-executes it:

    ("i", src, seq)           consumed frame seq of link (src, me)
    ("s", k, epoch or None)   read a chunk of source k
    ("f", router, dst)        flushed one buffer
    ("F",)                    flushed all
    ("C", produced)           a cut: the frames produced so far on each link (me, dst), a list
                              indexed by dst; logged after an "F" (nosync_span)

Lineage travels with the data: a frame carries the entries of its origins that are not yet
durable, and the receiver keeps them in a `Stash` until the origin's durable point covers them
(`trim`). When a process fails, `recovery_plan` restores it at its durable point, gathers from
the survivors' stashes the entries after that point (`merge_lineage`: only the gap-free run
counts, a step missing means everything after it is unknown), and says which frames the
upstream output logs must resend and from which chan_seq the downstream consumers must check
re-produced frames by fingerprint. `safe_point` is the epoch sinks may commit; `rewind_plan`
finds the operators and the steps a rewind to an epoch starts from; `consistent_cut` picks,
from each process's own snapshots, a set that a rewind can start from together.

Everything here is pure logic over plain values (ints, tuples, dicts): entries that went
through msgpack come back as lists and are normalised to tuples on the way in.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, TypedDict

import msgpack

from lineage.errors import LineageError

EOS = 1 << 62
"""The frontier of a process that has completed every epoch (end of stream)."""

STASH_FORMAT = 1
"""Version of the `Stash.to_msgpack` encoding."""


class Step(StrEnum):
    """The kind of a lineage entry, its first item (a plain string on the wire)."""

    CONSUMED = "i"
    """("i", src, seq): consumed frame seq of link (src, me)."""
    READ = "s"
    """("s", k, epoch or None): read a chunk of source k."""
    FLUSHED = "f"
    """("f", router, dst): flushed one buffer."""
    FLUSHED_ALL = "F"
    """("F",): flushed every buffer."""
    CUT = "C"
    """("C", produced): a cut, the frames produced so far on each link."""
    STOPPED = "x"
    """("x", upto or None): the run is stopping: the sources stopped reading (None), or closed
    every epoch up to `upto` (`control.Stop`)."""


Entry = tuple[Any, ...]
"""What one step did; the first item is its kind ("i", "s", "f", "F", "C" or "x")."""
Lineage = list[tuple[int, Entry]]
"""(step, entry) pairs in increasing step order."""


class DurablePoint(TypedDict):
    """What a process's durable state covers: at step `step` it had consumed frames
    1..consumed[src] of each link (src, me) and produced 1..produced[dst] on each link (me, dst);
    `frontier` is the least epoch that all its operators had completed (EOS: all)."""

    step: int
    frontier: int
    consumed: dict[int, int]
    produced: dict[int, int]


class RecoveryPlan(TypedDict):
    """How one failed process comes back; see `recovery_plan`."""

    restore_step: int
    replay: Lineage
    resend_from: dict[int, int]
    check: dict[int, int]
    needs: dict[int, list[int]]


class RewindPlan(TypedDict):
    """What a rewind restores; see `rewind_plan`."""

    cone: list[str]
    start: dict[tuple[str, int], int | None]


def _normal(item: Sequence[Any]) -> tuple[int, Entry]:
    step, entry = item
    return int(step), tuple(entry)


def safe_point(points: Mapping[int, DurablePoint], processes: int) -> int:
    """The highest epoch every process has durably completed: the least durable frontier.

    -1 while any of the processes 0..processes-1 has not reported a durable point (nothing is
    safe yet), and for a run without processes. Points of other process numbers are ignored.
    """
    least = -1
    for p in range(processes):
        point = points.get(p)
        if point is None:
            return -1
        frontier = int(point["frontier"])
        least = frontier if p == 0 else min(least, frontier)
    return least


class Stash:
    """The lineage entries a process holds for other processes (their origins), in memory.

    Invariant: per origin, the held steps strictly increase and all exceed the origin's trimmed
    step; `_steps[o]` and `_entries[o]` are parallel lists. Entries arrive in step order with
    the frames, so an entry at or below the highest step already held (or trimmed) is a repeat
    and is skipped; an entry beyond a gap is kept, and `contiguous` is what tells whether a run
    has no gap. Per receiving peer (`dest`) and origin, a mark remembers the last step handed
    on, so that each entry travels to a peer once (`delta`).
    """

    def __init__(self) -> None:
        self._steps: dict[int, list[int]] = {}
        self._entries: dict[int, list[Entry]] = {}
        self._trimmed: dict[int, int] = {}
        self._marks: dict[int, dict[int, int]] = {}

    def add(self, origin: int, entries: Iterable[Sequence[Any]]) -> None:
        """Keeps the entries of `origin` above what is already held or trimmed."""
        steps = self._steps.get(origin)
        if steps is None:
            steps = self._steps[origin] = []
            self._entries[origin] = []
        held = self._entries[origin]
        high = max(steps[-1] if steps else 0, self._trimmed.get(origin, 0))
        for step, entry in sorted((_normal(e) for e in entries), key=lambda e: e[0]):
            if step > high:
                steps.append(step)
                held.append(entry)
                high = step

    def delta(self, dest: int, origin: int, limit: int | None = None) -> Lineage:
        """The entries of `origin` not yet handed to `dest` (at most `limit` of them, the
        oldest), which are now marked as handed.

        O(log n + k) for n held and k returned entries.
        """
        steps = self._steps.get(origin)
        if not steps:
            return []
        marks = self._marks.setdefault(dest, {})
        i = bisect_right(steps, marks.get(origin, 0))
        if i == len(steps):
            return []
        end = len(steps) if limit is None else min(len(steps), i + limit)
        marks[origin] = steps[end - 1]
        return list(zip(steps[i:end], self._entries[origin][i:end], strict=True))

    def reset_marks(self, dest: int) -> None:
        """Forgets what was handed to `dest` (a reconnected peer holds nothing of ours)."""
        self._marks.pop(dest, None)

    def trim(self, origin: int, upto_step: int) -> None:
        """Drops the entries of `origin` up to `upto_step` (its durable point covers them)."""
        self._trimmed[origin] = max(self._trimmed.get(origin, 0), upto_step)
        steps = self._steps.get(origin)
        if steps:
            i = bisect_right(steps, upto_step)
            del steps[:i]
            del self._entries[origin][:i]

    def trimmed(self, origin: int) -> int:
        """The highest step of `origin` trimmed so far (0: none)."""
        return self._trimmed.get(origin, 0)

    def origins(self) -> list[int]:
        """The origins of which entries are held, in order."""
        return sorted(o for o, steps in self._steps.items() if steps)

    def entries(self, origin: int) -> Lineage:
        """Every held entry of `origin`, in step order."""
        return list(zip(self._steps.get(origin, []), self._entries.get(origin, []), strict=True))

    def contiguous(self, origin: int, after_step: int) -> Lineage:
        """The held entries of `origin` at after_step+1, after_step+2, ..., up to the first gap."""
        steps = self._steps.get(origin, [])
        held = self._entries.get(origin, [])
        run: Lineage = []
        i = bisect_left(steps, after_step + 1)
        expected = after_step + 1
        while i < len(steps) and steps[i] == expected:
            run.append((expected, held[i]))
            i += 1
            expected += 1
        return run

    def to_msgpack(self) -> bytes:
        """The held entries and trimmed steps (not the marks: peers reconnect after a restart)."""
        origins = sorted(set(self._steps) | set(self._trimmed))
        body = [
            [o, self._trimmed.get(o, 0), self._steps.get(o, []), [list(e) for e in self._entries.get(o, [])]]
            for o in origins
        ]
        return msgpack.packb([STASH_FORMAT, body], use_bin_type=True)

    @classmethod
    def from_msgpack(cls, data: bytes) -> Stash:
        """A stash from the bytes of `to_msgpack`; LineageError if they are not such bytes."""
        try:
            version, body = msgpack.unpackb(data, raw=False)
            if version != STASH_FORMAT:
                raise LineageError(f"stash format version {version!r}, this build reads {STASH_FORMAT}")
            stash = cls()
            for origin, trimmed, steps, entries in body:
                origin = int(origin)
                stash._trimmed[origin] = int(trimmed)
                stash.add(origin, zip(steps, entries, strict=True))
        except LineageError:
            raise
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise LineageError(f"not a lineage stash: {e}") from e
        return stash


def merge_lineage(held: Iterable[Iterable[Sequence[Any]]], after_step: int) -> Lineage:
    """The gap-free run of one origin's entries from after_step+1 that its holders offer together.

    `held` is one list of (step, entry) per holder. LineageError if two holders (or one holder
    twice) give different entries for the same step: one of them is not this origin's lineage.
    """
    union: dict[int, Entry] = {}
    for holder in held:
        for item in holder:
            step, entry = _normal(item)
            seen = union.setdefault(step, entry)
            if seen != entry:
                raise LineageError(f"holders disagree on step {step}: {seen!r} and {entry!r}")
    run: Lineage = []
    step = after_step + 1
    while step in union:
        run.append((step, union[step]))
        step += 1
    return run


def _seqs(point: Mapping[str, Any] | None, field: str) -> dict[int, int]:
    if point is None:
        return {}
    return {int(k): int(v) for k, v in point.get(field, {}).items()}


def recovery_plan(
    failed: Iterable[int],
    points: Mapping[int, DurablePoint],
    held: Mapping[int, Sequence[Iterable[Sequence[Any]]]],
    processes: int,
) -> dict[int, RecoveryPlan]:
    """How each failed process comes back without any survivor rolling back.

    For a failed process p (restored at its durable point, step 0 when it has none):

    - `restore_step`: the durable step its state is restored at;
    - `replay`: the entries after it that the survivors hold (`held[p]`, one list per holder),
      merged and cut at the first gap; p re-executes them in this order;
    - `resend_from[src]`: the first chan_seq of link (src, p) that src's output log must resend
      (consumed + 1), for every other process src;
    - `check[dst]`: the first chan_seq of link (p, dst) that p re-produces (produced + 1); dst
      checks re-produced frames it already processed by fingerprint;
    - `needs[src]`: the chan_seqs of link (src, p) that the replay consumes, in order.

    LineageError if the replay would consume a frame the durable point had already consumed, or
    the frames of one link out of order or with a gap: such lineage cannot be faithful.
    """
    plans: dict[int, RecoveryPlan] = {}
    for p in sorted(failed):
        if not 0 <= p < processes:
            raise ValueError(f"failed process {p} is not one of the run's processes 0..{processes - 1}")
        point = points.get(p)
        restore = int(point["step"]) if point is not None else 0
        consumed = _seqs(point, "consumed")
        produced = _seqs(point, "produced")
        replay = merge_lineage(held.get(p, []), restore)
        others = [q for q in range(processes) if q != p]
        needs: dict[int, list[int]] = {q: [] for q in others}
        for step, entry in replay:
            if not entry or entry[0] != Step.CONSUMED:
                continue
            if len(entry) != 3:
                raise LineageError(f"process {p}: step {step} has a malformed input entry {entry!r}")
            src, seq = int(entry[1]), int(entry[2])
            seqs = needs.setdefault(src, [])
            base = consumed.get(src, 0)
            if seq <= base:
                raise LineageError(
                    f"process {p}: replay step {step} would consume frame {seq} of link ({src}, {p}) "
                    f"again: its durable point (step {restore}) had consumed frames 1..{base}"
                )
            expected = base + len(seqs) + 1
            if seq != expected:
                raise LineageError(
                    f"process {p}: replay step {step} consumes frame {seq} of link ({src}, {p}), "
                    f"expected frame {expected} (frames of a link are consumed in order)"
                )
            seqs.append(seq)
        plans[p] = {
            "restore_step": restore,
            "replay": replay,
            "resend_from": {q: consumed.get(q, 0) + 1 for q in others},
            "check": {q: produced.get(q, 0) + 1 for q in others},
            "needs": needs,
        }
    return plans


def rewind_plan(
    edges: Iterable[tuple[str, str]],
    operator: str,
    epoch: int,
    epoch_starts: Mapping[tuple[str, int], Sequence[tuple[int, int]]],
) -> RewindPlan:
    """The operators a rewind of `operator` to just before `epoch` restores, and where each starts.

    The cone is `operator` and every operator downstream of it (reachable along `edges`,
    (upstream, downstream) pairs). `epoch_starts[(op, instance)]` lists (epoch, first step at
    which that instance processed that epoch); an instance of the cone starts at the first step
    of the least recorded epoch >= `epoch`, or None if it never reached one. The graph's
    operators are those named by an edge or by `epoch_starts`; ValueError for any other.
    """
    downstream: dict[str, list[str]] = {}
    for up, down in edges:
        downstream.setdefault(up, []).append(down)
        downstream.setdefault(down, [])
    for op, _ in epoch_starts:
        downstream.setdefault(op, [])
    if operator not in downstream:
        raise ValueError(f"operator {operator!r} is not in the graph (operators: {', '.join(sorted(downstream))})")
    cone = {operator}
    queue = deque([operator])
    while queue:
        for down in downstream[queue.popleft()]:
            if down not in cone:
                cone.add(down)
                queue.append(down)
    start: dict[tuple[str, int], int | None] = {}
    for (op, instance), starts in epoch_starts.items():
        if op in cone:
            first = min(((int(e), int(s)) for e, s in starts if e >= epoch), default=None)
            start[(op, instance)] = first[1] if first is not None else None
    return {"cone": sorted(cone), "start": start}


def consistent_cut(
    snapshots: Mapping[int, Sequence[Mapping[str, Any]]],
    unreadable: Callable[[int, int, int, int, int], int | None] | None = None,
) -> dict[int, int] | None:
    """The newest consistent cut of the processes' own snapshots, or None if there is none.

    `snapshots[p]` lists process p's candidate snapshots newest first, each a mapping with
    `consumed` and `produced` as in `DurablePoint`. The cut is an index into each list such
    that on every link (src, dst) the snapshot of dst consumed no frame that the snapshot of
    src had not produced: consumed[src] of dst <= produced[dst] of src. The frames between are
    in flight at the cut; `unreadable(src, index, dst, lo, hi)`, if given, returns the least
    chan_seq in lo..hi of link (src, dst) that src's log cannot supply when src stands at
    `snapshots[src][index]` (None: all can), and src then goes back to a snapshot that had not
    produced it. The callback must not find a frame readable at an older snapshot of src that
    it found unreadable at a newer one (a log that loses frames, never regains them): src is
    sent past every snapshot that produced the frame. A process goes back only as far as a
    link forces it, so each stands at its newest snapshot that any consistent cut can use;
    None when one runs out of snapshots.
    """
    procs = sorted(snapshots)
    seqs = {p: [(_seqs(s, "consumed"), _seqs(s, "produced")) for s in snapshots[p]] for p in procs}
    if any(not seqs[p] for p in procs):
        return None
    pos = dict.fromkeys(procs, 0)

    def consumed(dst: int, src: int) -> int:
        return seqs[dst][pos[dst]][0].get(src, 0)

    def produced(src: int, dst: int) -> int:
        return seqs[src][pos[src]][1].get(dst, 0)

    changed = True
    while changed:
        changed = False
        for dst in procs:
            for src in procs:
                while src != dst and consumed(dst, src) > produced(src, dst):
                    pos[dst] += 1
                    changed = True
                    if pos[dst] == len(seqs[dst]):
                        return None
        if changed or unreadable is None:
            continue
        for src in procs:
            for dst in procs:
                lo, hi = consumed(dst, src) + 1, produced(src, dst)
                if src == dst or lo > hi:
                    continue
                q = unreadable(src, pos[src], dst, lo, hi)
                if q is None:
                    continue
                while produced(src, dst) >= q:
                    pos[src] += 1
                    if pos[src] == len(seqs[src]):
                        return None
                changed = True
    return pos
