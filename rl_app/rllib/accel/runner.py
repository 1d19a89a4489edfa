"""Our sampling path: RLlib's env runner with its per-step work done once per vector step.

RLlib's ``SingleAgentEnvRunner`` runs two connector pipelines, unbatches every output, and calls
``add_env_step`` and three callbacks per env on every step. For the default pipelines (nothing in
them but batching, tensor conversion, action sampling and unsquashing) that is the same as: one
forward pass on the stacked observations, one draw from the action distribution, one env step,
and the step's arrays kept as they are. At the end of each ``sample()`` call the step arrays are
stacked once and every episode's columns are slices of them (an episode that starts in the call is
made only then, attribute for attribute as RLlib's constructor makes it), with the same ids,
lookback buffers, extra model outputs and metrics as RLlib's runner gives them (its episode
callbacks are no-ops; experiments with callbacks of their own sample with RLlib's runner). Same
seeds, same weights: same episodes, to the bit (tests/test_sampling.py).

Timestep sampling (training) and episode sampling (evaluation) take this path; random actions
stay RLlib's. Experiments it does not fit fall back to RLlib's runner, with the reason. For the
off-policy step that runs in one process, ``sample_transitions`` hands the replay buffer its rows
without making episodes at all (SAC samples one step per call, where the episode chunk cost as much
as the step).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
from collections.abc import Iterator
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical, TorchSquashedGaussian
from ray.rllib.env.env_runner import ENV_STEP_FAILURE
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.metrics import (
    RLMODULE_INFERENCE_TIMER,
    SAMPLE_TIMER,
    TIME_BETWEEN_SAMPLING,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.spaces.space_utils import clip_action, get_base_struct_from_space, unsquash_action

from rl_app.rllib.accel.adapter import (
    EpisodeFactory,
    forward_exploration,
    forward_inference,
    mark_episode_reset,
    mark_episode_steps,
)
from rl_app.rllib.accel.draws import sample_categorical, sample_squashed_gaussian
from rl_app.rllib.accel.episodes import EndedEpisode, StepArrays, append_rows, with_list_buffers
from rl_app.rllib.accel.transitions import OpenEpisodes, TransitionRows, Transitions
from rl_app.rllib.env_runner import RLAppEnvRunner

logger = logging.getLogger(__name__)

# RLlib 2.60's default pipelines for a single-agent, stateless module, which may start with the
# MeanStdFilter connector; anything else (user connectors, frame stacking connectors) is RLlib's to
# run.
DEFAULT_ENV_TO_MODULE = (
    "AddObservationsFromEpisodesToBatch",
    "AddTimeDimToBatchAndZeroPad",
    "AddStatesFromEpisodesToBatch",
    "BatchIndividualItems",
    "NumpyToTensor",
)
DEFAULT_MODULE_TO_ENV = (
    "GetActions",
    "TensorToNumpy",
    "UnBatchToIndividualItems",
    "RemoveSingleTsTimeRankFromBatch",
    "NormalizeAndClipActions",
    "ListifyDataForVectorEnv",
)


def _pipeline_refusal(runner: Any) -> str | None:
    env_to_module, module_to_env = runner.connector_names()
    if env_to_module[:1] == ("MeanStdFilter",):  # applied per vector step (FilterEachObservation)
        env_to_module = env_to_module[1:]
    if env_to_module != DEFAULT_ENV_TO_MODULE or module_to_env != DEFAULT_MODULE_TO_ENV:
        return f"connectors other than RLlib's defaults ({env_to_module}, {module_to_env})"
    if not runner.config.episodes_to_numpy:
        return "episodes_to_numpy is off (ours hands out numpy episodes)"
    if runner.module is None or runner.module.is_stateful():
        return "the module is recurrent"
    if any(p.device.type != "cpu" for p in runner.module.parameters()):
        return "the env runner's module is on a GPU"
    if not isinstance(runner.env.single_action_space, gym.spaces.Box | gym.spaces.Discrete):
        return f"action space {runner.env.single_action_space}"
    if not isinstance(runner.env.single_observation_space, gym.spaces.Box):
        return f"observation space {runner.env.single_observation_space}"
    # Episodes are filled once per call, so no episode callback would see what RLlib's shows it.
    config = runner.config
    episode_callbacks = ("created", "start", "step", "end")
    if config.callbacks_class is not RLlibCallback or any(
        getattr(config, f"callbacks_on_episode_{which}") for which in episode_callbacks
    ):
        return "custom episode callbacks"
    return None


# RLlib's exploration distributions that rl_app.rllib.distributions samples as plain tensor operations.
PLAIN_SAMPLERS = {TorchCategorical: sample_categorical, TorchSquashedGaussian: sample_squashed_gaussian}

_NARROWER = {np.dtype(np.int64): np.int32, np.dtype(np.float64): np.float32}


def _to_tensor(array: np.ndarray) -> Any:
    """RLlib's ``convert_to_torch_tensor`` for one CPU array: floats become float32."""
    tensor = torch.from_numpy(array)
    return tensor.float() if tensor.is_floating_point() and tensor.dtype != torch.float16 else tensor


