"""Our sampling path: RLlib's env runner with its per-step work done once per vector step.

RLlib's ``SingleAgentEnvRunner`` runs two connector pipelines, unbatches every output, and calls
``add_env_step`` and three callbacks per env on every step. For the default pipelines (nothing in
them but batching, tensor conversion, action sampling and unsquashing) that is the same as: one
forward pass on the stacked observations, one draw from the action distribution, one env step,
and the step's arrays kept as they are. The episodes are then filled once per ``sample()`` call
(or when one ends) from slices of those arrays, with the same ids, lookback buffers, extra model
outputs, metrics and callbacks as RLlib's runner gives them. Same seeds, same weights: same
episodes, to the bit (tests/test_sampling.py).

Timestep sampling (training) and episode sampling (evaluation) take this path; random actions
stay RLlib's. Experiments it does not fit fall back to RLlib's runner, with the reason.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.env.env_runner import ENV_STEP_FAILURE
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.metrics import RLMODULE_INFERENCE_TIMER, WEIGHTS_SEQ_NO
from ray.rllib.utils.spaces.space_utils import clip_action, get_base_struct_from_space, unsquash_action

from rl_app.envs import observation_space
from rl_app.rllib.env_runner import RLAppEnvRunner

logger = logging.getLogger(__name__)

FAST_ALGORITHMS = ("PPO", "APPO", "IMPALA", "DQN", "SAC")
# RLlib 2.60's default pipelines for a single-agent, stateless module; anything else (user
# connectors, MeanStdFilter, frame stacking connectors) is RLlib's to run.
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


def sampling_refusal(experiment: Any) -> str | None:
    """Why ``experiment`` samples with RLlib's runner, or None when ours fits it."""
    runners = experiment.env_runners
    if runners.runner == "rllib":
        return "env_runners.runner: rllib"
    if experiment.algorithm not in FAST_ALGORITHMS:
        return f"{experiment.algorithm} is not one of {', '.join(FAST_ALGORITHMS)}"
    if runners.observation_filter is not None:
        return f"env_runners.observation_filter {runners.observation_filter} is an RLlib connector"
    if not isinstance(observation_space(experiment.env), gym.spaces.Box):
        return "observations are not a Box"
    return None


def describe_sampling(experiment: Any) -> str:
    """The start line's word on sampling: our runner, or RLlib's and why."""
    refusal = sampling_refusal(experiment)
    return "fast runner (rl_app's batched sampler)" if refusal is None else f"RLlib's runner ({refusal})"


def _pipeline_refusal(runner: Any) -> str | None:
    env_to_module = tuple(type(c).__name__ for c in runner._env_to_module.connectors)
    module_to_env = tuple(type(c).__name__ for c in runner._module_to_env.connectors)
    if env_to_module != DEFAULT_ENV_TO_MODULE or module_to_env != DEFAULT_MODULE_TO_ENV:
        return f"connectors other than RLlib's defaults ({env_to_module}, {module_to_env})"
    if runner.module is None or runner.module.is_stateful():
        return "the module is recurrent"
    if any(p.device.type != "cpu" for p in runner.module.parameters()):
        return "the env runner's module is on a GPU"
    if not isinstance(runner.env.single_action_space, gym.spaces.Box | gym.spaces.Discrete):
        return f"action space {runner.env.single_action_space}"
    if not isinstance(runner.env.single_observation_space, gym.spaces.Box):
        return f"observation space {runner.env.single_observation_space}"
    # Episode start/end/created callbacks are made as RLlib makes them; per-step ones are not.
    if runner.config.callbacks_class is not RLlibCallback or runner.config.callbacks_on_episode_step:
        return "custom callbacks (on_episode_step is not made)"
    return None


_NARROWER = {np.dtype(np.int64): np.int32, np.dtype(np.float64): np.float32}


def _to_tensor(array: np.ndarray) -> Any:
    """RLlib's ``convert_to_torch_tensor`` for one CPU array: floats become float32."""
    tensor = torch.from_numpy(array)
    return tensor.float() if tensor.is_floating_point() and tensor.dtype != torch.float16 else tensor


