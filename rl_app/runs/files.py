"""JSON files that readers never see half-written, and one-line errors for unreadable ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_app.errors import UserError


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON via a temporary file so readers never see a half-written file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    partial.replace(path)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; missing, unreadable or non-object files are user errors."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"'{path}' is missing") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"'{path}' is unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"'{path}' is not a JSON object")
    return data
