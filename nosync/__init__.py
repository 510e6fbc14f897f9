"""nosync: a stream-processing engine on Apache Spark whose subject is fault tolerance.

The same pipeline runs under four modes (`none`, `abs`, `nosync`, `replay`) and can be crashed,
recovered, measured and rewound. The engine (pipeline API, runtime, channels, modes) is built
on `lsm`, the versioned state store, and `lineage`, the dependency planning; see DESIGN.md.
"""
