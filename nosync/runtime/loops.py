"""Loops across workers: the head and the tail of an `iterate` loop.

On every worker a loop is a head (the loop_entry operator), the body's operators, and a tail
(the iterate operator). The head feeds the body; the tail applies `keep` to what the body's
exit emits: the records kept go back to the head of their own worker over the loop's back
edge, the others leave the loop downstream. A body may hold exchanges (keyed operators), so a
record goes round through the workers that own its keys; the back edge itself stays on the
worker, and carries to every worker's head only the tails' progress and in-band events.

Progress, round by round (timely style: the round is a loop counter added to the epoch).
The loop works on one epoch at a time, the same on every worker, in *waves*: wave (e, r) is one
pass of the records of round r of epoch e through the body. The body's operators see the wave
as their epoch, `e << ROUND_BITS | r`, so their ordinary markers say when a wave has passed
them everywhere, and the watermark the head puts on its markers (the least epoch its input may
still bring, `next_epoch`) reaches every tail as the least over the heads.

- Round 0 of epoch e admits the loop's input of epoch e as it comes; the head closes the wave
  (its marker into the body) once its input has finished e. Input of a later epoch waits at
  the head.
- When the body's exit has finished a wave on worker v, v's tail tells every head, over the
  back edge: whether it kept any record in that wave, and the watermark.
- A head that has heard from every tail about the wave knows what every other head knows. If
  any tail kept a record, round r + 1 starts: each head feeds the body what its tail kept, and
  closes the wave at once. If none did, no record of epoch e remains anywhere: the heads mark
  the body with the last wave an epoch before e' could have (e' the least epoch the heads'
  inputs may still bring, so that no empty epoch costs a wave), which tells every tail to
  mark epoch e' - 1 finished downstream, and round 0 of e' starts. When e' is the end of
  input, the loop ends.

Records leave the loop tagged with the epoch of their wave, so epochs leave it in order, and
an epoch is never marked finished downstream while a record of it still goes round. A loop
still going round after `max_iterations` rounds of one epoch (else the run's --max-rounds)
fails the run, naming it. The head and the tail share nothing but the body and the back edge,
so a batch job can run them in different stages.

Nothing waits on the back edge: what the tail keeps is appended to the head's pending list, and
a head that starts a wave from inside another (a body without exchanges goes round at once)
takes it after the current one returns, so no loop nests calls by its rounds.

Everything a restart needs is in `snapshot_meta`: the wave and round, what waits at the head
(input of later epochs, records kept for the next wave), the tails' reports heard. Mode abs
records the back edge too (`start_cut`, `cut_barrier`): what arrives on it from the head's
snapshot until the barrier has come back round from every tail is the snapshot's back-edge
log, replayed into the loop on a restore (`replay_log`), as the ABS paper does on cycles.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nosync import codec
from nosync.api.pipeline import Node
from nosync.errors import RunFailed
from nosync.runtime import frames
from nosync.runtime.operators import EOS, Op

RECORDS, MARK = 0, 1
"""What a back-edge log item is: records kept on this worker, or a tail's report."""
HOLD_RECORDS = 200_000
"""Input of later epochs a head holds above which its worker's sources wait (`full`)."""
ROUND_BITS = 20
ROUNDS = (1 << ROUND_BITS) - 1
"""The body's epoch of wave (e, r) is e << ROUND_BITS | r; round ROUNDS of no epoch is run:
the marker of it says every wave of epochs <= e is done."""


def wave_of(epoch: int, round_: int) -> int:
    """The body's epoch of round `round_` of `epoch`."""
    return (epoch << ROUND_BITS) | round_


