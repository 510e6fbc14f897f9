"""The state file of a cluster: `<state dir>/cluster.json`.

It records what `up` was asked for (from which every name and address follows: `layout`),
where the cluster's files are, and the pid of every process it started, so that another
process (`nosync chaos --cluster`, `nosync cluster status`) can use the cluster, and
`down` can stop what has no namespace to be found by (the S3 server, in the root
namespace). It is written before anything is made and again after each step, each time
whole by a rename, so that a reader never sees half of it and a `down` after a failed `up`
finds the pids of what was started. `complete` says that `up` finished: only then is the
cluster one to use. The derived fields (addresses, the master's URL, the remote URI) are
written for a human reading the file; they are not read back.

The state directory also holds `logs/` (one file per process: `<namespace>.log`, `s3.log`)
and `local/`, the path at which every host mounts its private local root; in the root
namespace it stays an empty directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from experiments.cluster.layout import MASTER_PORT, Layout, plan

STATE_ROOT = "/var/tmp/nosync-cluster"
FORMAT_VERSION = 1
BUCKET = "nosync"
ACCESS_KEY = "nosync"
SECRET_KEY = "nosync"
"""moto accepts any credentials; these are the ones the remote URI and the Spark processes
carry."""


def default_state_dir(name: str) -> str:
    """Where cluster `name` keeps its state when no other directory is given."""
    return os.path.join(STATE_ROOT, name)


@dataclass(frozen=True)
class ClusterState:
    """What a cluster was made with, and the processes it runs. `pids`: the Spark process of
    each namespace by the namespace's name."""

    name: str
    subnet: str
    hosts: int
    cores: int
    memory: str
    disk: str
    state_dir: str
    python: str
    spark_home: str
    s3_port: int | None = None
    s3_pid: int | None = None
    pids: dict[str, int] = field(default_factory=dict)
    complete: bool = False

    @property
    def layout(self) -> Layout:
        """Every name and address of the cluster."""
        return plan(self.name, self.hosts, self.subnet)

    @property
    def path(self) -> str:
        """The state file."""
        return os.path.join(self.state_dir, "cluster.json")

    @property
    def logs(self) -> str:
        """The directory of every process's log."""
        return os.path.join(self.state_dir, "logs")

    @property
    def local_root(self) -> str:
        """The path of every host's private local root (empty in the root namespace)."""
        return os.path.join(self.state_dir, "local")

    @property
    def master_url(self) -> str:
        """The `--master` of a run on the cluster."""
        return f"spark://{self.layout.master.address}:{MASTER_PORT}"

    @property
    def remote(self) -> str:
        """The `--remote` of a run on the cluster: a folder of the S3 server's bucket."""
        endpoint = f"{self.layout.driver_address}:{self.s3_port}"
        return f"s3://{ACCESS_KEY}:{SECRET_KEY}@{BUCKET}/runs?endpoint_override={endpoint}&scheme=http"

    def with_pid(self, namespace: str, pid: int) -> ClusterState:
        """This state with `pid` as the Spark process of `namespace`."""
        return dataclasses.replace(self, pids={**self.pids, namespace: pid})


_FIELDS = tuple(f.name for f in dataclasses.fields(ClusterState))


def write(state: ClusterState) -> None:
    """Writes `state` to its state file, atomically."""
    layout = state.layout
    body = {"version": FORMAT_VERSION, **dataclasses.asdict(state)}
    body["derived"] = {
        "master": state.master_url,
        "remote": state.remote if state.s3_port else None,
        "driver_address": layout.driver_address,
        "bridge": layout.bridge,
        "namespaces": {h.name: h.address for h in (layout.master, *layout.hosts)},
        "veths": {h.name: layout.veth(h) for h in (layout.master, *layout.hosts)},
        "local_root": state.local_root,
    }
    tmp = state.path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(body, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, state.path)


def read(state_dir: str) -> ClusterState | None:
    """The state in `state_dir`, or None when there is none (or of another format)."""
    try:
        with open(os.path.join(state_dir, "cluster.json")) as f:
            body = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    if body.get("version") != FORMAT_VERSION:
        return None
    return ClusterState(**{k: body[k] for k in _FIELDS if k in body})
