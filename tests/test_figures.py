"""The figures the READMEs quote next to a results file are in that file: a block (a table row or a
paragraph) that cites `bench/results/NAME` may only carry decimals that NAME's .md or .json holds,
the JSON's numbers read at any rounding up to 4 places (or as percentages or milliseconds)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "bench/README.md", "docs/distributed.md"]
CITATION = re.compile(r"bench/results/(?!NAME)([\w.-]+?)(?:\.md|\.json)?(?=[)\s,;:`]|$)")
DECIMAL = re.compile(r"(?<![\w.])\d[\d,]*\.\d+")


def figures_of(value: object) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(figures_of(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(figures_of(v) for v in value)) if value else set()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return set()
    number = float(value)
    shown = {f"{abs(number):.{places}f}" for places in range(5)}
    shown |= {f"{abs(number):,.{places}f}" for places in range(5)}
    # Fractions are quoted as percentages, seconds as milliseconds.
    scaled = {f"{abs(number) * scale:.{places}f}" for scale in (100, 1000) for places in range(3)}
    return shown | scaled


def figures_in(name: str) -> set[str]:
    found: set[str] = set()
    for path in (REPO / "bench" / "results").glob(f"{name}*"):
        if path.suffix == ".json":
            found |= figures_of(json.loads(path.read_text()))
        elif path.suffix in (".md", ".csv"):  # text; a plot beside them (.png) holds no figure to read
            found |= {figure.replace(",", "") for figure in DECIMAL.findall(path.read_text())}
            found |= set(DECIMAL.findall(path.read_text()))
    return found


def cited_blocks() -> list[tuple[str, str, list[str]]]:
    blocks = []
    for doc in DOCS:
        for block in re.split(r"\n(?=\|)|\n\n", (REPO / doc).read_text()):
            names = sorted(set(CITATION.findall(block)))
            if names:
                blocks.append((doc, block, names))
    return blocks


def test_every_cited_results_file_exists() -> None:
    blocks = cited_blocks()
    assert len(blocks) >= 10
    missing = {
        name
        for _, _, names in blocks
        for name in names
        if not list((REPO / "bench" / "results").glob(f"{name}*"))
    }
    assert missing == set()


@pytest.mark.parametrize("doc", DOCS)
def test_figures_beside_a_results_file_are_in_it(doc: str) -> None:
    strays = []
    for source, block, names in cited_blocks():
        if source != doc:
            continue
        known = set().union(*(figures_in(name) for name in names))
        for figure in DECIMAL.findall(block.replace("\u2212", "-")):
            if figure not in known and figure.replace(",", "") not in known:
                strays.append(f"{figure} (citing {', '.join(names)}): {block[:80]!r}")
    assert strays == [], "\n".join(strays)


def test_quoted_results_blocks_are_their_files() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import render_docs
    finally:
        sys.path.remove(str(REPO / "bench"))
    quoted = 0
    for doc in render_docs.DOCS:
        text = (REPO / doc).read_text()
        quoted += len(render_docs.QUOTE.findall(text))
        assert render_docs.rendered(text) == text, f"{doc}: run python bench/render_docs.py"
    assert quoted >= 2
