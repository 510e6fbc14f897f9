"""A run given no --run-dir makes the directory `nosync run --help` says it does."""

from __future__ import annotations

import json
import re
import subprocess
import time

from support.paths import NOSYNC, WORKLOADS

from nosync.options import RunOptions, cli_fields


def test_the_default_run_dir_is_the_one_the_help_names(tmp_path):
    (help_text,) = [f.metadata["help"] for f in cli_fields() if f.name == "run_dir"]
    assert RunOptions().run_dir is None  # the runner makes the name
    default = re.search(r"\(default: ((?:<[^>]*>|[^\s<)])+)", help_text)
    assert default, help_text
    before = time.strftime("%Y%m%d-%H%M%S")
    done = subprocess.run(
        [*NOSYNC, "run", f"{WORKLOADS}/keyed_count.py", "--mode", "none", "--workers", "1"]
        + ["-p", "records=2000", "-p", "keys=10", "-p", f"output={tmp_path / 'out'}"],
        cwd=tmp_path,  # the default is relative to where the run is started
        capture_output=True,
        text=True,
        timeout=300,
    )
    after = time.strftime("%Y%m%d-%H%M%S")
    assert done.returncode == 0, done.stderr
    (made,) = list((tmp_path / "runs").iterdir())
    run = json.loads((made / "run.json").read_text())
    # each <placeholder> of the help, as this run fills it in
    fill = {
        "pipeline name": re.escape(run["pipeline"]),
        "YYYYmmdd-HHMMSS": r"(?P<time>\d{8}-\d{6})",
        "4 hex digits of the run's id": re.escape(run["run_id"][:4]),
    }
    pattern = ""
    for m in re.finditer(r"<([^>]*)>|[^<]+", default.group(1)):
        pattern += fill[m.group(1)] if m.group(1) is not None else re.escape(m.group(0))
    got = re.fullmatch(pattern, str(made.relative_to(tmp_path)))
    assert got, (pattern, made)
    assert before <= got.group("time") <= after
