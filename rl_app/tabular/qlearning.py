"""Tabular Q-learning, the baseline next to DQN: numpy, vectorized over a gymnasium vector env.

Observations become table rows through a :class:`Discretizer` (bins per dimension of a Box,
the index itself for a Discrete space). Each vector step updates every env's (state, action)
entry at once with ``np.add.at``, so two envs in the same state both count. Truncated
episodes bootstrap from their final observation; terminated ones do not.
"""

from __future__ import annotations

import json
import math
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rl_app.config import ExperimentConfig
from rl_app.config.schema import QLearningTraining
from rl_app.envs import make_env
from rl_app.errors import ConfigError
from rl_app.runs.progress import IterationMetrics

Q_TABLE = "q_table.npz"
SPACES = "spaces.pkl"  # the env's observation and action spaces, for evaluate and export


@dataclass(frozen=True)
class Discretizer:
    """Maps observations to row indices of the Q-table."""

    bins: tuple[int, ...]  # empty for a Discrete observation space
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    discrete_n: int = 0

    @property
    def num_states(self) -> int:
        return self.discrete_n or int(np.prod(self.bins))

    @classmethod
    def for_space(cls, space: gym.Space, training: QLearningTraining, source: str) -> Discretizer:
        """The discretizer the experiment declares for ``space``; a ConfigError naming the key if not."""
        if isinstance(space, gym.spaces.Discrete):
            return cls(bins=(), discrete_n=int(space.n))
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ConfigError(
                source, f"tabular Q-learning takes Discrete or 1-D Box observations, not {space}", "env"
            )
        dims = space.shape[0]
        if training.bins is None or len(training.bins) != dims:
            raise ConfigError(
                source, f"needs one bin count per observation dimension ({dims})", "training.bins"
            )
        bounds = []
        for key, given, from_space in (("low", training.low, space.low), ("high", training.high, space.high)):
            values = np.asarray(given if given is not None else from_space, dtype=np.float64)
            if not np.isfinite(values).all():
                message = f"the observation space is unbounded here ({from_space}): give clipping bounds"
                raise ConfigError(source, message, f"training.{key}")
            bounds.append(tuple(float(v) for v in values))
        return cls(bins=tuple(training.bins), low=bounds[0], high=bounds[1])

    def index(self, obs: np.ndarray) -> np.ndarray:
        """Row indices of a batch of observations."""
        if self.discrete_n:
            return np.asarray(obs, dtype=np.int64).reshape(-1)
        bins = np.asarray(self.bins)
        scaled = (np.asarray(obs, dtype=np.float64) - self.low) / (np.subtract(self.high, self.low)) * bins
        cells = np.clip(np.floor(scaled).astype(np.int64), 0, bins - 1)
        return (cells * self.strides()).sum(axis=-1)

    def strides(self) -> np.ndarray:
        return np.cumprod(np.r_[1, self.bins[:-1]]).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bins": list(self.bins),
            "low": list(self.low),
            "high": list(self.high),
            "discrete_n": self.discrete_n,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Discretizer:
        return cls(tuple(data["bins"]), tuple(data["low"]), tuple(data["high"]), int(data["discrete_n"]))


def epsilon_at(schedule: list[tuple[int, float]], timestep: int) -> float:
    """The exploration rate of a piecewise-linear ``[[timestep, epsilon], ...]`` schedule."""
    steps, values = zip(*schedule, strict=True)
    return float(np.interp(timestep, steps, values))


def save_q_table(folder: Path, q_table: np.ndarray, discretizer: Discretizer) -> None:
    np.savez(folder / Q_TABLE, q_table=q_table, discretizer=json.dumps(discretizer.to_dict()))


def load_q_table(folder: Path) -> tuple[np.ndarray, Discretizer]:
    """The Q-table and discretizer a tabular checkpoint holds."""
    with np.load(folder / Q_TABLE) as data:
        return np.array(data["q_table"]), Discretizer.from_dict(json.loads(str(data["discretizer"])))


def load_spaces(folder: Path) -> tuple[gym.Space, gym.Space]:
    with (folder / SPACES).open("rb") as handle:
        spaces: tuple[gym.Space, gym.Space] = pickle.load(handle)
    return spaces


def greedy_actions(q_table: np.ndarray, discretizer: Discretizer, obs: np.ndarray) -> np.ndarray:
    return np.asarray(q_table[discretizer.index(obs)].argmax(axis=-1))


