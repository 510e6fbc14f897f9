"""The re-execution of logged steps, shared by a recovery (`recovery.py`) and a span job
(`span.py`): one step at a time, the frame it consumed taken from the link's queue, its
pre-commits made again."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from lineage import Step
from nosync.errors import RunFailed
from nosync.runtime import frames

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker


def execute(h: Any, worker: Worker, entry: tuple, pump: Any) -> None:
    """Re-executes one logged step."""
    kind = entry[0]
    if kind == Step.CONSUMED:
        j, seq = int(entry[1]), int(entry[2])
        f = next_frame(h, j, seq, pump)
        h.consume(j, seq, f.header)
        h.replayed_frames += 1
        if f.kind == frames.DATA:
            h.replayed_frame_records += len(f.body)
        worker.process_frame(j, f)
    elif kind == Step.READ:
        h.log_step(tuple(entry))
        src = worker.sources[int(entry[1])]
        before = src.records_in
        src.poll(entry[2])
        h.replayed_source_records += src.records_in - before
    elif kind == Step.FLUSHED:
        h.log_step(tuple(entry))
        worker.routers[int(entry[1])].send_buffer(int(entry[2]))
    elif kind == Step.FLUSHED_ALL:
        h.log_step((Step.FLUSHED_ALL,))
        for r in worker.routers:
            r.flush()
    elif kind == Step.STOPPED:
        h.log_step(tuple(entry))
        worker.stop_sources(None if entry[1] is None else int(entry[1]))
    elif kind == Step.CUT:
        h.log_step(tuple(entry))
        now = [h.produced.get(d, 0) for d in range(worker.workers)]
        if list(entry[1]) != now:
            raise RunFailed(
                f"worker {worker.index}: replay reached a cut with frame counters {now}, the run had "
                f"{list(entry[1])}: an operator is not deterministic given its input order"
            )


def precommit_again(h: Any, worker: Worker, pcs: list) -> None:
    """The pre-commits a lineage point made after this step, made again with the same ids and
    epochs (the replay staged the same records)."""
    sinks = {s.name: s for s in worker.sinks}
    for name, c, upto in pcs:
        s = sinks[name]
        s.precommit(int(c), None if upto is None else int(upto), durable=False)


def next_frame(h: Any, j: int, seq: int, pump: Any) -> Any:
    """Frame `seq` of the link from worker `j`, the next in its queue once it arrived."""
    q = h.queue.setdefault(j, deque())
    while not q:
        pump(0.05)
    f = q.popleft()
    if f.header["s"] != seq:
        raise RunFailed(f"worker {h.w.index}: replay expected frame {seq} from worker {j}, got {f.header['s']}")
    return f
