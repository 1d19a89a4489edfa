"""Copy committed results into the docs that quote them.

    python bench/render_docs.py           (rewrite the quoted blocks)
    python bench/render_docs.py --check   (exit 1 when a block differs from its file)

A doc quotes a results file between ``<!-- from bench/results/NAME.md -->`` and
``<!-- end -->``: the file's text below its title, copied as it is, so a figure there is never
typed by hand."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "bench/README.md", "docs/distributed.md", "docs/internals.md", "docs/guide.md")
QUOTE = re.compile(r"(<!-- from (bench/results/[\w.-]+\.md) -->\n)(.*?)(<!-- end -->)", re.DOTALL)


def body(results_file: str) -> str:
    """The results file's text below its ``# title`` line, without the blank lines around it."""
    lines = (REPO / results_file).read_text().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).strip() + "\n"


def rendered(text: str) -> str:
    return QUOTE.sub(lambda m: m.group(1) + body(m.group(2)) + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which docs differ")
    args = parser.parse_args()
    stale = []
    for doc in DOCS:
        path = REPO / doc
        text = path.read_text()
        new = rendered(text)
        if new != text:
            stale.append(doc)
            if not args.check:
                path.write_text(new)
    verb = "differ from their results files" if args.check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "every quoted block is its results file")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
