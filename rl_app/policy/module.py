"""A trained policy as a plain ``torch.nn.Module``: observations in, env actions out.

It applies the RLlib module and then what RLlib's default module-to-env
connectors do: the greedy action for discrete spaces; for boxes, the distribution's
deterministic value rescaled from [-1, 1] to the bounds and clipped
(``normalize_actions=True``, RLlib's default). The deterministic value is
:func:`rl_app.rllib.distributions.deterministic_actions`' (tanh(mean) for SAC's squashed
Gaussian, also for checkpoints whose module class predates rl_app's fix of RLlib's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rl_app.envs.spaces import describe, flatten, space_from_description
from rl_app.errors import UserError


class ObservationFilter(torch.nn.Module):
    """RLlib's MeanStdFilter with frozen statistics: ``clip((obs - mean) / (std + 1e-6))``."""

    def __init__(self, mean: np.ndarray, std: np.ndarray | None, clip: float | None) -> None:
        super().__init__()
        scale = np.ones_like(mean) if std is None else 1.0 / (std + 1e-6)
        self.mean: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.clip = clip

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        normalised = (obs - self.mean) * self.scale
        return normalised if self.clip is None else torch.clamp(normalised, -self.clip, self.clip)


def load_observation_filter(checkpoint: Path) -> ObservationFilter | None:
    """The MeanStdFilter statistics the checkpoint's env runner normalised observations with, if any."""
    from rl_app.rllib.algorithm import load_mean_std_filter

    found = load_mean_std_filter(checkpoint)
    return None if found is None else ObservationFilter(*found)


class ObservationEncoder(torch.nn.Module):
    """The env's observations (a batch) as the module takes them after RLlib's ``FlattenObservations``:
    Discrete and MultiDiscrete values one-hot in the graph, so an exported policy takes the integer
    observation; MultiBinary raveled. Dict and Tuple observations arrive flattened already
    (:meth:`Policy.prepare`): a graph takes one array."""

    columns: torch.Tensor

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        self.kind = type(space).__name__
        depths = np.ravel([space.n] if isinstance(space, gym.spaces.Discrete) else getattr(space, "nvec", []))
        self.max_depth = int(depths.max()) if depths.size else 0
        # Each entry is one-hot over the widest depth; these columns keep each entry's first n.
        columns = [entry * self.max_depth + value for entry, n in enumerate(depths) for value in range(n)]
        self.register_buffer("columns", torch.as_tensor(columns, dtype=torch.int64))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.kind == "MultiBinary":
            return obs.reshape(obs.shape[0], -1).float()
        if self.kind not in ("Discrete", "MultiDiscrete"):
            return obs
        values = obs.reshape(obs.shape[0], -1).to(torch.int64)
        hot = (values.unsqueeze(-1) == torch.arange(self.max_depth)).float()
        return hot.reshape(obs.shape[0], -1).index_select(1, self.columns)


