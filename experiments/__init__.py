"""experiments: workloads, failure schedules, the experiment harness, and benchmarks."""
