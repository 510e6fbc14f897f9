"""Helpers the tests share: paths, runs and their judging, workloads' inputs and expected outputs, the soak grid."""
