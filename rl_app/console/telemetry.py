"""What a run records besides returns: system usage per iteration and TensorBoard events."""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path
from typing import Any

# Result keys that are bookkeeping, not metrics.
_SKIPPED_RESULT_KEYS = {"config", "hostname", "node_ip", "pid", "date", "trial_id", "experiment_id"}
# What tensorboardX's summary ops replace in a tag (tensorboardX.summary._INVALID_TAG_CHARACTERS).
_INVALID_TAG_CHARACTERS = re.compile(r"[^-/\w\.]")


class SystemMonitor:
    """CPU% and memory of this process and its children (Ray's local workers), and GPU when present."""

    # How often the process tree is listed again (a walk over every process on the machine).
    TREE_REFRESH_S = 5.0

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._process = psutil.Process(os.getpid())
        self._known: dict[int, Any] = {}
        self._listed_at = -math.inf
        self._gpu = _GpuReader.create()
        self.sample()  # psutil's first cpu_percent() call only starts the clock

    def _tree(self) -> list[Any]:
        """This process and its descendants, each the same ``psutil.Process`` as at the previous
        sample: ``cpu_percent`` measures from that object's last call (a new one reads 0)."""
        now = time.monotonic()
        if now - self._listed_at >= self.TREE_REFRESH_S:
            self._listed_at = now
            try:
                children = self._process.children(recursive=True)
            except self._psutil.Error:
                children = []
            known = {}
            for child in children:
                previous = self._known.get(child.pid)
                # Processes are equal when pid and start time are: a reused pid counts as new.
                known[child.pid] = previous if previous == child else child
            self._known = known
        return [self._process, *self._known.values()]

    def sample(self) -> dict[str, float]:
        cpu, rss = 0.0, 0
        for proc in self._tree():
            try:
                cpu += proc.cpu_percent(None)
                rss += proc.memory_info().rss
            except self._psutil.Error:
                continue
        usage = {
            "cpu_percent": cpu,
            "memory_mb": rss / 2**20,
            "system_memory_percent": float(self._psutil.virtual_memory().percent),
            "gpu_util_percent": math.nan,
            "gpu_memory_mb": math.nan,
        }
        if self._gpu is not None:
            usage.update(self._gpu.read())
        return usage


class _GpuReader:
    """nvidia-smi's numbers through NVML (``nvidia-ml-py``), else torch's memory counter."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle

    @classmethod
    def create(cls) -> _GpuReader | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                return None
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
        except Exception:
            pass
        try:
            import torch

            return cls(None, None) if torch.cuda.is_available() else None
        except ImportError:
            return None

    def read(self) -> dict[str, float]:
        if self.nvml is None:
            import torch

            return {"gpu_memory_mb": torch.cuda.memory_allocated() / 2**20}
        util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return {"gpu_util_percent": float(util.gpu), "gpu_memory_mb": memory.used / 2**20}


def flatten_numbers(result: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every finite number in an RLlib result, keyed by its slash-joined path."""
    flat: dict[str, float] = {}
    for key, value in result.items():
        if key in _SKIPPED_RESULT_KEYS:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_numbers(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[name] = float(value)
    return flat


class TensorBoardLog:
    """TensorBoard events in ``run_dir/tensorboard``: our summary metrics and all of RLlib's numbers."""

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(run_dir / "tensorboard"), flush_secs=10)
        self._tags: dict[str, str] = {}

    def _tag(self, name: str) -> str:
        """``name`` as tensorboardX's ``add_scalar`` writes it (characters it refuses made ``_``)."""
        tag = self._tags.get(name)
        if tag is None:
            tag = self._tags[name] = _INVALID_TAG_CHARACTERS.sub("_", name).lstrip("/")
        return tag

    def log(self, step: int, ours: dict[str, float], result: dict[str, Any]) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        numbers = {
            f"rl_app/{name}": float(value)
            for name, value in ours.items()
            if isinstance(value, (int, float)) and math.isfinite(value)
        }
        numbers.update(flatten_numbers(result))
        # One event holding every value of the iteration, which TensorBoard reads as one point per
        # tag: `add_scalar` per value built and wrote an event each, per iteration.
        values = [Summary.Value(tag=self._tag(name), simple_value=v) for name, v in numbers.items()]
        self.writer.file_writer.add_summary(Summary(value=values), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
