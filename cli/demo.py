"""`nosync lsm-demo`: a tour of the state store."""

from __future__ import annotations

import os
import shutil
import tempfile

import click


@click.command("lsm-demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default=None,
    help="State directory (default: a temporary one, removed after).",
)
def demo(directory: str | None) -> None:
    """A tour of the versioned state store: append, as-of reads, crash, rollback, compaction."""
    import lsm

    path = directory or tempfile.mkdtemp(prefix="nosync-demo-")
    shutil.rmtree(path, ignore_errors=True)
    say = click.echo
    words = "the quick brown fox jumps over the lazy dog the end".split()
    try:
        store = lsm.Store(path, retention=100)
        counts: dict[str, int] = {}
        for seq, word in enumerate(words):
            counts[word] = counts.get(word, 0) + 1
            store.append(seq, [(word, counts[word])])
        say(f"appended {len(words)} batches (seqs 0..{store.last_seq}) to {path}")
        say(f"  count of 'the' now: {store.get('the')}, as of seq 3: {store.get('the', as_of=3)}")
        durable = store.flush("disk")
        say(f"  durable on disk up to seq {durable}; remote up to seq {store.durable('remote')}")
        store.append(store.last_seq + 1, [("the", 99), ("dog", lsm.TOMBSTONE)])
        say("appended seq 11 (the=99, delete dog), then a simulated crash before it was flushed")
        store.abandon()
        store = lsm.Store(path, retention=2)
        say(f"  reopened: last seq {store.last_seq}, the={store.get('the')}, dog={store.get('dog')}")
        store.rollback(5)
        say(f"rolled back to seq 5: {dict(store.scan())}")
        store.flush("remote")
        report = store.compact()
        say(f"compacted up to seq {report['horizon']}: {report['versions_dropped']} old versions dropped")
        sizes = store.disk_bytes()
        say(f"  bytes on disk: LevelDB {sizes['disk']}, log {sizes['log']}, remote {sizes['remote']}")
        store.close()
        say("closed; try `nosync bench lsm` for the performance figures")
    finally:
        if directory is None and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
