"""Loading a pipeline file: a Python file that defines `pipeline` or `build(args)`."""

from __future__ import annotations

import os
import runpy

from nosync.api.pipeline import Pipeline
from nosync.errors import PipelineError


def load_pipeline(path: str, params: dict | None = None) -> Pipeline:
    """Runs the pipeline file and returns its pipeline: `build(params)` if it defines `build`,
    else its `pipeline` variable."""
    if not os.path.isfile(path):
        raise PipelineError(f"pipeline file {path} does not exist")
    try:
        ns = runpy.run_path(path, run_name="__nosync_pipeline__")
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
