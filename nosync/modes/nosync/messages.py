"""The operations of mode nosync's own control messages (`control.ModeMessage`)."""

from __future__ import annotations

from enum import StrEnum


class NosyncOp(StrEnum):
    """What a nosync mode message asks or says."""

    DURABLE = "durable"
    """worker -> coordinator: a newer durable point (`point`)."""
    POINTS = "points"
    """coordinator -> workers: every worker's durable point and the safe point."""
    LOST = "lost"
    """coordinator -> workers: a worker was lost; its links drop."""
    PEER_BACK = "peer_back"
    """coordinator -> workers: a lost worker's new attempt is at `address`."""
    SNAPSHOT_NOW = "snapshot_now"
    """coordinator -> workers: snapshot at once (a peer recovers from its durable point)."""
    REPLAYED = "replayed"
    """worker -> coordinator: a recovery's replay is done, with what it re-executed."""
    COVER = "cover"
    """worker -> coordinator: a span job's worker asks its peers to hold what it needs."""
    SPAN = "span"
    """worker -> coordinator: run the span job in `dir` with `tasks` tasks."""
    SPAN_DONE = "span_done"
    """coordinator -> worker: its span job ended (`seconds`, or `error`)."""
