"""A Spark application on the cluster, its driver here in the root namespace: W tasks with
`spark.cores.max` = W land one a host (the master spreads executors out), and each task runs
inside its host: its hostname, its Spark local dirs and its disk are the host's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

JOB = """
import json, os, socket, sys
from pyspark.sql import SparkSession

master, driver, root, workers, run = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
spark = (
    SparkSession.builder.master(master)
    .appName("cluster-test")
    .config("spark.driver.host", driver)
    .config("spark.driver.bindAddress", driver)
    .config("spark.cores.max", str(workers))
    .config("spark.ui.enabled", "false")
    .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1")
    .getOrCreate()
)

def task(i, _):
    import os, socket, time
    path = os.path.join(root, f"{run}-{i}")
    with open(path, "w") as f:
        f.write(str(i))
    time.sleep(1)  # every task holds its slot at once: one a core of cores.max
    yield {
        "task": i,
        "host": socket.gethostname(),
        "local_dirs": os.environ.get("SPARK_LOCAL_DIRS"),
        "tmp": os.environ.get("TMPDIR"),
        "wrote": open(path).read() == str(i),
        "root": sorted(os.listdir(root)),
    }

rows = spark.sparkContext.parallelize(range(workers), workers).mapPartitionsWithIndex(task).collect()
spark.stop()
print(json.dumps(rows))
"""


def test_one_task_a_host_each_inside_its_host(cluster, tmp_path):
    workers = len(cluster.hosts)
    run = f"task-{uuid.uuid4().hex[:8]}"
    # JVMs that live seconds start sooner with the first compiler tier alone (tests/integration/conftest.py)
    submit = "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_SUBMIT_ARGS=submit)
    proc = subprocess.run(
        [sys.executable, "-c", JOB, cluster.master, cluster.driver_address, cluster.local_root, str(workers), run],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(r["host"] for r in rows) == sorted(h.name for h in cluster.hosts)
    for r in rows:
        # Spark gives a Python task its executor's block manager dir, under the host's root
        assert r["local_dirs"].startswith(os.path.join(cluster.local_root, "spark") + "/"), r
        assert r["tmp"] == os.path.join(cluster.local_root, "tmp")
        assert r["wrote"]
        assert [x for x in r["root"] if x.startswith(run)] == [f"{run}-{r['task']}"], r  # its own, no other's
    assert os.listdir(cluster.local_root) == []  # nothing of it here, where the driver runs
