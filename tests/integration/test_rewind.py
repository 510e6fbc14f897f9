"""`nosync rewind` of keyed_count, whose run was in mode replay (epochs aligned).

keyed_count over W = 2 generator partitions: partition p holds records p, p + 2, ..., its
j-th record is in epoch j // epoch_records, and record i counts for key str(i % keys). With
an even number of keys, all of a key's records are in one partition, in order, so its
running counts are 1, 2, ..., n, and the count of a record of epoch e is known in advance.

- rewound to epoch E with the same pipeline: the new output equals the run's, epoch by epoch
  (`nosync diff` finds nothing), and the run directory is not changed;
- rewound with a changed aggregate (+2 per record): the diff starts at epoch E and nothing
  before it differs; the new output is exactly what the definition gives (counts up to the
  end of epoch E - 1 as before, then +2 per record);
- errors: an unknown operator, a source, an epoch after the run, another pipeline, an
  operator outside the cone that changed, a run directory that is not one.

The same run in mode abs, checkpointing every 50 ms, is rewound from its checkpoints: the
newest one whose cut lies before epoch E (found here from the checkpoint files themselves),
its keyed state read from copies of the run's stores, the sources read only after its cut.
The whole output must equal the run's (the same pipeline) or the definition (the changed
aggregate): a count restored wrongly from the checkpoint changes every later count of its
key. An epoch before the first checkpoint is refused with `--restore-from checkpoint`, and
recomputed from the sources, saying so, by default.

The same run in mode nosync, each worker snapshotting alone every 50 ms, is rewound from its
workers' own snapshots: a consistent cut of them (no snapshot consumed a frame its sender's
had not produced, checked here from the stores), its keyed state read from copies of the
workers' logs as of each snapshot's step, the frames in flight at the cut taken from the
senders' output logs. The whole output must again equal the run's or the definition: a frame
in flight lost or doubled, or a count restored as of the wrong step, changes the counts of its
keys from there on.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from support.paths import PIPELINES, ROOT, WORKLOADS
from support.runs import committed_pairs

import nosync as ns
from nosync.api.loader import load_pipeline
from nosync.errors import NosyncError, PipelineError
from nosync.spark.batch import keyed_state
from nosync.state import checkpoints
from nosync.tools.diff import diff_outputs
from nosync.tools.rewind import check_compatible, choose_start, rewind
from nosync.tools.runinfo import inspect_run
from nosync.tools.starts import find_snapshot_cut

RECORDS, KEYS, PER_EPOCH, E = 200_000, 2_000, 5_000, 10
ABS_RECORDS = 1_000_000
"""The abs run is longer, so that several of its 50 ms checkpoints fall inside its input."""


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return run_keyed_count(tmp_path_factory.mktemp("rewind"), "replay", RECORDS)


@pytest.fixture(scope="module")
def original_abs(tmp_path_factory):
    return run_keyed_count(tmp_path_factory.mktemp("rewind-abs"), "abs", ABS_RECORDS, "--checkpoint-ms", "50")


@pytest.fixture(scope="module")
def original_nosync(tmp_path_factory):
    # the whole run processes in about a second: at the default budget its snapshots stretch
    # apart to a few, and a slow machine may leave no cut with a frame in flight; at budget 1
    # each worker snapshots every 50 ms or its snapshot's cost, whichever is longer
    base = tmp_path_factory.mktemp("rewind-nosync")
    return run_keyed_count(base, "nosync", ABS_RECORDS, "--persist-ms", "50", "--persist-budget", "1")


def cuts(run_dir) -> list[tuple[int, int, int]]:
    """(checkpoint, most records read from one source partition, records read in all) of
    each checkpoint file of the run."""
    out = []
    for c in checkpoints.completed(str(run_dir)):
        body = checkpoints.read(checkpoints.path_of(str(run_dir), c))
        parts = [p for w in body["workers"].values() for p in w["ops"]["source_1"]["parts"]]
        out.append((c, max(p[2] for p in parts), sum(p[2] for p in parts)))
    return out


def expected_pairs(epoch: int, records: int = RECORDS) -> collections.Counter:
    """keyed_count's committed (key, count) pairs when each record counts 1 before `epoch` and
    2 from it on: record i is the (i // 2)-th of partition i % 2, so in epoch (i // 2) // PER_EPOCH."""
    expected: collections.Counter = collections.Counter()
    count: dict[str, int] = {}
    for i in range(records):
        k = str(i % KEYS)
        count[k] = count.get(k, 0) + (1 if (i // 2) // PER_EPOCH < epoch else 2)
        expected[(k, count[k])] += 1
    return expected


def run_keyed_count(base, mode: str, records: int, *options: str):
    run_dir, out = base / "run", base / "out"
    cmd = [sys.executable, "-m", "cli.main", "run", os.path.join(WORKLOADS, "keyed_count.py"), "--mode", mode]
    cmd += ["--workers", "2", "--epoch-records", str(PER_EPOCH), "--run-dir", str(run_dir), *options]
    cmd += ["-p", f"records={records}", "-p", f"keys={KEYS}", "-p", f"output={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, out


def load_run(run_dir) -> tuple[dict, ns.Pipeline]:
    """The run's run.json and its pipeline."""
    with open(run_dir / "run.json", encoding="utf-8") as f:
        run = json.load(f)
    return run, load_pipeline(run["pipeline_file"], run["params"])


def counts_from(run: dict, start: dict, until_epoch: int | None, spark, scratch) -> dict:
    """keyed_count's counts at the end of `until_epoch` (None: of the input), by batch jobs
    that start where `start` (`choose_start`) says."""
    got = keyed_state(
        run["pipeline_file"],
        run["params"],
        "aggregate_1",
        epoch_records=PER_EPOCH,
        until_epoch=until_epoch,
        spark=spark,
        run_dir=str(scratch),
        restore=start["restore"],
    )
    return dict(got)


def listing(d) -> dict:
    return {os.path.join(r, f): os.stat(os.path.join(r, f)).st_mtime_ns for r, _, files in os.walk(d) for f in files}


def test_rewind_with_the_same_pipeline_reproduces_the_run(spark, tmp_path, original):
    run_dir, out = original
    before = listing(run_dir)
    r = rewind(str(run_dir), "aggregate_1", E, output=str(tmp_path / "again"), spark=spark)
    assert r["cone"] == ["aggregate_1", "sink_1"] and not r["changed"] and r["by_epoch"]
    assert r["records_read"] == RECORDS
    s = diff_outputs(str(out), str(tmp_path / "again"), str(tmp_path / "d.jsonl"))
    assert (s["records_a"], s["records_b"], s["differences"]) == (RECORDS, RECORDS, 0)
    assert listing(run_dir) == before, "the rewind changed the run directory"


def test_rewind_with_a_changed_aggregate_changes_only_from_its_epoch(spark, tmp_path, original):
    run_dir, out = original
    new = tmp_path / "double"
    rewind(
        str(run_dir),
        "aggregate_1",
        E,
        pipeline_file=os.path.join(PIPELINES, "keyed_count_double.py"),
        output=str(new),
        spark=spark,
    )
    s = diff_outputs(str(out), str(new), str(tmp_path / "d.jsonl"))
    assert s["first_epoch"] == E and all(int(e) >= E for e in s["epochs"]), s["epochs"]
    assert committed_pairs(str(new)) == expected_pairs(E)


def checkpoint_and_epoch(cs: list) -> tuple[int, int, int]:
    """Two checkpoints inside the input, the second's cut inside an epoch the first's is
    before: the first checkpoint, the records read at its cut, and that epoch (checkpoint
    two read records of it: too late to start from; the first did not)."""
    pairs = [
        (a, b)
        for a, b in zip(cs, cs[1:], strict=False)
        if 0 < a[1] and b[1] < ABS_RECORDS // 2 and a[1] // PER_EPOCH < b[1] // PER_EPOCH and b[1] % PER_EPOCH
    ]
    assert pairs, f"the run took no two checkpoints inside its input in different epochs: {cs}"
    (want, _, read_before), (_, most, _) = pairs[len(pairs) // 2]
    return want, read_before, most // PER_EPOCH


def test_rewind_of_an_abs_run_starts_from_its_checkpoint(spark, tmp_path, original_abs):
    run_dir, out = original_abs
    before = listing(run_dir)
    cs = cuts(run_dir)
    want, read_before, epoch = checkpoint_and_epoch(cs)
    r = rewind(str(run_dir), "aggregate_1", epoch, output=str(tmp_path / "same"), spark=spark)
    assert r["checkpoint"] == want and f"checkpoint {want} of the run" in r["restored"], r
    assert r["records_read"] == ABS_RECORDS - read_before < ABS_RECORDS
    assert r["records_committed"] == ABS_RECORDS
    assert committed_pairs(str(tmp_path / "same")) == committed_pairs(str(out))
    new = tmp_path / "double"
    r = rewind(
        str(run_dir),
        "aggregate_1",
        epoch,
        pipeline_file=os.path.join(PIPELINES, "keyed_count_double.py"),
        output=str(new),
        spark=spark,
    )
    assert r["checkpoint"] == want and r["changed"]
    assert committed_pairs(str(new)) == expected_pairs(epoch, ABS_RECORDS)
    assert listing(run_dir) == before, "the rewind changed the run directory"
    assert not os.path.exists(tmp_path / "same" / "_rewind" / "state"), "the copies of the stores stayed"


def test_inspect_names_the_first_epoch_a_checkpoint_can_start(tmp_path, original_abs):
    run_dir, _ = original_abs
    first = inspect_run(str(run_dir))["checkpoints"]["rewind_from_epoch"]
    run, pipeline = load_run(run_dir)
    assert choose_start(str(run_dir), run, pipeline, first, str(tmp_path / "a"), "checkpoint")["checkpoint"] >= 1
    with pytest.raises(NosyncError, match=f"epoch {first - 1} is outside the run's checkpoint window"):
        choose_start(str(run_dir), run, pipeline, first - 1, str(tmp_path / "b"), "checkpoint")
    assert not os.path.exists(tmp_path / "b")


def test_a_new_sink_that_cannot_carry_the_runs_files_is_refused(spark, tmp_path, original_abs):
    run_dir, _ = original_abs
    with pytest.raises(NosyncError, match="sink 'sink_1' writes files in the run but not in the new pipeline"):
        rewind(
            str(run_dir),
            "aggregate_1",
            20,
            pipeline_file=os.path.join(PIPELINES, "keyed_count_console.py"),
            output=str(tmp_path / "c"),
            spark=spark,
            restore_from="checkpoint",
        )
    assert not os.path.exists(tmp_path / "c"), "a refused rewind left its output behind"


def test_rewind_of_an_abs_run_before_its_first_checkpoint(spark, tmp_path, original_abs):
    run_dir, out = original_abs
    assert cuts(run_dir)[0][1] > 0, "the first checkpoint's cut is at the start of the input"
    with pytest.raises(NosyncError, match="epoch 0 is outside the run's checkpoint window: no retained checkpoint"):
        rewind(str(run_dir), "aggregate_1", 0, output=str(tmp_path / "a"), spark=spark, restore_from="checkpoint")
    r = rewind(str(run_dir), "aggregate_1", 0, output=str(tmp_path / "b"), spark=spark)
    assert r["checkpoint"] is None and "recomputed from the sources" in r["restored"], r
    assert r["records_read"] == ABS_RECORDS
    assert committed_pairs(str(tmp_path / "b")) == committed_pairs(str(out))


def test_rewind_errors_name_what_is_wrong(spark, tmp_path, original):
    run_dir, _ = original
    with pytest.raises(NosyncError, match="has no operator 'nope'; operators: source_1, key_by_1, aggregate_1"):
        rewind(str(run_dir), "nope", E, output=str(tmp_path / "a"), spark=spark)
    with pytest.raises(NosyncError, match="'source_1' is a source"):
        rewind(str(run_dir), "source_1", E, output=str(tmp_path / "b"), spark=spark)
    last = (RECORDS // 2 - 1) // PER_EPOCH
    with pytest.raises(NosyncError, match=f"epoch {last + 5} is outside the run: its last committed epoch is {last}"):
        rewind(str(run_dir), "aggregate_1", last + 5, output=str(tmp_path / "c"), spark=spark)
    with pytest.raises(PipelineError, match="the new pipeline is 'random_tag', the run's is 'keyed_count'"):
        rewind(
            str(run_dir),
            "aggregate_1",
            E,
            pipeline_file=os.path.join(PIPELINES, "random_tag.py"),
            output=str(tmp_path / "d"),
            spark=spark,
        )
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "rewind", str(tmp_path), "--operator", "x", "--to-epoch", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "has no run.json" in proc.stderr, proc.stderr
    # refused before Spark started: no log of Spark's to point at
    assert "Spark's own output" not in proc.stderr, proc.stderr
    with pytest.raises(NosyncError, match="is a run in mode replay, which keeps no state to start from"):
        rewind(str(run_dir), "aggregate_1", E, output=str(tmp_path / "e"), spark=spark, restore_from="checkpoint")


def test_a_change_outside_the_cone_is_refused():
    def build(key_fn, add):
        p = ns.Pipeline("p")
        counts = p.source(ns.sources.Generator(records=10)).key_by(key_fn).aggregate(int, add)
        counts.sink(ns.sinks.Null())
        return p

    old = build(lambda k: k, lambda n, _: n + 1)
    inside = build(lambda k: k, lambda n, _: n + 2)
    outside = build(lambda k: k + "x", lambda n, _: n + 1)
    check_compatible(old, inside, {"aggregate_1", "sink_1"})
    with pytest.raises(PipelineError, match="operator 'key_by_1' is outside the rewound cone .* function `fn` changed"):
        check_compatible(old, outside, {"aggregate_1", "sink_1"})
    with pytest.raises(PipelineError, match="function `add` changed"):
        check_compatible(old, inside, {"sink_1"})


def test_state_of_an_abs_run_starts_from_its_checkpoint(spark, tmp_path, original_abs):
    """The count of key k at the end of epoch e counts the records i < 2 (e + 1) PER_EPOCH
    with i % KEYS == k (see expected_pairs). The state at the end of epoch e starts from the
    newest checkpoint whose cut lies before epoch e begins."""
    run_dir, _ = original_abs
    want, _, epoch = checkpoint_and_epoch(cuts(run_dir))
    run, pipeline = load_run(run_dir)
    start = choose_start(str(run_dir), run, pipeline, epoch, str(tmp_path / "q"))
    assert start["checkpoint"] == want
    got = counts_from(run, start, epoch, spark, tmp_path / "q")
    assert got == dict(collections.Counter(str(i % KEYS) for i in range(2 * (epoch + 1) * PER_EPOCH)))
    cli = [sys.executable, "-m", "cli.main", "state", str(run_dir), "--operator", "aggregate_1"]
    proc = subprocess.run(
        [*cli, "--as-of-epoch", str(epoch), "--key", "7"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    count = sum(1 for i in range(2 * (epoch + 1) * PER_EPOCH) if i % KEYS == 7)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"computed from checkpoint {want} of the run" in proc.stdout and f'"7": {count}' in proc.stdout, proc.stdout


def snapshot_metas(run_dir, tmp_path) -> dict[int, dict[int, dict]]:
    """Per worker, step -> metadata of each snapshot its log retains (read from a copy)."""
    import lsm
    from nosync.modes.nosync import iter_snapshots

    copy = tmp_path / "metas"
    shutil.copytree(run_dir / "state", copy, ignore=shutil.ignore_patterns("LOCK"))
    out = {}
    for w in (0, 1):
        store = lsm.Store(str(copy / f"w{w}" / "nosync"), budget=0)
        try:
            out[w] = {int(m["step"]): m for m in iter_snapshots(store)}
        finally:
            store.close()
    shutil.rmtree(copy)
    return out


def check_cut(metas: dict, steps: dict, epoch: int) -> int:
    """Asserts that the snapshots at `steps` (worker -> step) form a consistent cut before
    epoch `epoch` begins; returns the records the sources had read at it."""
    cut = {int(w): metas[int(w)][int(s)] for w, s in steps.items()}
    for a, b in ((0, 1), (1, 0)):
        assert cut[b]["consumed"].get(a, 0) <= cut[a]["produced"].get(b, 0), (a, b, steps)
    read = [part[2] for m in cut.values() for part in m["ops"]["source_1"]["parts"]]
    assert max(read) <= epoch * PER_EPOCH, (read, epoch)
    return sum(read)


def test_rewind_of_a_nosync_run_starts_from_a_cut_of_its_snapshots(spark, tmp_path, original_nosync):
    run_dir, out = original_nosync
    metas = snapshot_metas(run_dir, tmp_path)
    # a pre-commit whose snapshot never became durable leaves its files in staging: a copy
    # of a committed part, named with step 1, which every cut lies after, must not be carried
    part = sorted(n for n in os.listdir(out) if n.startswith("part-") and "-w0000-" in n)[0]
    stale = out / "_staging" / "part-0000000000-w0000-c0000000001-009.parquet"
    shutil.copy2(out / part, stale)
    before = listing(run_dir)
    # an epoch whose cut has frames in flight, which is the path to test: where snapshots fell
    # in the run decides which epochs have one, so the cuts of all epochs are looked at
    epoch, in_flight = None, 0
    copy = tmp_path / "cuts"  # opening a store rewrites its files: cuts are looked for in a copy
    shutil.copytree(run_dir / "state", copy, ignore=shutil.ignore_patterns("LOCK"))
    for e in range(60, 9, -1):
        found = find_snapshot_cut(str(copy), 2, e, PER_EPOCH)
        if "steps" not in found:
            continue
        steps = found["steps"]
        n = sum(
            metas[a][steps[a]]["produced"].get(b, 0) - metas[b][steps[b]]["consumed"].get(a, 0)
            for a, b in ((0, 1), (1, 0))
        )
        if n:
            epoch, in_flight = e, n
            break
    shutil.rmtree(copy)
    assert epoch is not None, "no cut of epochs 10 to 60 had a frame in flight: the path under test cannot run"
    same = tmp_path / "same"
    r = rewind(str(run_dir), "aggregate_1", epoch, output=str(same), spark=spark)
    assert r["start"] == "snapshots" and "the workers' own snapshots at steps" in r["restored"], r
    read = check_cut(metas, r["snapshots"], epoch)
    assert r["records_read"] == ABS_RECORDS - read < ABS_RECORDS
    assert r["records_committed"] == ABS_RECORDS
    assert committed_pairs(str(same)) == committed_pairs(str(out)), (epoch, r["snapshots"], in_flight)
    assert not os.path.exists(same / "_rewind" / "state"), "the copies of the stores stayed"
    assert r["frames_in_flight"] == in_flight, r  # data and marker frames: a nosync run sends no events
    later = epoch + epoch // 2
    r = rewind(
        str(run_dir),
        "aggregate_1",
        later,
        pipeline_file=os.path.join(PIPELINES, "keyed_count_double.py"),
        output=str(tmp_path / "double"),
        spark=spark,
        restore_from="checkpoint",
    )
    assert r["start"] == "snapshots" and r["changed"]
    check_cut(metas, r["snapshots"], later)
    assert committed_pairs(str(tmp_path / "double")) == expected_pairs(later, ABS_RECORDS)
    assert listing(run_dir) == before, "the rewind changed the run directory"
    stale.unlink()


def test_state_of_a_nosync_run_starts_from_a_cut_of_its_snapshots(spark, tmp_path, original_nosync):
    run_dir, _ = original_nosync
    epoch = ABS_RECORDS // 2 // PER_EPOCH // 3
    run, pipeline = load_run(run_dir)
    start = choose_start(str(run_dir), run, pipeline, epoch, str(tmp_path / "q"), "checkpoint")
    assert start["restore"]["kind"] == "nosync"
    check_cut(snapshot_metas(run_dir, tmp_path), start["steps"], epoch)
    got = counts_from(run, start, epoch, spark, tmp_path / "q")
    assert got == dict(collections.Counter(str(i % KEYS) for i in range(2 * (epoch + 1) * PER_EPOCH)))
    # at the end of the input: a cut before the sources read their last records, so that the
    # jobs have something to run on (a cut after it would hand back no state at all)
    start = choose_start(str(run_dir), run, pipeline, None, str(tmp_path / "e"), "checkpoint")
    assert start["restore"]["kind"] == "nosync" and start["records"] < ABS_RECORDS, start["start"]
    got = counts_from(run, start, None, spark, tmp_path / "e")
    assert got == dict(collections.Counter(str(i % KEYS) for i in range(ABS_RECORDS)))


def test_a_nosync_run_before_its_first_snapshot(tmp_path, original_nosync):
    run_dir, _ = original_nosync
    run, pipeline = load_run(run_dir)
    first = min(
        max(part[2] for part in m["ops"]["source_1"]["parts"])
        for w in snapshot_metas(run_dir, tmp_path).values()
        for m in w.values()
    )
    assert first > 0, "a worker's first snapshot comes after its first step, a read"
    with pytest.raises(NosyncError, match="epoch 0 is outside the run's snapshot window: worker . retains no snapshot"):
        choose_start(str(run_dir), run, pipeline, 0, str(tmp_path / "b"), "checkpoint")
    assert choose_start(str(run_dir), run, pipeline, 0, str(tmp_path / "c"))["restore"] is None


def test_inspect_names_the_first_epoch_a_cut_of_snapshots_can_start(tmp_path, original_nosync):
    run_dir, _ = original_nosync
    before = listing(run_dir)
    info = inspect_run(str(run_dir))
    first = info["snapshots"]["rewind_from_epoch"]
    # read from copies: opening a store itself would have LevelDB write a new log and manifest
    assert listing(run_dir) == before, "inspect changed the run directory"
    assert [s["worker"] for s in info["stores"]] == [0, 1]
    assert all(s["last_seq"] == s["disk"] > 0 and not s.get("in_use") for s in info["stores"]), info["stores"]
    run, pipeline = load_run(run_dir)
    assert first >= 1, "a worker's first snapshot comes after its first read"
    start = choose_start(str(run_dir), run, pipeline, first, str(tmp_path / "a"), "checkpoint")
    assert start["restore"]["kind"] == "nosync"
    with pytest.raises(NosyncError, match=f"epoch {first - 1} is outside the run's snapshot window"):
        choose_start(str(run_dir), run, pipeline, first - 1, str(tmp_path / "b"), "checkpoint")
    cmd = [sys.executable, "-m", "cli.main", "inspect", str(run_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"rewind     from a consistent cut of the workers' snapshots, to any epoch from {first} on" in proc.stdout
    assert listing(run_dir) == before, "inspect changed the run directory"


def test_a_run_whose_store_is_of_an_older_format_is_refused_naming_the_run_s_store(tmp_path, original_nosync):
    """A run whose worker 0 store was written by format version 2 (its manifest rewritten by
    hand, FORMAT.md's header layout): inspect and a start from its snapshots name that store's
    own manifest and the version, not the copies they read."""
    import struct

    import msgpack
    import xxhash

    src, _ = original_nosync
    run_dir = tmp_path / "old"
    shutil.copytree(src, run_dir)
    manifest = run_dir / "state" / "w0" / "nosync" / "MANIFEST"
    body = manifest.read_bytes()[24:]
    assert msgpack.unpackb(body)["store_id"], "not a manifest body"
    manifest.write_bytes(b"NSLSMMAN" + struct.pack("<IIQ", 2, len(body), xxhash.xxh3_64_intdigest(body)) + body)
    said = f"{manifest}: format version 2, this build reads 4"
    info = inspect_run(str(run_dir))
    assert [s.get("error") for s in info["stores"]] == [said, None], info["stores"]
    run, pipeline = load_run(run_dir)
    with pytest.raises(NosyncError) as ei:
        choose_start(str(run_dir), run, pipeline, None, str(tmp_path / "s"), "checkpoint")
    assert str(ei.value) == f"the stores of {run_dir} cannot be read: {said}"


@pytest.mark.soak  # the suite's time
def test_state_of_a_branch_whose_input_ended_before_the_cut(tmp_path):
    """two_branches: operator "twice" lies in stage 2, fed only by a source of 1,000 records
    that ends long before the cut; the other branch ends in stage 1. The batch jobs must still
    run stage 2's tasks and hand back its state: 10 per key of 100 keys (see the pipeline)."""
    run_dir = tmp_path / "run"
    pipeline = os.path.join(PIPELINES, "two_branches.py")
    cmd = [sys.executable, "-m", "cli.main", "run", pipeline, "--mode", "nosync", "--workers", "2"]
    cmd += ["--epoch-records", str(PER_EPOCH), "--persist-ms", "50", "--run-dir", str(run_dir)]
    cmd += ["-p", "records=2000000", "-p", f"output={tmp_path / 'out'}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = [sys.executable, "-m", "cli.main", "state", str(run_dir), "--operator", "twice"]
    proc = subprocess.run(
        [*state, "--restore-from", "checkpoint", "--limit", "0", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = dict(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))
    assert got == {str(k): 10 for k in range(100)}


LINES, LINE_EPOCH, LINE_E = 60_000, 1_000, 30
"""tcp_count reads the integers 0 .. LINES - 1 from one TCP connection, LINE_EPOCH lines per
epoch: line i is in epoch i // LINE_EPOCH and counts for key str(i % 50)."""


def serve_lines(lines: list[int]) -> tuple[socket.socket, list]:
    """A TCP server on loopback that sends `lines` to each connection, 200 every 5 ms, then
    closes it; returns the listening socket (close it to stop) and the connections served."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    served: list = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            served.append(conn)
            with conn:
                try:
                    for i in range(0, len(lines), 200):
                        conn.sendall("".join(f"{n}\n" for n in lines[i : i + 200]).encode())
                        time.sleep(0.005)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return server, served


def run_tcp_count(base, mode: str, lines: list[int], *options: str):
    server, served = serve_lines(lines)
    run_dir, out = base / "run", base / "out"
    cmd = [sys.executable, "-m", "cli.main", "run", os.path.join(PIPELINES, "tcp_count.py"), "--mode", mode]
    cmd += ["--workers", "2", "--epoch-records", str(LINE_EPOCH), "--run-dir", str(run_dir), *options]
    cmd += ["-p", f"port={server.getsockname()[1]}", "-p", f"output={out}"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        server.close()  # whatever reads the source after this cannot reach the server
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(served) == 1
    return run_dir, out


def tcp_expected(epoch: int) -> collections.Counter:
    """tcp_count's committed (key, count) pairs when each line counts 1 before `epoch` and 2
    from it on."""
    expected: collections.Counter = collections.Counter()
    count: dict[str, int] = {}
    for i in range(LINES):
        k = str(i % 50)
        count[k] = count.get(k, 0) + (1 if i // LINE_EPOCH < epoch else 2)
        expected[(k, count[k])] += 1
    return expected


def test_a_tcp_source_of_a_nosync_run_is_read_back_from_its_input_log(spark, tmp_path):
    """A TcpLines source cannot restart from a position; a nosync run logs what it read. Once
    the server is gone, a rewind and `state` read the source back from a copy of that log:
    from a cut of the snapshots and from the start of the log, with the same pipeline (the
    run's output) and a changed aggregate (the definition)."""
    run_dir, out = run_tcp_count(tmp_path, "nosync", list(range(LINES)), "--persist-ms", "50")
    assert committed_pairs(str(out)) == tcp_expected(LINES), "the run itself"
    before = listing(run_dir)
    r = rewind(str(run_dir), "aggregate_1", LINE_E, output=str(tmp_path / "same"), spark=spark)
    assert r["start"] == "snapshots" and "read back from the run's input logs" in r["restored"], r
    assert 0 < r["records_read"] < LINES
    assert committed_pairs(str(tmp_path / "same")) == tcp_expected(LINES)
    r = rewind(
        str(run_dir),
        "aggregate_1",
        LINE_E,
        pipeline_file=os.path.join(PIPELINES, "tcp_count_double.py"),
        output=str(tmp_path / "double"),
        spark=spark,
        restore_from="sources",
    )
    assert r["start"] == "sources" and r["records_read"] == LINES, r
    assert committed_pairs(str(tmp_path / "double")) == tcp_expected(LINE_E)
    assert not os.path.exists(tmp_path / "double" / "_rewind" / "inputs"), "the copies of the input logs stayed"
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "state", str(run_dir), "--operator", "aggregate_1"]
        + ["--as-of-epoch", "20", "--limit", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, *rows = proc.stdout.splitlines()
    assert head.startswith("aggregate_1: 50 keys at the end of epoch 20") and "from the run's input logs" in head, head
    got = dict(tuple(json.loads(x) for x in row.strip().split(": ")) for row in rows)
    assert got == dict(collections.Counter(str(i % 50) for i in range(21 * LINE_EPOCH)))
    assert listing(run_dir) == before, "the rewind changed the run directory"


def test_a_tcp_source_of_a_run_that_kept_no_input_log_is_refused(tmp_path):
    run_dir, _ = run_tcp_count(tmp_path, "none", list(range(2_000)))
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "rewind", str(run_dir), "--operator", "aggregate_1", "--to-epoch", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "TcpLines(127.0.0.1:" in proc.stderr and "'source_1'" in proc.stderr and "mode none" in proc.stderr
