"""keyed_count: a keyed running count over generated records (the benchmark workload).

Parameters: records (default 1,000,000), keys (100,000), skew (0: uniform; else the Zipf
exponent), seed (1: the generator's), output (a directory for committed Parquet files; "none" drops committed records,
counting them, to measure the engine alone).
"""

import nosync as ns


def build(args: dict) -> ns.Pipeline:
    records = int(args.get("records", 1_000_000))
    keys = int(args.get("keys", 100_000))
    skew = float(args.get("skew", 0.0))
    seed = int(args.get("seed", 1))
    out = args.get("output", "keyed-count-out")
    p = ns.Pipeline("keyed_count")
    src = p.source(ns.sources.Generator(records=records, keys=keys, skew=skew, seed=seed))
    counts = src.key_by(lambda k: k).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.Null() if out == "none" else ns.sinks.Files(out, format="parquet"))
    return p