@dataclass
class _Counters:
    iteration: int = 0
    timesteps: int = 0
    episodes: int = 0
    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class TabularQLearning:
    """The learner behind ``algorithm: QLearning``: trains, evaluates, saves and restores its table."""

    def __init__(self, experiment: ExperimentConfig, source: str) -> None:
        training = experiment.training
        assert isinstance(training, QLearningTraining)
        self.experiment: ExperimentConfig = experiment
        self.training: QLearningTraining = training
        self.envs: gym.vector.SyncVectorEnv = gym.vector.SyncVectorEnv(
            [lambda: make_env(experiment.env)] * training.num_envs,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        if not isinstance(self.envs.single_action_space, gym.spaces.Discrete):
            raise ConfigError(
                source,
                f"tabular Q-learning needs Discrete actions, not {self.envs.single_action_space}",
                "env",
            )
        self.discretizer: Discretizer = Discretizer.for_space(
            self.envs.single_observation_space, training, source
        )
        self.num_actions: int = int(self.envs.single_action_space.n)
        self.q_table: np.ndarray = np.zeros((self.discretizer.num_states, self.num_actions))
        self.counters: _Counters = _Counters(
            returns=np.zeros(training.num_envs), lengths=np.zeros(training.num_envs, dtype=np.int64)
        )
        self.reseed(experiment.seed or 0)

    def reseed(self, seed: int) -> None:
        """Fresh episodes from ``seed``: every env reset, the exploration RNG reseeded."""
        self.rng = np.random.default_rng(seed)
        reset: tuple[Any, Any] = self.envs.reset(seed=seed)
        self.obs: np.ndarray = np.asarray(reset[0])
        self.counters.returns[:] = 0
        self.counters.lengths[:] = 0

    def train(self) -> IterationMetrics:
        """One iteration of ``steps_per_iteration`` env steps; the episodes it finished."""
        started = time.perf_counter()
        training, counters, q_table = self.training, self.counters, self.q_table
        finished_returns: list[float] = []
        finished_lengths: list[int] = []
        start_steps = counters.timesteps
        while counters.timesteps - start_steps < training.steps_per_iteration:
            states = self.discretizer.index(self.obs)
            explore = self.rng.random(len(states)) < epsilon_at(training.epsilon, counters.timesteps)
            # Ties broken at random (a fresh table is all ties): always taking the first action
            # would walk an untrained agent into the same wall on every step.
            values = q_table[states]
            greedy = (values + self.rng.uniform(0, 1e-9, values.shape)).argmax(axis=1)
            actions = np.where(explore, self.rng.integers(0, self.num_actions, len(states)), greedy)
            stepped: tuple[Any, ...] = self.envs.step(actions)
            obs, rewards, terminated, truncated, info = stepped
            done = terminated | truncated
            bootstrap = obs
            if done.any():
                bootstrap = obs.copy()
                bootstrap[done] = np.stack(info["final_obs"][done])
            targets = rewards + training.gamma * ~terminated * q_table[self.discretizer.index(bootstrap)].max(
                axis=1
            )
            np.add.at(q_table, (states, actions), training.lr * (targets - q_table[states, actions]))
            counters.returns += rewards
            counters.lengths += 1
            for i in np.flatnonzero(done):
                finished_returns.append(float(counters.returns[i]))
                finished_lengths.append(int(counters.lengths[i]))
                counters.returns[i], counters.lengths[i] = 0.0, 0
            self.obs = obs
            counters.timesteps += len(states)
        counters.iteration += 1
        counters.episodes += len(finished_returns)
        seconds = time.perf_counter() - started
        returns = np.asarray(finished_returns) if finished_returns else np.asarray([math.nan])
        return IterationMetrics(
            iteration=counters.iteration,
            timesteps=counters.timesteps,
            episodes=counters.episodes,
            return_mean=float(returns.mean()),
            return_min=float(returns.min()),
            return_max=float(returns.max()),
            episode_len_mean=float(np.mean(finished_lengths)) if finished_lengths else math.nan,
            eval_return_mean=math.nan,
            steps_per_s=(counters.timesteps - start_steps) / seconds if seconds > 0 else 0.0,
            iteration_s=seconds,
            elapsed_s=0.0,
        )

    def evaluate(self, episodes: int, seed: int) -> float:
        """Mean return of ``episodes`` greedy episodes on fresh envs seeded ``seed``, ``seed + 1``, ..."""
        env = make_env(self.experiment.env)
        try:
            returns = []
            for episode in range(episodes):
                obs, _ = env.reset(seed=seed + episode)
                total, done = 0.0, False
                while not done:
                    action = int(greedy_actions(self.q_table, self.discretizer, np.asarray(obs)[None])[0])
                    obs, reward, terminated, truncated, _ = env.step(action)
                    total += float(reward)
                    done = terminated or truncated
                returns.append(total)
        finally:
            env.close()
        return float(np.mean(returns))

    def state(self) -> dict[str, Any]:
        return {
            "iteration": self.counters.iteration,
            "timesteps": self.counters.timesteps,
            "episodes": self.counters.episodes,
        }

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_q_table(folder, self.q_table, self.discretizer)
        with (folder / SPACES).open("wb") as handle:
            pickle.dump((self.envs.single_observation_space, self.envs.single_action_space), handle)
        (folder / "tabular_state.json").write_text(json.dumps(self.state()))

    def load_table(self, folder: Path) -> None:
        """The Q-table of the checkpoint in ``folder``; it must have this experiment's bins and spaces."""
        q_table, discretizer = load_q_table(folder)
        if q_table.shape != self.q_table.shape or discretizer != self.discretizer:
            raise ConfigError(
                str(folder),
                "its Q-table was made with other bins or spaces than this experiment's",
                "training.bins",
            )
        self.q_table = q_table

    def restore(self, folder: Path) -> None:
        """The Q-table and the counters of the checkpoint in ``folder``."""
        self.load_table(folder)
        state = json.loads((folder / "tabular_state.json").read_text())
        self.counters.iteration = int(state["iteration"])
        self.counters.timesteps = int(state["timesteps"])
        self.counters.episodes = int(state["episodes"])

    def close(self) -> None:
        self.envs.close()
