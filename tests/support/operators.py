"""Runtime operators driven directly in unit tests: a downstream operator that keeps what it is
given, and an operator wired to one."""

from __future__ import annotations

import nosync as ns


class Collector:
    """A downstream operator that keeps what it is given."""

    def __init__(self) -> None:
        self.batches: list[tuple[list, int]] = []
        self.markers: list[tuple[int, object, bool]] = []

    def push(self, records: list, epoch: int, channel: object) -> None:
        self.batches.append((list(records), epoch))

    def marker(self, channel: object, epoch: int, wm: object, eos: bool) -> None:
        self.markers.append((epoch, wm, eos))

    @property
    def records(self) -> list:
        """Every record pushed, in order, across batches."""
        return [r for recs, _ in self.batches for r in recs]


def source(p: ns.Pipeline, name: str | None = None) -> ns.Stream:
    """A source of `p` to build operators on (its records are never read: tests push their own)."""
    return p.source(ns.sources.Generator(records=0), name=name)


def wire(op, inputs=("in",)) -> Collector:
    """Connects `op`'s output to a new Collector and gives it the input channels `inputs`."""
    out = Collector()
    op.connect(out.push, out.marker, "out")
    for ch in inputs:
        op.add_input(ch)
    return out
