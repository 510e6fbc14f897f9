"""The `lsm` stores of a worker: opened to write (waiting for a killed attempt's lock), opened
to read, and a keyed operator's state loaded from one."""

from __future__ import annotations

import os
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import lsm
from lsm.files import copy_store
from nosync import storage
from nosync.errors import RunFailed
from nosync.runtime.heap import build_long_lived
from nosync.runtime.keyed import JoinOp

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

LOCK_WAIT_S = 30.0
"""How long a restarting worker waits for the store lock of a previous attempt to go."""


def read_store(path: str) -> Any:
    """Opens the `lsm` store at `path` (a run's, or a copy of it) only to read it: its persister
    neither merges its runs (so no retention applies) nor uploads its log to the remote tier."""
    return lsm.Store(path, budget=0, uploads=False)


def open_store(worker: Worker, name: str, what: str, **options: Any) -> Any:
    """Opens worker `worker`'s `lsm` store `name` in its local root (`Places.store`),
    waiting (with heartbeats) while the process of an attempt being killed still holds its
    lock; `what` names it in errors. A new store that uploads (`uploads=True`: the level a
    snapshot waits for is the remote tier) keeps its remote tier on the run's shared tier
    (`Places.store_remote`), so that a worker on another host restores from it when its own
    local root is gone: an empty directory opened with it is rebuilt from the remote tier. An
    existing store keeps the remote tier its manifest names. Its remote tier is fenced by the
    worker's lease (`Links.fence`): a replaced attempt that wakes writes nothing there."""
    places = worker.places
    path = places.store(worker.index, name)
    deadline = time.monotonic() + LOCK_WAIT_S
    if options.get("uploads") and not os.path.exists(os.path.join(path, "MANIFEST")):
        options.setdefault("remote", places.store_remote(worker.index, name))
    while True:
        try:
            store = lsm.Store(path, **options)
        except lsm.StoreLockedError as e:
            if time.monotonic() > deadline:
                raise RunFailed(f"worker {worker.index}: {what}: {e}") from e
            worker.keepalive()
            time.sleep(0.1)
        except lsm.LsmError as e:
            raise RunFailed(f"worker {worker.index}: {what}: {storage.redact(str(e))}") from e
        else:
            store.remote.fence = partial(worker.fence, "writes")
            return store


def put_store(path: str, where: str) -> None:
    """A copy at `where` (a path or a URI, `storage`) of the closed store (or tree of stores)
    at `path`, for a task on another host to open (`get_store`)."""
    if storage.is_local(where):
        copy_store(path, storage.local_path(where))
    else:
        storage.upload_tree(path, where, skip=("LOCK",))


def get_store(where: str, path: str) -> None:
    """A copy at the local `path` of the store (or tree of stores) `put_store` left at
    `where`, to open in its place."""
    if storage.is_local(where):
        copy_store(storage.local_path(where), path)
    else:
        storage.download_tree(where, path)


def load_keyed(op: Any, store: Any, prefix: Any, as_of: int | None = None) -> None:
    """Gives keyed operator `op` the state held under `prefix` of `store` as it stood after seq
    `as_of` (None: the last), all of it at once."""
    with build_long_lived():
        state = store.load(prefix, as_of=as_of)
        if isinstance(op, JoinOp):
            op.restore_increments(state)
        else:
            op.restore_state(state)
