"""The offline tools over a run directory: rewind, diff and run information."""
