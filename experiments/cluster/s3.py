"""The cluster's shared tier: an S3 server (moto) on the driver's host.

What must outlive a host goes to one `pyarrow.fs` URI (`--remote`); on this machine that is
moto's S3 server, in the root namespace, bound to the bridge's address only, so that every
host reaches it over its veth and nothing outside the machine does. It keeps its objects in
its own memory: they last as long as the cluster. Its pid is in the state file; `down` also
finds it by its command line (`moto.server -H <bridge address>`) when the state file is gone.
"""

from __future__ import annotations

import importlib.util
import os
import socket

from experiments.cluster.processes import cmdline, start_local, stop
from experiments.cluster.state import ACCESS_KEY, BUCKET, SECRET_KEY

_MODULE = "moto.server"


def available() -> bool:
    """Whether moto's server (`moto[server]`: moto and flask) can run here."""
    return all(importlib.util.find_spec(m) is not None for m in ("moto", "flask", "flask_cors"))


def free_port(address: str) -> int:
    """A port free on `address` now."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def start(python: str, address: str, port: int, log: str) -> int:
    """Starts the S3 server on `address:port`; returns its pid."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return start_local([python, "-m", _MODULE, "-H", address, "-p", str(port)], env, log)


def is_server(pid: int, address: str) -> bool:
    """Whether `pid` is an S3 server this package started on `address`."""
    argv = cmdline(pid)
    return _MODULE in argv and address in argv


def find(address: str) -> list[int]:
    """The pids of every S3 server started on `address`."""
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and is_server(int(e.name), address)]


def stop_server(pid: int, address: str) -> bool:
    """Stops `pid` if it is the S3 server on `address` (a recycled pid is left alone);
    returns whether it stopped one."""
    if not is_server(pid, address):
        return False
    stop(pid)
    return True


def make_bucket(address: str, port: int) -> None:
    """Makes the cluster's bucket; raises OSError while the server does not answer."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=f"{address}:{port}",
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
        connect_timeout=2,
        request_timeout=5,
    )
    fs.create_dir(BUCKET)


def answers(address: str, port: int) -> bool:
    """Whether an S3 server answers HTTP on `address:port`."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}:{port}/", timeout=2) as r:
            return r.status < 500
    except urllib.error.HTTPError as e:
        return e.code < 500  # an S3 error document (403, 404) is an answer
    except OSError:
        return False