def _to_numpy(tensor: Any) -> np.ndarray:
    """RLlib's ``convert_to_numpy`` for one CPU tensor: int64 becomes int32, float64 float32."""
    array = tensor.numpy()
    narrower = _NARROWER.get(array.dtype)
    return array if narrower is None else array.astype(narrower)


class BatchedEnvRunner(RLAppEnvRunner):
    """:class:`RLAppEnvRunner` whose sampling steps the vector env with batched arrays."""

    _pipeline_refusal_found: str | bool | None = False  # False: not checked yet

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # (length, return, seconds) of the episodes the transition path ended, for get_metrics.
        self._ended_for_metrics: list[tuple[int, Any, float]] = []
        super().__init__(*args, **kwargs)

    def sample_steps(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
        if self._open_episodes is not None:  # the transition path moved the envs on: start afresh
            self._open_episodes, force_reset = None, True
        if random_actions or self._pipeline_refusal() is not None:
            return super().sample_steps(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
            )
        with self._inference_mode():
            return self._sample_episodes(num_timesteps, num_episodes, explore, force_reset)

    def _timestep(self, ts: int) -> int:
        """The global env step RLlib's runner hands its module (exploration schedules) ``ts`` steps
        into a call: this runner's lifetime count scaled by the number of runners."""
        runners = self.config.num_env_runners or 1
        return (self.num_env_steps_sampled_lifetime // runners + ts) * runners

    def _pipeline_refusal(self) -> str | None:
        """Why this runner's connector pipelines are not ones it fits (said once), or None."""
        if self._pipeline_refusal_found is False:
            self._pipeline_refusal_found = _pipeline_refusal(self)
            if self._pipeline_refusal_found is not None:
                logger.warning("the batched runner steps aside for RLlib's: %s", self._pipeline_refusal_found)
        return cast(str | None, self._pipeline_refusal_found)

    def _act(
        self, observations: np.ndarray, explore: bool, t: int, outputs: bool = True
    ) -> dict[str, np.ndarray]:
        """RLlib's forward pass and ``GetActions`` on the stacked observations (the module is in
        eval mode for the whole sample call, see :meth:`_inference_mode`). Without ``outputs``, the
        actions alone: the same draws, no log-probs or other model outputs."""
        module: Any = self.module
        with torch.no_grad(), self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
            batch = {Columns.OBS: _to_tensor(observations)}
            # The methods RLlib's forward_exploration/forward_inference call, minus their mode switch.
            out = forward_exploration(module, batch, t) if explore else forward_inference(module, batch)
            if Columns.ACTIONS not in out and Columns.ACTION_DIST_INPUTS in out:
                if explore:
                    dist_class = module.get_exploration_action_dist_cls()
                else:
                    dist_class = module.get_inference_action_dist_cls()
                plain = PLAIN_SAMPLERS.get(dist_class) if explore and Columns.ACTION_LOGP not in out else None
                if plain is not None:
                    out[Columns.ACTIONS], logp = plain(out[Columns.ACTION_DIST_INPUTS], with_logp=outputs)
                    if outputs:
                        out[Columns.ACTION_LOGP] = logp
                else:
                    dist = dist_class.from_logits(out[Columns.ACTION_DIST_INPUTS])
                    if not explore:
                        dist = dist.to_deterministic()
                    out[Columns.ACTIONS] = dist.sample()
                    if outputs and Columns.ACTION_LOGP not in out:
                        out[Columns.ACTION_LOGP] = dist.logp(out[Columns.ACTIONS])
        if not outputs:
            return {Columns.ACTIONS: _to_numpy(out[Columns.ACTIONS])}
        return {key: _to_numpy(value) for key, value in out.items() if isinstance(value, torch.Tensor)}

    def _actions_for_env(self, actions: np.ndarray, action_struct: Any) -> np.ndarray:
        """RLlib's ``NormalizeAndClipActions``, on the whole batch at once."""
        if self.config.normalize_actions:
            return unsquash_action(actions, action_struct)
        if self.config.clip_actions:
            return clip_action(actions, action_struct)
        return actions

    @contextlib.contextmanager
    def _inference_mode(self) -> Iterator[None]:
        module: Any = self.module
        if module.training:
            # The runner's module only infers. RLlib's forward_* switch it to eval mode and back on
            # every call (a walk over all layers, twice); it stays in eval mode instead.
            module.eval()
        # A call allocates thousands of small objects that all live until it returns (episodes, their
        # buffers, info dicts); the collector would walk them, and the whole heap, again and again
        # (a quarter of the time at 256 CartPole envs). It runs once the call is over.
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if collecting:
                gc.enable()

    # Each env's running episode while the transition path samples (None: the episode path's turn).
    _open_episodes: OpenEpisodes | None = None

    def transition_refusal(self) -> str | None:
        """Why this runner cannot hand out :meth:`sample_transitions`, or None."""
        refusal = self._pipeline_refusal()
        if refusal is not None:
            return refusal
        config = self.config
        if config.in_evaluation or config.batch_mode != "truncate_episodes" or not config.explore:
            return "an evaluation runner, whole-episode batches, or sampling without exploring"
        if config.callbacks_on_sample_end or self.has_state_server():
            return "an on_sample_end callback, or a weights server to pull from"
        return None

    def sample_transitions(self, num_timesteps: int | None = None) -> Transitions:
        """``sample(num_timesteps=...)`` while exploring, as a replay buffer's rows instead of episodes.

        At one env step per call (SAC), making the call's episode chunk and its continuation costs
        as much as the forward pass and the env step together; a replay buffer reads only these
        columns from them. The rows come in the order the episode chunks would have given them
        (finished episodes as they ended, then the running ones by env), and the runner logs the
        metrics ``sample()`` and ``get_metrics()`` would (tests/test_sampling.py). Only for a
        runner with no :meth:`transition_refusal`."""
        if self.env is None:
            raise ValueError(f"{self} doesn't have an env! Can't call `sample()` on it.")
        metrics = self.metrics
        if self.time_after_sampling is not None:
            metrics.log_value(key=TIME_BETWEEN_SAMPLING, value=time.perf_counter() - self.time_after_sampling)
        metrics.log_value(key=WEIGHTS_SEQ_NO, value=self.weights_seq_no, window=1)
        with metrics.log_time(SAMPLE_TIMER), self._inference_mode():
            if num_timesteps is None:
                num_timesteps = self.config.get_rollout_fragment_length(self.worker_index) * self.num_envs
            try:
                transitions = self._sample_transitions(num_timesteps)
            except BaseException:
                self._open_episodes = None  # half a call's bookkeeping: the next call starts afresh
                raise
        self.time_after_sampling = time.perf_counter()
        return transitions

    def _reset_open_episodes(self) -> OpenEpisodes:
        """Every env reset as RLlib's runner resets them (seeded at first, episode callbacks), its
        episodes kept open for the transition path."""
        self.reset_envs_and_episodes(explore=True)
        self._open_episodes = OpenEpisodes(self.ongoing_episodes, self._ended_for_metrics)
        return self._open_episodes

    def _sample_transitions(self, num_timesteps: int) -> Transitions:
        episodes = self._open_episodes
        if episodes is None or self.needs_initial_reset:
            episodes = self._reset_open_episodes()
        env: Any = self.env
        action_struct = get_base_struct_from_space(env.single_action_space)
        rows = TransitionRows()
        ts, ended_before = 0, len(self._ended_for_metrics)
        while ts < num_timesteps:
            actions = self._act(episodes.observations, True, self._timestep(ts), outputs=False)[
                Columns.ACTIONS
            ]
            results = self.try_env_step(self._actions_for_env(actions, action_struct))
            if isinstance(results, str) and results == ENV_STEP_FAILURE:
                # As RLlib: this call's steps of the running episodes are dropped, every env starts over.
                rows.drop_running(episodes.ids)
                ts = 0
                episodes = self._reset_open_episodes()
                continue
            next_observations, rewards, terminateds, truncateds, _ = results
            if self._observation_filter is not None:
                next_observations = self._observation_filter(next_observations)
            stepped = ~episodes.resetting
            rows.add(stepped, episodes, actions, rewards, next_observations, terminateds, truncateds)
            ts += int(stepped.sum())
            now = time.perf_counter()
            rows.ended += episodes.step(stepped, rewards, terminateds, truncateds, next_observations, now)
        episodes.end_call()
        self.log_sampled(ts, len(self._ended_for_metrics) - ended_before)
        return rows.in_episode_order(episodes.ids)

    def get_metrics(self) -> Any:
        ended = list(self._ended_for_metrics)
        self._ended_for_metrics.clear()  # in place: the open episodes append to this list
        for length, episode_return, seconds in ended:
            self.log_episode_metrics(length, episode_return, seconds)
        return super().get_metrics()

    def _sample_episodes(
        self, num_timesteps: int | None, num_episodes: int | None, explore: bool, force_reset: bool
    ) -> list[Any]:
        """RLlib's ``sample`` step for ``num_timesteps`` (episode chunks, continued next call) or
        ``num_episodes`` (complete episodes from freshly reset envs; the unfinished are dropped)."""
        if force_reset or num_episodes is not None or self.needs_initial_reset:
            self.reset_envs_and_episodes(explore)
        if num_episodes is not None:
            self.needs_initial_reset = True  # the next call starts from fresh episodes too
        self.forget_cached_connector_output()
        # None: an episode that started in this call, made from the step arrays when it ends or the
        # call does (most episodes of a short-lived policy never exist before that).
        episodes: list[Any] = list(self.ongoing_episodes)
        n = self.num_envs
        # An env whose episode ended in the last step returns its reset observation next
        # (gymnasium's next-step autoreset): that step is the new episode's reset, not a timestep.
        resetting = np.array([not episode.is_reset for episode in episodes])
        observations = np.stack(
            [
                episode.get_observations(-1) if episode.is_reset else self._placeholder()
                for episode in episodes
            ]
        )
        env: Any = self.env
        action_struct = get_base_struct_from_space(env.single_action_space)
        steps = StepArrays()
        chunk_start = [0] * n  # each env's first step of its current episode
        ended: list[EndedEpisode] = []  # made or filled at the end of the call
        done_episodes: list[Any] = []
        ts = 0
        while (
            ts < num_timesteps
            if num_timesteps is not None
            else len(done_episodes) + len(ended) < cast(int, num_episodes)
        ):
            out = self._act(observations, explore, self._timestep(ts))
            actions = out.pop(Columns.ACTIONS)
            results = self.try_env_step(self._actions_for_env(actions, action_struct))
            if isinstance(results, str) and results == ENV_STEP_FAILURE:
                # As RLlib: the ongoing episodes are dropped (finished ones kept), every env starts over.
                done_episodes += self._finished(ended, steps)
                ts, steps, ended = 0, StepArrays(), []
                self.reset_envs_and_episodes(explore)
                episodes = list(self.ongoing_episodes)
                observations = np.stack([episode.get_observations(-1) for episode in episodes])
                resetting[:] = False
                chunk_start = [0] * n
                continue
            next_observations, rewards, terminateds, truncateds, infos = results
            if self._observation_filter is not None:
                next_observations = self._observation_filter(next_observations)
            s = steps.add(next_observations, actions, rewards, infos, out)
            stepped = ~resetting
            ts += int(stepped.sum())
            for i in np.flatnonzero(resetting).tolist():
                episodes[i] = None  # its reset observation is this step's
                chunk_start[i] = s + 1
            done = stepped & (terminateds | truncateds)
            for i in np.flatnonzero(done).tolist():
                ended.append(
                    EndedEpisode(
                        episodes[i], i, chunk_start[i], s + 1, bool(terminateds[i]), bool(truncateds[i])
                    )
                )
                if num_episodes is not None and len(done_episodes) + len(ended) >= num_episodes:
                    break
            resetting = done
            observations = np.ascontiguousarray(next_observations)  # a vector env may give it transposed

        done_episodes += self._finished(ended, steps)
        if num_episodes is not None:
            self.keep_done_for_metrics(done_episodes)
            self.log_sampled(ts, len(done_episodes))
            return done_episodes
        for i in range(n):
            if resetting[i]:  # ended in the last step: the next call resets it
                episodes[i] = self._array_episodes.empty()
            elif episodes[i] is None:
                episodes[i] = self._episode_from_steps(
                    steps, EndedEpisode(None, i, chunk_start[i], len(steps))
                )
            else:
                self._fill(episodes[i], steps, i, chunk_start[i], len(steps))
        continuations = [
            with_list_buffers(episode.cut(len_lookback_buffer=self.config.episode_lookback_horizon))
            for episode in episodes
        ]
        ongoing = []
        for episode in episodes:
            if episode.t == 0:
                continue
            episode.validate()
            self.keep_chunk_for_metrics(episode)
            ongoing.append(episode.to_numpy())
        self.ongoing_episodes = continuations
        self.keep_done_for_metrics(done_episodes)
        self.log_sampled(ts, len(done_episodes))
        return done_episodes + ongoing

    def _finished(self, ended: list[EndedEpisode], steps: StepArrays) -> list[Any]:
        """The episodes that ended in this call, made or filled from the call's step arrays."""
        finished = []
        for end in ended:
            if end.episode is None:
                finished.append(self._episode_from_steps(steps, end))
                continue
            end.episode.is_terminated, end.episode.is_truncated = end.terminated, end.truncated
            self._fill(end.episode, steps, end.env, end.start, end.stop)
            finished.append(end.episode.to_numpy())
        return finished

    def _episode_from_steps(self, steps: StepArrays, end: EndedEpisode) -> Any:
        """The episode env ``end.env`` began at step ``end.start - 1`` (its reset observation), as
        RLlib's ``add_env_reset``, ``add_env_step`` per step and ``to_numpy`` would leave it."""
        i, start, stop = end.env, end.start, end.stop
        reset = steps.step_time(start - 1)
        episode: Any
        if stop == start:  # reset, no step yet: as RLlib's runner keeps it (lists)
            episode = self._array_episodes.empty()
            info = steps.infos(i, slice(start - 1, start))[0]
            episode.add_env_reset(observation=steps.column("obs")[start - 1, i].copy(), infos=info)
            mark_episode_reset(episode, reset)
            return episode
        span = slice(start, stop)
        infos = steps.infos(i, slice(start - 1, stop))
        # Arrays where RLlib's signature says lists: its buffers take either, and arrays are what
        # to_numpy() would have made of the lists.
        columns: dict[str, Any] = {
            "observations": steps.column("obs")[start - 1 : stop, i].copy(),
            "actions": steps.column("actions")[span, i].copy(),
            "rewards": steps.column("rewards")[span, i].copy(),
            "extra_model_outputs": {key: steps.column(key)[span, i].copy() for key in steps.extra_keys}
            | {WEIGHTS_SEQ_NO: np.full(stop - start, self.weights_seq_no)},
        }
        episode = self._array_episodes.make(
            **columns, infos=infos, terminated=end.terminated, truncated=end.truncated
        )
        mark_episode_reset(episode, reset, steps.step_time(stop - 1))
        mark_episode_steps(episode, steps.step_time(stop - 1), episode.observations.data[-1], infos[-1])
        return episode

    @functools.cached_property
    def _observation_filter(self) -> Any:
        """The MeanStdFilter connector's step on whole vector steps, or None without one."""
        return self.observation_filter()

    @functools.cached_property
    def _array_episodes(self) -> EpisodeFactory:
        env: Any = self.env
        observation_filter = self._observation_filter
        # The filter connector gives each episode the space of the observations it wrote.
        space = env.single_observation_space
        if observation_filter is not None:
            space = observation_filter.observation_space
        return EpisodeFactory(space, env.single_action_space)

    def _placeholder(self) -> np.ndarray:
        env: Any = self.env
        space = env.single_observation_space
        return np.zeros(space.shape, dtype=space.dtype)

    def _fill(self, episode: Any, steps: StepArrays, i: int, start: int, stop: int) -> None:
        """``add_env_step`` for env ``i``'s steps ``start:stop``, all at once: each column's rows
        are one slice of the call's stacked arrays."""
        if stop <= start:
            return
        span = slice(start, stop)
        append_rows(episode.observations, steps.column("obs")[span, i])
        append_rows(episode.actions, steps.column("actions")[span, i])
        append_rows(episode.rewards, steps.column("rewards")[span, i])
        infos = steps.infos(i, span)
        episode.infos.extend(infos)
        for key in steps.extra_keys:
            if key not in episode.extra_model_outputs:
                episode.extra_model_outputs[key] = InfiniteLookbackBuffer()
            append_rows(episode.extra_model_outputs[key], steps.column(key)[span, i])
        if WEIGHTS_SEQ_NO not in episode.extra_model_outputs:
            episode.extra_model_outputs[WEIGHTS_SEQ_NO] = InfiniteLookbackBuffer()
        append_rows(episode.extra_model_outputs[WEIGHTS_SEQ_NO], np.full(stop - start, self.weights_seq_no))
        episode.t += stop - start
        mark_episode_steps(episode, steps.step_time(stop - 1), episode.observations.data[-1], infos[-1])
