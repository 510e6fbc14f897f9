"""Build-time errors of the pipeline API and of the pipeline-file loader.

Every PipelineError must name the operator and the file:line of the user's call that declared
it. The expected line is taken from this file itself (`next_line()` is called on the line just
before the declaring call), never from the error, so a wrong or missing location fails.
"""

from __future__ import annotations

import inspect
import os
import textwrap

import pytest

import nosync as ns
from nosync.api.loader import load_pipeline
from nosync.api.plan import plan
from nosync.errors import PipelineError

THIS_FILE = __file__


def next_line() -> int:
    """The line number just after the caller's line."""
    return inspect.currentframe().f_back.f_lineno + 1


def assert_names(err: PipelineError, operator: str, line: int, path: str = THIS_FILE) -> None:
    """The error names `operator` and `path:line`, in its attributes and in its message."""
    msg = str(err)
    assert err.operator == operator, msg
    assert err.where == f"{path}:{line}", msg
    assert f"'{operator}'" in msg
    assert f"{path}:{line}" in msg
    assert os.path.basename(path) in msg


def gen(n: int = 4) -> ns.sources.Generator:
    return ns.sources.Generator(records=n, fn=lambda i: i)


def numbers(p: ns.Pipeline) -> ns.Stream:
    return p.source(gen())


# -- keyed operators on a stream without key_by ---------------------------------------------


def test_reduce_without_key_by_names_operator_and_line():
    s = numbers(ns.Pipeline("p"))
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.reduce(lambda a, b: a + b, name="total")
    assert_names(ei.value, "total", line)
    assert "key_by" in str(ei.value)


def test_aggregate_without_key_by_uses_the_kind_as_name():
    s = numbers(ns.Pipeline("p"))
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.aggregate(int, lambda n, _: n + 1)
    assert_names(ei.value, "aggregate", line)


def test_stateful_map_without_key_by():
    s = numbers(ns.Pipeline("p"))
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.stateful_map(lambda st, v: (st, [v]), name="dedup")
    assert_names(ei.value, "dedup", line)


def test_window_without_key_by():
    s = numbers(ns.Pipeline("p"))
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.window(10.0, float, int, lambda n, _: n + 1)
    assert_names(ei.value, "window", line)


def test_join_without_key_by_on_either_side():
    p = ns.Pipeline("p")
    s = numbers(p)
    keyed = p.source(gen(), name="other").key_by(lambda x: x)
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.join(keyed, name="j1")
    assert_names(ei.value, "j1", line)
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        keyed.join(s, name="j2")
    assert_names(ei.value, "j2", line)
    assert "key_by" in str(ei.value)


def test_keyedness_ends_at_a_non_keyed_operator():
    """map, filter and union of a keyed stream give plain streams: no keyed operator after them."""
    p = ns.Pipeline("p")
    keyed = numbers(p).key_by(lambda x: x % 2)
    for derived in (keyed.map(lambda kv: kv), keyed.filter(bool), keyed.union(keyed)):
        assert not derived.keyed
        with pytest.raises(PipelineError) as ei:
            line = next_line()
            derived.reduce(lambda a, b: a)
        assert_names(ei.value, "reduce", line)


def test_keyed_operators_after_key_by_and_after_keyed_operators_build():
    p = ns.Pipeline("p")
    k = numbers(p).key_by(lambda x: x % 3)
    r = k.reduce(lambda a, b: a + b).reduce(lambda a, b: b)
    w = k.window(2.0, float, int, lambda n, _: n + 1)
    r.join(w).sink(ns.sinks.Console())
    k.stateful_map(lambda st, v: (None, [v])).sink(ns.sinks.Console())
    k.aggregate(int, lambda n, v: n + v).sink(ns.sinks.Console())
    p.validate()
    assert [n.kind for n in p.nodes] == [
        "source",
        "key_by",
        "reduce",
        "reduce",
        "window",
        "join",
        "sink",
        "stateful_map",
        "sink",
        "aggregate",
        "sink",
    ]


# -- whole-graph checks (validate) -----------------------------------------------------------


def test_sinkless_pipeline_names_the_dangling_stream():
    p = ns.Pipeline("nosink")
    s = p.source(gen())
    line = next_line()
    s.map(lambda x: x, name="last")
    with pytest.raises(PipelineError) as ei:
        p.validate()
    assert "no sink" in str(ei.value)
    assert "nosink" in str(ei.value)
    assert_names(ei.value, "last", line)


