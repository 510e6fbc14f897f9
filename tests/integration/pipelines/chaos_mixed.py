"""Chaos pipeline beyond the shipped workloads: two sources, a loop, a union, filter and
flat_map, a stateful_map, two windows joined, a reduce into a LevelDB sink, and two Files sinks
(one inside the other's directory). Every operator's output is the same whatever the order in
which its inputs interleave (the stateful_map emits counts, not sums), so chaos can judge it.
Parameters: records, output."""

import os

import nosync as ns


def event(i):
    return {"u": (i * 7919) % 5000, "amt": (i * 31) % 97, "ts": i}


def click(i):
    return {"u": (i * 104729) % 5000, "page": (i * 13) % 50, "ts": 2 * i}


def every5(state, r):
    c, s = state if state is not None else (0, 0)
    c += 1
    s += r["v"]
    return (c, s), ([[r["u"], c]] if c % 5 == 0 else [])


def build(args):
    n = int(args.get("records", 300_000))
    out = args["output"]
    p = ns.Pipeline("chaos_mixed")
    ev = p.source(ns.sources.Generator(records=n, fn=event), name="events")
    cl = p.source(ns.sources.Generator(records=n // 3, fn=click), name="clicks")
    halved = ev.map(lambda e: (e["u"], e["amt"], 0, e["ts"])).iterate(
        lambda s: s.map(lambda t: (t[0], t[1] // 2, t[2] + 1, t[3])), keep=lambda t: t[1] >= 10, name="halve"
    )
    both = halved.map(lambda t: {"u": t[0], "v": t[1] + t[2], "ts": t[3], "k": "e"}).union(
        cl.map(lambda c: {"u": c["u"], "v": c["page"], "ts": c["ts"], "k": "c"}), name="both"
    )
    kept = both.filter(lambda r: r["u"] % 10 != 3).flat_map(
        lambda r: [r] if r["k"] == "c" else [r, {**r, "u": r["u"] + 5000}]
    )
    ticks = kept.key_by(lambda r: r["u"]).stateful_map(every5, name="every5")
    ticks.sink(ns.sinks.Files(out, format="jsonl"), name="ticks")
    ew = (
        kept.filter(lambda r: r["k"] == "e")
        .key_by(lambda r: r["u"] % 50)
        .window(20_000, lambda r: r["ts"], int, lambda a, r: a + r["v"], name="ewin")
    )
    cw = cl.key_by(lambda c: c["u"] % 50).window(20_000, lambda c: c["ts"], int, lambda a, c: a + 1, name="cwin")
    joined = ew.join(cw, name="j")
    flat = joined.map(lambda kv: [kv[0], kv[1][0][0], kv[1][0][1], kv[1][1][0], kv[1][1][1]], name="flat")
    flat.sink(ns.sinks.Files(os.path.join(out, "joined"), format="jsonl"), name="joined_out")
    sums = flat.key_by(lambda r: r[0]).reduce(lambda a, b: [a[0], a[1] + b[1], a[2] + b[2], a[3], a[4]], name="sums")
    sums.map(lambda kv: (kv[0], kv[1][2])).sink(ns.sinks.LevelDB(os.path.join(out, "kv")), name="kv")
    return p
