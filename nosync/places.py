"""Where a run keeps what: the driver's run directory, each worker's local root on its own
host, and the shared tier every host (and every tool) can reach.

- **The run directory** (`--run-dir`, a path on the driver's host) holds the driver's own
  files: `run.json`, `events.jsonl`, `summary.json`, the metrics tables, the dead-letter
  files (the workers send their dead letters to the coordinator), Spark's log.
- **A worker's local root** (`<local base>/w<i>`) holds its stores, its output log's spill
  and what its sinks stage before a pre-commit: on the host the worker runs on, read by
  nobody else. The local base is `--local-dir/<run name>`, else `<run dir>/state` on an
  embedded Spark (every worker's host is the driver's), else Spark's local directory of the
  executor that runs the worker (`SPARK_LOCAL_DIRS`, `<dir>/nosync/<run name>`): a retry of
  the worker on another executor, even on the same host, starts from an empty root, and finds
  its state on the shared tier or in its peers' memory (`--checkpoint-tier remote` or
  `replicated`).
- **The shared tier** (`--remote URI/<run name>`, any `pyarrow.fs` URI; embedded, the run
  directory itself) holds what must outlive a host and what the offline tools read: the
  stores' remote tier (`remote/w<i>/<store>`), abs's checkpoint files (`checkpoints/`), the
  files batch jobs hand each other (mode replay's recomputed state, nosync's span jobs).

The run name is the run directory's name with a hash of its path (`run_name`), so a run
resumed from the same run directory finds its shared tier again, and runs in directories of
the same name elsewhere do not meet there. `Places` crosses to the workers in their spec (`to_wire`); each
worker resolves its own local root where it runs (`local_root`), since an executor's Spark
local directory is known only there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import xxhash

from nosync import storage

SHARED_STORES = "remote"
"""The folder of the shared tier that holds the stores' remote tiers, one folder per worker."""
SPARK_LOCAL = "spark"
"""`Places.local` for a worker whose local base is its executor's Spark local directory."""


@dataclass(frozen=True)
class Places:
    """A run's three places; see the module's docstring."""

    run_dir: str
    """The driver's run directory (absolute)."""
    shared: str
    """The run's shared tier: a path or URI (`storage`)."""
    local: str
    """The base of the workers' local roots: a path, or SPARK_LOCAL (resolved on each worker)."""
    run_name: str
    """The run's folder under `--remote` and `--local-dir` (`run_name`)."""

    @property
    def embedded(self) -> bool:
        """Whether the workers' local roots lie on the driver's host, in its run directory."""
        return self.local == os.path.join(self.run_dir, "state")

    def local_root(self, worker: int) -> str:
        """Worker `worker`'s local root on the host this runs on."""
        return os.path.join(self._local_base(), f"w{worker}")

    def _local_base(self) -> str:
        if self.local != SPARK_LOCAL:
            return self.local
        dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
        # Spark gives a Python task its executor's local directories; a process Spark did not
        # start (a test driving a worker by hand) has none and uses the temporary directory
        base = dirs[0] if dirs else os.environ.get("TMPDIR", "/tmp")
        return os.path.join(base, "nosync", self.run_name)

    def store(self, worker: int, name: str) -> str:
        """The directory of worker `worker`'s store `name` in its local root."""
        return os.path.join(self.local_root(worker), name)

    def store_remote(self, worker: int, name: str) -> str:
        """Where the remote tier of worker `worker`'s store `name` lives on the shared tier."""
        return storage.join(self.shared, SHARED_STORES, f"w{worker}", name)

    def shared_path(self, *parts: str) -> str:
        """A place under the run's shared tier."""
        return storage.join(self.shared, *parts)

    @property
    def shared_is_local(self) -> bool:
        """Whether the shared tier is a local path of the driver's host (an embedded run's
        default), which a worker on another host cannot reach."""
        return storage.is_local(self.shared)

    def to_wire(self) -> dict:
        """The places as a map (a worker's spec, run.json)."""
        return {"run_dir": self.run_dir, "shared": self.shared, "local": self.local, "run_name": self.run_name}

    @classmethod
    def from_wire(cls, d: dict) -> Places:
        """The places a map from `to_wire` holds."""
        return cls(str(d["run_dir"]), str(d["shared"]), str(d["local"]), str(d["run_name"]))


def run_name(run_dir: str) -> str:
    """The name of the run in `run_dir` (absolute) under `--remote` and `--local-dir`: the
    directory's name and a hash of its path, so that two runs in directories of the same name
    (`a/chaos`, `b/chaos`) do not share a folder, and a resumed run finds its own again."""
    path = run_dir.rstrip("/")
    return f"{os.path.basename(path)}-{xxhash.xxh32_hexdigest(path.encode())}"


def shared_of(run_dir: str, remote: str | None) -> str:
    """The shared tier of the run in `run_dir` (absolute) with `--remote remote` (None: not given)."""
    return storage.join(remote, run_name(run_dir)) if remote else run_dir


def places_of(run_dir: str, remote: str | None, local_dir: str | None, embedded: bool) -> Places:
    """The places of a run in `run_dir` (absolute) with `--remote remote` and `--local-dir
    local_dir`, on an embedded Spark or not."""
    name = run_name(run_dir)
    shared = shared_of(run_dir, remote)
    if local_dir:
        local = os.path.join(os.path.abspath(local_dir), name)
    elif embedded:
        local = os.path.join(run_dir, "state")
    else:
        local = SPARK_LOCAL
    return Places(run_dir, shared, local, name)


def spec_places(spec: dict) -> Places:
    """The places a worker's (or batch task's) spec names; a spec that names none (a test's
    stand-in worker) keeps everything in its run directory."""
    if "places" in spec:
        return Places.from_wire(spec["places"])
    return legacy_places(os.path.abspath(spec.get("run_dir", ".")))


def legacy_places(run_dir: str) -> Places:
    """The places of a run whose run.json names none (written before runs left one host):
    everything in its run directory."""
    return places_of(run_dir, None, None, True)
