"""One embedded Spark session for the whole integration suite (local[3,4]: up to 3 workers);
its JVM's options are the suite's (`tests/conftest.py`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from nosync.spark.session import get_spark

    session = get_spark(None, 3)
    yield session
    session.stop()
