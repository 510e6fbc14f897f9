"""The Spark task of a worker: the function the runner maps over W partitions."""

from __future__ import annotations

import logging
from typing import Any

from nosync.modes import worker_hooks
from nosync.options import RunOptions
from nosync.runtime.worker import Worker


def worker_main(spec: dict, index: int, _iterator: Any) -> list:
    """Runs worker `index` of the run described by `spec`, with its mode's hooks; Spark's
    attempt number tells a restart (attempt > 0) from a first start."""
    from pyspark import TaskContext  # lazy: pyspark costs ~1 s to import; `import nosync` need not pay it

    ctx = TaskContext.get()
    attempt = ctx.attemptNumber() if ctx is not None else 0
    logging.basicConfig(level=logging.WARNING)
    hooks = worker_hooks(spec["mode"], RunOptions.from_wire(spec["options"]))
    worker = Worker(index, attempt, spec, hooks)
    worker.task_id = ctx.taskAttemptId() if ctx is not None else -1
    return [worker.run()]
