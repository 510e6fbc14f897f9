"""What every test that starts Spark shares, wherever pytest is pointed.

Every Spark driver the suite starts (an integration test's session, each `nosync run` or
`nosync chaos` subprocess's, which inherit the environment) and every executor a cluster run
launches compile with the JVM's first tier only: a JVM here lives seconds over small inputs,
so its start is most of its work, and the second tier's compiler threads compete with the
workers for the machine's cores. It starts an embedded driver about 0.7 s sooner, and an
application on a cluster of hosts (whose executors are JVMs of their own) about 4 s sooner.
Runs outside the suite keep the JVM's defaults.
"""

from __future__ import annotations

import os

os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS",
    "--driver-java-options -XX:TieredStopAtLevel=1 "
    "--conf spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 pyspark-shell",
)
