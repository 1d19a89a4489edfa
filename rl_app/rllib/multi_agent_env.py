"""RLlib's side of several agents' envs: its ``MultiAgentEnv`` base class and its PettingZoo wrappers."""

from __future__ import annotations

from types import ModuleType
from typing import Any


def is_multi_agent_class(made: Any) -> bool:
    """Whether ``made`` is a subclass of RLlib's ``MultiAgentEnv``."""
    from ray.rllib.env.multi_agent_env import MultiAgentEnv

    return isinstance(made, type) and issubclass(made, MultiAgentEnv)


def pettingzoo_env(module: ModuleType, kwargs: dict[str, Any]) -> Any:
    """The PettingZoo env of ``module`` as RLlib's ``MultiAgentEnv``: its Parallel API where the
    module has one (``ParallelPettingZooEnv``), else its AEC API (``PettingZooEnv``)."""
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv, PettingZooEnv

    if hasattr(module, "parallel_env"):
        return ParallelPettingZooEnv(module.parallel_env(**kwargs))
    return PettingZooEnv(module.env(**kwargs))
