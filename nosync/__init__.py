"""nosync: a stream-processing engine on Apache Spark whose subject is fault tolerance.

The same pipeline runs under four modes (`none`, `abs`, `nosync`, `replay`) and can be crashed,
recovered, measured and rewound. A pipeline is built with the fluent API here and run by the
`nosync run` command (or `nosync.run`): W workers, each a long-running Spark task running one
instance of every operator, exchange records over authenticated TCP channels; the driver's
coordinator registers them, watches their heartbeats and applies the chosen mode.

    import nosync as ns
    p = ns.Pipeline("wordcount")
    (p.source(ns.sources.Files("books/*.txt"))
      .flat_map(str.split)
      .key_by(lambda w: w)
      .aggregate(int, lambda n, _: n + 1)
      .sink(ns.sinks.Files("out/")))

The engine builds on `lsm`, the versioned state store, and `lineage`, the dependency planning.
"""

from nosync import modes
from nosync.api import sinks, sources
from nosync.api.pipeline import KeyedStream, Pipeline, Stream
from nosync.driver.runner import run
from nosync.errors import NosyncError, PipelineError, RunFailed

__all__ = [
    "KeyedStream",
    "NosyncError",
    "Pipeline",
    "PipelineError",
    "RunFailed",
    "Stream",
    "modes",
    "run",
    "sinks",
    "sources",
]