def test_pipeline_without_source():
    with pytest.raises(PipelineError, match="has no source"):
        ns.Pipeline("empty").validate()


def test_stream_never_consumed_is_named():
    p = ns.Pipeline("p")
    s = numbers(p)
    s.sink(ns.sinks.Console())
    line = next_line()
    s.filter(lambda x: x > 1, name="forgotten")
    with pytest.raises(PipelineError) as ei:
        p.validate()
    assert "never consumed" in str(ei.value)
    assert_names(ei.value, "forgotten", line)


def test_valid_pipeline_passes_validate():
    p = ns.Pipeline("ok")
    numbers(p).map(str).sink(ns.sinks.Console())
    p.validate()


# -- arguments of single calls --------------------------------------------------------------


@pytest.mark.parametrize(
    "call, operator",
    [
        (lambda s: s.map(42), "map"),
        (lambda s: s.flat_map("abc", name="fm"), "fm"),
        (lambda s: s.filter(None), "filter"),
        (lambda s: s.key_by([1]), "key_by"),
        (lambda s: s.iterate(lambda x: x, keep=3), "iterate"),
        (lambda s: s.key_by(str).aggregate(0, lambda a, b: a), "aggregate"),
        (lambda s: s.key_by(str).aggregate(int, "add", name="agg"), "agg"),
        (lambda s: s.key_by(str).reduce(1.5), "reduce"),
        (lambda s: s.key_by(str).stateful_map(None), "stateful_map"),
        (lambda s: s.key_by(str).window(1.0, "t", int, max), "window"),
    ],
)
def test_non_callable_function(call, operator):
    s = numbers(ns.Pipeline("p"))
    with pytest.raises(PipelineError) as ei:
        call(s)
    # the declaring call is inside the lambda, on its line in the parametrize list above
    assert_names(ei.value, operator, inspect.getsourcelines(call)[1])
    assert "callable" in str(ei.value)


def test_non_positive_window_size_and_max_iterations():
    s = numbers(ns.Pipeline("p"))
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.key_by(str).window(0, float, int, max, name="w0")
    assert_names(ei.value, "w0", line)
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.iterate(lambda x: x.map(abs), keep=bool, max_iterations=0, name="it0")
    assert_names(ei.value, "it0", line)


def test_duplicate_operator_name():
    p = ns.Pipeline("dups")
    s = numbers(p).map(abs, name="twice")
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.map(abs, name="twice")
    assert_names(ei.value, "twice", line)
    assert "already used" in str(ei.value)


def test_automatic_names_never_take_a_name_given_by_hand():
    p = ns.Pipeline("p")
    s = numbers(p).map(abs, name="map_2")
    a = s.map(abs)
    b = a.map(abs, name="map_4")
    c = b.map(abs)
    names = [n.name for n in p.nodes]
    assert len(set(names)) == len(names)
    assert {a.node.name, c.node.name}.isdisjoint({"map_2", "map_4"})
    assert a.node.name.startswith("map_") and c.node.name.startswith("map_")


def test_source_and_sink_must_be_nosync_objects():
    p = ns.Pipeline("p")
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        p.source([1, 2, 3], name="lst")
    assert_names(ei.value, "lst", line)
    s = numbers(p)
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.sink(print, name="printer")
    assert_names(ei.value, "printer", line)


# -- unknown options of sources and sinks ---------------------------------------------------


def test_unknown_option_of_files_sink(tmp_path):
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        ns.sinks.Files(str(tmp_path), bogus=1)
    assert "bogus" in str(ei.value)
    assert_names(ei.value, "sinks.Files", line)


