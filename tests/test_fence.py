# ruff: noqa: E501  (the table of copied functions is one line per function)
"""The fence around rl_app's faster parts: one plan decides them, one switch and one version gate
turn them off, every private RLlib name they use is where RLlib 2.60 has it, and every RLlib
function they copy is the one they were proven equal to."""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest

from rl_app.algorithms import ALGORITHMS
from rl_app.cluster.resources import plan_resources
from rl_app.config import available_experiments, load_experiment
from rl_app.rllib.accel import PARTS, plan_acceleration
from rl_app.rllib.config import algorithm_config

# RLlib function -> (rl_app's copy or replacement, sha256 of RLlib 2.60's source, first 16 hex).
# A changed hash means RLlib changed that function: re-read the copy named beside it, make it
# equal again (its equivalence test says whether it is), then record the new hash.
COPIED = {
    "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner._sample": ("rl_app.rllib.accel.runner:BatchedEnvRunner._sample_episodes", "92e2404f91da8a81"),
    "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner.sample": ("rl_app.rllib.accel.runner:BatchedEnvRunner.sample_transitions", "d531fe2bcf1b2e8c"),
    "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner.get_metrics": ("rl_app.rllib.accel.runner:BatchedEnvRunner.get_metrics", "6d754d2cc9c1a6f1"),
    "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner.set_state": ("rl_app.rllib.accel.driver:in_place_sync", "6baa1de4afd65d59"),
    "ray.rllib.connectors.module_to_env.get_actions:GetActions._get_actions": ("rl_app.rllib.accel.runner:BatchedEnvRunner._act", "529c8961e6378bc1"),
    "ray.rllib.connectors.module_to_env.normalize_and_clip_actions:NormalizeAndClipActions.__call__": ("rl_app.rllib.accel.runner:BatchedEnvRunner._actions_for_env", "bcb5287d621cb27d"),
    "ray.rllib.utils.torch_utils:convert_to_torch_tensor": ("rl_app.rllib.accel.runner:_to_tensor", "a1e5f39aac235344"),
    "ray.rllib.utils.numpy:convert_to_numpy": ("rl_app.rllib.accel.runner:_to_numpy", "07ab34623ebd4570"),
    "ray.rllib.env.single_agent_episode:SingleAgentEpisode.__init__": ("rl_app.rllib.accel.adapter:EpisodeFactory.make", "6b1667b6d57eea23"),
    "ray.rllib.env.single_agent_episode:SingleAgentEpisode.add_env_reset": ("rl_app.rllib.accel.runner:BatchedEnvRunner._episode_from_steps", "3f887f6c7a9857ab"),
    "ray.rllib.env.single_agent_episode:SingleAgentEpisode.add_env_step": ("rl_app.rllib.accel.runner:BatchedEnvRunner._fill", "d7f6d0b887aacc7a"),
    "ray.rllib.env.single_agent_episode:SingleAgentEpisode.to_numpy": ("rl_app.rllib.accel.runner:BatchedEnvRunner._finished", "812d4aface774e5c"),
    "ray.rllib.env.utils.infinite_lookback_buffer:InfiniteLookbackBuffer.__init__": ("rl_app.rllib.accel.adapter:_buffer", "cbebf66b205ae474"),
    "ray.rllib.env.utils.infinite_lookback_buffer:InfiniteLookbackBuffer.finalize": ("rl_app.rllib.accel.runner:append_rows", "89b09c37739593af"),
    "ray.rllib.env.env_runner_group:EnvRunnerGroup.sync_weights": ("rl_app.rllib.accel.driver:in_place_sync", "55a70f615d3e3a50"),
    "ray.rllib.algorithms.ppo.ppo:PPO.training_step": ("rl_app.rllib.accel.driver:DriverPPO.training_step", "bb5a5ae3bfe96843"),
    "ray.rllib.algorithms.dqn.dqn:DQN._training_step_new_api_stack": ("rl_app.rllib.accel.offpolicy:_ArrayReplayTrainingStep._round", "09ec62b710932ad1"),
    "ray.rllib.utils.replay_buffers.prioritized_episode_buffer:PrioritizedEpisodeReplayBuffer.add": ("rl_app.rllib.accel.replay_buffer:ArrayPrioritizedEpisodeReplayBuffer.add", "c295138867e3072c"),
    "ray.rllib.utils.replay_buffers.prioritized_episode_buffer:PrioritizedEpisodeReplayBuffer.sample": ("rl_app.rllib.accel.replay_buffer:ArrayPrioritizedEpisodeReplayBuffer.sample_batch", "4b354d2e4a600579"),
    "ray.rllib.utils.replay_buffers.prioritized_episode_buffer:PrioritizedEpisodeReplayBuffer.update_priorities": ("rl_app.rllib.accel.replay_buffer:ArrayPrioritizedEpisodeReplayBuffer.update_priorities", "946160c981328883"),
    "ray.rllib.utils.replay_buffers.prioritized_episode_buffer:PrioritizedEpisodeReplayBuffer.get_state": ("rl_app.rllib.accel.replay_buffer:ArrayPrioritizedEpisodeReplayBuffer.set_state", "5a6f80f933f56e44"),
    "ray.rllib.core.learner.torch.torch_learner:TorchLearner._uncompiled_update": ("rl_app.rllib.accel.gradient_step:GradientStepMixin.update_step", "ecbe85f6afc95394"),
    "ray.rllib.core.learner.torch.torch_learner:TorchLearner.apply_gradients": ("rl_app.rllib.accel.gradient_step:GradientStepMixin.apply_gradients", "5613837a71ab844f"),
    "ray.rllib.core.learner.torch.torch_learner:TorchLearner._compute_off_policyness": ("rl_app.rllib.accel.ppo_learner:BatchedStepPPOLearner.compute_off_policyness", "2a8f1a29b11842f9"),
    "ray.rllib.core.learner.learner:Learner.update": ("rl_app.rllib.accel.offpolicy_learners:OffPolicyLearnerMixin.update_from_columns", "3881ea9242770af1"),
    "ray.rllib.core.learner.learner:Learner.after_gradient_based_update": ("rl_app.rllib.accel.offpolicy_learners:OffPolicyLearnerMixin.log_update_totals", "ac03acc33b22f4f9"),
    "ray.rllib.core.learner.learner:Learner._log_steps_trained_metrics": ("rl_app.rllib.accel.gradient_step:log_steps_trained", "bfba01c6f757a979"),
    "ray.rllib.core.learner.learner:Learner._log_metrics": ("rl_app.rllib.accel.ppo_learner:BatchedStepPPOLearner.log_minibatch_counters", "d28d3a5c842cb68e"),
    "ray.rllib.core.learner.learner:Learner._create_iterator_if_necessary": ("rl_app.rllib.accel.ppo_learner:BatchedStepPPOLearner.minibatch_iterator", "9c2247a5f7cf3fc1"),
    "ray.rllib.utils.torch_utils:clip_gradients": ("rl_app.rllib.accel.gradient_step:clip_gradients", "b38bf6c4be5b9ebd"),
    "ray.rllib.algorithms.dqn.dqn_learner:DQNLearner.after_gradient_based_update": ("rl_app.rllib.accel.offpolicy_learners:OffPolicyLearnerMixin.after_gradient_based_update", "112cd41c8b490f39"),
    "ray.rllib.core.learner.utils:update_target_network": ("rl_app.rllib.accel.gradient_step:polyak_average_tensors", "e4d2a73cdd92e3bd"),
    "ray.rllib.utils.minibatch_utils:MiniBatchCyclicIterator.__iter__": ("rl_app.rllib.accel.ppo_learner:ColumnMinibatches", "ce78a8feb5ee7e8d"),
    "ray.rllib.algorithms.ppo.torch.ppo_torch_learner:PPOTorchLearner.compute_loss_for_module": ("rl_app.rllib.accel.ppo_learner:BatchedStepPPOLearner.compute_loss_for_module", "c94d6a6faf8906ac"),
    "ray.rllib.algorithms.sac.torch.sac_torch_learner:SACTorchLearner._compute_loss_for_module_continuous": ("rl_app.rllib.accel.adapter:squared_critic_losses", "9a5a9ffdbe23c715"),
    "ray.rllib.algorithms.sac.torch.sac_torch_learner:SACTorchLearner.compute_gradients": ("rl_app.rllib.accel.offpolicy_learners:BatchedStepSACLearner.compute_gradients", "4bdcde0470e4c608"),
    "ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module:DefaultSACTorchRLModule._forward_train_continuous": ("rl_app.rllib.catalog:ConcatCriticSACTorchRLModule._forward_train_continuous", "4ad2586cf6700687"),
    "ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module:DefaultSACTorchRLModule._qf_forward_train_helper": ("rl_app.rllib.catalog:_critic", "4b957cd27db81662"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchCategorical.from_logits": ("rl_app.rllib.accel.draws:sample_categorical", "0354d7e0490f46fa"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchSquashedGaussian.from_logits": ("rl_app.rllib.accel.draws:_normal", "7d32eacbd0874980"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchSquashedGaussian._squash": ("rl_app.rllib.distributions:squash", "a42deca9554c4d8e"),
    "ray.rllib.core.models.torch.heads:TorchFreeLogStdMLPHead._forward": ("rl_app.rllib.accel.adapter:BatchFreeLogStdHead.forward", "e108f88243389a73"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchSquashedGaussian._squashed_logp": ("rl_app.rllib.accel.draws:_log_prob_of_squashed", "11bb55fc0f70fdc1"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchSquashedGaussian.sample": ("rl_app.rllib.accel.draws:sample_squashed_gaussian", "830475f65a2ff159"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchSquashedGaussian.logp": ("rl_app.rllib.accel.draws:sample_squashed_gaussian", "3fc2cce634994a60"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchSquashedGaussian.rsample_and_logp": ("rl_app.rllib.accel.draws:draw_squashed_gaussian", "9fd63b51f0568a9d"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchSquashedGaussian.sample_and_logp": ("rl_app.rllib.accel.draws:draw_squashed_gaussian", "e97a2f2815b9bd6b"),
    "ray.rllib.core.distribution.torch.torch_distribution:TorchSquashedGaussian.to_deterministic": ("rl_app.rllib.distributions:deterministic_actions", "3cb4f8da04b88112"),
    "ray.rllib.env.env_runner:EnvRunner.__init__": ("rl_app.rllib.env_runner:RLAppEnvRunner.reseed", "5bad63b7c990b362"),
    "ray.rllib.env.env_runner:EnvRunner._try_env_step": ("rl_app.rllib.env_runner:RLAppEnvRunner.try_env_step", "935581a89a9edbe1"),
    "ray.rllib.env.env_runner:EnvRunner._try_env_reset": ("rl_app.rllib.env_runner:RLAppEnvRunner.try_env_reset", "9f04d02cf75ad422"),
    "ray.rllib.utils.filter:MeanStdFilter.__call__": ("rl_app.policy.module:ObservationFilter", "fa6d8b6ae98d5e50"),
    "ray.rllib.connectors.env_to_module.mean_std_filter:MeanStdFilter.get_state": ("rl_app.rllib.algorithm:load_mean_std_filter", "35c9a37093638770"),
}  # fmt: skip


def _resolve(path: str) -> Any:
    module, _, qualname = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def test_every_copied_rllib_function_is_the_one_its_copy_was_proven_equal_to() -> None:
    changed = []
    for rllib, (ours, expected) in COPIED.items():
        _resolve(ours)  # the copy exists where this table says
        digest = hashlib.sha256(inspect.getsource(_resolve(rllib)).encode()).hexdigest()[:16]
        if digest != expected:
            changed.append(f"{rllib} changed ({digest}): re-read {ours}")
    assert changed == [], "\n".join(changed)


def test_the_private_attributes_the_parts_read_are_where_rllib_sets_them() -> None:
    from rl_app.rllib.accel.adapter import adapter_problem, missing_attributes

    assert adapter_problem() is None
    assert missing_attributes() == []


def _config(name: str, *overrides: str) -> Any:
    loaded = load_experiment(name, overrides)
    return algorithm_config(loaded.config, plan_resources(loaded.config, 2, 0), loaded.source)


RLLIB_EXPERIMENTS = [
    name
    for name in available_experiments()
    if ALGORITHMS[load_experiment(name).config.algorithm].backend == "rllib"
]


@pytest.mark.usefixtures("shipped")
@pytest.mark.parametrize("name", RLLIB_EXPERIMENTS)
def test_every_shipped_experiment_builds_on_rllibs_own_classes_when_acceleration_is_off(name: str) -> None:
    """``acceleration: off``: RLlib's env runner (with rl_app's env-failure limit and reseed), its
    algorithm class, learner class and module; auto: rl_app's where the plan says so."""
    from rl_app.rllib.accel.runner import BatchedEnvRunner
    from rl_app.rllib.env_runner import RLAppEnvRunner, RLAppMultiAgentEnvRunner

    off = _config(name, "acceleration=off")
    runner = RLAppMultiAgentEnvRunner if off.is_multi_agent else RLAppEnvRunner
    assert issubclass(off.env_runner_cls, runner) and not issubclass(off.env_runner_cls, BatchedEnvRunner)
    assert off.algo_class.__module__.startswith("ray.rllib."), off.algo_class
    learner = off.learner_class or off.get_default_learner_class()
    assert learner.__module__.startswith("ray.rllib."), learner
    spec = off.rl_module_spec if off.is_multi_agent else off.get_rl_module_spec()
    for module_spec in getattr(spec, "rl_module_specs", {"": spec}).values():
        module_class = module_spec.module_class
        assert getattr(module_class, "lean", False) is False, module_class

    experiment = load_experiment(name).config
    plan = plan_acceleration(experiment, plan_resources(experiment, 2, 0))
    auto = _config(name)
    assert issubclass(auto.env_runner_cls, BatchedEnvRunner) == plan.uses("runner")
    assert auto.algo_class.__module__.startswith("rl_app.") == plan.uses("training_step")
    auto_learner = auto.learner_class or auto.get_default_learner_class()
    assert auto_learner.__module__.startswith("rl_app.") == plan.uses("learner")


@pytest.mark.usefixtures("shipped")
def test_the_environment_switch_and_another_ray_turn_everything_off_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    experiment = load_experiment("sac_pendulum").config
    assert plan_acceleration(experiment).on == (
        "runner",
        "learner",
        "training_step",
        "replay_buffer",
        "module",
    )
    monkeypatch.setenv("RL_APP_ACCELERATION", "off")
    assert plan_acceleration(experiment).describe() == (
        "RLlib's own classes throughout ($RL_APP_ACCELERATION=off)"
    )
    monkeypatch.delenv("RL_APP_ACCELERATION")
    monkeypatch.setattr("ray.__version__", "2.61.0")
    plan = plan_acceleration(experiment)
    assert plan.on == () and plan.describe() == (
        "RLlib's own classes throughout (Ray 2.61.0: rl_app's parts are proven on Ray 2.60.0 only)"
    )
    config = _config("sac_pendulum")
    assert config.algo_class.__module__.startswith("ray.rllib.")


@pytest.mark.usefixtures("shipped")
def test_rllib_insides_that_moved_turn_everything_off_naming_the_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rl_app.rllib.accel import adapter

    moved = dict(adapter.PRIVATE_METHODS)
    key = ("ray.rllib.env.single_agent_env_runner", "SingleAgentEnvRunner")
    moved[key] = {**moved[key], "_sample_episodes": ("self",)}
    monkeypatch.setattr(adapter, "PRIVATE_METHODS", moved)
    adapter.adapter_problem.cache_clear()
    try:
        plan = plan_acceleration(load_experiment("ppo_cartpole").config)
    finally:
        adapter.adapter_problem.cache_clear()
    assert (
        plan.everything_off
        == "RLlib's insides differ from 2.60.0's: SingleAgentEnvRunner._sample_episodes is gone"
    )


def test_each_capability_the_registry_declares_has_its_code() -> None:
    """Adding an algorithm is one registry entry; what it declares it can use must exist."""
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule

    from rl_app.rllib.accel import part_classes
    from rl_app.rllib.pixels import image_module_class

    learners, training_steps = part_classes()
    for name, spec in ALGORITHMS.items():
        assert spec.accelerated <= set(PARTS), name
        assert ("learner" in spec.accelerated) == (name in learners), name
        assert ("training_step" in spec.accelerated) == (name in training_steps), name
        if "replay_buffer" in spec.accelerated:  # comes with the training step that replays from it
            assert "training_step" in spec.accelerated, name
        if spec.backend != "rllib":
            continue
        module, _, class_name = spec.rllib_config.partition(":")
        config = getattr(importlib.import_module(f"ray.rllib.algorithms.{module}"), class_name)()
        default = config.get_default_rl_module_spec()
        assert (image_module_class(default.module_class) is not None) == spec.image_inputs, name
        # model.ortho_init sets up PPO's catalog, which builds PPO's module (and APPO's, IMPALA's)
        assert issubclass(default.module_class, DefaultPPOTorchRLModule) == spec.ortho_init, name


def test_private_rllib_names_outside_rllib_are_none() -> None:
    """Outside rl_app/rllib/ (and ray_adapter.py for Ray's own), no module reads a private RLlib
    name: a Ray upgrade is read in rllib/ alone."""
    package = Path(__file__).resolve().parents[1] / "rl_app"
    offenders = []
    for path in package.rglob("*.py"):
        relative = path.relative_to(package).as_posix()
        if relative.startswith("rllib/") or relative == "ray_adapter.py":
            continue
        text = path.read_text()
        if "ray.rllib" in text:
            offenders.append(relative)
    assert offenders == []


ADAPTERS = ("rllib/accel/adapter.py", "ray_adapter.py")


def _on_self(node: Any) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def private_names_outside_the_adapters() -> list[str]:
    """Every use of a private Ray or RLlib name (an attribute starting with one underscore that
    rl_app does not define itself or that it reaches through ``super()``, an underscored keyword
    argument or import from Ray) in rl_app outside its two adapter modules, as ``file:line name``."""
    package = Path(__file__).resolve().parents[1] / "rl_app"
    trees = {p.relative_to(package).as_posix(): ast.parse(p.read_text()) for p in package.rglob("*.py")}
    own: set[str] = set()
    for relative, tree in trees.items():
        if relative in ADAPTERS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _on_self(node):
                own.add(node.attr)
    found = []
    for relative, tree in trees.items():
        if relative in ADAPTERS:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                library = isinstance(node.value, ast.Name) and node.value.id in ("torch", "os", "np")
                # super()._name reaches the library's method even where rl_app overrides the name.
                parent = (
                    isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name)
                    and node.value.func.id == "super"
                )
                if not library and (parent or node.attr not in own):
                    found.append(f"{relative}:{node.lineno} {node.attr}")
            elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("_"):
                found.append(f"{relative}:{node.value.lineno} {node.arg}=")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ray"):
                names = [a.name for a in node.names if a.name.startswith("_")]
                if "._" in (node.module or "") or names:
                    found.append(f"{relative}:{node.lineno} from {node.module} import {names}")
    return sorted(found)


def test_no_private_ray_or_rllib_name_is_used_outside_the_two_adapters() -> None:
    """An upgrade of Ray is read in rl_app/rllib/accel/adapter.py (RLlib's insides) and
    rl_app/ray_adapter.py (Ray core's and Tune's): nowhere else reaches a private name."""
    assert private_names_outside_the_adapters() == []