def _sample_categorical(logits: Any) -> tuple[Any, Any]:
    """``TorchCategorical.from_logits(logits)``'s ``sample()`` and ``logp()``, the same operations
    on the same torch RNG, without building the distribution objects (a third of a step's time)."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.nn.functional.softmax(normalized, dim=-1)
    actions = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).T.reshape(probs.shape[:-1])
    return actions, normalized.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def _to_numpy(tensor: Any) -> np.ndarray:
    """RLlib's ``convert_to_numpy`` for one CPU tensor: int64 becomes int32, float64 float32."""
    array = tensor.numpy()
    narrower = _NARROWER.get(array.dtype)
    return array if narrower is None else array.astype(narrower)


class FastEnvRunner(RLAppEnvRunner):
    """:class:`RLAppEnvRunner` whose sampling steps the vector env with batched arrays."""

    _fast_refusal: str | bool | None = False  # False: not checked yet

    def _sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[Any]:
        if self._fast_refusal is False:
            self._fast_refusal = _pipeline_refusal(self)
            if self._fast_refusal is not None:
                logger.warning("fast sampling off, RLlib's runner samples: %s", self._fast_refusal)
        if random_actions or self._fast_refusal is not None:
            return super()._sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
            )
        return self._sample_batched(num_timesteps, num_episodes, explore, force_reset)

    def _act(self, observations: np.ndarray, explore: bool, t: int) -> dict[str, np.ndarray]:
        """RLlib's forward pass and ``GetActions`` on the stacked observations (the module is in
        eval mode for the whole sample call, see :meth:`_sample_batched`)."""
        module: Any = self.module
        with torch.no_grad(), self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
            batch = {Columns.OBS: _to_tensor(observations)}
            # The methods RLlib's forward_exploration/forward_inference call, minus their mode switch.
            out = module._forward_exploration(batch, t=t) if explore else module._forward_inference(batch)
            if Columns.ACTIONS not in out and Columns.ACTION_DIST_INPUTS in out:
                if explore:
                    dist_class = module.get_exploration_action_dist_cls()
                else:
                    dist_class = module.get_inference_action_dist_cls()
                if explore and dist_class is TorchCategorical:
                    out[Columns.ACTIONS], out[Columns.ACTION_LOGP] = _sample_categorical(
                        out[Columns.ACTION_DIST_INPUTS]
                    )
                    return {
                        key: _to_numpy(value) for key, value in out.items() if isinstance(value, torch.Tensor)
                    }
                dist = dist_class.from_logits(out[Columns.ACTION_DIST_INPUTS])
                if not explore:
                    dist = dist.to_deterministic()
                out[Columns.ACTIONS] = dist.sample()
                if Columns.ACTION_LOGP not in out:
                    out[Columns.ACTION_LOGP] = dist.logp(out[Columns.ACTIONS])
        return {key: _to_numpy(value) for key, value in out.items() if isinstance(value, torch.Tensor)}

    def _actions_for_env(self, actions: np.ndarray, action_struct: Any) -> np.ndarray:
        """RLlib's ``NormalizeAndClipActions``, on the whole batch at once."""
        if self.config.normalize_actions:
            return unsquash_action(actions, action_struct)
        if self.config.clip_actions:
            return clip_action(actions, action_struct)
        return actions

    def _sample_batched(
        self, num_timesteps: int | None, num_episodes: int | None, explore: bool, force_reset: bool
    ) -> list[Any]:
        module: Any = self.module
        was_training = module.training
        module.eval()  # RLlib's forward_* switch it on every step: a walk over all layers, twice
        try:
            return self._sample_in_eval_mode(num_timesteps, num_episodes, explore, force_reset)
        finally:
            if was_training:
                module.train()

    def _sample_in_eval_mode(
        self, num_timesteps: int | None, num_episodes: int | None, explore: bool, force_reset: bool
    ) -> list[Any]:
        """RLlib's ``_sample`` for ``num_timesteps`` (episode chunks, continued next call) or
        ``num_episodes`` (complete episodes from freshly reset envs; the unfinished are dropped)."""
        if force_reset or num_episodes is not None or self._needs_initial_reset:
            self._reset_envs_and_episodes(explore)
        if num_episodes is not None:
            self._needs_initial_reset = True  # the next call starts from fresh episodes too
        self._cached_to_module = None  # RLlib's timestep path never runs after ours
        episodes: list[Any] = self._ongoing_episodes
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
        action_struct = get_base_struct_from_space(cast(Any, self.env).single_action_space)
        steps: list[dict[str, Any]] = []
        chunk_start = [0] * n  # each env's first step of its current episode
        done_episodes: list[Any] = []
        runners = self.config.num_env_runners or 1
        ts = 0
        while (
            ts < num_timesteps if num_timesteps is not None else len(done_episodes) < cast(int, num_episodes)
        ):
            t = (self.num_env_steps_sampled_lifetime // runners + ts) * runners
            out = self._act(observations, explore, t)
            actions = out.pop(Columns.ACTIONS)
            results = self._try_env_step(self._actions_for_env(actions, action_struct))
            if isinstance(results, str) and results == ENV_STEP_FAILURE:
                # As RLlib: the ongoing episodes are dropped (finished ones kept), every env starts over.
                ts, steps = 0, []
                self._reset_envs_and_episodes(explore)
                episodes = cast(list[Any], self._ongoing_episodes)
                observations = np.stack([episode.get_observations(-1) for episode in episodes])
                resetting[:] = False
                chunk_start = [0] * n
                continue
            next_observations, rewards, terminateds, truncateds, infos = results
            s = len(steps)
            steps.append(
                {
                    "obs": next_observations,
                    "actions": actions,
                    "rewards": rewards,
                    "terminateds": terminateds,
                    "truncateds": truncateds,
                    "infos": infos,
                    "extra": out,
                }
            )
            stepped = ~resetting
            ts += int(stepped.sum())
            for i in np.flatnonzero(resetting).tolist():
                episodes[i].add_env_reset(observation=next_observations[i], infos=infos[i])
                self._make_on_episode_callback("on_episode_start", i, episodes)
                chunk_start[i] = s + 1
            done = stepped & (terminateds | truncateds)
            for i in np.flatnonzero(done).tolist():
                self._fill(episodes[i], steps, i, chunk_start[i], s + 1)
                self._make_on_episode_callback("on_episode_end", i, episodes)
                done_episodes.append(episodes[i].to_numpy() if self.episodes_to_numpy else episodes[i])
                self._new_episode(i, episodes)
                if num_episodes is not None and len(done_episodes) >= num_episodes:
                    break
            resetting = done
            observations = np.asarray(next_observations)

        if num_episodes is not None:
            self._done_episodes_for_metrics.extend(done_episodes)
            self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=ts)
            self._increase_sampled_metrics(ts, len(done_episodes))
            return done_episodes
        ongoing = []
        for i in range(n):
            if not resetting[i]:
                self._fill(episodes[i], steps, i, chunk_start[i], len(steps))
        continuations = [
            episode.cut(len_lookback_buffer=self.config.episode_lookback_horizon) for episode in episodes
        ]
        for episode in episodes:
            if episode.t == 0:
                continue
            episode.validate()
            self._ongoing_episodes_for_metrics[episode.id_].append(episode)
            ongoing.append(episode.to_numpy() if self.episodes_to_numpy else episode)
        self._ongoing_episodes = continuations
        self._done_episodes_for_metrics.extend(done_episodes)
        self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=ts)
        self._increase_sampled_metrics(ts, len(done_episodes))
        return done_episodes + ongoing

    def _placeholder(self) -> np.ndarray:
        env: Any = self.env
        space = env.single_observation_space
        return np.zeros(space.shape, dtype=space.dtype)

    def _fill(self, episode: Any, steps: list[dict[str, Any]], i: int, start: int, stop: int) -> None:
        """``add_env_step`` for env ``i``'s steps ``start:stop``, all at once."""
        span = steps[start:stop]
        if not span:
            return
        observations = [step["obs"][i] for step in span]
        infos = [step["infos"][i] or {} for step in span]
        episode.observations.extend(observations)
        episode.actions.extend([step["actions"][i] for step in span])
        episode.rewards.extend([step["rewards"][i] for step in span])
        episode.infos.extend(infos)
        extra = {key: [step["extra"][key][i] for step in span] for key in span[0]["extra"]}
        extra[WEIGHTS_SEQ_NO] = [self._weights_seq_no] * len(span)
        for key, values in extra.items():
            if key not in episode.extra_model_outputs:
                episode.extra_model_outputs[key] = InfiniteLookbackBuffer(values)
            else:
                episode.extra_model_outputs[key].extend(values)
        episode.t += len(span)
        last = span[-1]
        episode.is_terminated = bool(last["terminateds"][i])
        episode.is_truncated = bool(last["truncateds"][i])
        episode._last_added_observation, episode._last_added_infos = observations[-1], infos[-1]
        episode._last_step_time = time.perf_counter()
        if episode._start_time is None:
            episode._start_time = episode._last_step_time
