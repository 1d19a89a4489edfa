"""PPO's model initialised as the PPO paper's baselines, Stable-Baselines3 and CleanRL initialise it
(``model.ortho_init``): orthogonal weights, gain sqrt(2) in the hidden layers, 0.01 on the policy's
output (a near-uniform first policy) and 1 on the value output, zero biases.

RLlib's PPO catalog builds its heads with torch's default initialisation and ignores the head
initializer settings; this catalog, given to RLlib through the module spec, sets them.
"""

from __future__ import annotations

import math
from typing import Any

from ray.rllib.algorithms.ppo.ppo_catalog import PPOCatalog
from ray.rllib.core.models.configs import CNNEncoderConfig, MLPEncoderConfig, MLPHeadConfig

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
        _orthogonal(self._encoder_config, HIDDEN_GAIN)  # the actor-critic encoder is built from it
        _orthogonal(self.vf_head_config, VALUE_OUTPUT_GAIN)

    def build_pi_head(self, framework: str) -> Any:
        super().build_pi_head(framework)  # sets pi_head_config (the output size needs the action dist)
        config: Any = self.pi_head_config
        _orthogonal(config, POLICY_OUTPUT_GAIN)
        return config.build(framework=framework)
