"""nosync across the hosts of a cluster (`conftest.cluster`: 3 hosts, an S3 server as the
shared tier): keyed_count under every mode with one worker a host, nothing of nosync's own
over loopback while it runs, the tools reading a cluster run's stores from the shared tier,
and the refusals a cluster run gets before Spark starts. One Spark application on the
cluster serves the module (the chaos judge's runs, each an application of its own, are in
`test_chaos_on_hosts.py`: this one holds the cluster's cores while it lives)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest
from support.paths import NOSYNC, ROOT, WORKLOADS
from support.workloads import keyed_count_expected

from nosync import storage

RECORDS, KEYS = 800_000, 20_000


@pytest.fixture(scope="module")
def spark(cluster):
    """A Spark application on the cluster, its driver here: up to 6 task slots (mode replay's
    2W at W = 3), spread over the hosts by the master."""
    from nosync.spark.session import check_slots, get_spark

    session = get_spark(cluster.master, 3, slots=6)
    # every executor registered (the runs' check of 3 slots would pass with two hosts' two
    # cores each, and place two workers on one host)
    check_slots(session, 6)
    yield session
    session.stop()


def shared(cluster, what: str) -> str:
    """A new place on the cluster's shared tier."""
    return storage.join(cluster.remote, "tests", f"{what}-{uuid.uuid4().hex[:8]}")


def committed(uri: str) -> dict:
    import collections

    import nosync as ns

    return collections.Counter(tuple(r) for r in ns.sinks.Files(uri).read_committed())


def worker_sockets(cluster, workers: dict) -> list[tuple[int, object, list]]:
    """(worker, socket, the host's sockets) of every TCP socket a worker's process holds now."""
    out = []
    for w, info in workers.items():
        host = next(h for h in cluster.hosts if h.address == info["host"])
        every = cluster.sockets(host)
        out += [(int(w), s, every) for s in every if info["pid"] in s.pids]
    return out


@pytest.mark.parametrize("mode", ["none", "abs", "nosync", "replay"])
def test_keyed_count_runs_one_worker_a_host_in_every_mode(cluster, spark, tmp_path, mode):
    """Every worker listens on its own host's address (none on loopback, every one on another
    host), the driver on the bridge's, and the output on the shared tier is exactly keyed_count's.
    Under nosync, while it runs: no socket a worker holds for nosync (its listener, its
    connections to the coordinator and its peers) is on loopback; the only loopback connection
    a worker holds goes to its own host's Spark executor."""
    from nosync.driver.runner import run

    out = shared(cluster, f"out-{mode}")
    options = {"checkpoint_tier": "remote"} if mode in ("abs", "nosync") else {}
    run_dir = tmp_path / "run"
    seen: list = []
    stop = threading.Event()

    def watch() -> None:
        # the sockets of the workers, sampled while the run runs
        path = run_dir / "workers.json"
        while not stop.is_set():
            try:
                workers = json.loads(path.read_text())
            except (OSError, ValueError):
                workers = {}
            if len(workers) == 3:
                seen.extend(worker_sockets(cluster, workers))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    if mode == "nosync":
        watcher.start()
    try:
        result = run(
            os.path.join(WORKLOADS, "keyed_count.py"),
            mode=mode,
            workers=3,
            spark=spark,
            run_dir=str(run_dir),
            remote=cluster.remote,
            params={"records": str(RECORDS), "keys": str(KEYS), "output": out},
            timeout_s=300,
            **options,
        )
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()
    s = result.summary
    hosts = sorted(s["worker_hosts"].values())
    assert hosts == sorted(h.address for h in cluster.hosts), s["worker_hosts"]
    assert s["driver_host"] == cluster.driver_address
    assert committed(out) == keyed_count_expected(RECORDS, KEYS)
    assert not os.listdir(cluster.local_root), "a worker's local root is on the driver's host"
    if mode != "nosync":
        return
    ours = [
        (w, sock)
        for w, sock, _ in seen
        if sock.state in ("LISTEN", "ESTAB") and "python" in {c for c, _ in sock.processes}
    ]
    assert {w for w, sock in ours if sock.state == "LISTEN" and not sock.loopback} == {0, 1, 2}, ours
    peers = {h.address for h in cluster.hosts} | {cluster.driver_address}
    assert any(sock.peer_address in peers for _, sock in ours), "no connection to another host was seen"
    for w, sock, every in seen:
        if sock.state == "LISTEN":
            # its own listener (PySpark's daemon's, on loopback, is the daemon's alone)
            assert not sock.loopback, f"worker {w} listens on loopback: {sock}"
        elif sock.state == "ESTAB" and sock.loopback:
            other = [x for x in every if (x.local_port, x.peer_port) == (sock.peer_port, sock.local_port)]
            assert other and all(c == "java" for x in other for c, _ in x.processes), (
                f"worker {w} holds a loopback connection to something other than its executor: {sock} <-> {other}"
            )


def test_a_cluster_run_without_a_shared_tier_is_refused_naming_remote(cluster, cli, tmp_path):
    got = cli(
        "run",
        os.path.join(WORKLOADS, "keyed_count.py"),
        "--mode",
        "replay",
        "--master",
        cluster.master,
        "--run-dir",
        str(tmp_path / "run"),
        "-p",
        f"output={tmp_path / 'out'}",
    )
    assert got.returncode == 2, got.stderr
    assert "--remote" in got.stderr and "replay" in got.stderr


def test_a_remote_whose_bucket_does_not_exist_is_refused_before_spark_starts(cluster, cli, tmp_path):
    bad = cluster.remote.replace("@nosync/", "@no-such-bucket/")
    t0 = time.monotonic()
    got = cli(
        "run",
        os.path.join(WORKLOADS, "keyed_count.py"),
        "--master",
        cluster.master,
        "--remote",
        bad,
        "--run-dir",
        str(tmp_path / "run"),
        "-p",
        f"output={tmp_path / 'out'}",
    )
    assert got.returncode == 2, got.stderr
    assert "no-such-bucket" in got.stderr and "--remote" in got.stderr
    assert "nosync:nosync@" not in got.stderr, "the URI's secret is in the message"
    assert not os.path.exists(tmp_path / "run" / "spark.log"), "Spark started"
    assert time.monotonic() - t0 < 60


def test_tools_read_a_cluster_runs_stores_from_the_shared_tier_or_say_why_not(cluster, spark, tmp_path):
    """`nosync state` of a cluster run: with --checkpoint-tier remote the stores are rebuilt
    from the shared tier (the workers' disks are out of reach) and the state computed from the
    workers' snapshots; with the disk tier it is refused, naming --remote."""
    import subprocess

    from nosync.driver.runner import run

    records, keys = 400_000, 1000
    for tier in ("remote", "disk"):
        run(
            os.path.join(WORKLOADS, "keyed_count.py"),
            mode="nosync",
            workers=3,
            spark=spark,
            remote=cluster.remote,
            run_dir=str(tmp_path / tier),
            checkpoint_tier=tier,
            params={"records": str(records), "keys": str(keys), "output": shared(cluster, f"tools-{tier}")},
            timeout_s=300,
        )
    cmd = [*NOSYNC, "state", str(tmp_path / "remote"), "--operator", "aggregate_1", "--key", "7"]
    got = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "from the workers' own snapshots" in got.stdout, got.stdout
    assert f'"7": {records // keys}' in got.stdout, got.stdout
    cmd = [*NOSYNC, "state", str(tmp_path / "disk"), "--operator", "aggregate_1", "--key", "7"]
    got = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 2, got.stdout + got.stderr
    assert "--remote" in got.stderr and "workers' hosts" in got.stderr, got.stderr