def test_unknown_option_of_files_source(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a\n")
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        ns.sources.Files(str(path), bogus=1)
    assert "bogus" in str(ei.value)
    assert "encoding" in str(ei.value)  # says what it does take
    assert_names(ei.value, "Files", line)


def test_unknown_option_of_leveldb_and_console_sinks(tmp_path):
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        ns.sinks.LevelDB(str(tmp_path), compression="snappy")
    assert "compression" in str(ei.value)
    assert_names(ei.value, "sinks.LevelDB", line)
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        ns.sinks.Console(color=True)
    assert_names(ei.value, "sinks.Console", line)


def test_unknown_file_format(tmp_path):
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        ns.sources.Files(str(tmp_path / "x.xlsx"))
    assert "xlsx" in str(ei.value)
    assert_names(ei.value, "Files", line)
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        ns.sinks.Files(str(tmp_path), format="csv")
    assert_names(ei.value, "sinks.Files", line)


# -- iterate ---------------------------------------------------------------------------------


def test_iterate_body_returning_an_outside_stream():
    p = ns.Pipeline("p")
    s = numbers(p)
    outside = s.map(abs)
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.iterate(lambda body: outside, keep=bool, name="loop")
    assert "a cycle that was not built with iterate" in str(ei.value)
    assert_names(ei.value, "loop", line)


def test_iterate_body_returning_its_upstream():
    p = ns.Pipeline("p")
    s = numbers(p)
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.iterate(lambda body: s, keep=bool)
    assert "a cycle that was not built with iterate" in str(ei.value)
    assert_names(ei.value, "iterate", line)


def test_iterate_body_reading_an_outside_stream_names_the_reading_operator():
    p = ns.Pipeline("p")
    s = numbers(p)
    outside = p.source(gen(), name="side")
    body_lines: list[int] = []

    def body(inner):
        body_lines.append(next_line())
        return inner.union(outside, name="mix")

    with pytest.raises(PipelineError) as ei:
        s.iterate(body, keep=bool)
    assert "a cycle that was not built with iterate" in str(ei.value)
    assert_names(ei.value, "mix", body_lines[0])


def test_iterate_body_may_hold_keyed_operators_and_the_plan_closes_the_loop():
    p = ns.Pipeline("p")
    s = numbers(p)
    out = s.iterate(lambda b: b.key_by(str).reduce(max, name="peak"), keep=bool, name="keyed_loop")
    out.sink(ns.sinks.Console())
    pl = plan(p, 3)
    it = out.node
    peak = p.node("peak")
    assert it.inputs == (peak.id,)
    into_peak = [e for e in pl.edges if e.dst == peak.id]
    assert [e.exchange for e in into_peak] == [True]  # records go round through the key's worker
    back = [e for e in pl.edges if e.feedback]
    assert [(e.src, e.dst) for e in back] == [(it.id, it.params["entry"])]
    assert all(not e.feedback for e in pl.forward_edges + pl.exchange_edges)


def test_iterate_body_with_sink_is_refused_naming_the_sink():
    s = numbers(ns.Pipeline("p"))
    lines = []

    def body(b):
        lines.append(next_line())
        b.sink(ns.sinks.Console(), name="inner")
        return b.map(abs)

    with pytest.raises(PipelineError) as ei:
        s.iterate(body, keep=bool, name="sinky")
    assert "sink" in str(ei.value) and "'sinky'" in str(ei.value)
    assert_names(ei.value, "inner", lines[0])


def test_iterate_body_with_a_source_is_refused_naming_the_source():
    p = ns.Pipeline("p")
    s = numbers(p)
    lines = []

    def body(b):
        lines.append(next_line())
        other = p.source(ns.sources.Generator(records=3), name="inner_source")
        return b.union(other)

    with pytest.raises(PipelineError) as ei:
        s.iterate(body, keep=bool, name="sourcy")
    assert "source" in str(ei.value)
    assert_names(ei.value, "inner_source", lines[0])


def test_iterate_body_must_return_a_stream():
    s = numbers(ns.Pipeline("p"))
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.iterate(lambda b: None, keep=bool)
    assert_names(ei.value, "iterate", line)


def test_valid_iterate_records_entry_body_and_exit():
    p = ns.Pipeline("p")
    s = numbers(p)
    out = s.iterate(lambda b: b.map(lambda n: n // 2).filter(lambda n: n >= 0), keep=lambda n: n > 1)
    out.sink(ns.sinks.Console())
    p.validate()
    it = out.node
    kinds = {n.id: n.kind for n in p.nodes}
    assert kinds[it.params["entry"]] == "loop_entry"
    assert [kinds[i] for i in it.params["body"]] == ["map", "filter"]
    assert kinds[it.params["exit"]] == "filter"
    assert it.inputs == (it.params["exit"],)
    assert p.nodes[it.params["entry"]].inputs == (s.node.id,)


# -- the pipeline-file loader ----------------------------------------------------------------


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


GOOD_BODY = """\
import nosync as ns
pipeline = ns.Pipeline("from_file")
pipeline.source(ns.sources.Generator(records=3)).sink(ns.sinks.Console())
"""


def test_loader_returns_the_pipeline_variable(tmp_path):
    path = write(tmp_path, "good.py", GOOD_BODY)
    p = load_pipeline(path)
    assert p.name == "from_file"
    assert [n.kind for n in p.nodes] == ["source", "sink"]
    assert p.nodes[0].where == f"{path}:3"


def test_loader_calls_build_with_the_params(tmp_path):
    path = write(
        tmp_path,
        "build.py",
        """\
        import nosync as ns
        def build(args):
            p = ns.Pipeline("built-" + args.get("suffix", "none"))
            p.source(ns.sources.Generator(records=int(args.get("n", 1)))).sink(ns.sinks.Console())
            return p
        """,
    )
    p = load_pipeline(path, {"suffix": "x", "n": "7"})
    assert p.name == "built-x"
    assert p.nodes[0].params["source"].records == 7
    assert load_pipeline(path).name == "built-none"


def test_loader_file_with_neither_pipeline_nor_build(tmp_path):
    path = write(tmp_path, "empty.py", "x = 1\n")
    with pytest.raises(PipelineError) as ei:
        load_pipeline(path)
    assert path in str(ei.value)
    assert "neither `pipeline` nor `build" in str(ei.value)


def test_loader_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "broken.py", "import nosync as ns\n\np = ns.Pipeline('x'\nq = 1\ndef (:\n")
    with pytest.raises(PipelineError) as ei:
        load_pipeline(path)
    # compile() of the same text is the independent judge of where the syntax error is
    with pytest.raises(SyntaxError) as se:
        compile(open(path).read(), path, "exec")
    assert f"{path}:{se.value.lineno}:" in str(ei.value)
    assert "syntax error" in str(ei.value)


def test_loader_syntax_error_on_a_known_line(tmp_path):
    path = write(tmp_path, "broken2.py", "a = 1\nb = 2\nc = )\n")
    with pytest.raises(PipelineError) as ei:
        load_pipeline(path)
    assert f"{path}:3:" in str(ei.value)


def test_loader_params_to_a_file_that_only_defines_pipeline(tmp_path):
    path = write(tmp_path, "good.py", GOOD_BODY)
    with pytest.raises(PipelineError) as ei:
        load_pipeline(path, {"input": "x.txt"})
    assert path in str(ei.value)
    assert "input" in str(ei.value)
    assert "-p" in str(ei.value)


def test_loader_missing_file_and_wrong_type(tmp_path):
    with pytest.raises(PipelineError, match="does not exist"):
        load_pipeline(str(tmp_path / "nope.py"))
    path = write(tmp_path, "wrong.py", "pipeline = 42\n")
    with pytest.raises(PipelineError, match="expected a nosync Pipeline, got int"):
        load_pipeline(path)


def test_loader_error_in_the_file_names_the_files_line(tmp_path):
    path = write(
        tmp_path,
        "keyless.py",
        """\
        import nosync as ns
        pipeline = ns.Pipeline("k")
        s = pipeline.source(ns.sources.Generator(records=3))
        s.reduce(max)
        """,
    )
    with pytest.raises(PipelineError) as ei:
        load_pipeline(path)
    assert_names(ei.value, "reduce", 4, path=path)


def test_loader_exception_in_the_file(tmp_path):
    path = write(tmp_path, "raises.py", "raise RuntimeError('boom')\n")
    with pytest.raises(PipelineError) as ei:
        load_pipeline(path)
    assert path in str(ei.value)
    assert "RuntimeError: boom" in str(ei.value)


def test_two_sinks_in_one_directory_are_refused(tmp_path):
    p = ns.Pipeline("p")
    s = numbers(p)
    s.sink(ns.sinks.Files(str(tmp_path / "out")), name="first")
    s.sink(ns.sinks.Files(str(tmp_path / "out" / "nested")), name="nested")  # a directory of its own
    s.sink(ns.sinks.Console(), name="console")
    with pytest.raises(PipelineError) as ei:
        line = next_line()
        s.map(abs).sink(ns.sinks.LevelDB(str(tmp_path / "out") + "/"), name="second")
    assert_names(ei.value, "second", line)
    assert f"{tmp_path / 'out'} is already the directory of sink 'first'" in str(ei.value)
