"""The driver: run options, the runner that starts W worker tasks, the coordinator that
registers them and watches their heartbeats, and the Spark task entry."""
