"""The PySpark daemon of nosync's executors (`spark.python.daemon.module`).

PySpark's daemon forks one process per task, and each imports its worker code after the fork:
pyspark's worker module, then nosync's runtime, the state store, pyarrow and LevelDB, about a
quarter of a second. A worker that Spark's retry starts after a failure pays that before it can
register. This daemon imports them once, before it forks, so every task starts with them loaded
(shared by the fork, copied on write), then runs PySpark's own daemon loop. It also builds one
Arrow table: pyarrow imports pandas (about a quarter of a second more) the first time a table is
made from Python lists, which a Parquet sink's first write would otherwise pay inside the run.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet  # noqa: F401
import pyspark.worker  # noqa: F401 - loaded before the fork: see above
from pyspark import daemon

import nosync.modes.abs  # noqa: F401
import nosync.modes.nosync.hooks  # noqa: F401
import nosync.modes.nosync.recovery  # noqa: F401
import nosync.modes.replay  # noqa: F401
import nosync.runtime.worker  # noqa: F401

pa.table({"key": pa.array([0]), "value": pa.array([0])})

if __name__ == "__main__":
    daemon.manager()
