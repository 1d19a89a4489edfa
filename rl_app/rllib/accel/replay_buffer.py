"""RLlib's prioritized episode replay buffer as flat arrays: every stored env step one row of each
column, a successor link per row, priorities in segment trees; the same draws and n-step batches
as RLlib's ``PrioritizedEpisodeReplayBuffer`` for the same contents (tests/test_offpolicy.py), and
able to take over that buffer's checkpointed state."""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.core.columns import Columns

from rl_app.rllib.accel.adapter import (
    RLLIB_BUFFER_MAX_PRIORITY,
)
from rl_app.rllib.accel.runner import Transitions

STATE_FORMAT = "rl_app.array_replay/1"  # marks our buffer state (RLlib's own state has "episodes")


class _SegmentTree:
    """A complete binary tree over ``capacity`` leaves, each node the ``reduce`` of its two children.

    Leaves are set in batches and every ancestor is recomputed from its children, level by level
    (no running sums that drift)."""

    def __init__(self, capacity: int, reduce: Any, neutral: float) -> None:
        self.leaves = 1 << max(0, capacity - 1).bit_length()
        self.nodes = np.full(2 * self.leaves, neutral, dtype=np.float64)
        self._reduce = reduce

    def set(self, index: np.ndarray, value: np.ndarray | float) -> None:
        nodes, reduce = self.nodes, self._reduce
        node = np.asarray(index, dtype=np.int64) + self.leaves
        nodes[node] = value
        node = np.unique(node // 2)  # sorted: the parents of a level are sorted too
        while len(node) > 1:
            nodes[node] = reduce(nodes[2 * node], nodes[2 * node + 1])
            parents = node // 2
            node = parents[np.r_[True, parents[1:] != parents[:-1]]]
        # One path left to the root (all of it for a single step's add): scalar steps, not array ops.
        i = int(node[0])
        while i >= 1:
            nodes[i] = reduce(nodes[2 * i], nodes[2 * i + 1])
            i //= 2

    @property
    def root(self) -> float:
        return float(self.nodes[1])

    def leaf(self, index: np.ndarray) -> np.ndarray:
        return self.nodes[np.asarray(index) + self.leaves]

    def find_prefix_sum(self, prefix: np.ndarray) -> np.ndarray:
        """For a sum tree: for each prefix, the first leaf where the running sum exceeds it."""
        node = np.ones(len(prefix), dtype=np.int64)
        prefix = prefix.astype(np.float64, copy=True)
        while node[0] < self.leaves:
            left = self.nodes[2 * node]
            right = prefix >= left
            prefix -= np.where(right, left, 0.0)
            node = 2 * node + right
        return node - self.leaves


class ArrayPrioritizedEpisodeReplayBuffer:
    """Prioritized n-step replay over env steps in ring arrays (see the module docstring).

    Takes RLlib's episode chunks in :meth:`add` (chunks of a running episode carry on where the
    last one stopped) and gives train batches as columns from :meth:`sample_batch`.
    """

    def __init__(self, capacity: int = 10_000, alpha: float = 1.0, **_rllib_kwargs: Any) -> None:
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.rng = np.random.default_rng()
        self._columns: dict[str, np.ndarray] = {}
        # A step's serial number is its place in the stream of every step ever added; its slot
        # is serial % capacity. A link to a serial whose slot holds another serial is gone.
        self._serial = np.full(self.capacity, -1, dtype=np.int64)
        self._successor = np.full(self.capacity, -1, dtype=np.int64)
        self._added = 0
        self._open_episodes: dict[str, int] = {}  # episode id -> serial of its last stored step
        self._sum = _SegmentTree(self.capacity, np.add, 0.0)
        self._min = _SegmentTree(self.capacity, np.minimum, np.inf)
        self._max_priority = 1.0
        self._last_sampled: np.ndarray = np.empty(0, dtype=np.int64)
        self.sampled_timesteps = 0

    def _clear(self) -> None:
        rng = self.rng  # seeded by the caller; set_state leaves the sampling RNG alone
        self.__init__(self.capacity, self.alpha)  # type: ignore[misc]
        self.rng = rng

    def __len__(self) -> int:
        return min(self._added, self.capacity)

    def get_num_timesteps(self) -> int:
        """Env steps stored (RLlib's name)."""
        return len(self)

    def add(self, data: list[Any] | Transitions) -> int:
        """Store RLlib's episode chunks, or a runner's :class:`Transitions`, at the highest priority
        seen so far. Returns the env steps stored."""
        if isinstance(data, Transitions):
            self._add_transitions(data)
            added = len(data.episode_ids)
        else:
            added = 0
            for episode in data:
                if len(episode):
                    self._add_chunk(episode)
                    added += len(episode)
        if len(self._open_episodes) > 1024:  # episodes of runners that went away
            oldest_kept = self._added - self.capacity
            self._open_episodes = {k: s for k, s in self._open_episodes.items() if s >= oldest_kept}
        return added

    def _add_chunk(self, episode: Any) -> None:
        observations = np.asarray(episode.get_observations())
        steps = len(observations) - 1
        columns = {
            "obs": observations[:-1],
            "next_obs": observations[1:],
            "actions": np.asarray(episode.get_actions()),
            "rewards": np.asarray(episode.get_rewards(), dtype=np.float64),
            "terminated": np.zeros(steps, dtype=bool),
            "truncated": np.zeros(steps, dtype=bool),
        }
        columns["terminated"][-1] = episode.is_terminated
        columns["truncated"][-1] = episode.is_truncated
        serials = self._store(columns)
        self._successor[serials[:-1] % self.capacity] = serials[1:]
        self._continue(episode.id_, int(serials[0]), int(serials[-1]), episode.is_done)

    def _add_transitions(self, transitions: Transitions) -> None:
        columns, ids = transitions.columns, transitions.episode_ids
        for start in range(0, len(ids), self.capacity):  # a call's rows may outnumber the capacity
            part = {name: values[start : start + self.capacity] for name, values in columns.items()}
            part["rewards"] = np.asarray(part["rewards"], dtype=np.float64)
            serials = self._store(part)
            done = part["terminated"] | part["truncated"]
            for serial, episode_id, ended in zip(
                serials.tolist(), ids[start : start + self.capacity], done.tolist(), strict=True
            ):
                self._continue(episode_id, serial, serial, ended)

    def _store(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """Write the rows of ``columns`` as the stream's next steps, linked to nothing yet; their serials."""
        steps = len(columns["rewards"])
        if steps > self.capacity:
            raise ValueError(f"{steps} steps at once do not fit a buffer of {self.capacity}")
        if not self._columns:
            self._columns = {
                name: np.zeros((self.capacity, *values.shape[1:]), dtype=values.dtype)
                for name, values in columns.items()
            }
        serials = np.arange(self._added, self._added + steps, dtype=np.int64)
        slots = serials % self.capacity
        for name, values in columns.items():
            self._columns[name][slots] = values
        self._serial[slots] = serials
        self._successor[slots] = -1
        priority = self._max_priority**self.alpha
        self._sum.set(slots, priority)
        self._min.set(slots, priority)
        self._added += steps
        return serials

    def _continue(self, episode_id: str, first: int, last: int, done: bool) -> None:
        """Steps ``first..last`` (already linked among themselves) go on from ``episode_id``'s last
        stored step; unless the episode is done, ``last`` becomes that step."""
        previous = self._open_episodes.pop(episode_id, None)
        if previous is not None and self._serial[previous % self.capacity] == previous:
            self._successor[previous % self.capacity] = first
        if not done:
            self._open_episodes[episode_id] = last

    def _n_step(
        self, slots: np.ndarray, n_steps: np.ndarray, gamma: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each start slot: whether its episode has ``n`` steps stored from it, the slot of the
        window's last step, and the window's discounted reward sum."""
        complete = np.ones(len(slots), dtype=bool)
        last = slots.copy()
        reward = self._columns["rewards"][slots].copy()
        for k in range(1, int(n_steps.max())):
            wanted = k < n_steps
            successor = self._successor[last]
            stored = (successor >= 0) & (self._serial[successor % self.capacity] == successor)
            complete &= stored | ~wanted
            step = wanted & stored
            last = np.where(step, successor % self.capacity, last)
            reward += np.where(step, gamma**k * self._columns["rewards"][last], 0.0)
        return complete, last, reward

    def sample_batch(
        self, batch_size: int, n_step: int | tuple[int, int] = 1, gamma: float = 0.99, beta: float = 0.0
    ) -> dict[str, np.ndarray]:
        """A train batch of ``batch_size`` n-step transitions, as the learner's columns."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        n_step = n_step or 1  # RLlib's default
        total = self._sum.root
        accepted: list[tuple[np.ndarray, ...]] = []  # (slots, n, last slots, rewards) per draw
        wanted = batch_size
        for _attempt in range(1000):
            draw = self._sum.find_prefix_sum(self.rng.random(wanted) * total)
            draw = np.minimum(draw, self.capacity - 1)
            if isinstance(n_step, tuple):
                n = self.rng.integers(n_step[0], n_step[1], size=wanted)
            else:
                n = np.full(wanted, n_step, dtype=np.int64)
            complete, lasts, rewards = self._n_step(draw, n, gamma)
            complete &= self._sum.leaf(draw) > 0  # a rounding draw past the last stored leaf
            accepted.append((draw[complete], n[complete], lasts[complete], rewards[complete]))
            wanted -= int(complete.sum())
            if wanted == 0:
                break
        else:
            raise ValueError(f"no stored step has {n_step} steps after it in its episode")
        slots, n_steps, lasts, rewards = (np.concatenate(part) for part in zip(*accepted, strict=True))
        self._last_sampled = slots
        self.sampled_timesteps += batch_size
        return self._learner_columns(slots, n_steps, lasts, rewards, beta)

    def batch_at(
        self, slots: np.ndarray, n_steps: np.ndarray, gamma: float, beta: float
    ) -> dict[str, np.ndarray]:
        """The learner's columns for the n-step transitions starting at ``slots``."""
        _, lasts, rewards = self._n_step(slots, n_steps, gamma)
        return self._learner_columns(slots, n_steps, lasts, rewards, beta)

    def _learner_columns(
        self, slots: np.ndarray, n_steps: np.ndarray, lasts: np.ndarray, rewards: np.ndarray, beta: float
    ) -> dict[str, np.ndarray]:
        stored, total = len(self), self._sum.root
        probability = self._sum.leaf(slots) / total
        smallest = self._min.root / total
        columns = self._columns
        return {
            Columns.OBS: columns["obs"][slots],
            Columns.ACTIONS: columns["actions"][slots],
            Columns.REWARDS: rewards,
            Columns.NEXT_OBS: columns["next_obs"][lasts],
            Columns.TERMINATEDS: columns["terminated"][lasts],
            Columns.TRUNCATEDS: columns["truncated"][lasts],
            "weights": (probability * stored) ** -beta / (smallest * stored) ** -beta,
            "n_step": n_steps,
        }

    def update_priorities(self, priorities: np.ndarray, module_id: Any = None) -> None:
        """New priorities (TD errors) for the last sampled batch, in its order."""
        priorities = np.maximum(np.asarray(priorities, dtype=np.float64), 1e-12)
        if len(priorities) != len(self._last_sampled):
            raise ValueError(f"{len(priorities)} priorities for {len(self._last_sampled)} sampled steps")
        # A step drawn twice keeps its last priority, as in RLlib's loop.
        slots, last_of_each = np.unique(self._last_sampled[::-1], return_index=True)
        value = priorities[::-1][last_of_each] ** self.alpha
        self._sum.set(slots, value)
        self._min.set(slots, value)
        self._max_priority = max(self._max_priority, float(priorities.max()))
        self._last_sampled = np.empty(0, dtype=np.int64)

    def get_metrics(self) -> dict[str, Any]:
        """What RLlib's buffer reports that still applies."""
        return {"num_env_steps_stored": len(self), "num_env_steps_sampled_lifetime": self.sampled_timesteps}

    def get_state(self) -> dict[str, Any]:
        """The stored steps (in stream order), their priorities, links and counters."""
        stored = len(self)
        order = np.arange(self._added - stored, self._added) % self.capacity
        return {
            "format": STATE_FORMAT,
            "capacity": self.capacity,
            "alpha": self.alpha,
            "added": self._added,
            "columns": {name: values[order] for name, values in self._columns.items()},
            "successor": self._successor[order],
            "priority": self._sum.leaf(order),
            "max_priority": self._max_priority,
            "open_episodes": dict(self._open_episodes),
            "sampled_timesteps": self.sampled_timesteps,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s state, or refill from RLlib's buffer state (its episodes)."""
        if state.get("format") != STATE_FORMAT:
            self._set_rllib_state(state)
            return
        added, steps = int(state["added"]), len(state["successor"])
        if steps > self.capacity:
            raise ValueError(f"the saved buffer holds {steps} steps, more than capacity {self.capacity}")
        self._clear()
        self._added = added
        serials = np.arange(added - steps, added, dtype=np.int64)
        slots = serials % self.capacity
        self._columns = {
            name: np.zeros((self.capacity, *values.shape[1:]), dtype=values.dtype)
            for name, values in state["columns"].items()
        }
        for name, values in state["columns"].items():
            self._columns[name][slots] = values
        self._serial[slots] = serials
        self._successor[slots] = state["successor"]
        if steps:
            self._sum.set(slots, state["priority"])
            self._min.set(slots, state["priority"])
        self._max_priority = float(state["max_priority"])
        self._open_episodes = dict(state["open_episodes"])
        self.sampled_timesteps = int(state["sampled_timesteps"])

    def _set_rllib_state(self, state: dict[str, Any]) -> None:
        """A checkpoint written with RLlib's episode buffer: its episodes, at the highest priority."""
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        if "episodes" not in state:
            raise ValueError("neither rl_app's nor RLlib's replay buffer state")
        self._clear()
        self._max_priority = float(state.get(RLLIB_BUFFER_MAX_PRIORITY, 1.0))
        self.add([SingleAgentEpisode.from_state(episode) for episode in state["episodes"]])
