"""Several agents: PettingZoo envs named by their module, and the user's own RLlib ``MultiAgentEnv``
classes, made as RLlib's ``MultiAgentEnv``; and which policy acts for each agent.

A PettingZoo env is named as it is imported: ``mpe2.simple_spread_v3``,
``pettingzoo.classic.tictactoe_v3``. Its Parallel API is used where the module has one, else its
AEC API (turn-based games), through RLlib's own wrappers.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rl_app.envs.spaces import MASK_KEY, spaces_problem
from rl_app.envs.wrappers import import_class
from rl_app.errors import error_detail

if TYPE_CHECKING:
    from rl_app.config.schema import EnvSection, ExperimentConfig, MultiAgentSection, SelfPlaySection


class MappingError(ValueError):
    """The multi_agent section does not fit the env's agents (rather than the env being broken)."""


def pettingzoo_module(env_id: str) -> ModuleType | None:
    """The module of a PettingZoo env id (one with ``parallel_env`` or ``env``), else None."""
    if ":" in env_id or "/" in env_id or "." not in env_id:
        return None
    try:
        module = importlib.import_module(env_id)
    except ImportError:
        return None
    return module if hasattr(module, "parallel_env") or hasattr(module, "env") else None


def is_multi_agent_env(env_id: str) -> bool:
    """Whether ``env_id`` names a PettingZoo env or an RLlib ``MultiAgentEnv`` class."""
    if pettingzoo_module(env_id) is not None:
        return True
    if ":" not in env_id:
        return False
    from rl_app.rllib.multi_agent_env import is_multi_agent_class

    try:
        return is_multi_agent_class(import_class(env_id))
    except ValueError:
        return False


def multi_agent_section(experiment: ExperimentConfig) -> MultiAgentSection | None:
    """The experiment's ``multi_agent`` section; its defaults (one shared policy) for a multi-agent
    env without one; None for a single-agent experiment."""
    from rl_app.config.schema import MultiAgentSection

    if experiment.multi_agent is not None:
        return experiment.multi_agent
    return MultiAgentSection.model_validate({}) if is_multi_agent_env(experiment.env.id) else None


def make_multi_agent_env(
    env: EnvSection, *, config: Mapping[str, Any] | None = None, render_mode: str | None = None
) -> Any:
    """One RLlib ``MultiAgentEnv`` of ``env``, its ``config`` (default: the section's) as kwargs."""
    kwargs = dict(env.config if config is None else config)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    module = pettingzoo_module(env.id)
    if module is None:
        return import_class(env.id)(**kwargs)
    from rl_app.rllib.multi_agent_env import pettingzoo_env

    return pettingzoo_env(module, kwargs)


def agent_ids(env: Any) -> list[str]:
    """The env's agents, sorted (RLlib's PettingZoo wrappers keep them in a set)."""
    return sorted(str(a) for a in (env.possible_agents or env.agents))


def agent_spaces(env: Any) -> dict[str, tuple[Any, Any]]:
    """(observation space, action space) of each agent."""
    return {a: (env.get_observation_space(a), env.get_action_space(a)) for a in agent_ids(env)}


def _episode_number(episode: Any) -> int:
    """A number per RLlib episode (its id is a uuid4's hex), for turn-taking in self-play."""
    return int(str(episode.id_)[:8], 16) if episode is not None else 0


@dataclass(frozen=True)
class PolicyMapping:
    """Which policy acts for each agent: fixed per agent, or in self-play the learner for one agent
    per episode (in turn: episode number modulo the number of agents) and the opponent for the rest."""

    agents: tuple[str, ...]
    fixed: tuple[tuple[str, str], ...] = ()
    self_play: tuple[str, str] | None = None  # (learner, opponent)

    def policy_of(self, agent_id: str, episode: int = 0) -> str:
        if self.self_play is not None:
            learner, opponent = self.self_play
            return learner if self.agents.index(agent_id) == episode % len(self.agents) else opponent
        return dict(self.fixed)[agent_id]

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        """RLlib's ``policy_mapping_fn(agent_id, episode, **kwargs)``."""
        return self.policy_of(str(agent_id), _episode_number(episode))


def policy_mapping(section: MultiAgentSection, agents: list[str]) -> PolicyMapping:
    """The mapping ``section`` gives for the env's ``agents``; ValueError naming an agent no pattern
    matches, or a policy no agent uses."""
    if section.self_play is not None:
        return PolicyMapping(tuple(agents), self_play=(section.self_play.learner, section.self_play.opponent))
    if section.policies == "shared":
        return PolicyMapping(tuple(agents), tuple((a, "shared") for a in agents))
    if section.policies == "per_agent":
        return PolicyMapping(tuple(agents), tuple((a, a) for a in agents))
    fixed = []
    for agent in agents:
        policy = next(
            (p for pattern, p in section.mapping.items() if fnmatch.fnmatchcase(agent, pattern)), None
        )
        if policy is None:
            patterns = ", ".join(repr(p) for p in section.mapping)
            raise MappingError(f"agent '{agent}' matches none of the mapping's patterns ({patterns})")
        fixed.append((agent, policy))
    unused = [p for p in section.policy_names(agents) if p not in {policy for _, policy in fixed}]
    if unused:
        raise MappingError(f"policy '{unused[0]}' acts for no agent (agents: {', '.join(agents)})")
    return PolicyMapping(tuple(agents), tuple(fixed))


