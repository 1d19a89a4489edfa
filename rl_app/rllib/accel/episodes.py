"""Episodes from one sampling call's stacked step arrays, as RLlib's runner would have built them
step by step: each episode's columns are slices of the call's ``[step, env, ...]`` arrays, its
lookback buffers left as RLlib's ``finalize()`` leaves them (tests/test_sampling.py)."""

from __future__ import annotations

import time
from typing import Any, NamedTuple, cast

import numpy as np
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.spaces.space_utils import batch


class EndedEpisode(NamedTuple):
    """Env ``env``'s episode over the call's steps ``start:stop``; ``episode`` None: made from them."""

    episode: Any
    env: int
    start: int
    stop: int
    terminated: bool = False
    truncated: bool = False


class StepArrays:
    """One ``sample()`` call's vector steps, stacked into ``[step, env, ...]`` arrays when read."""

    def __init__(self) -> None:
        self._rows: dict[str, list[Any]] = {"obs": [], "actions": [], "rewards": []}
        self._infos: list[Any] = []
        self._times: list[float] = []
        self._stacked: dict[str, np.ndarray] = {}
        self.extra_keys: list[str] = []

    def add(self, observations: Any, actions: Any, rewards: Any, infos: Any, extra: dict[str, Any]) -> int:
        """Keep one vector step; returns its index."""
        if not self._infos:
            self.extra_keys = list(extra)
            self._rows.update({key: [] for key in extra})
        for key, value in (("obs", observations), ("actions", actions), ("rewards", rewards), *extra.items()):
            self._rows[key].append(value)
        self._infos.append(infos)
        self._times.append(time.perf_counter())
        self._stacked.clear()
        return len(self._infos) - 1

    def __len__(self) -> int:
        return len(self._infos)

    def column(self, key: str) -> np.ndarray:
        if key not in self._stacked:
            self._stacked[key] = np.stack(self._rows[key])
        return self._stacked[key]

    def infos(self, i: int, span: slice) -> list[dict[str, Any]]:
        """Env ``i``'s info dicts over ``span`` ({} where it gave none)."""
        return [step[i] or {} for step in self._infos[span]]

    def step_time(self, index: int) -> float:
        """When step ``index`` came back from the env (``perf_counter``, as RLlib's episodes time)."""
        return self._times[index]


def append_rows(buffer: InfiniteLookbackBuffer, rows: np.ndarray) -> None:
    """Extend ``buffer`` by ``rows`` and leave it as ``finalize()`` would: one array, the
    items ``batch()`` would have stacked (a lookback kept as a list is stacked first)."""
    if buffer.finalized:
        buffer.data = np.concatenate([buffer.data, rows])
    elif buffer.data:
        buffer.data = np.concatenate([batch(cast(list[Any], buffer.data)), rows])
    else:
        buffer.data = rows.copy()  # not a view: it would keep the call's whole array alive
    buffer.finalized = True


def with_list_buffers(episode: Any) -> Any:
    """A continuation as RLlib's runner leaves it (its buffers lists of items), though ``cut()``
    took it from arrays: RLlib's own sampling may go on with it (random actions)."""
    buffers = [episode.observations, episode.actions, episode.rewards, *episode.extra_model_outputs.values()]
    for buffer in buffers:
        if buffer.finalized:
            buffer.data, buffer.finalized = list(buffer.data), False
    return episode
