"""wordcount: running word counts over text files.

    nosync run experiments/workloads/wordcount.py -p input='experiments/data/*.txt' -p output=out/

Parameters: input (a glob of text files; default: the bundled text), output (a directory of
committed JSONL files; default: ./wordcount-out; `nosync chaos` sets <run dir>/output).
Each output record is [word, count so far]; the last record of a word is its total.
"""

import os
import re

import nosync as ns

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_INPUT = os.path.join(HERE, "..", "data", "*.txt")
WORD = re.compile(r"[a-z']+")


def words(line: str) -> list[str]:
    return WORD.findall(line.lower())


def build(args: dict) -> ns.Pipeline:
    p = ns.Pipeline("wordcount")
    lines = p.source(ns.sources.Files(args.get("input", DEFAULT_INPUT), format="text"))
    counts = lines.flat_map(words).key_by(lambda w: w).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.Files(args.get("output", "wordcount-out"), format="jsonl"))
    return p
