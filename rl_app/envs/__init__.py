"""The one env factory: every env rl_app runs (training, evaluation, video, export) is made here.

An env is a Gymnasium id or a 'package.module:Class' path, with its ``config:`` as keyword
arguments, wrapped in the wrappers the experiment declares, in order.
"""

from rl_app.envs.factory import (
    action_space,
    check_env,
    check_env_id,
    env_creator,
    has_native_vector_env,
    has_training_only_wrappers,
    make_env,
    make_native_vector_env,
    observation_space,
)
from rl_app.envs.wrappers import WRAPPERS, check_wrapper

__all__ = [
    "WRAPPERS",
    "action_space",
    "check_env",
    "check_env_id",
    "check_wrapper",
    "env_creator",
    "has_native_vector_env",
    "has_training_only_wrappers",
    "make_env",
    "make_native_vector_env",
    "observation_space",
]
