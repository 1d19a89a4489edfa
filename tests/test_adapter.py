"""Schema -> RLlib AlgorithmConfig mapping and resource planning (RLlib imported, Ray not started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_app.cluster.resources import plan_resources
from rl_app.config import load_experiment
from rl_app.errors import ConfigError, UserError
from rl_app.rllib.config import algorithm_config


def build(name: str, *overrides: str, cpus: int = 2, gpus: int = 0):  # type: ignore[no-untyped-def]
    loaded = load_experiment(name, overrides)
    plan = plan_resources(loaded.config, cpus, gpus)
    return algorithm_config(loaded.config, plan, loaded.source), plan


def test_ppo_settings_reach_rllib(shipped: Path) -> None:
    config, plan = build(
        "ppo_cartpole", "training.lambda=0.95", "seed=11", "env_runners.num_env_runners=auto"
    )
    assert config.lr == [[0, pytest.approx(2e-3)], [100_000, 0.0]]  # a schedule, as RLlib takes it
    assert config.lambda_ == pytest.approx(0.95)
    assert config.num_epochs == 20 and config.minibatch_size == 256
    assert config.vf_clip_param == pytest.approx(10_000)
    assert config.model_config["fcnet_hiddens"] == [64, 64]
    assert config.model_config["vf_share_layers"] is False
    assert config.seed == 11
    # The env reaches RLlib through our one env factory, registered under its id.
    from ray.tune.registry import ENV_CREATOR, _global_registry

    assert config.env == "rl_app:CartPole-v1"
    env = _global_registry.get(ENV_CREATOR, config.env)(config.env_config)
    assert env.spec.id == "CartPole-v1"
    env.close()
    # 2 cores - 1 reserved leaves one runner, which PPO would only wait for: sample on the driver.
    assert config.num_env_runners == plan.num_env_runners == 0


def test_dqn_replay_target_and_epsilon_reach_rllib(shipped: Path) -> None:
    config, _ = build("dqn_cartpole")
    assert config.replay_buffer_config["type"] == "PrioritizedEpisodeReplayBuffer"
    assert config.replay_buffer_config["capacity"] == 100_000
    assert config.replay_buffer_config["alpha"] == 0.0
    assert config.target_network_update_freq == 10
    assert config.epsilon == [[0, 1.0], [8000, 0.04]]
    assert not config.double_q and not config.dueling
    assert config.n_step == 1 and config.training_intensity == 32
    assert config.train_batch_size_per_learner == 128


def test_evaluation_maps_to_deterministic_episodes(shipped: Path) -> None:
    config, _ = build("ppo_cartpole", "evaluation.interval=3", "evaluation.episodes=4")
    assert config.evaluation_interval == 3
    assert config.evaluation_duration == 4 and config.evaluation_duration_unit == "episodes"
    assert config.evaluation_config["explore"] is False
    # One episode per env: the 8 training envs would keep the 4 shortest episodes of 8.
    assert config.evaluation_config["num_envs_per_env_runner"] == 4


@pytest.mark.parametrize(
    ("episodes", "runners", "envs"),
    [(10, 0, 10), (10, 2, 5), (7, 0, 7), (100, 0, 50), (128, 0, 64), (3, 4, 1)],
)
def test_evaluation_envs_divide_the_episodes(episodes: int, runners: int, envs: int) -> None:
    from rl_app.rllib.config import evaluation_envs

    assert evaluation_envs(episodes, runners) == envs


@pytest.mark.parametrize(
    ("experiment", "cpus", "gpus", "overrides", "runners", "gpus_per_learner"),
    [
        ("ppo_cartpole", 2, 0, (), 0, 0),  # one runner would take turns with the learner: the driver samples
        ("appo_cartpole", 2, 0, (), 1, 0),  # APPO samples while it learns: the runner pays off
        ("ppo_cartpole", 3, 0, (), 2, 0),
        ("ppo_cartpole", 16, 0, (), 15, 0),
        ("ppo_cartpole", 1, 0, (), 0, 0),
        ("ppo_cartpole", 16, 1, (), 15, 1),  # a visible GPU is used without any config change
        ("ppo_cartpole", 16, 1, ("learners.device=cpu",), 15, 0),
        ("ppo_cartpole", 8, 0, ("env_runners.num_env_runners=3",), 3, 0),
        ("ppo_cartpole", 8, 0, ("env_runners.reserved_cpus=3",), 5, 0),
        ("ppo_cartpole", 8, 0, ("evaluation.interval=1", "evaluation.num_env_runners=2"), 5, 0),
    ],
)
def test_resource_plan(  # type: ignore[no-untyped-def]
    shipped: Path, experiment, cpus, gpus, overrides, runners, gpus_per_learner
) -> None:
    # ppo_cartpole samples on the driver (num_env_runners: 0); the plan is what "auto" gives.
    config, plan = build(experiment, "env_runners.num_env_runners=auto", *overrides, cpus=cpus, gpus=gpus)
    assert plan.num_env_runners == runners == config.num_env_runners
    assert plan.num_gpus_per_learner == gpus_per_learner == config.num_gpus_per_learner
    assert ("GPU" if gpus_per_learner else "CPU") in plan.describe()


def test_too_many_runners_for_the_cores_is_refused(shipped: Path) -> None:
    with pytest.raises(UserError, match="needs 5 CPUs"):
        build("ppo_cartpole", "env_runners.num_env_runners=5", cpus=2)


def test_rllib_validation_errors_become_one_line(shipped: Path) -> None:
    # RLlib, not our schema, owns the rule that a minibatch fits into the train batch.
    with pytest.raises(
        ConfigError, match=r"^experiments/ppo_cartpole.yaml: RLlib rejected the config: .*minibatch"
    ):
        build("ppo_cartpole", "training.minibatch_size=8000")


def _largest_singular_values(module) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import torch

    return {
        name: float(torch.linalg.svdvals(p.detach()).max())
        for name, p in module.named_parameters()
        if p.dim() == 2
    }


def test_ortho_init_starts_ppo_as_sb3_does(shipped: Path) -> None:
    import gymnasium
    import torch

    env = gymnasium.make("CartPole-v1")
    default, _ = build("ppo_cartpole")
    config, _ = build("ppo_cartpole", "model.ortho_init=true")
    assert default.rl_module_spec.catalog_class is None  # unset: RLlib's own module, untouched
    module = config.get_rl_module_spec(env=env).build()
    gains = _largest_singular_values(module)
    assert gains.pop("pi.net.mlp.0.weight") == pytest.approx(0.01, rel=1e-3)
    assert gains.pop("vf.net.mlp.0.weight") == pytest.approx(1.0, rel=1e-3)
    assert len(gains) == 4 and all(g == pytest.approx(2**0.5, rel=1e-3) for g in gains.values())
    for name, p in module.named_parameters():
        if p.dim() == 2:  # orthogonal: the rows (or columns) are orthonormal up to the gain
            w = p.detach() / torch.linalg.svdvals(p.detach()).max()
            small = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            assert torch.allclose(small, torch.eye(small.shape[0]), atol=1e-5), name
        else:
            assert not p.detach().any(), f"{name} is not zero"
    # RLlib's default draws differently: the policy output is not scaled down.
    plain = _largest_singular_values(default.get_rl_module_spec(env=env).build())
    assert plain["pi.net.mlp.0.weight"] > 0.1
    env.close()


def test_ortho_init_is_refused_where_ppo_catalog_does_not_build_the_model(shipped: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.ortho_init: applies to PPO, APPO, IMPALA, MARWIL, not DQN"):
        build("dqn_cartpole", "model.ortho_init=true")


def test_sac_critic_is_one_mlp_over_observation_and_action_as_in_the_sac_paper(shipped: Path) -> None:
    import gymnasium
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.models.torch.encoder import TorchMultiStreamEncoder

    from rl_app.rllib.catalog import TorchObservationActionEncoder

    env = gymnasium.make("Pendulum-v1")  # observations of 3, actions of 1
    config, _ = build("sac_pendulum")  # [256, 256] relu, no head hiddens
    module = config.get_rl_module_spec(env=env).build()
    for encoder in (module.qf_encoder, module.qf_twin_encoder):  # target copies are made by the learner
        assert isinstance(encoder, TorchObservationActionEncoder)
    linears = [
        m for m in [*module.qf_encoder.modules(), *module.qf.modules()] if isinstance(m, torch.nn.Linear)
    ]
    assert [(m.in_features, m.out_features) for m in linears] == [(4, 256), (256, 256), (256, 1)]

    # The critic computes relu(relu([obs, action] W1) W2) W3 with its own weights.
    obs, actions = torch.randn(5, 3), torch.rand(5, 1) * 4 - 2
    hidden = torch.cat([obs, actions], dim=-1)
    for layer in linears[:-1]:
        hidden = torch.relu(layer(hidden))
    expected = linears[-1](hidden).squeeze(-1)
    q = module._qf_forward_train_helper(
        {Columns.OBS: obs, Columns.ACTIONS: actions}, module.qf_encoder, module.qf
    )
    torch.testing.assert_close(q, expected)

    rllib_config, _ = build("sac_pendulum", "model.sac_critic=multi_stream")
    rllib_module = rllib_config.get_rl_module_spec(env=env).build()
    assert isinstance(rllib_module.qf_encoder, TorchMultiStreamEncoder)
    critic = sum(p.numel() for p in [*module.qf_encoder.parameters(), *module.qf.parameters()])
    theirs = sum(p.numel() for p in [*rllib_module.qf_encoder.parameters(), *rllib_module.qf.parameters()])
    assert theirs > 5 * critic  # RLlib's fusion net: ~9x the weights (and the compute) at [256, 256]
    env.close()


def test_the_concat_critic_modules_training_pass_is_rllibs_to_the_bit(shipped: Path) -> None:
    """Our SAC module computes RLlib's training pass with less around it: the same outputs and the
    same gradients, bit for bit, from the same weights and torch seed."""
    import dataclasses

    import gymnasium
    import torch
    from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule
    from ray.rllib.core.columns import Columns

    from rl_app.rllib.catalog import ConcatCriticSACTorchRLModule

    config, _ = build("sac_pendulum")
    spec = config.get_rl_module_spec(env=gymnasium.make("Pendulum-v1"))
    spec.observation_space = gymnasium.spaces.Box(-5.0, 5.0, (5,))
    spec.action_space = gymnasium.spaces.Box(-2.0, 2.0, (3,))
    assert spec.module_class is ConcatCriticSACTorchRLModule
    ours = spec.build()
    theirs = dataclasses.replace(spec, module_class=DefaultSACTorchRLModule).build()
    theirs.load_state_dict(ours.state_dict())
    for module in (ours, theirs):
        module.make_target_networks()
        with torch.no_grad():  # targets that differ from the critics, as after some training
            for target in module.target_qf.parameters():
                target.mul_(0.5)
    batch = {
        Columns.OBS: torch.randn(64, 5),
        Columns.NEXT_OBS: torch.randn(64, 5),
        Columns.ACTIONS: torch.rand(64, 3) * 2 - 1,
    }
    read_by_loss = (
        *("qf_preds", "qf_twin_preds", "q_curr"),
        *("logp_resampled", "q_target_next", "logp_next_resampled"),
    )
    outputs = []
    for module in (ours, theirs):
        torch.manual_seed(7)
        out = module._forward_train(batch)
        weights = torch.Generator().manual_seed(3)
        # What RLlib's continuous SAC loss reads (the next state's logits are not among them: ours
        # has no graph behind them, RLlib's has one that no loss uses).
        loss = sum((out[key] * torch.rand(out[key].shape, generator=weights)).sum() for key in read_by_loss)
        module.zero_grad(set_to_none=True)
        loss.backward()
        outputs.append((out, {name: p.grad for name, p in module.named_parameters()}))
    (our_out, our_grads), (their_out, their_grads) = outputs
    assert sorted(our_out) == sorted(their_out)
    for key in their_out:
        assert torch.equal(our_out[key], their_out[key]), key
    assert our_out["q_curr"].requires_grad and not our_out["q_target_next"].requires_grad
    assert sorted(our_grads) == sorted(their_grads)
    for name, grad in their_grads.items():
        assert (grad is None) == (our_grads[name] is None), name
        assert grad is None or torch.equal(our_grads[name], grad), name
    assert all(p.requires_grad for p in ours.qf.parameters())  # the critics' weights train again
    assert any(g is not None and g.abs().sum() > 0 for g in our_grads.values())


def test_a_sac_critic_setting_that_does_not_apply_is_refused(shipped: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.sac_critic: applies to SAC, not PPO"):
        build("ppo_cartpole", "model.sac_critic=concat")
    with pytest.raises(ConfigError, match=r"model.fusionnet_hiddens: .* set model.sac_critic: multi_stream"):
        build("sac_pendulum", "model.fusionnet_hiddens=[64]")
    # Discrete actions: RLlib's critic outputs a value per action and takes no action input.
    with pytest.raises(ConfigError, match=r"model.sac_critic: concat needs a flat Box observation"):
        build("sac_pendulum", "env.id=CartPole-v1", "model.sac_critic=concat")
    config, _ = build("sac_pendulum", "env.id=CartPole-v1")  # unset there: RLlib's critic, no error
    assert config.rl_module_spec.catalog_class is None
