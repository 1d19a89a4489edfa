"""Our catalogs, given to RLlib through the module spec, where RLlib's default model is not the one
the field trains.

PPO (``model.ortho_init``): the model initialised as the PPO paper's baselines, Stable-Baselines3
and CleanRL initialise it: orthogonal weights, gain sqrt(2) in the hidden layers, 0.01 on the
policy's output (a near-uniform first policy) and 1 on the value output, zero biases. RLlib's PPO
catalog builds its heads with torch's default initialisation and ignores the head initializer
settings.

SAC with continuous actions (``model.sac_critic``): RLlib 2.60 encodes observation and action in
separate MLPs and joins them in a tanh fusion net with skip connections, about nine times the
compute of the critic of the SAC paper, SB3 and CleanRL (one MLP over observation and action
concatenated) for [256, 256] layers. ``concat`` builds the paper's critic, in a module whose
training forward pass is RLlib's with less around the same tensor operations.

Every SAC module rl_app builds acts deterministically with tanh(mean), the mode of the squashed
Gaussian it was trained with (:class:`TanhModeSACTorchRLModule`, see rl_app.rllib.distributions).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.algorithms.ppo.ppo_catalog import PPOCatalog
from ray.rllib.algorithms.sac.sac_learner import ACTION_DIST_INPUTS_NEXT, QF_PREDS, QF_TWIN_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchSquashedGaussian
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.models.configs import CNNEncoderConfig, MLPEncoderConfig, MLPHeadConfig
from ray.rllib.core.models.torch.heads import TorchMLPHead

from rl_app.rllib.accel.adapter import (
    MLPEncoderInternals,
    SACCatalogInternals,
    SACModuleInternals,
    clips_log_std,
    encoder_config_of,
    inner_net,
)
from rl_app.rllib.accel.draws import draw_squashed_gaussian
from rl_app.rllib.distributions import SquashedGaussian

HIDDEN_GAIN = math.sqrt(2)
POLICY_OUTPUT_GAIN = 0.01
VALUE_OUTPUT_GAIN = 1.0
ORTHO_INIT_ALGORITHMS = ("PPO", "APPO", "IMPALA")  # the algorithms whose modules PPO's catalog builds


def _orthogonal(config: Any, output_gain: float | None = None) -> None:
    """Set orthogonal weights and zero biases on an RLlib model config, in place."""
    if isinstance(config, MLPEncoderConfig | MLPHeadConfig):
        config.hidden_layer_weights_initializer = "orthogonal_"
        config.hidden_layer_weights_initializer_config = {"gain": HIDDEN_GAIN}
        config.hidden_layer_bias_initializer = "zeros_"
        if output_gain is not None:
            config.output_layer_weights_initializer = "orthogonal_"
            config.output_layer_weights_initializer_config = {"gain": output_gain}
            config.output_layer_bias_initializer = "zeros_"
    elif isinstance(config, CNNEncoderConfig):
        config.cnn_kernel_initializer = "orthogonal_"
        config.cnn_kernel_initializer_config = {"gain": HIDDEN_GAIN}
        config.cnn_bias_initializer = "zeros_"


class OrthoInitPPOCatalog(PPOCatalog):
    """:class:`PPOCatalog` whose encoder and heads start orthogonal (see the module docstring)."""

    def __init__(self, observation_space: Any, action_space: Any, model_config_dict: dict) -> None:
        super().__init__(observation_space, action_space, model_config_dict)
        _orthogonal(encoder_config_of(self), HIDDEN_GAIN)  # the actor-critic encoder is built from it
        _orthogonal(self.vf_head_config, VALUE_OUTPUT_GAIN)

    def build_pi_head(self, framework: str) -> Any:
        super().build_pi_head(framework)  # sets pi_head_config (the output size needs the action dist)
        config: Any = self.pi_head_config
        _orthogonal(config, POLICY_OUTPUT_GAIN)
        return config.build(framework=framework)


class TorchObservationActionEncoder(MLPEncoderInternals):
    """An MLP encoder over the observation and the action concatenated: SAC's critic encoder."""

    def encode(self, inputs: dict, **kwargs: Any) -> dict:
        joined = torch.cat([inputs[Columns.OBS], inputs[Columns.ACTIONS]], dim=-1)
        return super().encode({Columns.OBS: joined}, **kwargs)


class ConcatCriticSACCatalog(SACCatalogInternals):
    """:class:`SACCatalog` whose continuous-action critics are one MLP over observation and action
    (see the module docstring); the actor is RLlib's."""

    def build_critic_encoder(self, framework: str) -> Any:
        if not is_concat_critic_eligible(self.observation_space, self.action_space):
            return super().build_critic_encoder(framework)
        observation_encoder: Any = encoder_config_of(self)  # an MLP's, for a flat Box observation
        action_space: Any = self.action_space
        joined = observation_encoder.input_dims[0] + action_space.shape[0]
        return TorchObservationActionEncoder(dataclasses.replace(observation_encoder, input_dims=[joined]))