class Policy(torch.nn.Module):
    """``forward(obs_batch) -> action_batch``; traceable for TorchScript and ONNX when not exploring.

    ``observation_space`` is the env's, where it is not the module's Box (RLlib flattened it)."""

    def __init__(
        self,
        module: Any,
        explore: bool = False,
        observation_filter: ObservationFilter | None = None,
        timestep: int = 0,
        observation_space: gym.Space | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.observation_filter = observation_filter
        self.explore = explore
        # Exploration that follows a schedule (DQN's epsilon) is taken where training left it.
        self.timestep = timestep
        self.action_space = module.action_space
        self.observation_space = observation_space or module.observation_space
        self.observation_encoder = (
            ObservationEncoder(self.observation_space)
            if not isinstance(self.observation_space, gym.spaces.Box)
            else None
        )
        self.observation_description = describe(self.observation_space) if self.observation_encoder else None
        # A recurrent module (model.use_lstm) carries its state from one step of an episode to the
        # next: ``act`` keeps it for a batch of one, ``reset`` starts an episode.
        self.recurrent = bool(module.is_stateful())
        self.state: Any = None
        self.dist_cls = (
            module.get_exploration_action_dist_cls() if explore else module.get_inference_action_dist_cls()
        )
        space = self.action_space
        self.rescale = (
            isinstance(space, gym.spaces.Box)
            and np.issubdtype(space.dtype, np.floating)
            and bool(np.all(space.bounded_below) and np.all(space.bounded_above))
        )
        bounds = (space.low, space.high) if self.rescale else (None, None)
        for name, value in zip(("low", "high"), bounds, strict=True):
            self.register_buffer(name, None if value is None else torch.as_tensor(value, dtype=torch.float32))

    def prepare(self, obs: Any) -> np.ndarray:
        """One env observation as a row of the batch ``forward`` takes: Dict and Tuple observations
        flattened as RLlib flattened them in training, anything else as float32."""
        if isinstance(self.observation_space, gym.spaces.Dict | gym.spaces.Tuple):
            assert self.observation_description is not None
            return flatten(self.observation_description, obs)
        return np.asarray(obs, dtype=np.float32)

    def reset(self) -> None:
        """Start an episode: a recurrent module's initial state (RLlib's), for a batch of one."""
        if self.recurrent:
            self.state = _map_tensors(lambda t: t.unsqueeze(0), self.module.get_initial_state())

    def module_inputs(self, obs: torch.Tensor) -> dict[str, Any]:
        """The batch RLlib's module takes: the observations, encoded and normalised as in training;
        for a recurrent module a time axis of one step and the state (RLlib's env runner's form)."""
        if self.observation_encoder is not None:
            obs = self.observation_encoder(obs)
        obs = obs if self.observation_filter is None else self.observation_filter(obs)
        if self.recurrent:
            if self.state is None:
                self.reset()
            return {"obs": obs.unsqueeze(1), "state_in": self.state}
        return {"obs": obs}

    def _dist_inputs(self, out: dict[str, Any]) -> torch.Tensor:
        if self.recurrent:
            self.state = out["state_out"]
            return out["action_dist_inputs"][:, 0]
        return out["action_dist_inputs"]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.explore:
            # ``t`` as RLlib's env runners pass it; DQN's module picks its epsilon-greedy action itself.
            out = self.module.forward_exploration(self.module_inputs(obs), t=self.timestep)
            if "actions" in out:
                action = out["actions"]
            else:
                action = self.dist_cls.from_logits(self._dist_inputs(out)).sample()
        else:
            out = self.module.forward_inference(self.module_inputs(obs))
            if "actions" in out:  # DQN's module picks the greedy action itself
                action = out["actions"]
            else:
                from rl_app.rllib.distributions import deterministic_actions  # with RLlib, as load_module

                action = deterministic_actions(self.dist_cls, self._dist_inputs(out))
        low, high = self.low, self.high
        if isinstance(low, torch.Tensor) and isinstance(high, torch.Tensor):
            action = low + (action + 1.0) * (high - low) / 2.0
            action = torch.maximum(torch.minimum(action, high), low)
        return action

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> Any:
        """One env action for one observation."""
        batch = torch.as_tensor(self.prepare(obs)[None])
        action = self(batch)[0].cpu().numpy()
        if isinstance(self.action_space, gym.spaces.Discrete):
            return int(action)
        return action.astype(self.action_space.dtype)


def _map_tensors(fn: Any, struct: Any) -> Any:
    """``fn`` applied to every tensor of a nested dict (a recurrent module's state)."""
    if isinstance(struct, dict):
        return {key: _map_tensors(fn, value) for key, value in struct.items()}
    return fn(torch.as_tensor(struct))


# RLlib's exploration distributions a served policy can sample from, by the names policy.json uses.
SAMPLED_DISTRIBUTIONS = {
    "TorchCategorical": "categorical",
    "TorchDiagGaussian": "diag_gaussian",
    "TorchSquashedGaussian": "squashed_gaussian",
}


class PolicyWithDistInputs(torch.nn.Module):
    """``forward(obs) -> (deterministic actions, action distribution inputs)``: what a server needs
    to also sample actions (PPO, APPO, SAC); the first output is :class:`Policy`'s."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.policy.module_inputs(obs)
        dist_inputs = self.policy.module.forward_inference(batch)["action_dist_inputs"]
        return self.policy(obs), dist_inputs


def sampled_distribution(policy: Policy, example: torch.Tensor) -> str | None:
    """The policy.json name of the distribution its actions are sampled from; None for policies
    whose exploration is not sampling from their outputs (DQN's epsilon-greedy) or unknown ones."""
    with torch.no_grad():
        out = policy.module.forward_inference(policy.module_inputs(example))
    if "actions" in out or "action_dist_inputs" not in out:
        return None
    return SAMPLED_DISTRIBUTIONS.get(policy.module.get_exploration_action_dist_cls().__name__)


class TabularPolicy(torch.nn.Module):
    """The greedy policy of a Q-table: discretize the observation as training did, take the argmax.

    Traceable for TorchScript and ONNX like :class:`Policy`, with the same ``act``."""

    q: torch.Tensor
    bins: torch.Tensor
    strides: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(
        self, q_table: np.ndarray, discretizer: Any, observation_space: Any, action_space: Any
    ) -> None:
        super().__init__()
        self.observation_space, self.action_space = observation_space, action_space
        self.discrete = bool(discretizer.discrete_n)
        self.register_buffer("q", torch.as_tensor(q_table, dtype=torch.float32))
        bins = discretizer.bins or (1,)
        self.register_buffer("bins", torch.as_tensor(bins, dtype=torch.int64))
        self.register_buffer("strides", torch.as_tensor(discretizer.strides() if discretizer.bins else [1]))
        self.register_buffer("low", torch.as_tensor(discretizer.low or (0.0,), dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(discretizer.high or (1.0,), dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            rows = obs.reshape(-1).to(torch.int64)
        else:
            cells = torch.floor((obs - self.low) / (self.high - self.low) * self.bins).to(torch.int64)
            cells = torch.minimum(torch.clamp(cells, min=0), self.bins - 1)
            rows = (cells * self.strides).sum(dim=-1)
        return self.q[rows].argmax(dim=-1)

    act = Policy.act

    def reset(self) -> None:
        """Nothing to reset: a Q-table has no memory."""

    def prepare(self, obs: Any) -> np.ndarray:
        return np.asarray(obs, dtype=np.float32)


def load_policy(checkpoint: Path, explore: bool = False, name: str | None = None) -> Policy | TabularPolicy:
    """The policy of an rl_app checkpoint, in eval mode on the CPU; ``name``: which of the policies of
    several agents (the checkpoint's ``policies``)."""
    from rl_app.tabular.qlearning import Q_TABLE, load_q_table, load_spaces

    if (checkpoint / Q_TABLE).is_file():
        if explore:
            raise UserError(
                "--explore: the tabular Q-learning policy is greedy (epsilon is for training only)"
            )
        q_table, discretizer = load_q_table(checkpoint)
        return TabularPolicy(q_table, discretizer, *load_spaces(checkpoint)).eval()

    from rl_app.rllib.algorithm import load_module
    from rl_app.runs.checkpoints import read_info

    info = read_info(checkpoint)
    described = info.observation_space
    if info.policies is not None:
        if name not in info.policies:
            known = ", ".join(info.policies)
            raise UserError(f"checkpoint '{checkpoint}' has the policies {known}; name one (not {name!r})")
        described = info.policies[name]
    elif name is not None:
        raise UserError(f"checkpoint '{checkpoint}' has one policy; --policy is for several agents'")
    module = load_module(checkpoint, *([name] if name is not None else []))
    module.eval()
    policy = Policy(
        module,
        explore=explore,
        observation_filter=load_observation_filter(checkpoint) if name is None else None,
        timestep=info.timesteps,
        observation_space=space_from_description(described) if described else None,
    ).eval()
    policy.requires_grad_(False)  # an inference artifact: exported outputs need no autograd
    return policy
