"""A run's options: one frozen dataclass, validated once, read by the CLI (which makes its
flags from the fields), the runner, and both halves of every mode.

Each field's metadata says what `nosync run --help` shows (`help`), the least value a number
takes (`min`), the values a string takes (`choices`), and whether the CLI offers it at all
(`cli`). A mode's worker half gets the options over the wire as a plain map (`to_wire`,
`from_wire`), so no default is written twice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from nosync.errors import NosyncError

HEARTBEAT_MS = 50
"""How often a worker beats (from a thread of its own, whatever its loop is doing)."""
FAILURE_TIMEOUT_MS = 1500
"""The default --failure-timeout-ms (`nosync experiment detection` measures the choice: see
docs/performance.md)."""

MAX_DEAD_LETTERS = 10_000
"""The default --max-dead-letters: the dead letters a worker keeps (and the driver keeps of it)."""
MAX_PERSIST_MS = 5_000
"""The default --max-persist-ms: the longest nosync's budget stretches the snapshot interval to."""

TIERS = ("disk", "remote", "replicated")
"""Where a snapshot must be durable before it counts: the worker's local disk, the remote
tier, or the memory of --replicas peers (mode nosync)."""


def _opt(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class RunOptions:
    """Everything `nosync run` takes beside the pipeline file; see each field's help."""

    mode: str = _opt("none", "The fault-tolerance mode.")
    workers: int = _opt(2, "Worker tasks, each running one instance of every operator.", min=1, short="-w")
    master: str | None = _opt(None, "Spark master URL (default: embedded local[W,F]; 2W slots in mode replay).")
    run_dir: str | None = _opt(
        None,
        "The driver's run directory: events, summary, metrics (default: runs/<pipeline name>-<YYYYmmdd-HHMMSS>-<4 hex "
        "digits of the run's id> under the current directory).",
    )
    remote: str | None = _opt(
        None,
        "The shared tier, any pyarrow.fs URI (s3://bucket/prefix?endpoint_override=..., hdfs://, file://) or a path "
        "every host shares: abs checkpoints, nosync's remote tier and what the tools read, under URI/<run name> "
        "(default: the run directory, which only an embedded run's workers reach).",
    )
    local_dir: str | None = _opt(
        None,
        "Where each worker keeps its stores on its own host, under DIR/<run name>/w<i> (default: <run dir>/state "
        "embedded, else the executor's Spark local directory).",
    )
    driver_host: str | None = _opt(
        None,
        "The address the executors reach the driver at: Spark's driver and the coordinator (default: loopback "
        "embedded, else this host's address toward the master).",
    )
    epoch_records: int | None = _opt(None, "Cut epochs every N records per source partition (default 10000).", min=1)
    epoch_ms: int | None = _opt(None, "Cut epochs every MS milliseconds instead.", min=1)
    batch_size: int = _opt(1024, "Records a source reads per step.", min=1)
    linger_ms: int = _opt(5, "How long an exchange buffer waits to fill before it is sent.", min=0)
    max_rounds: int | None = _opt(
        None,
        "Rounds a loop may go for one epoch before the run fails, naming the loop (default: unlimited; "
        "iterate's max_iterations, when given, is the loop's own bound).",
        min=1,
    )
    on_bad_record: str = _opt(
        "deadletter",
        "A record a source cannot parse: to the run's dead-letter file, or fail the run.",
        choices=("deadletter", "fail"),
    )
    max_dead_letters: int | None = _opt(
        MAX_DEAD_LETTERS,
        "Dead letters a worker may have; its next one fails the run, with the count (each is kept in memory "
        "to be written once).",
        min=1,
    )
    duration: float | None = _opt(
        None,
        "Stop the run cleanly after S seconds, as `nosync stop` does: its sources stop at an epoch boundary, "
        "everything before it is committed and a last checkpoint or snapshot taken (--resume reads on).",
    )
    checkpoint_ms: int = _opt(1000, "abs: checkpoint interval.", min=1)
    checkpoint_tier: str = _opt(
        "disk",
        "abs, nosync: where a snapshot must be durable before it counts: the local disk, the remote tier, or "
        "(nosync) the memory of --replicas peers.",
        choices=TIERS,
    )
    replicas: int | None = _opt(
        None,
        "nosync: peers that hold a copy of each worker's store in memory (the replicated level; default: 1 "
        "with --checkpoint-tier replicated, else 0).",
        min=0,
    )
    replica_memory_mb: int = _opt(
        1024, "nosync: MB of copies of other workers' stores a worker holds at most (the replicated level).", min=1
    )
    max_concurrent_checkpoints: int = _opt(1, "abs: checkpoints in flight at once.", min=1)
    checkpoint_timeout_ms: int = _opt(60_000, "abs: a checkpoint not complete by then is aborted.", min=1)
    max_restarts: int | None = _opt(None, "Recoveries a run survives before it fails (default: unlimited).", min=0)
    standbys: int = _opt(
        0,
        "Spare tasks started with the run: each registers, holds no partition and waits; a worker lost or "
        "suspected is replaced by one (on another host where one is) at once, without waiting for Spark's retry.",
        min=0,
    )
    failure_timeout_ms: int = _opt(
        FAILURE_TIMEOUT_MS,
        "A worker silent this long is suspected: taken for lost, and its task killed through Spark (at least 3 "
        f"heartbeats of {HEARTBEAT_MS} ms).",
    )
    suspect_kill: str = _opt(
        "process",
        "How a suspected worker is ended: 'process' kills its process at once when the run is embedded (its "
        "executors are processes of this host) and asks Spark to kill its task attempt; 'spark' only asks Spark, "
        "as on a cluster, where a process that only paused may wake before Spark's kill reaches it (a zombie, "
        "fenced: it commits and writes nothing).",
        choices=("process", "spark"),
    )
    persist_ms: int = _opt(
        200,
        "nosync: how often each worker snapshots its state at most (alone, no barrier); the budget stretches it.",
        min=1,
    )
    max_persist_ms: int | None = _opt(
        None,
        f"nosync: the longest the budget stretches the snapshot interval to (default: {MAX_PERSIST_MS}, or "
        "--persist-ms when longer): past it a snapshot is taken whatever it costs, so the span a recovery "
        "re-executes stays bounded as the state grows (--persist-ms here: a fixed interval).",
        min=1,
    )
    persist_budget: float = _opt(
        0.05,
        "The share of a worker's time its persistence may take, in (0, 1]: its stores' merges (abs, nosync) are held"
        " to it; past it, nosync's levels beyond --checkpoint-tier fall behind (remote, disk indexing, replicated)"
        " and its snapshots come less often.",
    )
    max_unpersisted_mb: int = _opt(
        256, "nosync: bytes appended and not yet durable (snapshots, lineage points) above which sources wait.", min=1
    )
    max_output_log_mb: int = _opt(
        64, "nosync: output-log MB held in memory; past it, the oldest frames go to a local spill file.", min=1
    )
    max_concurrent_snapshots: int = _opt(
        1, "nosync: snapshots being persisted at once (not yet durable); the next waits for one to be done.", min=1
    )
    replay_threshold_records: int | None = _opt(
        None,
        "nosync: a recovery whose span to re-execute holds more records hands it to a Spark batch job, "
        "parallel over keys (default: never).",
        min=1,
    )
    resume: bool = _opt(
        False,
        "Continue the run in --run-dir (abs: its last completed checkpoint; nosync: every worker's last snapshot).",
    )
    params: Mapping[str, Any] = field(default_factory=dict, metadata={"cli": False})
    """The pipeline's parameters (`build(args)`), `-p KEY=VALUE` on the command line."""
    timeout_s: float | None = field(default=None, metadata={"cli": False})
    """Fail the run after this long (tests and benchmarks)."""
    latency_from_s: float | None = field(default=None, metadata={"cli": False})
    """Latency counts only the records due (or read) this long after the source clock started:
    a benchmark's steady window."""
    slow_worker: tuple[int, int] | None = field(default=None, metadata={"cli": False})
    """(worker, ms): a straggler for benchmarks, its sources waiting after every batch."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", dict(self.params or {}))
        if self.slow_worker is not None:
            object.__setattr__(self, "slow_worker", tuple(self.slow_worker))
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            least = f.metadata.get("min")
            if least is not None and value < least:
                raise NosyncError(f"{flag(f.name)} must be at least {least}, got {value}")
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise NosyncError(f"{flag(f.name)} is one of {', '.join(choices)}, not {value!r}")
        if self.failure_timeout_ms < 3 * HEARTBEAT_MS:
            raise NosyncError(
                f"--failure-timeout-ms must be at least {3 * HEARTBEAT_MS} (3 heartbeats of {HEARTBEAT_MS} ms: one "
                f"late beat must not make a suspicion), got {self.failure_timeout_ms}"
            )
        if self.standbys and self.mode == "none":
            raise NosyncError(
                f"--standbys {self.standbys}: mode none does not recover (a lost worker fails the run); standbys "
                "replace lost workers in modes abs, nosync and replay"
            )
        if self.duration is not None and not self.duration > 0:
            raise NosyncError(f"--duration is the seconds the run lasts before it stops, > 0, not {self.duration}")
        if self.epoch_records is not None and self.epoch_ms is not None:
            raise NosyncError("give --epoch-records or --epoch-ms, not both")
        if self.resume and not self.run_dir:
            raise NosyncError("--resume needs --run-dir: the run directory to continue")
        if not 0 < self.persist_budget <= 1:
            raise NosyncError(
                f"--persist-budget is the share of a worker's time its persistence may take, in (0, 1], "
                f"not {self.persist_budget}"
            )
        if self.max_persist_ms is not None and self.max_persist_ms < self.persist_ms:
            raise NosyncError(
                f"--max-persist-ms {self.max_persist_ms} is less than --persist-ms {self.persist_ms}: the budget "
                "stretches the snapshot interval from --persist-ms up to --max-persist-ms"
            )
        if self.replay_threshold_records is not None and self.mode != "nosync":
            raise NosyncError(
                f"--replay-threshold-records is for mode nosync (a recovery's span re-executed by a Spark "
                f"batch job), not mode {self.mode}"
            )
        if self.replicas is not None and self.replicas >= self.workers:
            raise NosyncError(
                f"--replicas {self.replicas} needs more workers than replicas: each copy goes to another worker, "
                f"and there are --workers {self.workers}"
            )
        if self.replicas and self.mode != "nosync":
            raise NosyncError(f"--replicas is for mode nosync (the replicated level), not mode {self.mode}")
        if self.checkpoint_tier == "replicated":
            if self.mode == "abs":
                raise NosyncError(
                    f"--checkpoint-tier replicated is mode nosync's level (copies in peers' memory); mode "
                    f"{self.mode} takes disk or remote"
                )
            if self.replicas == 0:
                raise NosyncError("--checkpoint-tier replicated needs --replicas 1 or more")
        if self.remote is not None and not self.remote.strip():
            raise NosyncError("--remote is empty: give a pyarrow.fs URI or a path every host shares")
        if self.mode == "replay" and self.epoch_ms is not None:
            raise NosyncError(
                "mode replay recomputes lost state epoch by epoch from the sources: cut epochs by records "
                "(--epoch-records), not by time (--epoch-ms)"
            )

    @property
    def replica_count(self) -> int:
        """The peers that hold a copy of each worker's store (0: no replicated level)."""
        return replica_count(self.checkpoint_tier, self.replicas)

    @property
    def persist_bound_ms(self) -> int:
        """The longest nosync's snapshot interval is stretched to (`max_persist_ms`)."""
        return self.max_persist_ms if self.max_persist_ms is not None else max(MAX_PERSIST_MS, self.persist_ms)

    def but(self, **changes: Any) -> RunOptions:
        """These options with `changes`, validated again; a name that is no option is an error
        naming it."""
        names = {f.name for f in fields(self)}
        unknown = sorted(k for k in changes if k not in names)
        if unknown:
            raise NosyncError(f"unknown run option '{unknown[0]}'; options: {', '.join(sorted(names))}")
        return replace(self, **changes)

    def to_wire(self) -> dict:
        """The options as a msgpack-able map (what a worker gets in its spec)."""
        d = asdict(self)
        d["params"] = dict(self.params)
        d["slow_worker"] = list(self.slow_worker) if self.slow_worker else None
        return d

    @classmethod
    def from_wire(cls, d: Mapping[str, Any] | None) -> RunOptions:
        """The options a map from `to_wire` holds (a partial map: defaults for the rest); a key
        that is no option is an error naming it."""
        return cls().but(**(d or {}))


def replica_count(tier: str | None, replicas: int | None) -> int:
    """The peers that hold a copy of each worker's store with `--checkpoint-tier tier` and
    `--replicas replicas` (None: not given, one on the replicated tier, else none)."""
    if replicas is not None:
        return replicas
    return 1 if tier == "replicated" else 0


def flag(name: str) -> str:
    """The command-line flag of option `name`."""
    return "--" + name.replace("_", "-")


def cli_fields() -> list:
    """The fields `nosync run` offers as flags, in declaration order."""
    return [f for f in fields(RunOptions) if f.metadata.get("cli", True)]


def default_of(f: Any) -> Any:
    """A field's default value."""
    return f.default_factory() if f.default is MISSING else f.default
