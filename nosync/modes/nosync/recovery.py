"""Recovery of one nosync worker: restore its last durable snapshot, replay its steps after it.

Spark's retry of the lost task re-registers; the coordinator gives it the peers and tells the
survivors where it is, and they go on meanwhile: what they send it stays in their output logs.
The new attempt opens its store and restores:

- the snapshot's metadata: frontiers and source positions, the frame counters per link, the
  lineage held for others, the sinks' pre-commits, the records in the exchange buffers, and the
  output log's residue (frames stay encoded);
- the lineage points after the snapshot: the entries they persisted (its own steps up to its
  durable point, and the others' it held) and where each pre-committed its sinks;
- keyed state in bulk (`BulkLoader`): each keyed operator's runs are decoded and applied a
  block at a time, on the processing thread whenever it has nothing to read, while the worker
  replays and then runs live: a key a record touches before its operator's load is done is
  read alone from the store (`Store.reader`: one binary search in an index of the key hashes
  of all the runs, built on a thread of its own from the restore on out of the runs' index
  entries, which then reads the runs ahead; then one block of 64 keys decoded, or the columns
  of an append's run at the first look-up that lands in it). When a load is done, the loaded
  dict becomes the operator's state (the keys touched meanwhile win) and the per-key path
  leaves the hot loop. Windows and joins load before the replay (a window closes over every
  key; a join's sides are rebuilt from their increments).

Then it exchanges one LINEAGE frame with every survivor each way: the first chan_seq to send
again, and the lineage entries held for the other. The merged entries after the snapshot are
replayed in their order - sources read again from the snapshot's positions, frames taken from
what the survivors resend, pre-commits made again where the lineage points made them - and
re-produced frames that a survivor already processed are dropped by chan_seq after their
fingerprint is checked. Then it runs live. A second worker lost while one recovers, or `run
--resume`, makes every worker restore its own last snapshot and replay the same way (a new
generation); each then has its own durable lineage points, and the entries of the others it
persisted, to replay by.

With `replay_threshold_records`, a long span up to a cut goes to a Spark batch job first
(`span.py`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from lineage import LineageError, recovery_plan
from nosync.codec import unpack
from nosync.errors import RunFailed
from nosync.modes.nosync import span
from nosync.modes.nosync.messages import NosyncOp
from nosync.modes.nosync.steps import execute, precommit_again
from nosync.runtime import control
from nosync.runtime.heap import freeze_made
from nosync.runtime.keyed import MISSING_STATE, JoinOp, KeyedOp, WindowOp
from nosync.runtime.operators import SinkOp
from nosync.state.layout import LINEAGE, META, OUT, store_state

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

REPLAY_TIMEOUT_S = 120.0
POLL_S = 0.005
"""How often a replay takes the frames and control messages that arrived."""


def recover(h: Any, worker: Worker) -> None:
    """Restores worker `worker` from its store and replays its steps (`on_start` of a restart)."""
    t0 = time.perf_counter()
    restore(h, worker)
    h.take_held_back(worker)  # what arrived while its copies were fetched (a lost machine)
    h.read_restored = sum(s.records_in for s in worker.sources)
    h.recovered = True
    h.restore_meta_s = time.perf_counter() - t0
    # restored, and about to execute (its logged steps first): running again, while its state
    # loads in the background
    worker.report_restored()
    worker.report_ready()
    # one LINEAGE frame each way with every peer, then replay what they hold for us
    for j, conn in worker.out.items():
        conn.send_uncounted(h.lineage_frame(j))
    worker.flush_peers()
    worker.keepalive()
    replay(h, worker)
    h.restore_s = time.perf_counter() - t0
    worker.send_ctrl(
        control.mode_message(
            NosyncOp.REPLAYED,
            gen=worker.gen,
            restored_step=h.durable_step,
            steps=h.replayed_steps,
            source_records=h.replayed_source_records,
            frames=h.replayed_frames,
            frame_records=h.replayed_frame_records,
            read_restored=h.read_restored,
            restore_s=h.restore_s,
            restore_meta_s=h.restore_meta_s,
            keys_read_alone=h.loader.keys_read_alone() if h.loader is not None else h.keys_read_alone,
            load_wait_s=h.loader.waited_s if h.loader is not None else h.load_wait_s,
            load_s=h.load_s,
            span_steps=h.span_steps,
            span_records=h.span_records,
            span_s=h.span_s,
            span_parts=h.span_parts,
            span_reason=h.span_reason,
            restored_from=h.restored_from(),
        )
    )


def restore(h: Any, worker: Worker) -> None:
    """Puts the worker back to its last durable snapshot and the lineage points after it (keyed
    state mostly loaded in the background); with no snapshot, back to the start."""
    store = h.store
    metas = store.versions(META, 0)
    h.durable_seq = store.last_seq
    h.kept.restored([seq for seq, _ in metas], time.monotonic())
    snap_seq = h.snap_seq = metas[-1][0] if metas else -1
    for _, raw in store.versions(LINEAGE, 0, after=snap_seq):
        point = unpack(raw)
        for origin, entries in point["entries"].items():
            h.stash.add(int(origin), entries)
        if point["pc"]:
            h.pc_at[int(point["step"])] = [tuple(pc) for pc in point["pc"]]
    if not metas:
        # nothing snapshotted yet: start over from the sources' beginnings, without the files
        # a pre-commit left in staging (the replay makes its pre-commits again)
        for op in worker.ops:
            if isinstance(op, SinkOp):
                op.part.recover(-1, [], h.durable_seq)
        return
    meta = unpack(metas[-1][1])
    h.step = h.snapshot_step = h.durable_step = int(meta["step"])
    h.produced = {int(d): int(s) for d, s in meta["produced"].items()}
    h.consumed = {int(j): int(s) for j, s in meta["consumed"].items()}
    h.received = dict(h.consumed)
    h.snap_point = {"step": h.durable_step, "consumed": dict(h.consumed), "produced": dict(h.produced)}
    for origin, entries in meta["stash"].items():
        h.stash.add(int(origin), entries)
    h.outlog.restore(store.load(OUT, as_of=snap_seq))
    routers = {r.edge: r for r in worker.routers}
    for edge, d, epoch, data in meta["buffers"]:
        r = routers[int(edge)]
        r.buffers[int(d)] = list(unpack(data))
        r.buffer_epoch[int(d)] = int(epoch)
        r.buffer_since[int(d)] = time.monotonic()
    metas_of = meta["ops"]
    lazy = []
    for i, op in enumerate(worker.ops):
        m = metas_of.get(op.name)
        if m is not None:
            op.restore_meta(m)
        if isinstance(op, (WindowOp, JoinOp)):
            store_state(store, i, op, snap_seq)
        elif isinstance(op, KeyedOp):
            lazy.append((i, op))
        if isinstance(op, SinkOp):
            pre = [(int(c), handle) for c, handle in (m["precommitted"] if m is not None else ())]
            op.part.recover(snap_seq, [], h.durable_seq)
            op.precommitted = pre
            op.committed = m["committed"] if m is not None else 0
        worker.keepalive()
    if lazy:
        h.loader = BulkLoader(store, lazy, snap_seq)


class BulkLoader:
    """Loads keyed operators' state on the processing thread, a part at a time (a block of a
    merged run: `Store.load_steps`), while the worker has nothing else to do (`advance`, from
    its loop when idle): records go first, and the load takes the time left over. Until an
    operator's load is done, a key a record touches is read alone (`_read_alone`).

    On a thread of its own, the load held the interpreter lock for 5 ms at a time against a
    processing thread that waits for input every few hundred microseconds: that thread then
    ran about a tenth as fast while the load lasted."""

    def __init__(self, store: Any, ops: list[tuple[int, Any]], as_of: int) -> None:
        self.store = store
        self.ops = dict(ops)
        self.as_of = as_of
        self.done: dict[int, dict] = {}
        self.error: BaseException | None = None
        self.seconds = 0.0
        """Time spent loading (on the processing thread, in parts)."""
        self.read_alone = 0
        """Keys read alone (a record touched them) before their operator's load was installed."""
        self.waited_s = 0.0
        """How long records waited to read keys alone: what was left of building the readers'
        indexes when the first key was asked."""
        self._readers: dict[int, Any] = {}
        # each operator's reader is built at once, on a thread of its own (its runs read from
        # the disk tier, which gives the GIL up, their key hashes sorted): meanwhile the worker
        # waits for its peers' LINEAGE frames, before any record asks for a key
        self._building = {i: _Building(store, i, as_of) for i, _ in ops}
        self._todo = [i for i, _ in ops]
        self._steps: Any = None
        self._stop = False
        for i, op in ops:
            op.lazy(lambda key, i=i: self._read_alone(i, key), raw=True)

    def _read_alone(self, i: int, key: Any) -> Any:
        """The state of `key` in operator `i`, read alone from the store through one index of
        the key hashes of every run it needs (`Store.reader`, built on a thread since the load
        began: what was left of it at the operator's first read counted in `waited_s`); once
        the operator's load is done, from it."""
        loaded = self.done.get(i)
        if loaded is not None:
            return loaded.get(key, MISSING_STATE)
        reader = self._readers.get(i)
        if reader is None:
            t0 = time.perf_counter()
            reader = self._building[i].result()
            if reader is None:  # its build failed: built again here, to raise what failed
                reader = self.store.reader(i, self.as_of)
            self._readers[i] = reader
            self.waited_s += time.perf_counter() - t0
        return reader.get(key, MISSING_STATE)

    @property
    def loading(self) -> bool:
        """Whether some operator's state is still to load."""
        return bool(self._todo) and self.error is None and not self._stop

    def advance(self, budget_s: float) -> None:
        """Loads parts for about `budget_s` seconds (one part at least)."""
        t0 = time.perf_counter()
        deadline = t0 + budget_s
        try:
            while self.loading:
                if self._steps is None:
                    self._steps = self.store.load_steps(self._todo[0], as_of=self.as_of)
                    self._part: dict = {}
                for part in self._steps:
                    self._part = part
                    if time.perf_counter() >= deadline:
                        return
                i = self._todo.pop(0)
                self.done[i] = self._part
                self._readers.pop(i, None)
                self._building[i].stop(wait=False)  # its reader is read no more
                self._steps = None
        except BaseException as e:  # noqa: BLE001 - raised by install_done, between two steps
            self.error = e
        finally:
            # what was loaded lives as long as the generation: out of the collector's full
            # passes, which would otherwise walk all of it again and again as it grows
            freeze_made()
            self.seconds += time.perf_counter() - t0

    def install_done(self, worker: Worker) -> bool:
        """Makes every loaded state its operator's (between two steps); True once every
        operator has its state."""
        if self.error is not None:
            raise RunFailed(f"worker {worker.index}: loading its keyed state: {self.error}") from self.error
        for i in [i for i in self.done if i in self.ops]:
            op = self.ops.pop(i)
            loaded = self.done.pop(i)
            state = op.state
            # a key read alone and deleted since must stay deleted
            for k in op.looked:
                if k not in state:
                    loaded.pop(k, None)
            loaded.update(state)
            op.state = loaded
            self.read_alone += len(op.looked)
            op.loader = None
            op.looked = set()
        if not self.ops and worker.hooks.loader is self:
            worker.hooks.loader = None
            worker.hooks.load_s = self.seconds
            worker.hooks.keys_read_alone = self.read_alone
            worker.hooks.load_wait_s = self.waited_s
            freeze_made()  # the keys read alone too live as long as the generation
        return not self.ops

    def keys_read_alone(self) -> int:
        """Keys read alone so far, the operators still loading included."""
        return self.read_alone + sum(len(op.looked) for op in self.ops.values())

    def wait(self) -> None:
        """Loads every operator's state now, to its end."""
        while self.loading:
            self.advance(1.0)

    def stop(self) -> None:
        """Stops the load (a replaced attempt, or the worker's end): nothing more is loaded, and
        the readers still being built are waited for, so that the store closes under no read."""
        self._stop = True
        for b in self._building.values():
            b.stop()


