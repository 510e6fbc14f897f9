"""`nosync demo`: the story of the project in one command; `nosync lsm-demo`: a tour of the state store."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import click

from cli.common import spark_output_to


@click.command("demo")
@click.option("--out", type=click.Path(file_okay=False), default="runs/demo", show_default=True)
@click.option("--records", type=click.IntRange(min=100_000), default=2_000_000, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=100_000, show_default=True)
def demo_cmd(out: str, records: int, keys: int) -> None:
    """Run keyed_count under none, abs and nosync; kill a worker in the two fault-tolerant
    runs; show that their committed output is exactly-once, a side-by-side table and a figure.
    Spark's own output goes to OUT/spark.log."""
    import time

    from experiments import demo
    from nosync.errors import NosyncError

    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    log = os.path.join(out, "spark.log")
    t0 = time.monotonic()
    click.echo(f"nosync demo: three runs on an embedded Spark (its own output goes to {log})")
    failed = None
    with spark_output_to(log):
        try:
            results = demo.run(out, records, keys, say=click.echo)
        except (NosyncError, AssertionError) as e:
            failed = str(e)
    if failed is not None:
        click.echo(f"error: {failed} (Spark's output: {log})", err=True)
        sys.exit(1)
    click.echo("")
    click.echo(demo.table(results))
    with open(os.path.join(out, "demo.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    png = os.path.join(out, "demo.png")
    demo.figure(out, results, png)
    click.echo("")
    click.echo(f"figure: {png}")
    click.echo(f"runs: {out}/none, {out}/abs, {out}/nosync (try `nosync inspect {out}/nosync`)")
    click.echo(f"{time.monotonic() - t0:.0f} s")
    if any(r["verdict"] not in ("reference", "exactly-once") for r in results.values()):
        sys.exit(1)


@click.command("lsm-demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default=None,
    help="State directory (default: a temporary one, removed after).",
)
def lsm_demo(directory: str | None) -> None:
    """A tour of the versioned state store: append, as-of reads, crash, rollback, compaction."""
    import lsm

    path = directory or tempfile.mkdtemp(prefix="nosync-demo-")
    shutil.rmtree(path, ignore_errors=True)
    say = click.echo
    words = "the quick brown fox jumps over the lazy dog the end".split()
    try:
        store = lsm.Store(path, retention=100, uploads=True)
        counts: dict[str, int] = {}
        for seq, word in enumerate(words):
            counts[word] = counts.get(word, 0) + 1
            store.append(seq, {"counts": {word: counts[word]}})
        say(f"appended {len(words)} runs (seqs 0..{store.last_seq}) to {path}")
        say(f"  count of 'the' now: {store.get('counts', 'the')}, as of seq 3: {store.get('counts', 'the', as_of=3)}")
        durable = store.flush("disk")
        say(f"  durable on disk up to seq {durable}; remote up to seq {store.durable('remote')}")
        store.append(store.last_seq + 1, {"counts": {"the": 99, "dog": lsm.TOMBSTONE}})
        say("appended seq 11 (the=99, delete dog), then a simulated crash before it was flushed")
        store.abandon()
        store = lsm.Store(path, retention=2, uploads=True)
        say(
            f"  reopened: last seq {store.last_seq}, the={store.get('counts', 'the')}, dog={store.get('counts', 'dog')}"
        )
        store.rollback(5)
        say(f"rolled back to seq 5: {store.load('counts')}")
        store.flush("remote")
        report = store.compact()
        say(
            f"merged up to seq {report['horizon']}: {report['merges']} merges, "
            f"runs now {store.runs('counts')} ((first seq, last seq, keys) each)"
        )
        sizes = store.disk_bytes()
        say(f"  bytes on disk: LevelDB {sizes['disk']}, log {sizes['log']}, remote {sizes['remote']}")
        store.close()
        say("closed; try `nosync bench lsm` for the performance figures")
    finally:
        if directory is None and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
