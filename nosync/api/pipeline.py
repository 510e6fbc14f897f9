"""The pipeline API: a fluent builder of the logical dataflow graph.

A pipeline is sources -> operators -> sinks. Every call records the operator's name and the
file:line of the user's code that declared it, so that build-time errors (and later, runtime
errors) point at the user's line. The graph is a DAG by construction; `iterate` is the only way
to make a feedback loop. Keyed streams carry (key, value) pairs: `key_by(fn)` turns each record
r into (fn(r), r), and the keyed operators after it are partitioned by key across workers.

User functions must be deterministic given their input order: every fault-tolerance mode
relies on re-executing them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nosync import storage
from nosync.api.sinks import Sink
from nosync.api.sources import Source
from nosync.api.where import declared_at
from nosync.errors import PipelineError

KEYED_KINDS = frozenset({"reduce", "aggregate", "stateful_map", "window", "join"})


@dataclass
class Node:
    """One logical operator."""

    id: int
    kind: str
    name: str
    where: str
    inputs: tuple[int, ...]
    keyed: bool
    params: dict[str, Any] = field(default_factory=dict)


class Pipeline:
    """A named dataflow graph.

    >>> import nosync as ns
    >>> p = ns.Pipeline("wordcount")
    >>> lines = p.source(ns.sources.Generator(records=3, fn=lambda i: f"a b {i}"))
    >>> counts = lines.flat_map(str.split).key_by(lambda w: w).aggregate(int, lambda n, _: n + 1)
    >>> counts.sink(ns.sinks.Console())
    >>> [n.kind for n in p.nodes]
    ['source', 'flat_map', 'key_by', 'aggregate', 'sink']
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise PipelineError(f"a pipeline needs a non-empty name, got {name!r}")
        self.name = name
        self.nodes: list[Node] = []
        self._names: set[str] = set()
        self._loop_depth = 0

    def _add(
        self,
        kind: str,
        inputs: tuple[int, ...],
        keyed: bool,
        name: str | None,
        where: str,
        **params: Any,
    ) -> Node:
        if name is None:
            n = sum(1 for x in self.nodes if x.kind == kind) + 1
            name = f"{kind}_{n}"
            while name in self._names:
                n += 1
                name = f"{kind}_{n}"
        elif not isinstance(name, str) or not name:
            raise PipelineError(f"operator names are non-empty strings, got {name!r}", kind, where)
        elif name in self._names:
            raise PipelineError(f"the name '{name}' is already used in pipeline '{self.name}'", name, where)
        self._names.add(name)
        node = Node(len(self.nodes), kind, name, where, inputs, keyed, params)
        self.nodes.append(node)
        return node

    def source(self, source: Any, name: str | None = None) -> Stream:
        """A stream read from a source (see `nosync.sources`)."""
        where = declared_at()
        if not isinstance(source, Source):
            raise PipelineError(f"source() takes a nosync.sources object, got {type(source).__name__}", name, where)
        node = self._add("source", (), False, name, where, source=source)
        return Stream(self, node)

    @property
    def sinks(self) -> list[Node]:
        """The pipeline's sink nodes, in declaration order."""
        return [n for n in self.nodes if n.kind == "sink"]

    def node(self, name: str) -> Node:
        """The operator named `name`; raises PipelineError if the pipeline has none."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise PipelineError(f"pipeline '{self.name}' has no operator named '{name}'")

    def validate(self) -> None:
        """Checks what only the whole graph can show: a sink exists, every path ends in one,
        the graph is acyclic outside `iterate`."""
        if not any(n.kind == "source" for n in self.nodes):
            raise PipelineError(f"pipeline '{self.name}' has no source")
        consumed = {i for n in self.nodes for i in n.inputs}
        if not self.sinks:
            ends = [n for n in self.nodes if n.id not in consumed]
            raise PipelineError(
                f"pipeline '{self.name}' has no sink: end this stream with .sink(...)",
                ends[-1].name,
                ends[-1].where,
            )
        for n in self.nodes:
            if n.kind != "sink" and n.id not in consumed and not n.params.get("loop_internal"):
                raise PipelineError(
                    "this stream is never consumed: end it with .sink(...) or remove it",
                    n.name,
                    n.where,
                )
        for n in self.nodes:
            for i in n.inputs:
                if i >= n.id:
                    raise PipelineError("a cycle that was not built with iterate()", n.name, n.where)

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, {len(self.nodes)} operators)"


def _sink_directory(sink: Any) -> str | None:
    """Where a sink writes, as an absolute path (a URI as it is, its secrets hidden); None for
    a sink that writes no files."""
    directory = getattr(sink, "directory", None)
    if not isinstance(directory, str):
        return None
    return storage.redact(directory.rstrip("/")) if storage.is_uri(directory) else os.path.abspath(directory)


def _check_fn(fn: object, what: str, op: str, where: str) -> None:
    if not callable(fn):
        raise PipelineError(f"{what} must be callable, got {type(fn).__name__}: {fn!r:.60}", op, where)


class Stream:
    """A stream of records produced by one operator."""

    keyed = False

    def __init__(self, pipeline: Pipeline, node: Node) -> None:
        self.pipeline = pipeline
        self.node = node

    def _derive(self, kind: str, name: str | None, where: str, keyed: bool = False, **params: Any) -> Node:
        return self.pipeline._add(kind, (self.node.id,), keyed, name, where, **params)

    def map(self, fn: Callable[[Any], Any], name: str | None = None) -> Stream:
        """One output per record: fn(record).

        >>> s.map(lambda r: r * 2)  # doctest: +SKIP
        """
        where = declared_at()
        _check_fn(fn, "map's function", name or "map", where)
        return Stream(self.pipeline, self._derive("map", name, where, fn=fn))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], name: str | None = None) -> Stream:
        """Zero or more outputs per record: every item of fn(record).

        >>> lines.flat_map(str.split)  # doctest: +SKIP
        """
        where = declared_at()
        _check_fn(fn, "flat_map's function", name or "flat_map", where)
        return Stream(self.pipeline, self._derive("flat_map", name, where, fn=fn))

    def filter(self, pred: Callable[[Any], bool], name: str | None = None) -> Stream:
        """The records for which pred(record) is true.

        >>> words.filter(lambda w: len(w) > 3)  # doctest: +SKIP
        """
        where = declared_at()
        _check_fn(pred, "filter's predicate", name or "filter", where)
        return Stream(self.pipeline, self._derive("filter", name, where, fn=pred))

    def key_by(self, fn: Callable[[Any], Any], name: str | None = None) -> KeyedStream:
        """Keys the stream: each record r becomes (fn(r), r); keyed operators after this are
        partitioned by key (xxhash) across workers. Keys must be str, bytes, int or tuples.

        >>> words.key_by(lambda w: w)  # doctest: +SKIP
        """
        where = declared_at()
        _check_fn(fn, "key_by's key function", name or "key_by", where)
        return KeyedStream(self.pipeline, self._derive("key_by", name, where, keyed=True, fn=fn))

    def iterate(
        self,
        body: Callable[[Stream], Stream],
        keep: Callable[[Any], bool],
        max_iterations: int | None = None,
        name: str | None = None,
    ) -> Stream:
        """A feedback loop: records go through `body`; each output r for which keep(r) is true
        goes round again, the others leave the loop downstream. The only way to build a cycle.

        The body may hold any operator but sources and sinks, keyed ones included: a record
        goes round through the worker that owns its key. Progress is tracked per round: the
        records of an epoch go round until a round in which no worker kept any, and leave the
        loop tagged with that epoch, epochs in order. A loop still going round after
        `max_iterations` rounds of one epoch (default: the run's --max-rounds, unlimited
        unless given) fails the run, naming the loop.

        >>> nums.iterate(lambda s: s.map(lambda n: n // 2), keep=lambda n: n > 1)  # doctest: +SKIP
        """
        where = declared_at()
        op = name or "iterate"
        _check_fn(body, "iterate's body", op, where)
        _check_fn(keep, "iterate's keep predicate", op, where)
        if max_iterations is not None and (
            not isinstance(max_iterations, int) or isinstance(max_iterations, bool) or max_iterations < 1
        ):
            raise PipelineError(f"max_iterations must be a positive int, got {max_iterations!r}", op, where)
        p = self.pipeline
        entry = self._derive("loop_entry", None, where, loop_internal=True)
        first_body = len(p.nodes)
        out = body(Stream(p, entry))
        if not isinstance(out, Stream) or out.pipeline is not p:
            raise PipelineError("iterate's body must return a stream derived from its input", op, where)
        body_nodes = p.nodes[first_body:]
        if out.node.id < first_body and out.node is not entry:
            raise PipelineError(
                "a cycle that was not built with iterate(): the body returned a stream from outside it",
                op,
                where,
            )
        for n in body_nodes:
            if n.kind in ("sink", "source"):
                raise PipelineError(
                    f"a {n.kind} cannot be inside a loop: '{n.name}' is declared in the body of iterate "
                    f"'{op}' ({where}); put it after the loop",
                    n.name,
                    n.where,
                )
            if any(i < entry.id for i in n.inputs):
                raise PipelineError(
                    "a cycle that was not built with iterate(): the body reads a stream from outside it",
                    n.name,
                    n.where,
                )
            n.params["loop_internal"] = True
        node = p._add(
            "iterate",
            (out.node.id,),
            False,
            name,
            where,
            entry=entry.id,
            exit=out.node.id,
            body=[n.id for n in body_nodes],
            keep=keep,
            max_iterations=max_iterations,
        )
        return Stream(p, node)

    def union(self, *others: Stream, name: str | None = None) -> Stream:
        """The records of this stream and the others, interleaved."""
        where = declared_at()
        for o in others:
            if not isinstance(o, Stream) or o.pipeline is not self.pipeline:
                raise PipelineError("union() takes streams of the same pipeline", name or "union", where)
        node = self.pipeline._add("union", (self.node.id, *(o.node.id for o in others)), False, name, where)
        return Stream(self.pipeline, node)

    def sink(self, sink: Any, name: str | None = None) -> None:
        """Ends the stream in a sink (see `nosync.sinks`)."""
        where = declared_at()
        if not isinstance(sink, Sink):
            raise PipelineError(f"sink() takes a nosync.sinks object, got {type(sink).__name__}", name, where)
        directory = _sink_directory(sink)
        for other in self.pipeline.sinks if directory is not None else ():
            if directory == _sink_directory(other.params["sink"]):
                raise PipelineError(
                    f"{directory} is already the directory of sink '{other.name}' (declared at {other.where}): "
                    "two sinks in one directory would overwrite each other's files",
                    name or "sink",
                    where,
                )
        self._derive("sink", name, where, sink=sink)

    def _keyed_only(self, kind: str, name: str | None, where: str) -> None:
        raise PipelineError(f"{kind} is a keyed operator: call key_by(...) on the stream first", name or kind, where)

    def reduce(self, fn: Callable[[Any, Any], Any], name: str | None = None) -> KeyedStream:
        """Refuses: `reduce` is a keyed operator; call `key_by` on the stream first."""
        self._keyed_only("reduce", name, declared_at())

    def aggregate(
        self, init: Callable[[], Any], add: Callable[[Any, Any], Any], name: str | None = None
    ) -> KeyedStream:
        """Refuses: `aggregate` is a keyed operator; call `key_by` on the stream first."""
        self._keyed_only("aggregate", name, declared_at())

    def stateful_map(self, fn: Callable[[Any, Any], tuple[Any, Iterable[Any]]], name: str | None = None) -> Stream:
        """Refuses: `stateful_map` is a keyed operator; call `key_by` on the stream first."""
        self._keyed_only("stateful_map", name, declared_at())

    def window(
        self,
        size: float,
        time: Callable[[Any], float],
        init: Callable[[], Any],
        add: Callable[[Any, Any], Any],
        name: str | None = None,
    ) -> KeyedStream:
        """Refuses: `window` is a keyed operator; call `key_by` on the stream first."""
        self._keyed_only("window", name, declared_at())

    def join(self, other: KeyedStream, name: str | None = None) -> KeyedStream:
        """Refuses: `join` is a keyed operator; call `key_by` on the stream first."""
        self._keyed_only("join", name, declared_at())


class KeyedStream(Stream):
    """A stream of (key, value) pairs, partitioned by key for the keyed operators."""

    keyed = True

    def reduce(self, fn: Callable[[Any, Any], Any], name: str | None = None) -> KeyedStream:
        """A running reduction per key: emits (key, acc) for every record, acc = fn(acc, value)
        (the first value of a key is its acc).

        >>> pairs.key_by(lambda kv: kv[0]).reduce(lambda a, b: (a[0], a[1] + b[1]))  # doctest: +SKIP
        """
        where = declared_at()
        _check_fn(fn, "reduce's function", name or "reduce", where)
        return KeyedStream(self.pipeline, self._derive("reduce", name, where, keyed=True, fn=fn))

    def aggregate(
        self, init: Callable[[], Any], add: Callable[[Any, Any], Any], name: str | None = None
    ) -> KeyedStream:
        """A running aggregate per key: acc starts as init(), each record sets acc = add(acc, value),
        and (key, acc) is emitted.

        >>> words.key_by(lambda w: w).aggregate(int, lambda n, _: n + 1)  # doctest: +SKIP
        """
        where = declared_at()
        op = name or "aggregate"
        _check_fn(init, "aggregate's init", op, where)
        _check_fn(add, "aggregate's add", op, where)
        return KeyedStream(self.pipeline, self._derive("aggregate", name, where, keyed=True, init=init, add=add))

    def stateful_map(self, fn: Callable[[Any, Any], tuple[Any, Iterable[Any]]], name: str | None = None) -> Stream:
        """Arbitrary per-key state: fn(state, value) -> (new state, outputs); state is None for a
        new key, and returning None as the new state forgets the key.

        >>> def dedup(seen, x):  # doctest: +SKIP
        ...     return True, ([] if seen else [x])
        >>> events.key_by(lambda e: e["id"]).stateful_map(dedup)  # doctest: +SKIP
        """
        where = declared_at()
        _check_fn(fn, "stateful_map's function", name or "stateful_map", where)
        return Stream(self.pipeline, self._derive("stateful_map", name, where, keyed=True, fn=fn))

    def window(
        self,
        size: float,
        time: Callable[[Any], float],
        init: Callable[[], Any],
        add: Callable[[Any, Any], Any],
        name: str | None = None,
    ) -> KeyedStream:
        """Tumbling event-time windows of `size` (in the unit of time(value)): per key and window,
        acc = add(acc, value) from init(); emits (key, (window_start, acc)) once the watermark
        (the least event time still to come, over all inputs) passes the window's end.

        >>> per_auction = bids.key_by(lambda b: b["auction"])  # doctest: +SKIP
        >>> per_auction.window(10.0, lambda b: b["ts"], int, lambda n, _: n + 1)  # doctest: +SKIP
        """
        where = declared_at()
        op = name or "window"
        if not isinstance(size, int | float) or size <= 0:
            raise PipelineError(f"window size must be a positive number, got {size!r}", op, where)
        _check_fn(time, "window's time function", op, where)
        _check_fn(init, "window's init", op, where)
        _check_fn(add, "window's add", op, where)
        return KeyedStream(
            self.pipeline,
            self._derive("window", name, where, keyed=True, size=size, time=time, init=init, add=add),
        )

    def join(self, other: KeyedStream, name: str | None = None) -> KeyedStream:
        """A keyed inner join that keeps both sides as state: for each record, emits
        (key, (left, right)) with every record of the other side seen so far for its key.

        >>> bids.key_by(lambda b: b["auction"]).join(auctions.key_by(lambda a: a["id"]))  # doctest: +SKIP
        """
        where = declared_at()
        op = name or "join"
        if not isinstance(other, KeyedStream) or other.pipeline is not self.pipeline:
            raise PipelineError("join() takes a keyed stream of the same pipeline (call key_by on it)", op, where)
        node = self.pipeline._add("join", (self.node.id, other.node.id), True, name, where)
        return KeyedStream(self.pipeline, node)


def require_replayable(pipeline: Pipeline, who: str, why: str) -> None:
    """Refuses a pipeline with a source that cannot restart from a position, which `who`
    needs (`why` says why), naming the source and where it was declared."""
    for n in pipeline.nodes:
        if n.kind == "source" and not n.params["source"].replayable:
            raise PipelineError(
                f"{n.params['source'].describe()} cannot restart from a position, which {who} needs ({why})",
                n.name,
                n.where,
            )
