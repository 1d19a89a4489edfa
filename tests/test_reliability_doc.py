"""docs/reliability.md and the tests agree: every test a row names exists, and every fault or
bad-input test (recognised by its name) has a row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "reliability.md"
# Names of the tests that prove a fault survived or a bad input refused.
FAULT_OR_BAD_INPUT = re.compile(
    r"kill|crash|outage|disk|interrupt|sigterm|sigkill|sigint|signal|read_only|timeout|same_second|another_ray_version|damaged"
    r"|failing|bad_|one_line|refused|refuses|corrupt|fails_fast|folder_named|no_traceback|unknown_command"
)


def functions_by_file() -> dict[str, set[str]]:
    found = {}
    for path in sorted((REPO / "tests").glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        tree = ast.parse(path.read_text())
        found[f"tests/{path.name}"] = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
        }
    return found


def test_every_test_the_reliability_doc_names_exists() -> None:
    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", DOC.read_text())
    assert len(named) >= 40
    functions = functions_by_file()
    missing = [f"{file}::{name}" for file, name in named if name not in functions.get(file, set())]
    assert missing == [], f"docs/reliability.md names tests that do not exist: {missing}"


def test_every_fault_and_bad_input_test_has_a_row_in_the_reliability_doc() -> None:
    text = DOC.read_text()
    unlisted = [
        f"{file}::{name}"
        for file, names in functions_by_file().items()
        for name in sorted(names)
        if FAULT_OR_BAD_INPUT.search(name) and f"`{file}::{name}`" not in text
    ]
    assert unlisted == [], f"fault or bad-input tests without a row in docs/reliability.md: {unlisted}"
