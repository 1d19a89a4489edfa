"""Our off-policy update path: prioritized replay kept in arrays, train batches built without episodes.

RLlib 2.60's DQN and SAC spend most of an update outside the loss: the prioritized episode buffer
draws each transition in a Python loop and wraps it in a one-step ``SingleAgentEpisode``, and
the learner connector turns those 256 episodes back into columns (~50 of the ~60 ms of a
dqn_cartpole update here). This buffer keeps every env step in preallocated arrays, draws a
whole batch with vectorized segment trees, computes n-step returns with array walks, and hands
the learner the columns RLlib's connector would have built (``obs``, ``new_obs``, ``actions``,
``rewards``, ``terminateds``, ``truncateds``, ``weights``, ``n_step``).

What is drawn follows RLlib's ``PrioritizedEpisodeReplayBuffer``: a step is drawn with
probability proportional to its priority (new steps get the highest priority seen), a draw
whose n-step window runs past the steps stored for its episode is drawn again, importance
weights are ``(p * N) ** -beta`` over their maximum, and priorities become ``|td| ** alpha``.
Proven against RLlib's buffer and learner connector in tests/test_offpolicy.py. One difference
by design: when the buffer is full it forgets its oldest steps, where RLlib's forgets whole
episodes.

The algorithm classes run DQN's training step (RLlib 2.60 ``_training_step_new_api_stack``) with
the buffer sampled as arrays; they are registered through ``AlgorithmConfig.algo_class``, RLlib's
extension point for a custom ``training_step``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.dqn.dqn import DQN, calculate_rr_weights
from ray.rllib.algorithms.sac.sac import SAC
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    REPLAY_BUFFER_ADD_DATA_TIMER,
    REPLAY_BUFFER_RESULTS,
    REPLAY_BUFFER_SAMPLE_TIMER,
    REPLAY_BUFFER_UPDATE_PRIOS_TIMER,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TD_ERROR_KEY,
    TIMERS,
)

from rl_app.rllib.accel.adapter import (
    RLLIB_BUFFER_MAX_PRIORITY,
    sample_from_runners,
    update_without_reducing_metrics,
)
from rl_app.rllib.accel.driver import in_place_sync
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
        return self._batch(slots, n_steps, lasts, rewards, beta)

    def batch_at(
        self, slots: np.ndarray, n_steps: np.ndarray, gamma: float, beta: float
    ) -> dict[str, np.ndarray]:
        """The learner's columns for the n-step transitions starting at ``slots``."""
        _, lasts, rewards = self._n_step(slots, n_steps, gamma)
        return self._batch(slots, n_steps, lasts, rewards, beta)

    def _batch(
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


class _ArrayReplayTrainingStep:
    """DQN's training step (RLlib 2.60) with the replay buffer sampled as columns.

    Where the env runner and the learner share the algorithm's process (no remote runners, a local
    learner; the usual single-machine SAC and DQN), one training step runs the rounds (sample,
    store, replay, update, copy weights) of a whole iteration's minimum env steps inside one
    call into the learner, our runner handing the buffer transitions instead of episodes
    (``FastEnvRunner.sample_transitions``), and collects the runner's and the learner's metrics
    once at its end: RLlib's per-round sampling call, metrics reduce and aggregation cost more
    than the env step and a third of a SAC update at one update per env step. An update of one
    minibatch goes through our learner's ``update_from_columns`` (RLlib's ``Learner.update`` less
    its per-call machinery; ~5 % of a SAC update). The rounds are the same, in the same order, as
    RLlib's training steps would run them, and so are the learner results, but for window-1 stats
    (losses, Q values): the iteration's last update's here, the mean of each round's last in RLlib's.
    """

    config: Any
    metrics: Any
    env_runner_group: Any
    env_runner: Any
    learner_group: Any
    local_replay_buffer: Any  # an ArrayPrioritizedEpisodeReplayBuffer, set in setup()

    def setup(self, config: Any) -> None:
        # RLlib's validation accepts only its own buffer type names, so the config keeps
        # "PrioritizedEpisodeReplayBuffer" and the array buffer takes that buffer's place here.
        super().setup(config)  # type: ignore[misc]
        settings = self.config.replay_buffer_config
        self.local_replay_buffer = ArrayPrioritizedEpisodeReplayBuffer(
            settings["capacity"], settings.get("alpha", 1.0)
        )
        if self.config.seed is not None:  # a seeded run draws the same replay batches again
            self.local_replay_buffer.rng = np.random.default_rng(self.config.seed)

    def training_step(self) -> None:
        if self.env_runner_group.num_remote_workers() == 0 and self.learner_group.is_local:
            self.learner_group.foreach_learner(self._rounds_in_one_process)
        else:
            self._round(self._sample_from_runners, self._update_learner_group, self._sync_runners)

    def _rounds_in_one_process(self, learner: Any) -> None:
        runner = self.env_runner
        sync = in_place_sync(runner, learner) or self._sync_runners
        updated = False
        # One minibatch per update (prioritized replay, or one update per round) goes to our
        # learner's lean update, its per-update metrics logged once below.
        lean_refusal = getattr(learner, "lean_update_refusal", None)  # RLlib's learners have none
        lean = lean_refusal is not None and lean_refusal() is None

        def update(
            columns: dict[str, np.ndarray], minibatch: int | None, timesteps: dict[str, Any]
        ) -> list[Any]:
            nonlocal updated
            if lean and minibatch is None:
                learner.update_from_columns(columns, timesteps)
            else:
                update_without_reducing_metrics(
                    learner,
                    batch=as_multi_agent_batch(columns),
                    minibatch_size=minibatch,
                    num_epochs=1,
                    timesteps=timesteps,
                )
            updated = True
            # Per-sample TD errors are read off (for the priorities) and not kept in the results.
            key = (DEFAULT_MODULE_ID, TD_ERROR_KEY)
            td_errors = learner.metrics.peek(key, default=None, compile=False) or []
            if td_errors:
                learner.metrics.delete(*key)
            return td_errors

        # Our runner hands the buffer its rows directly (no episode chunks to build and read back).
        refusal = getattr(runner, "transition_refusal", None)  # RLlib's runner has none
        sample = runner.sample_transitions if refusal is not None and refusal() is None else runner.sample
        minimum = self.config.min_sample_timesteps_per_iteration or 0
        sampled = 0
        try:
            while True:
                sampled += self._round(sample, update, sync, sampled)
                if sampled >= minimum:
                    break
        finally:  # the updates made are logged, as RLlib's would be, even if a round raised
            if lean:
                learner.log_update_totals()
        self.metrics.aggregate([runner.get_metrics()], key=ENV_RUNNER_RESULTS)
        if updated:
            self.metrics.aggregate([learner.metrics.reduce()], key=LEARNER_RESULTS)

    def _sample_from_runners(self) -> list[Any]:
        episodes, env_runner_results = sample_from_runners(
            self.env_runner_group, concat=True, sample_timeout_s=self.config.sample_timeout_s
        )
        self.metrics.aggregate(env_runner_results, key=ENV_RUNNER_RESULTS)
        return episodes

    def _update_learner_group(
        self, columns: dict[str, np.ndarray], minibatch_size: int | None, timesteps: dict[str, Any]
    ) -> list[Any]:
        learner_results = self.learner_group.update(
            batch=as_multi_agent_batch(columns),
            minibatch_size=minibatch_size,
            num_epochs=1,
            timesteps=timesteps,
        )
        # TD errors are per sample: popped before the results are logged.
        td_errors: list[Any] = []
        for result in learner_results:
            module_results = result.get(DEFAULT_MODULE_ID, {})
            if TD_ERROR_KEY in module_results:
                td_errors.extend(module_results.pop(TD_ERROR_KEY).peek())
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return td_errors

    def _sync_runners(self) -> None:
        self.env_runner_group.sync_weights(
            from_worker_or_learner_group=self.learner_group,
            policies={DEFAULT_MODULE_ID},
            global_vars=None,
            inference_only=True,
        )

    def _round(self, sample: Any, update: Any, sync: Any, sampled_this_step: int = 0) -> int:
        """One round of DQN's training step: sample and store, then (once learning has started)
        replay and update, then weights to the runners. Returns the env steps it sampled."""
        config = self.config
        store_weight, sample_and_train_weight = (int(w) for w in calculate_rr_weights(config))
        before = self.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
        sampled = 0
        for _ in range(store_weight):
            with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
                steps = sample()  # episodes, or our runner's transitions
            with self.metrics.log_time((TIMERS, REPLAY_BUFFER_ADD_DATA_TIMER)):
                sampled += self.local_replay_buffer.add(steps)
        # The lifetime count in the metrics lags by the steps of this training step's earlier
        # rounds when their runner metrics are collected at its end.
        lifetime = before + sampled_this_step + sampled
        if lifetime < config.num_steps_sampled_before_learning_starts:
            return sampled
        # Uniform replay (alpha 0): the buffer does not change between the updates of a round, so
        # drawing all their minibatches up front is the same draw, and one learner call runs them
        # in turn (one batch conversion and metrics reduce per round instead of per update).
        # Prioritized replay refreshes priorities between updates, so it takes them one by one.
        uniform = self.local_replay_buffer.alpha == 0
        rounds, updates_per_round = (1, sample_and_train_weight) if uniform else (sample_and_train_weight, 1)
        minibatch = config.total_train_batch_size
        timesteps = {
            NUM_ENV_STEPS_SAMPLED_LIFETIME: lifetime,
            NUM_AGENT_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                (ENV_RUNNER_RESULTS, NUM_AGENT_STEPS_SAMPLED_LIFETIME), default=0
            ),
        }
        for _ in range(rounds):
            with self.metrics.log_time((TIMERS, REPLAY_BUFFER_SAMPLE_TIMER)):
                columns = self.local_replay_buffer.sample_batch(
                    minibatch * updates_per_round,
                    n_step=config.n_step,
                    gamma=config.gamma,
                    beta=config.replay_buffer_config.get("beta") or 0.0,
                )
                for name, value in self.local_replay_buffer.get_metrics().items():
                    self.metrics.log_value((REPLAY_BUFFER_RESULTS, name), value, reduce="max", window=1)
            with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
                td_errors = update(columns, minibatch if updates_per_round > 1 else None, timesteps)
            if not uniform:
                with self.metrics.log_time((TIMERS, REPLAY_BUFFER_UPDATE_PRIOS_TIMER)):
                    self.local_replay_buffer.update_priorities(concatenated(td_errors))
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            sync()
        return sampled


def as_multi_agent_batch(columns: dict[str, np.ndarray]) -> MultiAgentBatch:
    """The replayed columns as the learner's train batch, each row an env step."""
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=len(columns[Columns.REWARDS]))


def concatenated(td_errors: list[Any]) -> np.ndarray:
    """The per-sample TD errors an update logged (tensors or arrays, one per minibatch) as one
    array, empty when it logged none (the priority update then refuses the mismatch)."""
    if not td_errors:
        return np.zeros(0, dtype=np.float32)
    # RLlib's metrics hand them back as lists of floats: np.asarray takes those in one call
    # where convert_to_numpy maps over every float.
    return np.concatenate(
        [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in td_errors]
    )


class ArrayReplayDQN(_ArrayReplayTrainingStep, DQN):
    """RLlib's DQN, its replay sampled as arrays."""


class ArrayReplaySAC(_ArrayReplayTrainingStep, SAC):
    """RLlib's SAC, its replay sampled as arrays."""


# The algorithm class of each algorithm whose registry entry names the "replay_buffer" part.
ARRAY_REPLAY_ALGORITHMS = {"DQN": ArrayReplayDQN, "SAC": ArrayReplaySAC}