class _Building:
    """A keyed operator's reader (`Store.reader`) being built on a thread of its own. Once the
    reader is in use (`result`), the thread reads ahead the runs it indexed from their index
    entries (`PointReader.prefetch`: LevelDB's reads give the interpreter lock up), until
    `stop`: not before, so that the restore's own reads do not wait behind it."""

    def __init__(self, store: Any, i: int, as_of: int) -> None:
        self.reader: Any = None
        self._built = threading.Event()
        self._go = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._build, args=(store, i, as_of), name="nosync-index", daemon=True)
        self._thread.start()

    def _build(self, store: Any, i: int, as_of: int) -> None:
        try:
            self.reader = store.reader(i, as_of)
        except Exception:  # noqa: BLE001, S110 - the processing thread builds it again, and raises
            pass
        finally:
            self._built.set()
        self._go.wait()
        if self.reader is not None and not self._stop:
            try:
                self.reader.prefetch(lambda: self._stop)
            except Exception:  # noqa: BLE001, S110 - a look-up that lands in the run reads it, and raises
                pass

    def result(self) -> Any:
        """The reader, once built (None: the build failed); waits for the build, and lets the
        reading ahead begin."""
        self._built.wait()
        self._go.set()
        return self.reader

    def stop(self, wait: bool = True) -> None:
        """Ends the reading ahead; with `wait`, waits for the thread to end."""
        self._stop = True
        self._go.set()
        if wait:
            self._thread.join()


