"""A real Spark standalone cluster on loopback (a master and two one-core workers, started from
the installed pyspark), running wordcount with --master spark://...: same output as embedded."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_ports(n: int) -> list[int]:
    """n distinct free ports, bound at once (ports taken one at a time could repeat: a
    worker's UI took the master's UI port before the master bound it, and the master's UI
    moved to the next one)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def cluster(tmp_path):
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    env = dict(
        os.environ,
        SPARK_HOME=spark_home,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_WORKER_DIR=str(tmp_path / "work"),
    )
    port, ui, *worker_uis = free_ports(4)
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, *args: str) -> None:
        out = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(
            subprocess.Popen(
                [spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    try:
        start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        )
        wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True, 90, "the master")
        for i in range(2):
            start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(worker_uis[i]),
                f"spark://127.0.0.1:{port}",
            )

        def two_alive():
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                body = r.read()
            try:
                return json.loads(body).get("aliveworkers", 0) >= 2
            except ValueError:
                return False  # the UI answering before it serves its JSON (a fresh-clone run read an empty body)

        wait_for(two_alive, 90, "two live workers")
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_wordcount_on_a_standalone_cluster(cluster, tmp_path):
    text = tmp_path / "in"
    text.mkdir()
    lines = ["alpha beta gamma alpha", "beta beta delta", "it's alpha's turn"] * 40
    (text / "a.txt").write_text("\n".join(lines[:60]) + "\n")
    (text / "b.txt").write_text("\n".join(lines[60:]) + "\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "run",
            os.path.join(ROOT, "experiments", "workloads", "wordcount.py"),
            "--master",
            cluster,
            "--workers",
            "2",
            "--run-dir",
            str(tmp_path / "run"),
            "--epoch-records",
            "25",
            "-p",
            f"input={text}/*.txt",
            "-p",
            f"output={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = collections.Counter()
    for name in os.listdir(out):
        if name.endswith(".jsonl"):
            for line in (out / name).read_text().splitlines():
                w, n = json.loads(line)
                got[(w, n)] += 1
    words = [w for line in lines for w in re.findall(r"[a-z']+", line.lower())]
    expected = collections.Counter()
    for w, n in collections.Counter(words).items():
        for i in range(1, n + 1):
            expected[(w, i)] += 1
    assert got == expected
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["master"] == cluster
    assert summary["workers"] == 2


@pytest.mark.soak  # two minutes; `make soak` runs it
def test_abs_recovers_a_killed_worker_on_a_standalone_cluster(cluster, tmp_path):
    """The retry of a killed worker task rejoins the run on the cluster; exactly-once holds."""
    from experiments.chaos import chaos

    r = chaos(
        os.path.join(ROOT, "experiments", "workloads", "keyed_count.py"),
        "abs",
        2,
        1,
        seed=4,
        params={"records": "2000000", "keys": "10000"},
        out=str(tmp_path / "chaos"),
        options={"master": cluster},
    )
    assert "run_failed" not in r, r["run_failed"]
    assert r["kills"] == 1 and r["recoveries"] == 1, r
    assert r["exactly_once"] is True, r["sinks"]
    summary = json.loads((tmp_path / "chaos" / "chaos" / "summary.json").read_text())
    assert summary["master"] == cluster
