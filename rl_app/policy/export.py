"""Export a trained policy for inference without Ray or RLlib: TorchScript or ONNX, plus a spec JSON."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from rl_app.console.tables import output_console, warner
from rl_app.errors import UserError
from rl_app.policy import EXPORT_FORMAT_VERSION
from rl_app.runs.files import write_json
from rl_app.runs.remote import open_checkpoint
from rl_app.serve.policy import POLICIES_FILE

FILENAMES = {"torchscript": "policy.pt", "onnx": "policy.onnx"}


def _example_batch(policy: Any, size: int = 8) -> Any:
    """A batch of ``policy``'s input: observations sampled from its space, as ``act`` prepares them."""
    import numpy as np
    import torch

    space = policy.observation_space
    space.seed(0)
    return torch.as_tensor(np.stack([policy.prepare(space.sample()) for _ in range(size)]))


def _earlier_exports(out_dir: Path) -> dict[str, Any]:
    """The ``files`` entries of an earlier ``policy.json`` in ``out_dir`` whose files are still there."""
    try:
        earlier = json.loads((out_dir / "policy.json").read_text())
    except (OSError, ValueError):
        return {}
    files = earlier.get("files") or {
        earlier.get("file"): {k: earlier.get(k) for k in ("format", "checkpoint", "iteration")}
    }
    return {name: entry for name, entry in files.items() if name and (out_dir / name).is_file()}


def _run_name(checkpoint: Path) -> str:
    """``<experiment>/<stamp>`` of the run folder holding ``checkpoint`` (``<run>/checkpoints/<name>``)."""
    run = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    return f"{run.parent.name}/{run.name}"


def _versions() -> dict[str, str]:
    from importlib import metadata

    from rl_app import __version__

    return {"rl_app": __version__, **{name: metadata.version(name) for name in ("ray", "torch", "gymnasium")}}


def export_policy(
    location: str,
    fmt: str,
    out_dir: Path | None = None,
    *,
    runs_root: Path = Path("runs"),
    verbose: bool = False,
    allow_version_mismatch: bool = False,
    console: Console | None = None,
    warn: Callable[[str], None] | None = None,
) -> Path:
    """Write ``policy.pt`` or ``policy.onnx`` and ``policy.json`` (spaces, algorithm, source), and
    return the policy file; for several agents' policies, one folder of those per policy and their
    index, ``policies.json``, which is returned.
    ``warn`` (default: a warning line on ``console``) hears of a run's damaged checkpoints passed over."""

    from rl_app.library_logs import capture_rllib_logs, library_log_note, write_library_logs
    from rl_app.policy.module import (
        load_policy,
    )

    if fmt not in FILENAMES:
        raise UserError(f"export format '{fmt}' is not one of: {', '.join(FILENAMES)}")
    if not verbose:
        capture_rllib_logs()
    console = console or output_console()
    warn = warn or warner(console)
    checkpoint, info = open_checkpoint(location, runs_root, allow_version_mismatch, warn=warn)
    out_dir = out_dir or checkpoint.parent.parent / "export"
    target = out_dir / FILENAMES[fmt]
    out_dir.mkdir(parents=True, exist_ok=True)
    if not verbose:
        write_library_logs(out_dir)
    if info.policies is None:
        _export_one(load_policy(checkpoint), fmt, target, checkpoint, info)
        console.print(
            f"Exported {info.algorithm} policy ({info.env}) to {target} and {out_dir / 'policy.json'}"
        )
    else:  # several agents: a folder per policy, each as one agent's export
        for name in info.policies:
            _export_one(
                load_policy(checkpoint, name=name), fmt, out_dir / name / target.name, checkpoint, info
            )
        write_json(
            out_dir / POLICIES_FILE,
            {"policies": list(info.policies), "algorithm": info.algorithm, "env": info.env, "format": fmt},
        )
        names = ", ".join(info.policies)
        console.print(
            f"Exported {info.algorithm} policies {names} ({info.env}) to {out_dir}/<policy>/{target.name}"
        )
        target = out_dir / POLICIES_FILE
    note = None if verbose else library_log_note(out_dir)
    if note:
        console.print(note)
    return target


def _export_one(policy: Any, fmt: str, target: Path, checkpoint: Path, info: Any) -> None:
    """Write ``policy`` to ``target`` and its ``policy.json`` beside it."""
    import gymnasium as gym
    import torch

    from rl_app.envs.spaces import describe
    from rl_app.policy.module import Policy, PolicyWithDistInputs, sampled_distribution

    if getattr(policy, "recurrent", False):
        raise UserError(
            f"{checkpoint}: a recurrent policy (model.use_lstm) carries its state from step to step, "
            "which an exported file does not take yet; evaluate it with `rl_app evaluate`"
        )
    if isinstance(policy, Policy):
        from rl_app.rllib.distributions import with_batch_free_log_std_heads

        with_batch_free_log_std_heads(policy.module)
    example = _example_batch(policy)
    # ONNX exports also return the distribution inputs, so a server can sample actions too;
    # TorchScript keeps one output, the actions (what ``torch.jit.load(...)(obs)`` users expect).
    distribution = (
        sampled_distribution(policy, example) if fmt == "onnx" and isinstance(policy, Policy) else None
    )
    out_dir = target.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    # Write next to the target and move into place: a failed export leaves any earlier one intact.
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-") as scratch:
        staged = Path(scratch) / target.name
        with torch.no_grad():
            if fmt == "torchscript":
                torch.jit.trace(policy, example).save(str(staged))
            else:
                torch.onnx.export(
                    PolicyWithDistInputs(policy).eval()
                    if distribution and isinstance(policy, Policy)
                    else policy,
                    (example,),
                    str(staged),
                    input_names=["obs"],
                    output_names=["action", "dist_inputs"] if distribution else ["action"],
                    dynamic_shapes={"obs": {0: torch.export.Dim("batch", min=1)}},
                    dynamo=True,
                    external_data=False,  # one self-contained file
                    verbose=False,
                )
        shutil.move(str(staged), target)
    exported = {
        "format": fmt,
        "format_version": EXPORT_FORMAT_VERSION,
        "checkpoint": str(checkpoint),
        "iteration": info.iteration,
        # Which distribution the file's second output ("dist_inputs") parameterizes; None: actions only.
        "sampling": distribution,
    }
    if distribution == "squashed_gaussian":  # what a server clamps the log-std to, as RLlib does
        from rl_app.rllib.distributions import LOG_STD_BOUNDS

        exported["log_std_bounds"] = list(LOG_STD_BOUNDS)
    write_json(
        out_dir / "policy.json",
        {
            # The latest export; ``files`` describes every policy file in the folder.
            "format": fmt,
            "file": target.name,
            "files": {**_earlier_exports(out_dir), target.name: exported},
            "algorithm": info.algorithm,
            "env": info.env,
            "checkpoint": str(checkpoint),
            "iteration": info.iteration,
            "run": _run_name(checkpoint),
            "versions": _versions(),
            # Dict and Tuple observations reach the file flattened (rl_app.envs.spaces.flatten).
            "input": {
                "name": "obs",
                "batched": True,
                "dtype": "float32",
                "flattened": isinstance(policy.observation_space, gym.spaces.Dict | gym.spaces.Tuple),
            },
            "observation_space": describe(policy.observation_space),
            "action_space": describe(policy.action_space),
            "deterministic": True,
        },
    )