def replay(h: Any, worker: Worker) -> None:
    """Waits for a LINEAGE frame from every peer, then re-executes the logged steps after the
    snapshot, in their order."""
    h.replaying = True
    me = worker.index
    deadline = [time.monotonic() + REPLAY_TIMEOUT_S]

    def pump(wait: float) -> None:
        worker.pump(wait, strict=True)
        worker.flush_peers()
        worker.keepalive()
        if time.monotonic() > deadline[0]:
            raise RunFailed(f"worker {me}: replay not done after {REPLAY_TIMEOUT_S:.0f}s")

    try:
        while not all(h.resumed.get(j) for j in worker.inc):
            pump(0.05)
        # the plan checks the lineage against the snapshot: frames of each link consumed
        # in order, none the snapshot had already consumed
        point = {"step": h.step, "consumed": h.consumed, "produced": h.produced}
        try:
            plan = recovery_plan({me}, {me: point}, {me: [h.stash.entries(me)]}, worker.workers)[me]
        except LineageError as e:
            raise RunFailed(f"worker {me}: the lineage its peers hold cannot be replayed: {e}") from e
        entries = plan["replay"]
        # the replay does not wait for the bulk load: until it is done, a key a step touches is
        # read alone (`KeyedOp.fault_in`), and the loaded state is installed between two steps
        # as soon as it is, so a short span is not held up by the load of every key
        if h.threshold and h.alone:
            taken = span.hand_over(h, worker, entries, pump)
            deadline[0] = time.monotonic() + REPLAY_TIMEOUT_S
            entries = entries[taken:]
        elif h.threshold and h.span_reason is None:
            h.span_reason = "every worker restored (a regroup): the span job is for one worker recovering alone"
        polled = time.perf_counter()
        for step, entry in entries:
            execute(h, worker, entry, pump)
            h.replayed_steps += 1
            pcs = h.pc_at.pop(int(step), None)
            if pcs:
                precommit_again(h, worker, pcs)
            if time.perf_counter() - polled >= POLL_S:
                # what the peers send meanwhile is taken (and credited) as it comes, so that
                # they go on while this worker replays
                pump(0)
                if h.loader is not None:
                    h.loader.install_done(worker)
                polled = time.perf_counter()
    finally:
        h.replaying = False
    h.drain(worker)
    h.pc_at = {}
