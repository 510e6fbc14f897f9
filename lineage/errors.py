"""The exceptions of the `lineage` package: one hierarchy, each naming what and where."""

from __future__ import annotations


class LineageError(Exception):
    """Base of every error the lineage package raises: lineage that cannot be trusted."""


class CorruptLineageLogError(LineageError):
    """A record in the middle of a lineage log failed its checksum or framing."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt lineage log record in {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason
