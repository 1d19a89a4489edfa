"""The bench scripts run outside `make test`; what they import from rl_app must still exist."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_rl_app_name_a_bench_script_imports_exists() -> None:
    imported = []
    for script in sorted((REPO / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rl_app"):
                imported += [(script.name, node.module, alias.name) for alias in node.names]
    assert len(imported) >= 20
    missing = []
    for script, module_name, name in imported:
        module = importlib.import_module(module_name)
        if not hasattr(module, name) and importlib.util.find_spec(f"{module_name}.{name}") is None:
            missing.append(f"{script}: from {module_name} import {name}")
    assert missing == []
