"""The physical plan: every worker runs one instance of every operator.

An edge is forward (the consumer is on the same worker: a direct call) or exchange (records are
routed to the worker that owns their key). An edge is exchange exactly when it leaves a key_by:
keyed operators keep their input's partitioning, so what follows them stays forward. Partition
i of a source is read by worker i % W.

A loop adds one more edge, its back edge (`feedback`), from the iterate operator (the loop's
tail) to its loop_entry (the head): the records kept go back to the head on their own worker.
When the body holds an exchange, the back edge is one too: the tail's reports on each round
and its barriers go to the head of every worker, which go round in step (see
`nosync.runtime.loops`); otherwise the loop stays on its worker and the edge is forward. It is
the only edge that goes backwards in node order.
"""

from __future__ import annotations

from dataclasses import dataclass

from nosync.api.pipeline import KEYED_KINDS, Pipeline


@dataclass(frozen=True)
class Edge:
    """Input `port` of operator `dst` reads operator `src`. `id` names the edge on the wire and
    in channel ids, so that the two inputs of a self-join stay apart."""

    id: int
    src: int
    dst: int
    port: int
    exchange: bool
    feedback: bool = False
    """A loop's back edge, from its iterate operator to its loop_entry."""


@dataclass
class PhysicalPlan:
    """A pipeline laid out on `workers` workers: its edges, and the partitions of each source each
    worker reads."""

    pipeline: Pipeline
    workers: int
    edges: list[Edge]
    source_parts: dict[int, list[list[dict]]]
    """source node id -> per worker, the partitions that worker reads."""

    def inputs_of(self, node_id: int) -> list[Edge]:
        """The edges into operator `node_id`."""
        return [e for e in self.edges if e.dst == node_id]

    def outputs_of(self, node_id: int) -> list[Edge]:
        """The edges out of operator `node_id`."""
        return [e for e in self.edges if e.src == node_id]

    @property
    def forward_edges(self) -> list[Edge]:
        """Every edge but the loops' back edges: the graph they make is acyclic."""
        return [e for e in self.edges if not e.feedback]

    @property
    def exchange_edges(self) -> list[Edge]:
        """The edges whose records are routed to the worker that owns their key."""
        return [e for e in self.edges if e.exchange and not e.feedback]


def plan(pipeline: Pipeline, workers: int) -> PhysicalPlan:
    """The physical plan of a validated pipeline on `workers` workers."""
    pipeline.validate()
    nodes = pipeline.nodes
    edges = []
    for n in nodes:
        for port, i in enumerate(n.inputs):
            up = nodes[i]
            exchange = n.kind in KEYED_KINDS and up.kind == "key_by"
            edges.append(Edge(len(edges), i, n.id, port, exchange))
    for n in nodes:
        if n.kind == "iterate":
            body = set(n.params["body"])
            crosses = any(e.exchange for e in edges if e.dst in body)
            edges.append(Edge(len(edges), n.id, n.params["entry"], 1, crosses, feedback=True))
    parts: dict[int, list[list[dict]]] = {}
    for n in nodes:
        if n.kind == "source":
            src = n.params["source"]
            all_parts = src.partitions(workers)
            per = [[] for _ in range(workers)]
            for i, part in enumerate(all_parts):
                per[i % workers].append(part)
            parts[n.id] = per
    return PhysicalPlan(pipeline, workers, edges, parts)
