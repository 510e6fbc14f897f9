"""The exceptions of the `lsm` package: one hierarchy, each naming what and where."""

from __future__ import annotations


class LsmError(Exception):
    """Base of every error the store raises."""


class StoreLockedError(LsmError):
    """Another process (or another open handle) holds the store directory's lock."""

    def __init__(self, path: str) -> None:
        super().__init__(f"store {path} is locked by another process or handle (one writer per store)")
        self.path = path


class CorruptLogError(LsmError):
    """A record in the middle of a log segment, or a run, failed its checksum or framing."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt log record in {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class FormatVersionError(LsmError):
    """A file was written by an incompatible format version, or is not ours at all."""

    def __init__(self, path: str, found: object, expected: object) -> None:
        super().__init__(f"{path}: format version {found!r}, this build reads {expected!r}")
        self.path = path


class SeqOrderError(LsmError):
    """`append` was given a sequence number that does not increase."""


class RetentionError(LsmError):
    """An as-of read, rollback or snapshot asked for a seq older than the retention horizon."""

    def __init__(self, seq: int, horizon: int) -> None:
        super().__init__(f"seq {seq} is older than the retention horizon {horizon}: its versions were compacted away")
        self.seq = seq
        self.horizon = horizon


class LookupTooDearError(LsmError):
    """A `get` given `max_decode` would have decoded more of a run than that (its value column,
    or an append's run whole, not decoded before): the caller reads the state another way."""

    def __init__(self, path: str, nbytes: int, limit: int) -> None:
        super().__init__(f"a look-up in {path} would decode {nbytes:,} bytes of a run (max_decode {limit:,})")
        self.nbytes = nbytes


class KeyEncodingError(LsmError):
    """A key is not of a type the store can order (None, bool, int64, float, str, bytes, tuples)."""


class ValueEncodingError(LsmError):
    """A value of an append cannot be stored: its type has no encoding (FORMAT.md)."""

    def __init__(self, where: str, state: object, key: object, value: object, cause: BaseException) -> None:
        super().__init__(f"{where}: the value of key {key!r:.60} cannot be stored: {cause}")
        self.state = state
        self.key = key
        self.type_name = type(value).__name__
        self.cause = cause


class PersistError(LsmError):
    """The background persister failed to write a tier; nothing durable was lost, it retries."""

    def __init__(self, level: str, path: str, cause: BaseException) -> None:
        super().__init__(f"persisting to the {level} tier failed at {path}: {cause}")
        self.level = level
        self.path = path
        self.cause = cause


class FencedError(LsmError, PermissionError):
    """A write to the remote tier refused by the tier's fence (`RemoteTier.fence`): the writer
    may no longer change the tier (a process that was replaced by another). The persister
    counts it as a failed step and tries again; nothing durable is lost."""


class StoreClosedError(LsmError):
    """The store was closed (or abandoned by a simulated crash)."""
