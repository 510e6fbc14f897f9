"""A cluster of hosts on one machine, for running nosync as on several machines and losing
them for real.

A host is a Linux network namespace with its own address, its own loopback and its own
private disk, running one Spark standalone worker; one more namespace runs the Spark
master. Every namespace has a veth pair to a bridge in the root namespace, and the root
namespace is the driver's host: a `nosync run` or `nosync chaos` from a user's shell runs
its driver there and reaches every host over the bridge (`spark.driver.host` is the
bridge's address, `Cluster.driver_address`). What must outlive a host goes to an S3 server
(moto) on the driver's host, bound to the bridge's address: the cluster's `remote` URI.

    nosync cluster up            # 3 hosts of 2 cores: prints the --master and --remote to use
    nosync run PIPELINE --master spark://10.213.0.2:7077 --remote 's3://nosync:nosync@nosync/runs?...'
    nosync cluster down

A host's private disk is a tmpfs mounted in a mount namespace of the host's worker alone
(`processes`), at a path that is the same on every host and empty everywhere else; the
worker's executors and their Python workers inherit it, and nothing else can read it, the
driver included. It exists as long as one of those processes does, so killing every process
of a host (`Cluster.kill_host`) wipes its disk at the moment the last one exits: the loss of
a machine, not of a process, as the chaos judge needs it (`Cluster.lose_host`, which then
starts a new worker in its place, with an empty disk).

The modules, one concept each: `layout` (every name and address, from the cluster's name,
its number of hosts and its subnet), `network` (bridge, namespaces, veths), `processes`
(starting a host's process with its private root, finding and killing a namespace's
processes, the master's state), `s3` (the shared tier's server), `state` (the state file,
from which any process can `load` the cluster), `cluster` (the `Cluster` a user holds),
`sockets` (a host's TCP sockets, to check what a worker listens on and dials), and
`lifecycle` (`up`, `down`, `load`). Everything the cluster makes on the machine is named
after it (`nsc-br`, `nsc-master`, `nsc-h1`, `nsc-v1`, ...), so that `down` finds it all by
name, whatever state a failed `up` left. It all needs root.
"""

from __future__ import annotations

from experiments.cluster.cluster import Cluster, ClusterStatus, HostStatus
from experiments.cluster.errors import ClusterError, ClusterRefused
from experiments.cluster.layout import DEFAULT_NAME, DEFAULT_SUBNET, Host
from experiments.cluster.lifecycle import down, load, up
from experiments.cluster.sockets import Socket
from experiments.cluster.state import default_state_dir

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_SUBNET",
    "Cluster",
    "ClusterError",
    "ClusterRefused",
    "ClusterStatus",
    "Host",
    "HostStatus",
    "Socket",
    "default_state_dir",
    "down",
    "load",
    "up",
]
