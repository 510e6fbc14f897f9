"""Benchmarks behind `nosync bench`: each measures its own limits first, on the same data."""
