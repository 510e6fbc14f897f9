"""A command that starts Spark keeps Spark's own output (its WARN and log4j lines) off the
terminal and in the run directory's spark.log; `--verbose` shows it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARK_LINE = re.compile(r"\bWARN\b|log4j|NativeCodeLoader|SparkContext|Setting default log level")


def _run(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, str]:
    run_dir = str(tmp_path / f"run{len(extra)}")
    cmd = [
        sys.executable, "-m", "cli.main", "run", os.path.join(ROOT, "experiments", "workloads", "keyed_count.py"),
        "--mode", "none", "--workers", "1", "--run-dir", run_dir,
        "-p", "records=2000", "-p", "keys=10", "-p", f"output={tmp_path / ('out' + str(len(extra)))}", *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done, run_dir


def test_run_keeps_sparks_output_in_the_run_directory(tmp_path):
    done, run_dir = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    terminal = done.stdout + done.stderr
    assert [line for line in terminal.splitlines() if SPARK_LINE.search(line)] == []
    log = os.path.join(run_dir, "spark.log")
    assert os.path.isfile(log)
    assert f"Spark's output  {log}" in done.stdout or log in done.stdout


def test_verbose_shows_sparks_output(tmp_path):
    done, run_dir = _run(tmp_path, "--verbose")
    assert done.returncode == 0, done.stderr
    assert any(SPARK_LINE.search(line) for line in (done.stdout + done.stderr).splitlines())
    assert not os.path.exists(os.path.join(run_dir, "spark.log"))
