"""Our off-policy update path: prioritized replay kept in arrays, train batches built without episodes.

RLlib 2.60's DQN and SAC spend most of an update outside the loss: the prioritized episode buffer
draws each transition in a Python loop and wraps it in a one-step ``SingleAgentEpisode``, and the
learner connector turns those 256 episodes back into columns. This buffer keeps every env step in
preallocated arrays, draws a whole batch with vectorized segment trees, computes n-step returns with
array walks, and hands the learner the columns RLlib's connector would have built (``obs``,
``new_obs``, ``actions``, ``rewards``, ``terminateds``, ``truncateds``, ``weights``, ``n_step``).

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
from ray.rllib.algorithms.dqn.dqn import DQN
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
    round_weights,
    sample_from_runners,
    update_without_reducing_metrics,
)
from rl_app.rllib.accel.driver import in_place_sync
from rl_app.rllib.accel.replay_buffer import ArrayPrioritizedEpisodeReplayBuffer


class _ArrayReplayTrainingStep:
    """DQN's training step (RLlib 2.60) with the replay buffer sampled as columns.

    Where the env runner and the learner share the algorithm's process (no remote runners, a local
    learner; the usual single-machine SAC and DQN), one training step runs the rounds (sample,
    store, replay, update, copy weights) of a whole iteration's minimum env steps inside one
    call into the learner, our runner handing the buffer transitions instead of episodes
    (``BatchedEnvRunner.sample_transitions``), and collects the runner's and the learner's metrics
    once at its end: RLlib's per-round sampling call, metrics reduce and aggregation cost more
    than the env step and a third of a SAC update at one update per env step. An update of one
    minibatch goes through our learner's ``update_from_columns`` (RLlib's ``Learner.update`` less
    its per-call machinery). The rounds are the same, in the same order, as
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
        store_weight, sample_and_train_weight = round_weights(config)
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
