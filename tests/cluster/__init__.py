"""Tests across a cluster of hosts on this machine: a package, so that its cluster (a
package-scoped fixture, `conftest.cluster`) is taken down once its last test is done, not
kept up, its JVMs and S3 server running, through the rest of the suite."""
