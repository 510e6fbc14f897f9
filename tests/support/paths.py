"""Where the tests find the repository: its root, the shipped workloads, the tests' own pipelines, the CLI."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOADS = os.path.join(ROOT, "experiments", "workloads")
PIPELINES = os.path.join(ROOT, "tests", "integration", "pipelines")
NOSYNC = [sys.executable, "-m", "cli.main"]
"""The command line, as a subprocess runs it (from ROOT)."""
