"""Env steps as a replay buffer's rows, without episodes: what the batched runner's transition path
(``BatchedEnvRunner.sample_transitions``) keeps of each env's running episode, and the rows of one
call put in the order RLlib's episode chunks would give them (tests/test_sampling.py)."""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple, cast

import numpy as np

from rl_app.rllib.accel.adapter import (
    episode_start_time,
)


class Transitions(NamedTuple):
    """Env steps as a replay buffer's rows: ``columns`` (``obs``, ``next_obs``, ``actions``,
    ``rewards``, ``terminated``, ``truncated``, one row per step) and each row's episode id."""

    columns: dict[str, np.ndarray]
    episode_ids: list[str]


class OpenEpisodes:
    """Each env's running episode on the transition path: its id, the observation to act on, and
    what RLlib's episode metrics read when it ends, summed as RLlib sums its runner's chunks (one
    per call: the return of each, the seconds from its reset or first step to its last step)."""

    def __init__(self, episodes: list[Any], ended: list[tuple[int, Any, float]]) -> None:
        """Right after RLlib's reset made ``episodes``; each episode that ends is appended to
        ``ended`` as (length, return, seconds)."""
        n = len(episodes)
        self.ids = [episode.id_ for episode in episodes]
        self.observations = np.stack([episode.get_observations(-1) for episode in episodes])
        self.resetting = np.zeros(n, dtype=bool)  # ended last step: gymnasium's next step resets it
        self.lengths = [0] * n
        self.rewards: list[list[Any]] = [[] for _ in range(n)]  # this call's
        self.chunk_start: list[float | None] = [episode_start_time(episode) for episode in episodes]
        self.last_step: list[float] = [0.0] * n
        self.chunks: list[list[tuple[Any, float]]] = [[] for _ in range(n)]  # earlier calls' (return, s)
        self.ended = ended

    def step(
        self,
        stepped: np.ndarray,
        rewards: np.ndarray,
        terminateds: np.ndarray,
        truncateds: np.ndarray,
        next_observations: np.ndarray,
        now: float,
    ) -> list[str]:
        """Take one vector step's results; returns the ids of the episodes that ended in it."""
        for i in np.flatnonzero(~stepped).tolist():  # this step was the reset of a new episode
            self.ids[i] = uuid.uuid4().hex
            self.lengths[i], self.rewards[i], self.chunks[i], self.chunk_start[i] = 0, [], [], now
        for i in np.flatnonzero(stepped).tolist():
            self.lengths[i] += 1
            self.rewards[i].append(rewards[i])
            self.last_step[i] = now
            if self.chunk_start[i] is None:
                self.chunk_start[i] = now
        done = stepped & (terminateds | truncateds)
        ended = []
        for i in np.flatnonzero(done).tolist():
            # RLlib's get_metrics: the last chunk's figures, then each earlier chunk's added in turn.
            episode_return, seconds = sum(self.rewards[i]), now - cast(float, self.chunk_start[i])
            for chunk_return, chunk_seconds in self.chunks[i]:
                episode_return += chunk_return
                seconds += chunk_seconds
            self.ended.append((self.lengths[i], episode_return, seconds))
            ended.append(self.ids[i])
        self.resetting = done
        self.observations = np.ascontiguousarray(next_observations)  # a vector env may give it transposed
        return ended

    def end_call(self) -> None:
        """Close this call's chunk of every running episode that stepped in it."""
        for i, start in enumerate(self.chunk_start):
            if start is not None and self.rewards[i] and not self.resetting[i]:
                self.chunks[i].append((sum(self.rewards[i]), self.last_step[i] - start))
            self.rewards[i], self.chunk_start[i] = [], None


class TransitionRows:
    """One call's transitions, kept per vector step and put in episode order at the end."""

    NAMES = ("obs", "actions", "rewards", "next_obs", "terminated", "truncated")

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._ids: list[str] = []
        self._dropped: set[str] = set()
        self.ended: list[str] = []  # ids of the episodes that ended in the call, in that order

    def add(
        self,
        stepped: np.ndarray,
        episodes: OpenEpisodes,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_observations: np.ndarray,
        terminateds: np.ndarray,
        truncateds: np.ndarray,
    ) -> None:
        row = (episodes.observations, actions, rewards, next_observations, terminateds, truncateds)
        if stepped.all():
            self._parts.append(row)
            self._ids += episodes.ids
        else:
            index = np.flatnonzero(stepped)
            self._parts.append(tuple(column[index] for column in row))
            self._ids += [episodes.ids[i] for i in index.tolist()]

    def drop_running(self, episode_ids: list[str]) -> None:
        """Leave out the rows of these episodes but those that ended (an env failure's loss)."""
        self._dropped |= set(episode_ids) - set(self.ended)

    def in_episode_order(self, running: list[str]) -> Transitions:
        """The rows episode by episode, as RLlib's chunks come: ended episodes in the order they
        ended, then the ``running`` ones by env; each episode's rows in time order."""
        if not self._parts:  # no step asked for
            return Transitions({}, [])
        rank = {episode_id: k for k, episode_id in enumerate(self.ended)}
        for env, episode_id in enumerate(running):
            rank.setdefault(episode_id, len(self.ended) + env)
        ranks = np.array([-1 if i in self._dropped else rank[i] for i in self._ids], dtype=np.int64)
        order = np.argsort(ranks, kind="stable")
        order = order[ranks[order] >= 0]
        columns = {
            name: np.concatenate([part[k] for part in self._parts])[order]
            for k, name in enumerate(self.NAMES)
        }
        return Transitions(columns, [self._ids[k] for k in order.tolist()])
