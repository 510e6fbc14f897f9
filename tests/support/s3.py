"""A real S3 endpoint for tests: moto's server (`moto[server]`), started on 127.0.0.1.

`moto_s3()` starts one server on a free port, waits until it answers, creates a bucket and
yields the base URI of a prefix in it, with the options `pyarrow.fs` needs to reach it:
`s3://k:s@<bucket>/<prefix>?endpoint_override=127.0.0.1:<port>&scheme=http` (moto takes any
credentials). The server is killed when the block ends, however it ends. Tests make it a
module- or session-scoped fixture, so that it starts once (about a second):

    @pytest.fixture(scope="module")
    def s3():
        with moto_s3() as base:
            yield base
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

STARTUP_S = 30.0
"""How long the server may take to answer before the fixture gives up."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def endpoint_uri(bucket: str, prefix: str, port: int) -> str:
    """The URI of `prefix` in `bucket` on the moto server at `port`."""
    return f"s3://k:s@{bucket}/{prefix}?endpoint_override=127.0.0.1:{port}&scheme=http"


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # an HTTP error is an answer
    except OSError:
        return False


@contextlib.contextmanager
def moto_s3(bucket: str = "nosync-test") -> Iterator[str]:
    """Starts a moto S3 server, creates `bucket`, yields the base URI of a fresh prefix in it,
    and kills the server at the end."""
    try:
        import moto.server  # noqa: F401 - only to fail with a clear message
    except ImportError:
        raise RuntimeError("these tests need moto's S3 server: pip install 'moto[server]'") from None
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so that the kill below reaches its children
    )
    try:
        deadline = time.monotonic() + STARTUP_S
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                with open(log.name, errors="replace") as f:
                    raise RuntimeError(f"moto server on port {port} did not start:\n{f.read()[-2000:]}")
            time.sleep(0.1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/{bucket}", method="PUT")
        with urllib.request.urlopen(req, timeout=10):
            pass
        yield endpoint_uri(bucket, f"t-{uuid.uuid4().hex[:8]}", port)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        os.unlink(log.name)
