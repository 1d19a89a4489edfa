"""Action masking: envs whose observation is a Dict carrying ``action_mask`` (the common
convention: 1 for an action allowed now, 0 for one that is not) beside the rest of the observation.

RLlib's ``FlattenObservations`` connector flattens such an observation like any Dict (keys in
sorted order, so ``action_mask`` first); these modules split the flat row again: the first n
values are the mask, the model reads the rest. PPO's family pushes every masked action's logit to
the lowest float before any distribution is made of them (through the adapter's ForwardHooks, as
RLlib runs those passes by private names), DQN sets its Q-value to -inf. So
training samples, evaluation, the exported file and a server's answers never pick a masked action.
The value function reads the observation without the mask.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import DefaultAPPOTorchRLModule
from ray.rllib.algorithms.dqn.dqn_learner import QF_PREDS
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.utils.torch_utils import FLOAT_MIN

from rl_app.rllib.accel.adapter import ForwardHooks


class MaskSplit:
    """Mixin for RLlib's torch modules over flattened ``{action_mask, ...}`` rows: the model is built
    on, and reads, the row without its first n values (the mask)."""

    def __init__(self, *args: Any, observation_space: Any, action_space: Any, **kwargs: Any) -> None:
        n = int(action_space.n)
        self.observation_space_with_mask = observation_space
        rest = gym.spaces.Box(
            np.asarray(observation_space.low)[n:],
            np.asarray(observation_space.high)[n:],
            dtype=observation_space.dtype,
        )
        # The catalog builds the model on what it reads: the observation without its mask.
        super().__init__(*args, observation_space=rest, action_space=action_space, **kwargs)  # type: ignore[call-arg]

    def setup(self) -> None:
        super().setup()  # type: ignore[misc]
        # Checkpoints record the space the module takes, mask and all.
        self.observation_space = self.observation_space_with_mask

    def _split(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        obs = batch[Columns.OBS]
        n = int(self.action_space.n)  # type: ignore[attr-defined]
        return obs[..., :n], {**batch, Columns.OBS: obs[..., n:]}


class MaskedActions(ForwardHooks, MaskSplit):
    """PPO's family: masked actions' logits pushed to the lowest float, in every forward pass."""

    def before_forward(self, batch: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
        mask, rest = self._split(batch)
        return rest, mask

    def after_forward(self, outputs: dict[str, Any], mask: torch.Tensor) -> dict[str, Any]:
        outputs[Columns.ACTION_DIST_INPUTS] = outputs[Columns.ACTION_DIST_INPUTS] + torch.clamp(
            torch.log(mask), min=FLOAT_MIN
        )
        return outputs

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> Any:
        if embeddings is None:
            batch = self._split(batch)[1]
        return super().compute_values(batch, embeddings)  # type: ignore[misc]


class MaskedQValues(MaskSplit):
    """DQN: masked actions' Q-values set to -inf, online and target. RLlib's DQN reads -inf as a
    masked action: its exploration draws random actions among the finite ones only, and its loss
    bootstraps from the best allowed action (-inf taken as 0 where nothing is allowed)."""

    @staticmethod
    def _masked(out: dict[str, Any], mask: torch.Tensor) -> dict[str, Any]:
        allowed = mask > 0
        # A row that allows nothing (the last observation of a finished game) stays as it is.
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
        out[QF_PREDS] = out[QF_PREDS].masked_fill(~allowed, float("-inf"))
        return out

    def compute_q_values(self, batch: dict[str, Any]) -> dict[str, Any]:
        mask, rest = self._split(batch)
        return self._masked(super().compute_q_values(rest), mask)  # type: ignore[misc]

    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        mask, rest = self._split(batch)
        return self._masked(super().forward_target(rest), mask)  # type: ignore[misc]


class MaskedPPOModule(MaskedActions, DefaultPPOTorchRLModule):
    """PPO's and IMPALA's default module, never choosing a masked action."""


class MaskedAPPOModule(MaskedActions, DefaultAPPOTorchRLModule):
    """APPO's default module, never choosing a masked action."""


class MaskedDQNModule(MaskedQValues, DefaultDQNTorchRLModule):
    """DQN's default module, never choosing a masked action."""


MASKED_MODULES: dict[type, type] = {
    DefaultAPPOTorchRLModule: MaskedAPPOModule,
    DefaultDQNTorchRLModule: MaskedDQNModule,
    DefaultPPOTorchRLModule: MaskedPPOModule,
}


def masked_module_class(default_module_class: type) -> type | None:
    """Our masking variant of RLlib's default module class, or None if there is none."""
    return MASKED_MODULES.get(default_module_class)
