"""RLlib modules that take observations as the env makes them: uint8 frames, bool grids, and flat
vectors of either (a grid through ``flatten_observation``).

RLlib's CNN encoder needs float input; its own Atari example converts every frame to float32 in
the env, so episodes, batches and the object store carry 4x the bytes. These modules keep the
env's dtype all the way to the model and convert on the way in (uint8 scaled to [0, 1]), where
a batch is already one tensor; the conversion is part of the module, so checkpoints, evaluation
and exported policies apply it too.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import DefaultAPPOTorchRLModule
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.models.torch.encoder import TorchCNNEncoder, TorchMLPEncoder

from rl_app.rllib.accel.adapter import inner_net, set_inner_net


def has_raw_inputs(space: gym.Space) -> bool:
    """A Box whose values are not floats, of rank 3 (frames, grids) or 1 (a flattened grid, counts):
    RLlib's encoders would meet them as they are and fail at their first layer."""
    return (
        isinstance(space, gym.spaces.Box)
        and len(space.shape) in (1, 3)
        and not np.issubdtype(space.dtype, np.floating)
    )


class ToFloat(torch.nn.Module):
    """``x -> float32(x) * scale``: 1/255 for uint8 frames, 1 for bool or small-int grids."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32) * self.scale


class ImageInputs:
    """Mixin for an RLlib torch module: every encoder reading the observation starts with
    :class:`ToFloat` (the CNN encoders of frames and grids, the MLP encoders of flat vectors).

    The scale depends on the observation space only, never on the dtype of a batch, so a
    policy fed float copies of the frames acts exactly as one fed the frames.
    """

    def setup(self) -> None:
        super().setup()  # type: ignore[misc]
        dtype = self.observation_space.dtype  # type: ignore[attr-defined]
        scale = 1.0 / 255.0 if dtype == np.uint8 else 1.0
        flat = len(self.observation_space.shape) == 1  # type: ignore[attr-defined]
        modules: list[Any] = list(self.modules())  # type: ignore[attr-defined]
        for encoder in modules:
            if isinstance(encoder, TorchCNNEncoder):
                set_inner_net(encoder, torch.nn.Sequential(ToFloat(scale), *inner_net(encoder)))
            elif flat and isinstance(encoder, TorchMLPEncoder):
                set_inner_net(encoder, torch.nn.Sequential(ToFloat(scale), inner_net(encoder)))


class ImagePPOModule(ImageInputs, DefaultPPOTorchRLModule):
    """PPO's and IMPALA's default module, taking observations as they come."""


class ImageAPPOModule(ImageInputs, DefaultAPPOTorchRLModule):
    """APPO's default module, taking observations as they come."""


class ImageDQNModule(ImageInputs, DefaultDQNTorchRLModule):
    """DQN's default module, taking observations as they come."""


IMAGE_MODULES: dict[type, type] = {
    DefaultAPPOTorchRLModule: ImageAPPOModule,
    DefaultPPOTorchRLModule: ImagePPOModule,
    DefaultDQNTorchRLModule: ImageDQNModule,
}


def image_module_class(default_module_class: type) -> type | None:
    """Our image-input variant of RLlib's default module class, or None if there is none."""
    return IMAGE_MODULES.get(default_module_class)