class LoopHead(Op):
    """The loop_entry operator: admits the loop's input, starts the waves, and hears the tails."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.back_edge: int | None = None
        self.back_channels: list = []
        """The back edge's channels: one per worker when the body crosses workers, else one."""
        self.limit: int | None = None
        self.loop_name = node.name
        self.loop_where = node.where
        self.sender = f"operator '{node.name}' (declared at {node.where})"
        self.epoch = 0
        """The epoch the loop works on."""
        self.round = 0
        self.wave = 0
        """The wave being run: the epoch the body's operators see."""
        self.open = True
        """Whether the wave admits input (round 0, before the input finished `epoch`)."""
        self.input_frontier = -1
        self.held: list = []
        """[epoch, records] of input of later epochs, in arrival order."""
        self.held_count = 0
        self.pending: list = []
        """The records kept in the running wave, for the next."""
        self.heard: dict[int, dict[int, tuple[bool, int]]] = {}
        """wave -> worker -> (kept any, next epoch): the tails' reports."""
        self.finished = False
        self.rounds = 0
        self.waves = 0
        self.round_max = 0
        self.cuts: dict[int, dict] = {}
        """abs: checkpoint -> the head's snapshot and the back-edge log being recorded."""
        self.to_replay: list = []
        """abs: the back-edge log of the checkpoint restored, for `replay_log`."""
        self._busy = False
        self._again = False

    def is_back(self, channel: Any) -> bool:
        """Whether `channel` is the back edge (from some worker's tail)."""
        return type(channel) is tuple and len(channel) >= 2 and channel[1] == self.back_edge

    @property
    def full(self) -> bool:
        """Whether the worker's sources should wait: the head holds much input of later epochs
        and needs none for the epoch it works on (its input has passed it). A head still
        waiting for input of its epoch never stops a source, so no loop can stall the input
        it waits for."""
        return not self.open and self.held_count > HOLD_RECORDS

    def next_epoch(self) -> int:
        """The least epoch this worker's input may still bring: the held input's, or the one
        after the input's frontier."""
        nxt = EOS if self.input_frontier >= EOS else self.input_frontier + 1
        for e, _ in self.held:
            if e < nxt:
                nxt = e
        return nxt

    # -- records and progress -------------------------------------------------------------

    def push(self, records: list, epoch: int, channel: Any) -> None:
        """Input records join the running wave, or wait for their epoch; records kept by the
        tail wait for the next wave."""
        if self.blocked and channel in self.blocked:
            super().push(records, epoch, channel)
            return
        self.records_in += len(records)
        if self.is_back(channel):
            if self.cuts:
                self._record(channel, (RECORDS, records))
            self.pending.extend(records)
            return
        records = frames.wire_records(records, self.sender)
        if self.open and epoch <= self.epoch:
            self.emit(list(records), self.wave)
        elif epoch > self.epoch:
            self.held.append([epoch, list(records)])
            self.held_count += len(records)
        else:
            raise RunFailed(
                f"loop '{self.loop_name}' (declared at {self.loop_where}): {len(records)} records of epoch "
                f"{epoch} arrived after the loop had finished that epoch's input"
            )

    def marker(self, channel: Any, epoch: int, wm: Any, eos: bool) -> None:
        """The input finished `epoch`, or a tail reports on a wave (`wm`: [kept any, next
        epoch]); either may let the loop go on."""
        if self.blocked and channel in self.blocked:
            super().marker(channel, epoch, wm, eos)
            return
        if self.is_back(channel):
            if self.cuts:
                self._record(channel, (MARK, epoch, wm, eos))
            self.inputs[channel] = EOS if eos else max(self.inputs[channel], epoch)
            if eos:
                return
            kept, nxt = wm
            self.heard.setdefault(epoch, {})[channel] = (bool(kept), int(nxt))
        else:
            self.inputs[channel] = EOS if eos else max(self.inputs[channel], epoch)
            self.input_frontier = min(v for c, v in self.inputs.items() if not self.is_back(c))
        self.advance()

    def advance(self) -> None:
        """Moves the loop on as far as what it knows lets it; a call from inside a wave this
        one started returns at once and is taken when that wave returns."""
        if self._busy:
            self._again = True
            return
        self._busy = True
        t = time.perf_counter()
        try:
            self._again = True
            while self._again:
                self._again = False
                self._step()
        finally:
            self._busy = False
            self.busy_s += time.perf_counter() - t

    def _mark_body(self, wave: int) -> None:
        wm = None if wave == EOS else self.next_epoch()
        for _, mark, _, chan in self.targets:
            mark(chan, wave, wm, wave == EOS)

    def _step(self) -> None:
        if self.finished:
            return
        if self.open and self.input_frontier >= self.epoch:
            self.open = False
            self._mark_body(self.wave)
        got = self.heard.get(self.wave)
        if self.open or got is None or len(got) < len(self.back_channels):
            return
        del self.heard[self.wave]
        self.waves += 1
        if any(kept for kept, _ in got.values()):
            self.round += 1
            self.rounds += 1
            self.round_max = max(self.round_max, self.round)
            limit = self.limit
            if (limit is not None and self.round >= limit) or self.round >= ROUNDS:
                raise RunFailed(
                    f"loop '{self.loop_name}' (declared at {self.loop_where}) did not converge: records of "
                    f"epoch {self.epoch} still going round after {self.round} rounds (max_iterations / --max-rounds)"
                )
            self.wave = wave_of(self.epoch, self.round)
            recs, self.pending = self.pending, []
            self.emit(recs, self.wave)
            self._mark_body(self.wave)
            return
        nxt = min(n for _, n in got.values())
        if nxt >= EOS:
            self.finished = True
            self.frontier = EOS
            self._mark_body(EOS)
            return
        # every wave of the epochs before nxt is done: the tails mark nxt - 1 finished downstream
        self._mark_body(wave_of(nxt - 1, ROUNDS))
        self.epoch, self.round, self.open = nxt, 0, True
        self.wave = wave_of(nxt, 0)
        self.last_epoch = max(self.last_epoch, nxt)
        now = [r for e, r in self.held if e <= nxt]
        self.held = [h for h in self.held if h[0] > nxt]
        self.held_count = sum(len(r) for _, r in self.held)
        for recs in now:
            self.emit(recs, self.wave)
        self._again = True

    # -- state ---------------------------------------------------------------------------

    def snapshot_meta(self) -> dict:
        """Adds the loop's progress and what waits at the head."""
        return {
            **super().snapshot_meta(),
            "loop": {
                "epoch": self.epoch,
                "round": self.round,
                "wave": self.wave,
                "open": self.open,
                "input_frontier": self.input_frontier,
                "held": self.held,
                "pending": self.pending,
                "heard": [[w, [[c, k, n] for c, (k, n) in got.items()]] for w, got in self.heard.items()],
                "finished": self.finished,
            },
        }

    def restore_meta(self, meta: dict) -> None:
        """Puts back what `snapshot_meta` took, and keeps a back-edge log (abs) to replay."""
        super().restore_meta(meta)
        s = meta["loop"]
        self.epoch, self.round, self.wave = s["epoch"], s["round"], s["wave"]
        self.open, self.input_frontier, self.finished = s["open"], s["input_frontier"], s["finished"]
        self.held = [[e, list(r)] for e, r in s["held"]]
        self.held_count = sum(len(r) for _, r in self.held)
        self.pending = list(s["pending"])
        self.heard = {w: {tuple(c): (bool(k), n) for c, k, n in got} for w, got in s["heard"]}
        self.to_replay = list(meta.get("backedge") or ())

    # -- the back-edge log (abs) ----------------------------------------------------------

    def start_cut(self, n: int) -> None:
        """Checkpoint `n`'s barrier came on the input: takes the head's snapshot and records
        the back edge until the barrier comes back round from every tail."""
        meta = codec.unpack(codec.pack(self.snapshot_meta()))
        self.cuts[n] = {"meta": meta, "open": set(self.back_channels), "log": [], "t0": time.perf_counter()}

    def _record(self, channel: Any, item: tuple) -> None:
        for cut in self.cuts.values():
            if channel in cut["open"]:
                cut["log"].append([channel, *item])

    def cut_barrier(self, channel: Any, n: int) -> dict | None:
        """Checkpoint `n`'s barrier came back round on `channel`: once it has on every back
        channel, the snapshot (the head's state and the back-edge log) is complete and returned."""
        cut = self.cuts.get(n)
        if cut is None:
            return None
        cut["open"].discard(channel)
        if cut["open"]:
            return None
        del self.cuts[n]
        meta = cut["meta"]
        meta["backedge"] = cut["log"]
        meta["backedge_bytes"] = len(codec.pack(cut["log"]))
        meta["backedge_records"] = sum(len(x[2]) for x in cut["log"] if x[1] == RECORDS)
        meta["backedge_ms"] = (time.perf_counter() - cut["t0"]) * 1000
        return meta

    def replay_log(self) -> None:
        """After a restore (every operator restored): the back-edge log goes into the loop again,
        in the order it was recorded."""
        log, self.to_replay = self.to_replay, []
        for chan, kind, *rest in log:
            chan = tuple(chan)
            if kind == RECORDS:
                self.push(list(rest[0]), self.wave, chan)
            else:
                epoch, wm, eos = rest
                self.marker(chan, epoch, wm, eos)

    def metrics(self) -> dict:
        """The operator's metrics, with the loop's waves and rounds."""
        return {**super().metrics(), "waves": self.waves, "rounds": self.rounds, "rounds_max": self.round_max}


