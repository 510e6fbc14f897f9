"""Prints the most frequent words from wordcount's committed output: python -m experiments.top_words DIR [N]."""

from __future__ import annotations

import sys

import nosync as ns


def top_words(directory: str, n: int = 10) -> list[tuple[str, int]]:
    """Each word's total is its largest running count."""
    totals: dict[str, int] = {}
    for word, count in ns.sinks.Files(directory).read_committed():
        if count > totals.get(word, 0):
            totals[word] = count
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m experiments.top_words OUTPUT_DIR [N]")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rows = top_words(sys.argv[1], n)
    if not rows:
        sys.exit(f"no committed output in {sys.argv[1]}")
    print(f"top {len(rows)} words:")
    for word, count in rows:
        print(f"  {count:5d}  {word}")


if __name__ == "__main__":
    main()
