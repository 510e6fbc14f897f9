"""keyed_count: a keyed running count over generated records (the benchmark workload).

Parameters: records (default 1,000,000; "none": unbounded, until the run is stopped), keys
(100,000), draw ("cycle": i % keys, the default; "random": drawn uniformly), skew (0: as draw
says; else Zipf-skewed with that exponent), rate (records/s per partition, open loop; default:
as fast as the run reads), value_bytes (0; else each record carries a value of that many bytes
and each key's state keeps the last one, so that the state grows with the keys), seed (1: the
generator's), output (a directory for committed Parquet files; "none" drops committed records,
counting them, to measure the engine alone).
"""

import nosync as ns


def count(n, _):
    return n + 1


def count_and_keep(state, record):
    return (state[0] + 1, record[1])


def build(args: dict) -> ns.Pipeline:
    records = str(args.get("records", 1_000_000))
    keys = int(args.get("keys", 100_000))
    skew = float(args.get("skew", 0.0))
    rate = args.get("rate")
    value_bytes = int(args.get("value_bytes", 0))
    out = args.get("output", "keyed-count-out")
    p = ns.Pipeline("keyed_count")
    src = p.source(
        ns.sources.Generator(
            records=None if records.lower() == "none" else int(records),
            keys=keys,
            skew=skew,
            seed=int(args.get("seed", 1)),
            rate=None if rate in (None, "none") else float(rate),
            draw=args.get("draw", "cycle"),
            value_bytes=value_bytes,
        )
    )
    if value_bytes:
        counts = src.key_by(lambda r: r[0]).aggregate(lambda: (0, ""), count_and_keep)
    else:
        counts = src.key_by(lambda k: k).aggregate(int, count)
    counts.sink(ns.sinks.Null() if out == "none" else ns.sinks.Files(out, format="parquet"))
    return p
