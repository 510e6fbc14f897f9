"""Sources, sinks and bad input through real runs on embedded Spark."""

from __future__ import annotations

import glob
import json
import os
import socket
import threading

import pytest

import nosync as ns
from nosync.errors import RunFailed

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINES = os.path.join(HERE, "pipelines")


def write_events(path, n_good: int, bad_at: set[int]) -> tuple[dict, list[int]]:
    totals: dict = {}
    bad_offsets = []
    offset = 0
    with open(path, "wb") as f:
        for i in range(n_good + len(bad_at)):
            if i in bad_at:
                line = b'{"user": "u1", "amount": oops}\n'
                bad_offsets.append(offset)
            else:
                user = f"u{i % 7}"
                amount = i % 13
                totals[user] = totals.get(user, 0) + amount
                line = json.dumps({"user": user, "amount": amount}).encode() + b"\n"
            f.write(line)
            offset += len(line)
    return totals, bad_offsets


@pytest.mark.parametrize("workers", [2])
def test_jsonl_bad_records_go_to_the_dead_letter_file(spark, tmp_path, workers):
    totals, bad_offsets = write_events(tmp_path / "events.jsonl", 500, {17, 250})
    kv = tmp_path / "kv"
    result = ns.run(
        os.path.join(PIPELINES, "jsonl_to_leveldb.py"),
        workers=workers,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        epoch_records=64,
        params={"input": str(tmp_path / "events.jsonl"), "output": str(tmp_path / "out"), "kv": str(kv)},
    )
    assert ns.sinks.LevelDB(str(kv)).read_committed() == totals
    letters = []
    for path in glob.glob(os.path.join(result.run_dir, "dead-letter-w*.jsonl")):
        with open(path, encoding="utf-8") as f:
            letters.extend(json.loads(line) for line in f)
    assert sorted(x["position"]["byte"] for x in letters) == bad_offsets
    assert all(x["file"] == str(tmp_path / "events.jsonl") for x in letters)
    assert result.summary["dead_letters"] == 2


def test_on_bad_record_fail_names_file_and_position(spark, tmp_path):
    _, bad_offsets = write_events(tmp_path / "events.jsonl", 50, {20})
    with pytest.raises(RunFailed) as e:
        ns.run(
            os.path.join(PIPELINES, "jsonl_to_leveldb.py"),
            workers=2,
            spark=spark,
            run_dir=str(tmp_path / "run"),
            on_bad_record="fail",
            params={
                "input": str(tmp_path / "events.jsonl"),
                "output": str(tmp_path / "out"),
                "kv": str(tmp_path / "kv"),
            },
        )
    msg = str(e.value)
    assert "events.jsonl" in msg and str(bad_offsets[0]) in msg, msg


def collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def test_tcp_source_and_iterate(spark, tmp_path):
    numbers = list(range(2, 400))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.sendall("".join(f"{n}\n" for n in numbers).encode())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        ns.run(
            os.path.join(PIPELINES, "tcp_collatz.py"),
            workers=2,
            spark=spark,
            run_dir=str(tmp_path / "run"),
            epoch_records=50,
            params={"port": str(port), "output": str(tmp_path / "out")},
        )
    finally:
        server.close()
    got = sorted(tuple(r) for r in ns.sinks.Files(str(tmp_path / "out")).read_committed())
    assert got == sorted((n, collatz_steps(n)) for n in numbers)


def test_records_too_large_for_one_frame_cross_an_exchange(spark, tmp_path):
    """A buffer of 1024 records of 150,000 characters (150 MB) does not fit in one frame (64
    MiB at most): it goes in several, and every record arrives once."""
    records, size = 3000, 150_000
    ns.run(
        os.path.join(PIPELINES, "big_records.py"),
        workers=2,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        params={"records": str(records), "size": str(size), "output": str(tmp_path / "out")},
    )
    got = ns.sinks.Files(str(tmp_path / "out" / "chars")).read_committed()
    assert len(got) == records
    # the running count of each key ends at its 60 records' characters
    final: dict = {}
    for k, n in got:
        final[k] = max(final.get(k, 0), n)
    assert final == {str(k): 60 * size for k in range(50)}
