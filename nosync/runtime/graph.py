"""The physical graph on a worker: which worker owns a key, one instance of every operator,
and the edges and channels between them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import xxhash

from nosync.api.pipeline import Node
from nosync.api.plan import PhysicalPlan
from nosync.errors import PipelineError
from nosync.runtime import frames
from nosync.runtime.keyed import AggregateOp, JoinOp, ReduceOp, StatefulMapOp, WindowOp
from nosync.runtime.loops import LoopHead, LoopTail
from nosync.runtime.operators import FilterOp, FlatMapOp, KeyByOp, MapOp, Op, UnionOp


def key_hash(key: Any) -> int:
    """xxhash64 of the bytes of `key` (a list hashes as the tuple of its items)."""
    if type(key) is str:
        data = key.encode("utf-8", "surrogatepass")
    elif type(key) is bytes:
        data = key
    elif type(key) is int:
        data = key.to_bytes(16, "little", signed=True)
    else:
        data = msgpack.packb(key, use_bin_type=True)
    return xxhash.xxh64_intdigest(data)


def partition_of(key: Any, workers: int) -> int:
    """The worker that owns `key`: its hash modulo W."""
    return key_hash(key) % workers


def build_ops(
    p: PhysicalPlan, keep: set[int] | None, source_op: Callable, sink_op: Callable, hooks: Any
) -> tuple[list[Op], dict[int, Op]]:
    """One instance of every operator of `p` (or of the nodes in `keep`), in node order, each
    loop's head and tail knowing each other; the edges are the caller's (`graph_edges`, then
    `finish_loops`)."""
    ops: list[Op] = []
    by_id: dict[int, Op] = {}
    for n in p.pipeline.nodes:
        if keep is not None and n.id not in keep:
            continue
        if n.kind == "source":
            op: Op = source_op(n)
        elif n.kind == "sink":
            op = sink_op(n)
        elif n.kind == "join":
            op = JoinOp(n, set())
        elif n.kind == "iterate":
            op = LoopTail(n)
        elif n.kind == "loop_entry":
            op = LoopHead(n)
        else:
            op = make_op(n)
        op.hooks = hooks
        op.track_dirty = hooks.tracks_dirty and hasattr(op, "dirty")
        if op.track_dirty and isinstance(op, JoinOp):
            # a join's sides only grow: what a batch appended is its update, not its sides
            op.incremental, op.track_dirty = True, False
        op.align_epochs = (
            hooks.aligns_epochs and n.kind not in ("loop_entry", "iterate") and not n.params.get("loop_internal")
        )
        ops.append(op)
        by_id[n.id] = op
    return ops, by_id


def graph_edges(p: PhysicalPlan) -> list[Any]:
    """The edges that carry records between operator instances, the loops' back edges included."""
    return list(p.edges)


def edge_channels(e: Any, workers: int) -> list[Any]:
    """The input channels edge `e` gives its consumer: one per sending worker on an exchange."""
    return [("x", e.id, w) for w in range(workers)] if e.exchange else [("f", e.id)]


def exchange_sender(ch: Any) -> int | None:
    """The worker an input channel of `edge_channels` comes from, if it is an exchange's."""
    return ch[2] if isinstance(ch, tuple) and ch[0] == "x" else None


def connect_back_edge(e: Any, tail: LoopTail, head: LoopHead, router: Any = None) -> None:
    """Connects a loop's back edge `e`: through `router` (a `FeedbackRouter`) when the body
    crosses workers, else straight to the head of this worker, the records kept decoded from
    their wire form as a router's would be."""
    if router is not None:
        tail.connect_back(router.push, router.marker, router.event)
        return
    chan = ("f", e.id)
    sender = f"operator '{tail.name}' (declared at {tail.node.where})"
    tail.connect_back(
        lambda records, epoch, _c: head.push(frames.wire_records(records, sender), epoch, chan),
        lambda _c, epoch, wm, eos: head.marker(chan, epoch, wm, eos),
        lambda _c, ev: head.event(chan, ev),
    )


def add_edge_input(dst: Op, e: Any, workers: int) -> None:
    """Gives `dst` the input channels of edge `e` (a join learns which are its left side)."""
    left = isinstance(dst, JoinOp) and e.port == 0
    for chan in edge_channels(e, workers):
        dst.add_input(chan)
        if left:
            dst.left_channels.add(chan)


def finish_loops(p: PhysicalPlan, by_id: dict[int, Op], max_rounds: int | None = None) -> None:
    """Gives every loop's head its back edge and its bound on rounds (iterate's max_iterations,
    else `max_rounds`)."""
    back = {e.dst: e.id for e in p.edges if e.feedback}
    for n in p.pipeline.nodes:
        if n.kind != "iterate":
            continue
        head = by_id.get(n.params["entry"])
        if head is None:
            continue  # a batch job's stage holds the tail alone
        head.back_edge = back[head.node.id]
        head.back_channels = [c for c in head.inputs if head.is_back(c)]
        head.limit = n.params.get("max_iterations") or max_rounds
        head.loop_name, head.loop_where = n.name, n.where


OPS: dict[str, type[Op]] = {
    "map": MapOp,
    "flat_map": FlatMapOp,
    "filter": FilterOp,
    "key_by": KeyByOp,
    "union": UnionOp,
    "reduce": ReduceOp,
    "aggregate": AggregateOp,
    "stateful_map": StatefulMapOp,
    "window": WindowOp,
}


def make_op(node: Node) -> Op:
    """The runtime operator of a one-input node."""
    cls = OPS.get(node.kind)
    if cls is None:
        raise PipelineError(f"no runtime operator for kind {node.kind!r}", node.name, node.where)
    return cls(node)
