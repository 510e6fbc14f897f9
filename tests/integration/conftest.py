"""One embedded Spark session for the whole integration suite (local[3,4]: up to 3 workers).

Every Spark driver the suite starts (this session's, and each `nosync run` or `nosync chaos`
subprocess's, which inherit the environment) compiles with the JVM's first tier only: a
driver here lives seconds over small inputs, so its start is most of its work, and the
second tier's compiler threads compete with the workers for the machine's cores. It starts
the driver about 0.7 s sooner. Runs outside the suite keep the JVM's defaults.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell")


@pytest.fixture(scope="session")
def spark():
    from nosync.spark.session import get_spark

    session = get_spark(None, 3)
    yield session
    session.stop()
