"""The exceptions of the `nosync` package.

`PipelineError` names the operator and the file:line where the user declared it, so a bad
pipeline is reported where it was written, not where the engine noticed.
"""

from __future__ import annotations


class NosyncError(Exception):
    """Base of every error the engine raises."""


class PipelineError(NosyncError):
    """A pipeline that cannot run as built."""

    def __init__(self, message: str, operator: str | None = None, where: str | None = None) -> None:
        prefix = ""
        if operator:
            prefix = f"operator '{operator}'"
            if where:
                prefix += f" (declared at {where})"
            prefix += ": "
        super().__init__(prefix + message)
        self.operator = operator
        self.where = where


class FrameError(NosyncError):
    """A malformed frame on a channel: the connection that sent it is closed."""


class AuthError(NosyncError):
    """A connection that did not prove knowledge of the run's secret."""


class PeerLost(NosyncError):
    """A peer worker that could not be reached while a generation was set up."""


class RunFailed(NosyncError):
    """A run that could not complete (a worker died in mode `none`, a user function raised);
    `run_dir`: the run directory, when the run had one."""

    def __init__(self, message: str, run_dir: str | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


class Replaced(NosyncError):
    """This worker's attempt was suspected and replaced while it hung or paused: a zombie,
    which stops without touching anything of the run's."""


class BadRecord(NosyncError):
    """An input record that cannot be parsed; goes to the dead-letter file or fails the run."""

    def __init__(self, message: str, source: str, position: object) -> None:
        super().__init__(f"{source} at {position}: {message}")
        self.source = source
        self.position = position
