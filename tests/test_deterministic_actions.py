"""Deterministic actions from a policy whose action-distribution inputs we set by hand: SAC's is
tanh(mean) rescaled to the bounds (not RLlib 2.60's clip(mean)) in every place rl_app takes one
(both env runners' evaluation, ``rl_app evaluate``, TorchScript and ONNX exports, the server);
PPO's diagonal Gaussian gives its mean rescaled and clipped, a categorical its argmax."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_sampling import runner_pair

from rl_app.errors import UserError
from rl_app.runs.checkpoints import list_checkpoints, read_info, write_marker

REPO = Path(__file__).resolve().parents[1]

# Pre-tanh means of Pendulum's one action dimension: 1.5 is where clip and tanh part ways most
# (clip(1.5) rescaled is the bound 2.0, tanh(1.5) rescaled is 1.81), -0.3 where they nearly agree.
MEANS = (1.5, -0.3)
LOG_STD = -1.0


def set_output(module: Any, head: str, outputs: list[float]) -> None:
    """Make ``module``'s ``head`` output ``outputs`` for any observation: the last layer's weights
    zeroed, its bias set."""
    import torch

    last = [layer for layer in getattr(module, head).modules() if isinstance(layer, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor(outputs))


def pendulum_observations(count: int = 16) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, size=(count, 3)).astype(np.float32)


def sac_module(mean: float, module_class: Any = None) -> Any:
    """sac_pendulum's module (rl_app's class, or ``module_class``) acting with a known mean."""
    import dataclasses

    import gymnasium

    from rl_app.cluster.resources import plan_resources
    from rl_app.config import load_experiment
    from rl_app.rllib.config import algorithm_config

    loaded = load_experiment("sac_pendulum", ())
    config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
    spec = config.get_rl_module_spec(env=gymnasium.make("Pendulum-v1"))
    if module_class is not None:
        spec = dataclasses.replace(spec, module_class=module_class)
    module = spec.build()
    set_output(module, "pi", [mean, LOG_STD])
    return module


@pytest.mark.parametrize("mean", MEANS)
def test_both_env_runners_evaluate_sac_with_tanh_of_the_mean(shipped: Path, mean: float) -> None:
    """Our runner and RLlib's (the evaluation runners of a training run) act with tanh(mean): the
    episode's actions are the module's, in [-1, 1], before the rescaling to the env's bounds."""
    ours, theirs = runner_pair("sac_pendulum")
    set_output(ours.module, "pi", [mean, LOG_STD])
    theirs.set_state(ours.get_state())
    for runner in (ours, theirs):
        episodes = runner.sample(num_timesteps=12, explore=False)
        actions = np.concatenate([episode.get_actions() for episode in episodes])
        assert len(actions) == 12
        np.testing.assert_allclose(actions, np.tanh(mean), rtol=1e-6, err_msg=type(runner).__name__)


@pytest.mark.parametrize("mean", MEANS)
def test_a_policy_acts_with_tanh_of_the_mean_also_from_rllibs_own_module_class(
    shipped: Path, mean: float
) -> None:
    """``rl_app evaluate``'s policy, from rl_app's SAC module and from RLlib's class (which a
    checkpoint written before the fix names), gives 2 tanh(mean) on Pendulum's [-2, 2]."""
    from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule

    from rl_app.policy.module import Policy

    obs = pendulum_observations()
    for module_class in (None, DefaultSACTorchRLModule):
        policy = Policy(sac_module(mean, module_class).eval()).eval()
        actions = np.stack([policy.act(row) for row in obs])
        np.testing.assert_allclose(actions, 2.0 * np.tanh(mean), rtol=1e-6)


