"""Export a trained policy for inference without Ray or RLlib: TorchScript or ONNX, plus a spec JSON."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from rl_app.errors import UserError
from rl_app.runs.checkpoints import read_info
from rl_app.runs.files import write_json
from rl_app.runs.remote import locate_checkpoint

FILENAMES = {"torchscript": "policy.pt", "onnx": "policy.onnx"}


def _example_batch(space: Any, size: int = 8) -> Any:
    import numpy as np
    import torch

    space.seed(0)
    return torch.as_tensor(np.stack([space.sample() for _ in range(size)]).astype(np.float32))


def export_policy(
    location: str,
    fmt: str,
    out_dir: Path | None = None,
    *,
    runs_root: Path = Path("runs"),
    console: Console | None = None,
) -> Path:
    """Write ``policy.pt`` or ``policy.onnx`` and ``policy.json`` (spaces, algorithm, source)."""
    import torch

    from rl_app.policy.module import load_policy, space_description

    if fmt not in FILENAMES:
        raise UserError(f"export format '{fmt}' is not one of: {', '.join(FILENAMES)}")
    console = console or Console()
    checkpoint = locate_checkpoint(location, runs_root)
    info = read_info(checkpoint)
    out_dir = out_dir or checkpoint.parent.parent / "export"
    target = out_dir / FILENAMES[fmt]
    policy = load_policy(checkpoint)
    example = _example_batch(policy.observation_space)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Write next to the target and move into place: a failed export leaves any earlier one intact.
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-") as scratch:
        staged = Path(scratch) / target.name
        with torch.no_grad():
            if fmt == "torchscript":
                torch.jit.trace(policy, example).save(str(staged))
            else:
                torch.onnx.export(
                    policy,
                    (example,),
                    str(staged),
                    input_names=["obs"],
                    output_names=["action"],
                    dynamic_shapes={"obs": {0: torch.export.Dim("batch", min=1)}},
                    dynamo=True,
                    external_data=False,  # one self-contained file
                    verbose=False,
                )
        shutil.move(str(staged), target)
    write_json(
        out_dir / "policy.json",
        {
            "format": fmt,
            "file": target.name,
            "algorithm": info.algorithm,
            "env": info.env,
            "checkpoint": str(checkpoint),
            "iteration": info.iteration,
            "input": {"name": "obs", "batched": True, "dtype": "float32"},
            "observation_space": space_description(policy.observation_space),
            "action_space": space_description(policy.action_space),
            "deterministic": True,
        },
    )
    console.print(f"Exported {info.algorithm} policy ({info.env}) to {target} and {out_dir / 'policy.json'}")
    return target
