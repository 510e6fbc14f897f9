"""The stages of a pipeline's batch jobs, and the rounds of its loops across workers.

A stage is what lies between stage boundaries (`stages`); a loop whose body crosses workers
has stages of its own, which run again round after round (`loop_blocks`): each round's tasks
start their operators as the round before left them (`resume_round`, from the files
`dump_ops` wrote at `round_path`)."""

from __future__ import annotations

from typing import Any

from nosync import codec, storage
from nosync.api.plan import PhysicalPlan
from nosync.runtime.keyed import KeyedOp


def stages(p: PhysicalPlan) -> dict[int, int]:
    """node id -> its stage: the greatest number of stage boundaries on a path to it from a
    source, a boundary being an exchange, or the way into or out of a loop whose body crosses
    workers (such a loop's stages run again round after round, `loop_blocks`, and nothing
    else is downstream of it in them). Back edges are left out: they go to an earlier stage."""
    heads = {e.dst for e in p.edges if e.feedback and e.exchange}
    tails = {e.src for e in p.edges if e.feedback and e.exchange}
    edges = p.forward_edges
    stage = {n.id: 0 for n in p.pipeline.nodes}
    changed = True
    while changed:
        changed = False
        for e in edges:
            s = stage[e.src] + (1 if e.exchange or e.dst in heads or e.src in tails else 0)
            if s > stage[e.dst]:
                stage[e.dst] = s
                changed = True
    return stage


def stage_entries(p: PhysicalPlan, stage: dict[int, int]) -> dict[int, int]:
    """Per stage after the first, one edge that enters it from an earlier stage."""
    out: dict[int, int] = {}
    for e in p.edges:
        if stage[e.dst] > stage[e.src]:
            out.setdefault(stage[e.dst], e.id)
    return out


def round_nodes(p: PhysicalPlan) -> set[int]:
    """The operators of the loops whose body crosses workers: head, body, tail."""
    out: set[int] = set()
    for n in p.pipeline.nodes:
        if n.kind == "iterate" and any(e.feedback and e.exchange and e.src == n.id for e in p.edges):
            out |= {n.id, n.params["entry"], *n.params["body"]}
    return out


def loop_blocks(p: PhysicalPlan, stage: dict[int, int]) -> list[tuple[int, int, list[int]]]:
    """The stages that run round after round: for each loop whose body crosses workers, from
    its head's stage to its tail's, with its back edge; overlapping ranges are merged."""
    blocks: list[list] = []
    for e in sorted((e for e in p.edges if e.feedback and e.exchange), key=lambda e: stage[e.dst]):
        a, b = stage[e.dst], stage[e.src]
        if blocks and a <= blocks[-1][1]:
            blocks[-1][1] = max(blocks[-1][1], b)
            blocks[-1][2].append(e.id)
        else:
            blocks.append([a, b, [e.id]])
    return [(a, b, ids) for a, b, ids in blocks]


def dump_ops(ops: list, path: str, switches: list | None = None) -> None:
    """Every operator of `ops` as it stands (meta and keyed state, saved), to `path`; in a
    rewind, the new pipeline's instance of an operator of the cone under `NAME@new`, and
    which of them have taken over."""
    body: dict = {}
    for op in ops:
        name = op.name if op.name not in body else f"{op.name}{NEW}"
        body[name] = {
            "meta": op.snapshot_meta(),
            "keyed": op.saved_state() if isinstance(op, KeyedOp) else None,
        }
    if switches:
        body[SWITCHED] = [sw.name for sw in switches if sw.switched]
    codec.write_file(path, body)


NEW = "@new"
SWITCHED = "@switched"


def round_path(spec: dict, worker: int, s: int, k: int) -> str:
    """Where round `k` of a loop's jobs leaves stage `s` of `worker`, for round k + 1."""
    return storage.join(spec["rounds_dir"], f"w{worker}-s{s}-r{k}.msgpack")


def resume_round(host: Any, ops: list, s: int, k: int) -> None:
    """Round `k` > 0 of a loop's jobs: the operators of the stage as round k - 1 left them."""
    saved = codec.read_file(round_path(host.spec, host.index, s, k - 1))
    seen: set = set()
    for op in ops:
        got = saved.get(op.name if op.name not in seen else f"{op.name}{NEW}")
        seen.add(op.name)
        if got is None:
            continue
        op.restore_meta(got["meta"])
        if isinstance(op, KeyedOp) and got["keyed"] is not None:
            op.restore_keyed(got["keyed"], host.keepalive)
    switched = set(saved.get(SWITCHED, ()))
    for sw in host.switches:
        if sw.name in switched:
            sw.cur = sw.new