def test_ppo_acts_with_its_mean_clipped_and_a_categorical_with_its_argmax(shipped: Path) -> None:
    """The other distributions keep RLlib's convention: a diagonal Gaussian's mean rescaled to the
    bounds and clipped (no tanh: PPO trains unsquashed), a categorical's most likely action."""
    import gymnasium

    from rl_app.cluster.resources import plan_resources
    from rl_app.config import load_experiment
    from rl_app.policy.module import Policy
    from rl_app.rllib.config import algorithm_config

    def ppo_policy(env_id: str, outputs: list[float]) -> Policy:
        loaded = load_experiment("ppo_cartpole", (f"env.id={env_id}",))
        config = algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)
        module = config.get_rl_module_spec(env=gymnasium.make(env_id)).build()
        set_output(module, "pi", outputs)
        return Policy(module.eval()).eval()

    obs = pendulum_observations()
    for mean, expected in ((0.4, 0.8), (1.5, 2.0), (-1.7, -2.0)):
        policy = ppo_policy("Pendulum-v1", [mean, LOG_STD])
        np.testing.assert_allclose([policy.act(row) for row in obs], expected, rtol=1e-6)
    policy = ppo_policy("CartPole-v1", [0.2, 0.9])
    assert [policy.act(row) for row in np.zeros((4, 4), np.float32)] == [1, 1, 1, 1]
    policy = ppo_policy("CartPole-v1", [0.9, 0.2])
    assert [policy.act(row) for row in np.zeros((4, 4), np.float32)] == [0, 0, 0, 0]


@pytest.fixture(scope="module")
def sac_run(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-iteration sac_pendulum run whose last checkpoint's policy acts with mean 1.5."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    from rl_app.rllib.algorithm import MODULE_PATH
    from rl_app.training.run import train

    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    root = tmp_path_factory.mktemp("runs")
    run_dir = train("sac_pendulum", ["stop.iterations=1", "evaluation.interval=0"], runs_root=root).run_dir
    checkpoint = list_checkpoints(run_dir)[-1]
    module_dir = checkpoint.joinpath(*MODULE_PATH)
    module = RLModule.from_checkpoint(str(module_dir))
    set_output(module, "pi", [MEANS[0], LOG_STD])
    shutil.rmtree(module_dir)
    module.save_to_path(str(module_dir))
    write_marker(checkpoint, read_info(checkpoint))  # its files changed on purpose: list them again
    return run_dir


@pytest.mark.ray
def test_evaluate_exports_and_the_server_act_with_tanh_of_the_mean(sac_run: Path) -> None:
    import onnxruntime
    import torch

    from rl_app.policy.export import export_policy
    from rl_app.policy.module import load_policy
    from rl_app.serve.policy import load_served_policy

    obs = pendulum_observations()
    expected = 2.0 * np.tanh(MEANS[0])  # 1.81; RLlib 2.60's clip(1.5) rescaled would be 2.0
    policy = load_policy(list_checkpoints(sac_run)[-1])
    np.testing.assert_allclose([policy.act(row) for row in obs], expected, rtol=1e-6)

    out = sac_run / "export"
    export_policy(str(sac_run), "torchscript", out)
    export_policy(str(sac_run), "onnx", out)
    scripted = torch.jit.load(str(out / "policy.pt"))(torch.as_tensor(obs)).numpy()
    onnx_actions = onnxruntime.InferenceSession(str(out / "policy.onnx")).run(None, {"obs": obs})[0]
    np.testing.assert_allclose(scripted, expected, rtol=1e-6)
    np.testing.assert_allclose(onnx_actions, expected, rtol=1e-6)
    for fmt in ("onnx", "torchscript"):
        served = load_served_policy(out, fmt)
        np.testing.assert_allclose(served.act(obs), expected, rtol=1e-6, err_msg=fmt)


@pytest.mark.ray
def test_a_sac_export_from_before_the_fix_is_refused_by_the_server(sac_run: Path, tmp_path: Path) -> None:
    from rl_app.policy.export import export_policy
    from rl_app.serve.policy import load_served_policy

    out = tmp_path / "export"
    export_policy(str(sac_run), "onnx", out)
    spec = json.loads((out / "policy.json").read_text())
    assert spec["files"]["policy.onnx"]["format_version"] == 2
    del spec["files"]["policy.onnx"]["format_version"]  # as an older rl_app wrote it
    (out / "policy.json").write_text(json.dumps(spec))
    with pytest.raises(UserError, match=r"clip\(mean\), not tanh\(mean\); export it again \(rl_app export "):
        load_served_policy(out)
    spec["algorithm"] = "PPO"  # the fix changed nothing for other algorithms: their old exports serve
    (out / "policy.json").write_text(json.dumps(spec))
    assert load_served_policy(out).act(pendulum_observations()).shape == (16, 1)
