"""Loading a pipeline file: a Python file that defines `pipeline` or `build(args)`."""

from __future__ import annotations

import os
import runpy

from nosync.api.pipeline import Pipeline
from nosync.errors import PipelineError


def load_pipeline(path: str, params: dict | None = None, source: bytes | None = None) -> Pipeline:
    """Runs the pipeline file and returns its pipeline: `build(params)` if it defines `build`,
    else its `pipeline` variable. `source`: the file's text as the driver read it, run in
    place of the file at `path` (a worker's host may have no such file, or another version
    of it); `path` still names it in errors and in the places of its declarations."""
    if source is None and not os.path.isfile(path):
        raise PipelineError(f"pipeline file {path} does not exist")
    try:
        if source is None:
            ns = runpy.run_path(path, run_name="__nosync_pipeline__")
        else:
            ns = {"__name__": "__nosync_pipeline__", "__file__": path, "__builtins__": __builtins__}
            exec(compile(source, path, "exec"), ns)  # noqa: S102 - the user's own pipeline, as run_path runs it
    except PipelineError:
        raise
    except SyntaxError as e:
        raise PipelineError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:
        raise PipelineError(f"{path}: loading it raised {type(e).__name__}: {e}") from e
    params = dict(params or {})
    if "build" in ns:
        if not callable(ns["build"]):
            raise PipelineError(f"{path}: `build` must be a function build(args) -> Pipeline")
        try:
            p = ns["build"](params)
        except PipelineError:
            raise
        except KeyError as e:
            raise PipelineError(
                f"{path}: build(args) needs the parameter {e} (give it with -p {e.args[0]}=...)"
            ) from None
        except Exception as e:
            raise PipelineError(f"{path}: build(args) raised {type(e).__name__}: {e}") from e
    elif "pipeline" in ns:
        if params:
            raise PipelineError(
                f"{path} defines `pipeline`, not `build(args)`: it takes no -p parameters ({', '.join(params)})"
            )
        p = ns["pipeline"]
    else:
        raise PipelineError(f"{path} defines neither `pipeline` nor `build(args)`")
    if not isinstance(p, Pipeline):
        raise PipelineError(f"{path}: expected a nosync Pipeline, got {type(p).__name__}")
    return p


def spec_pipeline(spec: dict) -> Pipeline:
    """The pipeline a worker's (or a batch task's) spec names: its file's text as the driver
    read it (`pipeline_source`), else the file at its path, built with its parameters."""
    return load_pipeline(spec["pipeline_file"], spec.get("params"), spec.get("pipeline_source"))


def pipeline_source(path: str) -> bytes:
    """The text of the pipeline file at `path`, for the workers' spec (`spec_pipeline`)."""
    with open(path, "rb") as f:
        return f.read()
