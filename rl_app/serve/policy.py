"""An exported policy loaded for serving: ``policy.json`` plus ``policy.onnx`` (onnxruntime) or
``policy.pt`` (TorchScript), with the observation checks a request must pass.

Imports neither Ray nor RLlib, and torch only for a TorchScript file, so the inference image
needs numpy, onnxruntime and the ASGI stack alone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rl_app.envs.spaces import box_bounds, flat_size, flatten, nesting_depth, value_count
from rl_app.errors import UserError, error_detail
from rl_app.policy import EXPORT_FORMAT_VERSION

SPEC = "policy.json"
# An export of several agents' policies: one folder per policy, and this index of them.
POLICIES_FILE = "policies.json"
PREFERRED_FORMATS = ("onnx", "torchscript")  # onnxruntime needs no torch at run time


class ObservationError(ValueError):
    """Observations a policy cannot take; the message names what is wrong."""


@dataclass(frozen=True)
class ObservationSpec:
    """What one observation must look like: shape, dtype and bounds, from ``policy.json``."""

    shape: tuple[int, ...]
    dtype: np.dtype
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    discrete_n: int | None = None  # a Discrete space: integers in [start, start + n)
    discrete_start: int = 0
    # A Dict or Tuple space's description: each observation is JSON of that structure, flattened
    # as training flattened it (rl_app.envs.spaces).
    structure: dict[str, Any] | None = None

    @classmethod
    def from_description(cls, space: dict[str, Any]) -> ObservationSpec:
        kind = space.get("type")
        if kind == "Discrete":
            return cls((), np.dtype(np.int64), discrete_n=int(space["n"]), discrete_start=int(space["start"]))
        if kind in ("Dict", "Tuple"):
            return cls((flat_size(space),), np.dtype(np.float32), structure=space)
        if kind == "MultiDiscrete":
            nvec = np.asarray(space["nvec"])
            start = np.asarray(space.get("start", 0)) + np.zeros_like(nvec)
            return cls(nvec.shape, np.dtype(np.int64), low=start, high=start + nvec - 1)
        if kind == "MultiBinary":
            shape = tuple(int(n) for n in space["shape"])
            return cls(shape, np.dtype(np.int8), low=np.zeros(shape), high=np.ones(shape))
        if kind != "Box":
            served = "Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple"
            raise ValueError(f"observation space {kind!r} is not served ({served})")
        low, high = box_bounds(space)
        return cls(low.shape, np.dtype(space["dtype"]), low=low, high=high)

    @property
    def nesting(self) -> int:
        """How deep one observation nests as JSON."""
        return len(self.shape) if self.structure is None else nesting_depth(self.structure)

    @property
    def values(self) -> int:
        """How many numbers one observation holds as JSON."""
        return math.prod(self.shape) if self.structure is None else value_count(self.structure)

    def flatten_rows(self, rows: list[Any]) -> np.ndarray:
        """Structured observations (JSON objects or lists) as the (N, flat size) float32 batch the
        model takes, or ObservationError naming the first that does not fit."""
        assert self.structure is not None
        if not rows:
            raise ObservationError("empty batch: send at least one observation")
        flat = []
        for index, row in enumerate(rows):
            try:
                flat.append(flatten(self.structure, row))
            except (ValueError, TypeError) as exc:
                raise ObservationError(f"observation {index}: {exc}") from None
        batch = np.stack(flat)
        if not np.isfinite(batch).all():
            raise ObservationError("NaN or infinity in the observations")
        return batch

    def check(self, batch: np.ndarray) -> np.ndarray:
        """``batch`` as a (N, *shape) float32 array for the model, or ObservationError."""
        if batch.ndim != len(self.shape) + 1 or batch.shape[1:] != self.shape:
            expected = ", ".join(["N", *map(str, self.shape)])
            raise ObservationError(f"expected shape ({expected}), got {tuple(batch.shape)}")
        if batch.shape[0] == 0:
            raise ObservationError("empty batch: send at least one observation")
        if batch.dtype.kind not in "biuf":
            raise ObservationError(f"expected numbers, got dtype {batch.dtype}")
        if batch.dtype.kind == "f" and not np.isfinite(batch).all():
            raise ObservationError("NaN or infinity in the observations")
        if self.dtype.kind in "iub" and batch.dtype.kind == "f" and not (batch == np.round(batch)).all():
            raise ObservationError(f"expected integers ({self.dtype}), got fractions")
        if self.discrete_n is not None:
            low, high = self.discrete_start, self.discrete_start + self.discrete_n - 1
            if (batch < low).any() or (batch > high).any():
                raise ObservationError(f"expected integers in [{low}, {high}]")
        elif self.low is not None and self.high is not None:
            outside = (batch < self.low) | (batch > self.high)
            if outside.any():
                row, *index = (int(i) for i in np.argwhere(outside)[0])
                value, low, high = (
                    batch[(row, *index)].item(),
                    self.low[tuple(index)],
                    self.high[tuple(index)],
                )
                raise ObservationError(
                    f"observation {row} is outside the observation space at index {index}: "
                    f"{value!r} not in [{low}, {high}]"
                )
        return batch.astype(np.float32, copy=False)


class _OnnxModel:
    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        # One thread per session: the server overlaps requests itself, and onnxruntime's
        # spinning thread pool otherwise takes the cores the HTTP side needs.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, obs: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(output) for output in self.session.run(None, {self.input_name: obs})]


class _TorchScriptModel:
    def __init__(self, path: Path) -> None:
        import torch

        torch.set_num_threads(1)
        self.torch = torch
        self.module = torch.jit.load(str(path), map_location="cpu").eval()

    def __call__(self, obs: np.ndarray) -> list[np.ndarray]:
        with self.torch.inference_mode():
            return [np.asarray(self.module(self.torch.from_numpy(obs)).numpy())]


@dataclass
class ServedPolicy:
    """A loaded export: ``act(observations) -> actions`` plus what ``/v1/metadata`` reports."""

    folder: Path
    spec: dict[str, Any]
    file: str
    model: Any = field(repr=False)
    observations: ObservationSpec = field(repr=False)

    @property
    def name(self) -> str:
        """``<experiment>/<run stamp>`` of the run the policy came from."""
        if self.spec.get("run"):
            return str(self.spec["run"])
        parts = Path(str(self.spec.get("checkpoint", ""))).parts
        if "checkpoints" in parts:
            run = parts[: parts.index("checkpoints")]
            return "/".join(run[-2:])
        return self.folder.name

    @property
    def discrete_actions(self) -> bool:
        return self.spec["action_space"].get("type") == "Discrete"

    def spaces(self) -> tuple[Any, Any]:
        """The observation and action space descriptions; a reload must keep them."""
        return self.spec["observation_space"], self.spec["action_space"]

    @property
    def sampling(self) -> str | None:
        """The distribution sampled actions come from (``policy.json``); None: deterministic only."""
        entry = self.spec.get("files", {}).get(self.file, {})
        return entry.get("sampling") if isinstance(entry, dict) else None

    def infer(self, observations: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Deterministic actions for a checked float32 batch, as the export computes them, and the
        action distribution's inputs where the export has them."""
        outputs = self.model(observations)
        actions = outputs[0].astype(np.int64, copy=False) if self.discrete_actions else outputs[0]
        return actions, outputs[1] if self.sampling and len(outputs) > 1 else None

    def act(self, observations: np.ndarray) -> np.ndarray:
        """Deterministic actions for a checked float32 batch."""
        return self.infer(observations)[0]

    def sample(self, dist_inputs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Actions sampled from the distribution ``dist_inputs`` parameterize, as RLlib's exploration
        samples them: then rescaled to a bounded Box's bounds and clipped, as evaluation does."""
        if self.sampling == "categorical":
            return np.argmax(dist_inputs + rng.gumbel(size=dist_inputs.shape), axis=-1).astype(np.int64)
        loc, log_std = np.split(dist_inputs.astype(np.float64), 2, axis=-1)
        if self.sampling == "squashed_gaussian":  # the export says what RLlib clamps the log-std to
            low, high = self.spec["files"][self.file]["log_std_bounds"]
            log_std = np.clip(log_std, low, high)
        actions = loc + np.exp(log_std) * rng.standard_normal(loc.shape)
        if self.sampling == "squashed_gaussian":
            actions = np.tanh(actions)
        space = self.spec["action_space"]
        if None not in space.get("low", [None]) + space.get("high", [None]):
            low = np.asarray(space["low"]).reshape(space["shape"])
            high = np.asarray(space["high"]).reshape(space["shape"])
            actions = np.clip(low + (actions + 1.0) * (high - low) / 2.0, low, high)
        return actions.astype(np.float32)

    def metadata(self) -> dict[str, Any]:
        keys = (
            "algorithm",
            "env",
            "checkpoint",
            "iteration",
            "observation_space",
            "action_space",
            "versions",
        )
        return {
            "policy": self.name,
            "format": self.spec["files"][self.file]["format"]
            if "files" in self.spec
            else self.spec["format"],
            "file": self.file,
            "sampling": self.sampling,
            "observation_encodings": ["nested lists", "base64 of the raw array (dtype, shape)"],
            **{key: self.spec[key] for key in keys if key in self.spec},
        }


def _choose_file(spec: dict[str, Any], folder: Path, fmt: str | None) -> str:
    files: dict[str, Any] = spec.get("files") or {spec.get("file"): {"format": spec.get("format")}}
    by_format = {entry.get("format"): name for name, entry in files.items() if (folder / name).is_file()}
    if fmt is not None:
        if fmt not in by_format:
            present = ", ".join(sorted(by_format)) or "none"
            raise UserError(f"{folder / SPEC}: no {fmt} export in this folder (present: {present})")
        return by_format[fmt]
    for preferred in PREFERRED_FORMATS:
        if preferred in by_format:
            return by_format[preferred]
    raise UserError(f"{folder / SPEC}: none of its policy files is there ({', '.join(map(str, files))})")


def _refuse_clipped_sac_export(spec: dict[str, Any], folder: Path, file: str) -> None:
    """A SAC export from before format 2 answers deterministic requests with clip(mean) instead of
    the policy's tanh(mean): refuse it rather than serve actions the policy never trained for."""
    entry = (spec.get("files") or {}).get(file)
    version = entry.get("format_version", 1) if isinstance(entry, dict) else 1
    continuous = spec["action_space"].get("type") == "Box"
    if spec.get("algorithm") == "SAC" and continuous and version < EXPORT_FORMAT_VERSION:
        source = spec.get("checkpoint") or "its run"
        raise UserError(
            f"{folder / file}: exported by an older rl_app whose deterministic SAC actions were "
            f"clip(mean), not tanh(mean); export it again (rl_app export {source})"
        )


def load_served_policy(folder: Path, fmt: str | None = None) -> ServedPolicy:
    """The export in ``folder`` (ONNX preferred, or ``fmt``); a missing or corrupt one is a UserError."""
    spec_path = folder / SPEC
    try:
        spec = json.loads(spec_path.read_text())
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
        observations = ObservationSpec.from_description(spec["observation_space"])
        if "type" not in spec["action_space"]:
            raise KeyError("action_space.type")
    except FileNotFoundError:
        raise UserError(f"{spec_path}: no exported policy here (make one with `rl_app export`)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{spec_path}: not a readable policy description ({error_detail(exc)})") from None
    file = _choose_file(spec, folder, fmt)
    _refuse_clipped_sac_export(spec, folder, file)
    loader = _OnnxModel if file.endswith(".onnx") else _TorchScriptModel
    try:
        model = loader(folder / file)
    except Exception as exc:  # onnxruntime and torch raise their own types for a corrupt file
        raise UserError(f"{folder / file}: cannot load the policy ({error_detail(exc)})") from None
    return ServedPolicy(folder=folder, spec=spec, file=file, model=model, observations=observations)


def load_served_policies(folder: Path, fmt: str | None = None) -> ServedPolicy | dict[str, ServedPolicy]:
    """The policy of an export folder, or, for an export of several agents' policies
    (``policies.json``), each of them by name."""
    index = folder / POLICIES_FILE
    if not index.is_file():
        return load_served_policy(folder, fmt)
    try:
        names = json.loads(index.read_text())["policies"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{index} is unreadable ({exc}); export the run again") from None
    return {str(name): load_served_policy(folder / str(name), fmt) for name in names}
