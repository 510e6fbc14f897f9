"""Spark itself: the session the driver holds, and the batch jobs that run a pipeline's
functional stages (the `replay` mode's recomputation, `nosync batch`, `nosync state`)."""