def is_concat_critic_eligible(observation_space: Any, action_space: Any) -> bool:
    """Whether :class:`ConcatCriticSACCatalog` builds the concatenated critic for these spaces."""
    return (
        isinstance(action_space, gym.spaces.Box)
        and len(action_space.shape) == 1
        and isinstance(observation_space, gym.spaces.Box)
        and len(observation_space.shape) == 1
    )


class TanhModeSACTorchRLModule(SACModuleInternals):
    """RLlib's SAC module whose inference distribution's deterministic action is tanh(mean)
    (:class:`SquashedGaussian`), so RLlib's evaluation runners, its action connector and our runner
    all act with it; exploration and training keep RLlib's own distribution class."""

    def get_inference_action_dist_cls(self) -> Any:
        dist_class = super().get_inference_action_dist_cls()
        return SquashedGaussian if dist_class is TorchSquashedGaussian else dist_class

    def get_exploration_action_dist_cls(self) -> Any:
        # TorchRLModule's default is the inference class; exploration samples, so RLlib's serves.
        return super().get_inference_action_dist_cls()

    def get_train_action_dist_cls(self) -> Any:
        return super().get_inference_action_dist_cls()


class ConcatCriticSACTorchRLModule(TanhModeSACTorchRLModule):
    """RLlib's SAC module (2.60) for :class:`ConcatCriticSACCatalog`'s critics, its continuous-action
    training pass leaner around the same tensor operations, in the same order on the same RNG (the
    outputs and gradients are RLlib's to the bit, tests/test_adapter.py): the next state's actor and
    the target critics run without autograd recording (RLlib detaches their outputs), the squashed
    Gaussian is computed inline instead of through two distribution objects per pass, and the
    critics' MLPs are called directly (the rest is the same matmuls)."""

    lean = True  # off: RLlib's own training pass over the same critics (acceleration off)

    def train_pass_continuous(self, batch: dict[str, Any]) -> dict[str, Any]:
        critics = [(self.qf_encoder, self.qf)]
        targets = [(self.target_qf_encoder, self.target_qf)]
        if self.twin_q:
            critics.append((self.qf_twin_encoder, self.qf_twin))
            targets.append((self.target_qf_twin_encoder, self.target_qf_twin))
        plain = (
            self.lean
            and self.get_train_action_dist_cls() is TorchSquashedGaussian
            and all(_plain_critic(encoder, head) for encoder, head in critics + targets)
        )
        if not plain:
            return super().train_pass_continuous(batch)
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        output: dict[str, Any] = {}
        action_logits = self.pi(self.pi_encoder({Columns.OBS: obs})[ENCODER_OUT])
        for key, (encoder, head) in zip((QF_PREDS, QF_TWIN_PREDS), critics, strict=False):
            output[key] = _critic(encoder, head, obs, batch[Columns.ACTIONS])
        output[Columns.ACTION_DIST_INPUTS] = action_logits
        # Drawn in RLlib's order: the current state's reparameterized actions, then the next state's.
        actions_resampled, logp_resampled = draw_squashed_gaussian(action_logits, reparameterized=True)
        output["logp_resampled"] = logp_resampled
        with torch.no_grad():
            action_logits_next = self.pi(self.pi_encoder({Columns.OBS: next_obs})[ENCODER_OUT])
            output[ACTION_DIST_INPUTS_NEXT] = action_logits_next
            actions_next, output["logp_next_resampled"] = draw_squashed_gaussian(
                action_logits_next, reparameterized=False
            )
        # The actor's loss reaches the actor through the critics, not the critics' weights.
        critic_params = [p for encoder, head in critics for p in (*encoder.parameters(), *head.parameters())]
        for param in critic_params:
            param.requires_grad = False
        try:
            q_curr = [_critic(encoder, head, obs, actions_resampled) for encoder, head in critics]
        finally:
            for param in critic_params:
                param.requires_grad = True
        output["q_curr"] = q_curr[0] if len(q_curr) == 1 else torch.min(q_curr[0], q_curr[1])
        with torch.no_grad():
            q_next = [_critic(encoder, head, next_obs, actions_next) for encoder, head in targets]
            output["q_target_next"] = q_next[0] if len(q_next) == 1 else torch.min(q_next[0], q_next[1])
        return output


class PlainConcatCriticSACTorchRLModule(ConcatCriticSACTorchRLModule):
    """The concatenated critic with RLlib's own training pass (rl_app's acceleration off)."""

    lean = False


def _plain_critic(encoder: Any, head: Any) -> bool:
    """Whether a critic is :class:`TorchObservationActionEncoder` and an unclipped MLP head, so
    calling their nets is what their forward calls."""
    return (
        type(encoder) is TorchObservationActionEncoder
        and type(head) is TorchMLPHead
        and not clips_log_std(head)
    )


def _critic(encoder: Any, head: Any, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """RLlib's ``_qf_forward_train_helper(squeeze=True)`` for a :func:`_plain_critic`."""
    return inner_net(head)(inner_net(encoder)(torch.cat([obs, actions], dim=-1))).squeeze(-1)