class LoopTail(Op):
    """The iterate operator: applies `keep` to what the body emits, sends the records kept and its
    reports on each wave back to the heads, and the rest downstream, tagged with their epoch."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.keep = node.params["keep"]
        self.back: tuple[Callable, Callable, Callable] | None = None
        self.kept = 0
        self.kept_total = 0

    def connect_back(self, push: Callable, marker: Callable, event: Callable) -> None:
        """The back edge: to this worker's head (records) and every worker's (reports, events)."""
        self.back = (push, marker, event)

    def push(self, records: list, epoch: int, channel: Any) -> None:
        """Records kept go back to the head; the others leave the loop, tagged with the epoch of
        their wave; a `keep` that raises fails the run, naming the loop."""
        if self.blocked and channel in self.blocked:
            super().push(records, epoch, channel)
            return
        t = time.perf_counter()
        self.records_in += len(records)
        keep = self.keep
        kept: list = []
        out: list = []
        try:
            for r in records:
                (kept if keep(r) else out).append(r)
        except Exception as e:
            raise RunFailed(
                f"operator '{self.name}' (declared at {self.node.where}): its keep predicate raised "
                f"{type(e).__name__}: {e}"
            ) from e
        self.busy_s += time.perf_counter() - t
        if kept:
            self.kept += len(kept)
            self.kept_total += len(kept)
            self.back[0](kept, epoch, None)
        if out:
            e = epoch >> ROUND_BITS if epoch != EOS else self.last_epoch
            # never an epoch already marked finished downstream (a window in the body closes at
            # the end of input, after the last wave)
            e = max(e, self.last_epoch, self.frontier + 1 if self.frontier != EOS else e)
            self.last_epoch = e
            self.emit(out, e)

    def marker(self, channel: Any, epoch: int, wm: Any, eos: bool) -> None:
        """The body finished a wave here: tells every head whether anything was kept in it; or
        it finished every wave of an epoch: marks that epoch finished downstream."""
        if self.blocked and channel in self.blocked:
            super().marker(channel, epoch, wm, eos)
            return
        self.inputs[channel] = EOS if eos else epoch
        if eos:
            self._downstream(EOS)
            self.back[1](None, EOS, None, True)
            return
        if epoch & ROUNDS == ROUNDS:
            self._downstream(epoch >> ROUND_BITS)
            return
        report = [self.kept > 0, EOS if wm is None else wm]
        self.kept = 0
        self.back[1](None, epoch, report, False)

    def _downstream(self, upto: int) -> None:
        """No record of epochs <= `upto` remains in the loop anywhere: the marker downstream."""
        if upto <= self.frontier:
            return
        self.frontier = upto
        if upto != EOS and upto > self.last_epoch:
            self.last_epoch = upto
        for _, mark, _, chan in self.targets:
            mark(chan, upto, None, upto == EOS)

    def forward_event(self, ev: dict) -> None:
        """An in-band event goes downstream and back round to every head."""
        super().forward_event(ev)
        self.back[2](None, ev)

    def snapshot_meta(self) -> dict:
        """Adds the records kept in the running wave so far."""
        return {**super().snapshot_meta(), "kept": self.kept}

    def restore_meta(self, meta: dict) -> None:
        """Puts back what `snapshot_meta` took."""
        super().restore_meta(meta)
        self.kept = meta.get("kept", 0)

    def metrics(self) -> dict:
        """The operator's metrics, with the records kept."""
        return {**super().metrics(), "kept": self.kept_total}
