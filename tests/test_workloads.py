"""Pixel workloads: the Atari preprocessing, uint8 frames and bool grids reaching the model, and
each Atari experiment through train -> checkpoint -> evaluate -> export."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers import rllib_actions

from rl_app.config import load_experiment
from rl_app.config.schema import EnvSection
from rl_app.envs import make_env
from rl_app.runs.checkpoints import list_checkpoints

REPO = Path(__file__).resolve().parents[1]
BREAKOUT = {"id": "ALE/Breakout-v5", "config": {"frameskip": 1, "repeat_action_probability": 0.0}}
ATARI_EXPERIMENTS = ["ppo_pong", "impala_pong"]
# Two short iterations of each: the shipped batches are for learning, not for a pipeline check.
TINY_ATARI = {
    "ppo_pong": [
        "training.train_batch_size_per_learner=256",
        "training.minibatch_size=64",
        "training.num_epochs=1",
    ],
    "impala_pong": ["training.train_batch_size_per_learner=100"],
}


def wrapper_names(env: gym.Env) -> list[str]:
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_the_atari_preset_makes_stacked_uint8_frames_and_keeps_training_tricks_out_of_evaluation() -> None:
    section = EnvSection.model_validate({**BREAKOUT, "wrappers": ["atari"]})
    training, evaluation = make_env(section), make_env(section, evaluation=True)
    try:
        assert training.observation_space == gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
        assert evaluation.observation_space == training.observation_space
        assert {"EpisodicLife", "TransformReward"} <= set(wrapper_names(training))
        assert not {"EpisodicLife", "TransformReward"} & set(wrapper_names(evaluation))
        assert "FireReset" in wrapper_names(training)  # Breakout waits for FIRE

        # Training: each stacked observation shifts the previous one by a frame, and the episode
        # ends when a life is lost while the game goes on.
        obs, _ = training.reset(seed=0)
        training.action_space.seed(0)
        ale = training.unwrapped.ale  # type: ignore[attr-defined]
        lives_at_start, terminated, steps = ale.lives(), False, 0
        while not terminated:
            previous = obs
            obs, reward, terminated, truncated, _ = training.step(training.action_space.sample())
            assert obs.dtype == np.uint8 and reward in (0.0, 1.0)
            np.testing.assert_array_equal(obs[..., :-1], previous[..., 1:])
            steps += 1
            assert not truncated and steps < 5000
        assert 0 < ale.lives() < lives_at_start, "a life lost ends a training episode, not the game"

        # Evaluation: the episode is the whole game, over every life.
        evaluation.reset(seed=0)
        evaluation.action_space.seed(0)
        done = False
        while not done:
            _, _, terminated, truncated, _ = evaluation.step(evaluation.action_space.sample())
            done = terminated or truncated
        assert evaluation.unwrapped.ale.lives() == 0  # type: ignore[attr-defined]
    finally:
        training.close()
        evaluation.close()


def test_the_atari_preset_says_what_it_needs() -> None:
    from rl_app.envs import check_env

    with pytest.raises(ValueError, match=r"frameskip: 1"):
        check_env(EnvSection.model_validate({"id": "ALE/Pong-v5", "wrappers": ["atari"]}))
    with pytest.raises(ValueError, match="needs an ALE env"):
        check_env(EnvSection.model_validate({"id": "CartPole-v1", "wrappers": ["atari"]}))


def test_a_pixel_rllib_experiment_on_something_without_an_image_model_is_refused(shipped: Path) -> None:
    from rl_app.cluster.resources import plan_resources
    from rl_app.errors import ConfigError
    from rl_app.rllib.config import algorithm_config

    loaded = load_experiment("sac_pendulum", ["env.id=MinAtar/Breakout-v1"])
    with pytest.raises(ConfigError, match="no image-input model"):
        algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)


# Each pixel experiment's observations as the env makes them, and the encoders that read them.
RAW_INPUTS = {
    "ppo_pong": ("torch.uint8", (84, 84, 4), "TorchCNNEncoder", 1),
    # gymnax-blines' networks: the flattened grid into separate actor and critic MLPs.
    "ppo_minatar_breakout": ("torch.bool", (400,), "TorchMLPEncoder", 2),
}
TINY_MINATAR = [
    "env_runners.num_envs_per_env_runner=8",
    "env_runners.rollout_fragment_length=32",
    "training.train_batch_size_per_learner=256",
    "training.minibatch_size=128",
]


@pytest.mark.ray
@pytest.mark.parametrize("name", RAW_INPUTS)
def test_frames_and_grids_reach_the_model_unconverted(ray_session: None, shipped: Path, name: str) -> None:
    from rl_app.cluster.resources import plan_resources
    from rl_app.rllib.config import algorithm_config
    from rl_app.rllib.pixels import ToFloat

    dtype, shape, encoder_class, encoders = RAW_INPUTS[name]
    tiny = TINY_ATARI.get(name, TINY_MINATAR)
    loaded = load_experiment(name, [*tiny, "evaluation.interval=0"])
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    algo = config.build_algo()
    try:
        if name == "ppo_pong":  # the frames come from ale-py's native vector env, as shipped
            assert type(algo.env_runner.env.unwrapped).__name__ == "AtariVectorEnv"
        seen: dict[str, list[tuple[tuple[int, ...], str]]] = {"env runner": [], "learner": []}
        modules = {
            "env runner": algo.env_runner.module,
            "learner": algo.learner_group._learner.module["default_policy"],  # type: ignore[union-attr]
        }
        for where, module in modules.items():
            converting = [m for m in module.modules() if type(m).__name__ == encoder_class]
            layers = [m for m in module.modules() if isinstance(m, ToFloat)]
            # Every encoder reading the observation converts it (the env runner's module is
            # inference-only: no critic).
            assert len(layers) == len(converting) >= (1 if where == "env runner" else encoders), where
            for layer in layers:
                layer.register_forward_pre_hook(
                    lambda _, args, where=where: seen[where].append(
                        (tuple(args[0].shape), str(args[0].dtype))
                    )
                )
        algo.train()
    finally:
        algo.stop()
    for where, inputs in seen.items():
        assert inputs, f"no batch reached the {where}'s model"
        assert {dtype for _, dtype in inputs} == {dtype}, (where, inputs[:3])
        assert {shape[1:] for shape, _ in inputs} == {shape}


@pytest.mark.ray
@pytest.mark.parametrize("name", ATARI_EXPERIMENTS)
def test_an_atari_experiment_trains_checkpoints_evaluates_and_exports(
    name: str, ray_session: None, tmp_path: Path
) -> None:
    import onnxruntime as ort

    from rl_app.policy.evaluate import evaluate
    from rl_app.policy.export import export_policy
    from rl_app.training.run import train

    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    overrides = [*TINY_ATARI[name], "stop.iterations=2", "checkpoint.every=1", "evaluation.interval=0"]
    summary = train(name, overrides, runs_root=tmp_path)
    assert summary.status == "finished" and summary.iterations == 2
    checkpoint = list_checkpoints(summary.run_dir)[-1]

    report = evaluate(str(summary.run_dir), episodes=1, video=True, video_episodes=1, runs_root=tmp_path)
    # A whole game of Pong: a score in points, -21..21, over hundreds of steps.
    score = report["return"]["mean"]
    assert -21 <= score <= 21 and float(score).is_integer() and report["per_episode"][0]["length"] > 100
    # The video shows the game's own 210x160 colour frames, not the 84x84 grayscale the model reads.
    from moviepy.video.io.VideoFileClip import VideoFileClip

    (video,) = report["videos"]
    with VideoFileClip(video) as clip:
        assert tuple(clip.size) == (160, 210)

    target = export_policy(str(summary.run_dir), "onnx", tmp_path / "export")
    spec = json.loads((target.parent / "policy.json").read_text())
    assert spec["observation_space"]["shape"] == [84, 84, 4] and spec["observation_space"]["dtype"] == "uint8"
    # The exported file takes what the env factory makes and acts as RLlib's module does.
    env = make_env(load_experiment(name).config.env)
    obs = [env.reset(seed=3)[0]]
    for _ in range(31):
        obs.append(env.step(env.action_space.sample())[0])
    env.close()
    frames = np.stack(obs)
    exported = ort.InferenceSession(str(target)).run(None, {"obs": frames.astype(np.float32)})[0]
    np.testing.assert_array_equal(exported, rllib_actions(checkpoint, frames))


@pytest.mark.ray
def test_observation_normalisation_is_kept_in_the_checkpoint_and_applied_by_the_export(
    ray_session: None, tmp_path: Path
) -> None:
    import onnxruntime as ort
    import torch
    from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
    from ray.rllib.connectors.env_to_module import MeanStdFilter
    from ray.rllib.core.rl_module.rl_module import RLModule

    from rl_app.policy.export import export_policy
    from rl_app.training.run import train

    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    overrides = [
        *("training.train_batch_size_per_learner=512", "training.minibatch_size=128"),
        *("training.num_epochs=1", "stop.iterations=2", "checkpoint.every=1", "evaluation.interval=0"),
        "model.free_log_std=true",  # RLlib's free log-std head, which export must trace for any batch size
    ]
    summary = train("ppo_halfcheetah", overrides, runs_root=tmp_path)
    checkpoint = list_checkpoints(summary.run_dir)[-1]
    pipeline = ConnectorPipelineV2.from_checkpoint(str(checkpoint / "env_runner" / "env_to_module_connector"))
    (piece,) = [c for c in pipeline.connectors if isinstance(c, MeanStdFilter)]
    (rllib_filter,) = piece._filters.values()  # type: ignore[union-attr]
    assert rllib_filter.running_stats.num_pushes >= 1024, "the runner's statistics reached the checkpoint"

    env = make_env(load_experiment("ppo_halfcheetah").config.env)
    env.action_space.seed(0)
    raw = [env.reset(seed=0)[0]]
    for _ in range(63):
        raw.append(env.step(env.action_space.sample())[0])
    env.close()
    raw_obs = np.stack(raw).astype(np.float32)
    normalised = np.stack([rllib_filter(o, update=False) for o in raw_obs]).astype(np.float32)
    assert not np.allclose(normalised, raw_obs, atol=0.1)

    target = export_policy(str(summary.run_dir), "onnx", tmp_path / "export")
    session = ort.InferenceSession(str(target))
    exported, dist_inputs = session.run(None, {"obs": raw_obs})
    # Raw observations into the export give what RLlib's module gives on RLlib's normalised ones.
    np.testing.assert_allclose(exported, rllib_actions(checkpoint, normalised), atol=1e-4)
    # The distribution inputs too, the free log-std among them, for a batch of any size.
    module = RLModule.from_checkpoint(str(checkpoint / "learner_group/learner/rl_module/default_policy"))
    with torch.no_grad():
        theirs = module.forward_inference({"obs": torch.as_tensor(normalised)})["action_dist_inputs"].numpy()
    np.testing.assert_allclose(dist_inputs, theirs, atol=1e-4)
    for rows in (1, 5):
        np.testing.assert_allclose(session.run(None, {"obs": raw_obs[:rows]})[1], theirs[:rows], atol=1e-4)
    scripted = torch.jit.load(str(export_policy(str(summary.run_dir), "torchscript", tmp_path / "export")))
    for rows in (1, 5, 64):
        np.testing.assert_allclose(
            scripted(torch.as_tensor(raw_obs[:rows])).numpy(), exported[:rows], atol=1e-4
        )
