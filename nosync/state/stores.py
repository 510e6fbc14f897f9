"""The `lsm` stores of a worker: opened to write (waiting for a killed attempt's lock), opened
to read, and a keyed operator's state loaded from one."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import lsm
from nosync.errors import RunFailed
from nosync.runtime.keyed import JoinOp

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

LOCK_WAIT_S = 30.0
"""How long a restarting worker waits for the store lock of a previous attempt to go."""


def read_store(path: str) -> Any:
    """Opens the `lsm` store at `path` (a run's, or a copy of it) only to read it: its persister
    neither merges its runs (so no retention applies) nor uploads its log to the remote tier."""
    return lsm.Store(path, budget=0, uploads=False)


def remote_of(path: str) -> str:
    """Where the remote tier of the store at `<run dir>/state/w<i>/<name>` lives:
    `<run dir>/remote/w<i>/<name>`, outside the worker's local root `state/w<i>` (what a lost
    machine takes with it)."""
    head, name = os.path.split(os.path.abspath(path))
    state, wdir = os.path.split(head)
    return os.path.join(os.path.dirname(state), "remote", wdir, name)


def open_store(worker: Worker, path: str, what: str, **options: Any) -> Any:
    """Opens the `lsm` store at `path` for `worker`, waiting (with heartbeats) while the
    process of an attempt being killed still holds its lock; `what` names it in errors. A new
    store keeps its remote tier outside the worker's local root (`remote_of`); an existing one
    where its manifest says (a copy made by a tool reads its original's)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    if not os.path.exists(os.path.join(path, "MANIFEST")):
        options.setdefault("remote", remote_of(path))
    while True:
        try:
            return lsm.Store(path, **options)
        except lsm.StoreLockedError as e:
            if time.monotonic() > deadline:
                raise RunFailed(f"worker {worker.index}: {what}: {e}") from e
            worker.keepalive()
            time.sleep(0.1)
        except lsm.LsmError as e:
            raise RunFailed(f"worker {worker.index}: {what}: {e}") from e


def load_keyed(op: Any, store: Any, prefix: Any, as_of: int | None = None) -> None:
    """Gives keyed operator `op` the state held under `prefix` of `store` as it stood after seq
    `as_of` (None: the last), all of it at once."""
    state = store.load(prefix, as_of=as_of)
    if isinstance(op, JoinOp):
        op.restore_increments(state)
    else:
        op.restore_state(state)