def policy_spaces(env: Any, mapping: PolicyMapping) -> dict[str, tuple[Any, Any]]:
    """(observation space, action space) of each policy: those of the agents it acts for, which
    must be the same; ValueError naming two agents that differ."""
    found: dict[str, tuple[str, Any, Any]] = {}
    agents = mapping.agents
    for agent, (obs_space, act_space) in agent_spaces(env).items():
        policies = {mapping.policy_of(agent, episode) for episode in range(len(agents))}
        for policy in sorted(policies):
            if policy not in found:
                found[policy] = (agent, obs_space, act_space)
                continue
            other, other_obs, other_act = found[policy]
            if (other_obs, other_act) != (obs_space, act_space):
                raise MappingError(
                    f"agents '{other}' and '{agent}' both use policy '{policy}' but their spaces differ "
                    f"({other_obs}, {other_act} vs {obs_space}, {act_space})"
                )
    return {policy: (obs, act) for policy, (_, obs, act) in found.items()}


def check_multi_agent_env(env: EnvSection, section: MultiAgentSection) -> None:
    """Make the env, check each agent's spaces and the mapping, reset, and step until every agent
    has acted once (random actions among the allowed ones): ValueError naming the cause."""
    if env.wrappers:
        raise ValueError("takes no wrappers: they wrap single-agent Gymnasium envs")
    try:
        instance = make_multi_agent_env(env)
    except Exception as exc:
        raise ValueError(f"cannot be created: {type(exc).__name__}: {error_detail(exc)}") from None
    try:
        agents = agent_ids(instance)
        if not agents:
            raise ValueError("has no agents")
        mapping = policy_mapping(section, agents)
        spaces = agent_spaces(instance)
        for agent, (obs_space, act_space) in spaces.items():
            problem = spaces_problem(obs_space, act_space)
            if problem:
                raise ValueError(f"agent '{agent}': {problem}")
        policy_spaces(instance, mapping)
        try:
            obs, _ = instance.reset(seed=0)
        except Exception as exc:
            raise ValueError(f"reset() raised {type(exc).__name__}: {error_detail(exc)}") from None
        acted: set[str] = set()
        for _ in range(4 * len(agents)):
            for agent, value in obs.items():
                if not spaces[agent][0].contains(value):
                    raise ValueError(f"agent '{agent}': an observation outside its space {spaces[agent][0]}")
            actions = {agent: random_action(spaces[agent][1], value, seed=0) for agent, value in obs.items()}
            acted |= set(actions)
            try:
                obs, _, terminated, truncated, _ = instance.step(actions)
            except Exception as exc:
                raise ValueError(f"step() raised {type(exc).__name__}: {error_detail(exc)}") from None
            if acted >= set(agents) or terminated.get("__all__") or truncated.get("__all__"):
                break
    finally:
        with contextlib.suppress(Exception):
            instance.close()


def random_action(action_space: Any, observation: Any, seed: int | None = None) -> Any:
    """A uniformly random action, among the allowed ones where the observation carries a mask."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if isinstance(observation, dict) and MASK_KEY in observation:
        allowed = np.flatnonzero(np.asarray(observation[MASK_KEY]))
        if len(allowed):
            return int(rng.choice(allowed))
    action_space.seed(int(rng.integers(2**31)))
    return action_space.sample()


@dataclass(frozen=True)
class MultiAgentSetup:
    """What training needs to know of a multi-agent experiment, read from its env once."""

    mapping: PolicyMapping
    spaces: dict[str, tuple[Any, Any]]  # policy -> (observation space, action space)
    trained: tuple[str, ...]
    self_play: SelfPlaySection | None = None


def multi_agent_setup(env: EnvSection, section: MultiAgentSection) -> MultiAgentSetup:
    """The mapping, each policy's spaces, and the policies that learn (the env made once per
    process, env and section: the config, the checkpoint marker and evaluation all ask)."""
    return _setup(env.model_dump_json(), section.model_dump_json())


@functools.cache
def _setup(env_json: str, section_json: str) -> MultiAgentSetup:
    from rl_app.config.schema import EnvSection, MultiAgentSection

    env, section = (
        EnvSection.model_validate_json(env_json),
        MultiAgentSection.model_validate_json(section_json),
    )
    instance = make_multi_agent_env(env)
    try:
        agents = agent_ids(instance)
        mapping = policy_mapping(section, agents)
        spaces = policy_spaces(instance, mapping)
        return MultiAgentSetup(mapping, spaces, tuple(section.trained(agents)), section.self_play)
    finally:
        with contextlib.suppress(Exception):
            instance.close()
