"""The exceptions of `experiments.cluster`.

`ClusterRefused` is raised before anything is made (a usage error: the CLI exits 2);
`ClusterError` when something made or asked of a cluster fails (the CLI exits 1). Both carry
one line a user can act on.
"""

from __future__ import annotations


class ClusterError(Exception):
    """A cluster that could not be made, reached or changed."""


class ClusterRefused(ClusterError):
    """A request refused before anything was made: not root, a tool missing, a name taken, a
    subnet in use, a bad option."""
