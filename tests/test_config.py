"""Schema, loader and overrides: no Ray, no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_app.config import available_experiments, load_experiment
from rl_app.config.data import apply_overrides, parse_override
from rl_app.errors import ConfigError

MINIMAL = "algorithm: PPO\nenv: CartPole-v1\nstop: {timesteps: 1000}\n"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def test_minimal_experiment_gets_schema_defaults(experiments: Path) -> None:
    write(experiments, "tiny", MINIMAL)
    loaded = load_experiment("tiny")
    config = loaded.config
    assert config.algorithm == "PPO"
    assert config.env.id == "CartPole-v1" and config.env.config == {}
    assert config.env_runners.num_env_runners == "auto"
    assert config.checkpoint.every == 10 and config.checkpoint.keep == 3
    # Unset hyperparameters stay unset so that RLlib's own defaults apply.
    assert config.training.lr is None and config.training.clip_param is None


def test_overrides_are_typed_and_validated_like_yaml(experiments: Path) -> None:
    write(experiments, "tiny", MINIMAL)
    loaded = load_experiment(
        "tiny", ["training.lr=0.0003", "stop.timesteps=50000", "model.fcnet_hiddens=[64, 64]"]
    )
    assert loaded.config.training.lr == pytest.approx(3e-4)
    assert loaded.config.stop.timesteps == 50000
    assert loaded.config.model.fcnet_hiddens == [64, 64]
    with pytest.raises(ConfigError, match=r"^--set training\.lr=-1: training\.lr: must be a number > 0"):
        load_experiment("tiny", ["training.lr=-1"])
    with pytest.raises(ConfigError, match="did you mean 'lr'"):
        load_experiment("tiny", ["training.lrr=0.1"])


def test_override_into_env_shorthand_and_new_section() -> None:
    data = apply_overrides({"env": "CartPole-v1"}, ("env.config.max_steps=10", "seed=3"))
    assert data == {"env": {"id": "CartPole-v1", "config": {"max_steps": 10}}, "seed": 3}
    assert parse_override("training.lr=1e-3") == ("training.lr", 1e-3)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("training.lr")


def test_extends_merges_sections(experiments: Path) -> None:
    write(experiments, "base", MINIMAL + "training: {lr: 0.001, num_epochs: 3}\n")
    write(experiments, "child", "extends: base\ntraining: {num_epochs: 5}\nseed: 7\n")
    config = load_experiment("child").config
    assert config.training.lr == pytest.approx(1e-3)
    assert config.training.num_epochs == 5 and config.seed == 7


def test_schedules_and_replay_buffer(experiments: Path) -> None:
    write(
        experiments,
        "dqn",
        "algorithm: DQN\nenv: CartPole-v1\nstop: {timesteps: 1000}\n"
        "training:\n  epsilon: [[0, 1.0], [1000, 0.05]]\n"
        "  replay_buffer: {type: PrioritizedEpisodeReplayBuffer, capacity: 1000, alpha: 0.6, beta: 0.4}\n",
    )
    training = load_experiment("dqn").config.training
    assert training.epsilon == [(0, 1.0), (1000, 0.05)]
    assert training.replay_buffer.capacity == 1000
    with pytest.raises(ConfigError, match="schedule must be"):
        load_experiment("dqn", ["training.epsilon=[[5, 1.0]]"])


def bench_module(filename: str) -> Any:
    import importlib.util
    import sys

    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(f"bench_{Path(filename).stem}", bench / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def offline_bench_targets() -> dict[str, object]:
    return {name: case["target"] for name, case in bench_module("offline.py").CASES.items()}


def test_every_shipped_experiment_validates(shipped: Path) -> None:
    names = available_experiments()
    assert {"ppo_cartpole", "dqn_cartpole", "sac_pendulum"} <= set(names)
    for name in names:
        loaded = load_experiment(name)
        assert loaded.config.description, f"{name} needs a one-line description"
        if loaded.config.offline is not None and loaded.config.stop.return_ is None:
            # Its target is relative to its data (beat the recorded episodes' mean): the bench fixes it.
            assert name in offline_bench_targets(), f"{name} must state its target in bench/offline.py"
            continue
        if loaded.config.multi_agent is not None and loaded.config.stop.return_ is None:
            # Judged on more than one return (win and loss rates, a baseline beside): the bench fixes it.
            targets = bench_module("multi_agent.py").TARGETS
            assert name in targets, f"{name} must state its target in bench/multi_agent.py"
            continue
        if name == bench_module("atari_learning.py").EXPERIMENT:
            # Its target is a score after an hour on this machine, not a return to stop at.
            assert bench_module("atari_learning.py").TARGET > 0
            continue
        assert loaded.config.stop.return_ is not None, f"{name} must state the return it reaches"


def test_the_minatar_target_is_the_published_figure_the_bench_checks(shipped: Path) -> None:
    bench = bench_module("minatar_learning.py")
    stop = load_experiment(bench.EXPERIMENT).config.stop
    assert (stop.return_, stop.timesteps) == (bench.TARGET, bench.TARGET_MARK)
    assert bench.PUBLISHED[bench.TARGET_MARK] == bench.TARGET and max(bench.MARKS) == bench.TARGET_MARK
    assert not set(bench.SEEDS) & set(load_experiment(bench.EXPERIMENT).config.tuning_seeds)
