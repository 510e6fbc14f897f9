"""Bundled workloads: pipeline files for `nosync run`, the tests and the benchmarks."""
