"""Run options (`nosync.options.RunOptions`): validated once, named by their flag when wrong,
the same on the command line, in the runner and on the wire to a worker."""

from __future__ import annotations

import pathlib

import pytest
from click.testing import CliRunner

from cli.main import main
from nosync.errors import NosyncError
from nosync.options import MAX_PERSIST_MS, RunOptions, cli_fields

PIPELINE = str(pathlib.Path(__file__).resolve().parents[3] / "experiments" / "workloads" / "keyed_count.py")


def test_options_cross_the_wire_unchanged():
    o = RunOptions(mode="nosync", workers=3, persist_ms=500, params={"records": "10"}, slow_worker=(1, 20))
    assert RunOptions.from_wire(o.to_wire()) == o
    assert RunOptions.from_wire({}) == RunOptions()


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"persist_budget": 0.0}, "--persist-budget"),
        ({"persist_budget": 1.5}, "--persist-budget"),
        ({"workers": 0}, "--workers"),
        ({"linger_ms": -1}, "--linger-ms"),
        ({"checkpoint_tier": "tape"}, "--checkpoint-tier"),
        ({"epoch_records": 10, "epoch_ms": 10}, "--epoch-ms"),
        ({"resume": True}, "--run-dir"),
        ({"replay_threshold_records": 5, "mode": "abs"}, "--replay-threshold-records"),
        ({"mode": "replay", "epoch_ms": 100}, "--epoch-ms"),
        ({"mode": "nosync", "workers": 3, "replicas": 3}, "--workers 3"),
        ({"mode": "abs", "replicas": 1}, "--replicas"),
        ({"mode": "abs", "checkpoint_tier": "replicated"}, "replicated"),
        ({"mode": "nosync", "checkpoint_tier": "replicated", "replicas": 0}, "--replicas 1"),
        ({"max_dead_letters": 0}, "--max-dead-letters"),
        ({"persist_ms": 2000, "max_persist_ms": 1000}, "--max-persist-ms 1000 is less than --persist-ms 2000"),
    ],
)
def test_a_bad_option_is_refused_naming_it(changes, named):
    with pytest.raises(NosyncError, match=named):
        RunOptions(**changes)


def test_an_unknown_option_on_the_wire_is_named():
    with pytest.raises(NosyncError, match="'persist_tier'"):
        RunOptions.from_wire({"persist_tier": "disk"})


def test_every_run_option_is_a_flag_of_run():
    out = CliRunner().invoke(main, ["run", "--help"]).output
    missing = [f.name for f in cli_fields() if "--" + f.name.replace("_", "-") not in out]
    assert missing == []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--persist-budget", "0"], "--persist-budget"),
        (["--persist-budget", "1.01"], "--persist-budget"),
        (["--epoch-records", "5", "--epoch-ms", "5"], "--epoch-ms"),
        (["--resume"], "--run-dir"),
        (["--mode", "nosync", "-w", "2", "--replicas", "2"], "--replicas 2"),
        # below 3 heartbeats: one late beat would make a suspicion
        (["--failure-timeout-ms", "149"], "--failure-timeout-ms"),
        (["--failure-timeout-ms", "-5"], "--failure-timeout-ms"),
        (["--standbys", "-1"], "--standbys"),
        (["--standbys", "1"], "--standbys 1: mode none does not recover"),
        (["--max-dead-letters", "0"], "--max-dead-letters"),
        (["--max-dead-letters", "-3"], "--max-dead-letters"),
    ],
)
def test_run_refuses_bad_options_with_exit_2_before_starting_spark(args, named):
    got = CliRunner().invoke(main, ["run", PIPELINE, *args])
    assert got.exit_code == 2
    assert named in got.output


def test_replicas_default_to_one_on_the_replicated_tier_and_to_none_elsewhere():
    assert RunOptions(mode="nosync", checkpoint_tier="replicated").replica_count == 1
    assert RunOptions(mode="nosync", checkpoint_tier="remote").replica_count == 0
    assert RunOptions(mode="nosync", workers=3, checkpoint_tier="remote", replicas=2).replica_count == 2


def test_dead_letters_are_bounded_by_default_and_unbounded_by_none():
    assert RunOptions().max_dead_letters == 10_000
    assert RunOptions(max_dead_letters=1).max_dead_letters == 1
    assert RunOptions(max_dead_letters=None).max_dead_letters is None
    assert RunOptions.from_wire(RunOptions(max_dead_letters=None).to_wire()).max_dead_letters is None


def test_the_snapshot_interval_is_bounded_by_default_and_never_below_persist_ms():
    assert RunOptions().persist_bound_ms == MAX_PERSIST_MS
    assert RunOptions(persist_ms=3 * MAX_PERSIST_MS).persist_bound_ms == 3 * MAX_PERSIST_MS
    assert RunOptions(persist_ms=100, max_persist_ms=100).persist_bound_ms == 100
