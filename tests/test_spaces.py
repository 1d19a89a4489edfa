"""Observations that are not a Box: flattened as RLlib's FlattenObservations does, in training,
evaluation, export and serving."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_app.envs.spaces import describe, flat_size, flatten, space_from_description, unsupported_part
from rl_app.serve.policy import ObservationSpec
from rl_app.serve.protocol import RequestError, parse_act_request

REPO = Path(__file__).resolve().parents[1]

NESTED = gym.spaces.Dict(
    {
        "b": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1.0, 1.0, (2, 1), np.float32))),
        "a": gym.spaces.Box(-10.0, 10.0, (), np.float32),
        "c": gym.spaces.MultiDiscrete([2, 3]),
        "d": gym.spaces.MultiBinary(3),
    }
)
SPACES = {
    "discrete": gym.spaces.Discrete(16),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 5, 2]),
    "multi_binary": gym.spaces.MultiBinary((2, 2)),
    "nested": NESTED,
}


@pytest.mark.parametrize("name", list(SPACES))
def test_flatten_is_rllibs_flattening(name: str) -> None:
    from ray.rllib.utils.numpy import flatten_inputs_to_1d_tensor
    from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space

    space = SPACES[name]
    space.seed(3)
    description = json.loads(json.dumps(describe(space)))  # as policy.json and the marker hold it
    for _ in range(50):
        obs = space.sample()
        ours = flatten(description, obs)
        theirs = flatten_inputs_to_1d_tensor(obs, get_base_struct_from_space(space), batch_axis=False)
        assert ours.dtype == np.float32 and ours.shape == (flat_size(description),)
        np.testing.assert_array_equal(ours, np.asarray(theirs, dtype=np.float32).ravel())
    assert space_from_description(description) == space


@pytest.mark.parametrize("name", ["discrete", "multi_discrete", "multi_binary"])
def test_the_graphs_encoder_is_the_flattening(name: str) -> None:
    from rl_app.policy.module import ObservationEncoder

    space = SPACES[name]
    space.seed(4)
    samples = [space.sample() for _ in range(64)]
    encoded = ObservationEncoder(space)(torch.as_tensor(np.stack(samples).astype(np.float32)))
    expected = np.stack([flatten(describe(space), obs) for obs in samples])
    np.testing.assert_array_equal(encoded.numpy(), expected)


def test_spaces_rllib_cannot_flatten_are_named() -> None:
    text = unsupported_part(gym.spaces.Dict({"map": gym.spaces.Graph(gym.spaces.Box(0, 1, (2,)), None)}))
    assert text is not None and "part ['map']" in text and "allowed: Box, Discrete" in text
    text = unsupported_part(gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3, start=1))))
    assert text is not None and "part [1]" in text and "starts at 1" in text
    assert unsupported_part(NESTED) is None


def test_a_server_flattens_structured_observations_and_names_the_one_that_does_not_fit() -> None:
    spec = ObservationSpec.from_description(json.loads(json.dumps(describe(NESTED))))
    NESTED.seed(5)
    samples = [NESTED.sample() for _ in range(3)]
    rows = [
        {
            "a": float(s["a"]),
            "b": [int(s["b"][0]), s["b"][1].tolist()],
            "c": s["c"].tolist(),
            "d": s["d"].tolist(),
        }
        for s in samples
    ]
    request = parse_act_request(json.dumps({"observations": rows}).encode(), spec, max_rows=8)
    np.testing.assert_array_equal(
        request.observations, np.stack([flatten(describe(NESTED), s) for s in samples])
    )

    def refusal(observations: Any) -> str:
        with pytest.raises(RequestError) as caught:
            parse_act_request(json.dumps({"observations": observations}).encode(), spec, max_rows=8)
        assert caught.value.status in (400, 413, 422)
        return caught.value.message

    assert "observation 1: missing key(s) ['d']" in refusal(
        [rows[0], {k: v for k, v in rows[1].items() if k != "d"}]
    )
    assert "observation 0: expected 2 integers below [2, 3]" in refusal([{**rows[0], "c": [1, 3]}])
    assert "observation 0: expected an integer in [0, 1]" in refusal([{**rows[0], "b": [2, [[0], [0]]]}])
    assert "empty batch" in refusal([])
    assert "a request of 8 observations" in refusal(rows * 3)  # counted before parsing
    assert "batch of 9" in refusal([{"a": 0}] * 9)
    deep = "[" * 50 + "]" * 50
    with pytest.raises(RequestError) as caught:
        parse_act_request(b'{"observations": ' + deep.encode() + b"}", spec, max_rows=8)
    assert caught.value.status == 400 and "nested" in caught.value.message


def test_a_multi_discrete_server_checks_each_entry_against_its_own_bound() -> None:
    spec = ObservationSpec.from_description(describe(SPACES["multi_discrete"]))
    ok = parse_act_request(b'{"observations": [[2, 4, 1]]}', spec, max_rows=8)
    assert ok.observations.tolist() == [[2.0, 4.0, 1.0]]
    with pytest.raises(RequestError) as caught:
        parse_act_request(b'{"observations": [[2, 5, 1]]}', spec, max_rows=8)
    assert "at index [1]: 5 not in [0, 4]" in caught.value.message


# Training, evaluation, export and serving of a Discrete (FrozenLake) and a Dict observation env.
TINY = ["stop.iterations=2", "evaluation.interval=0", "training.train_batch_size_per_learner=256"]
RUNS = {
    "frozenlake": ("ppo_frozenlake", TINY),
    "dict": ("ppo_frozenlake", [*TINY, "env=spaces_envs:DictGoal"]),
    "masked": ("ppo_frozenlake", [*TINY, "env=spaces_envs:MaskedGoal"]),
    "masked_dqn": (
        "dqn_cartpole",
        [
            "env=spaces_envs:MaskedGoal",
            "stop.timesteps=1200",
            "evaluation.interval=0",
            "training.num_steps_sampled_before_learning_starts=256",
            "training.training_intensity=1",  # a few updates: enough to train the masked Q-values
        ],
    ),
    "lstm": ("ppo_stateless_cartpole", TINY),
}


@pytest.fixture(scope="module")
def runs(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from rl_app.training.run import train

    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    root = tmp_path_factory.mktemp("runs")
    return {name: train(exp, overrides, runs_root=root).run_dir for name, (exp, overrides) in RUNS.items()}


def rllib_actions(checkpoint: Path, space: gym.Space, observations: list[Any]) -> np.ndarray:
    """What RLlib's env runner picks: its FlattenObservations connector on an episode, its module."""
    from ray.rllib.connectors.env_to_module import FlattenObservations
    from ray.rllib.core.rl_module.rl_module import RLModule
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    module = RLModule.from_checkpoint(str(checkpoint / "learner_group/learner/rl_module/default_policy"))
    connector = FlattenObservations(space, module.action_space)
    episodes = [SingleAgentEpisode(observations=[obs]) for obs in observations]
    connector(rl_module=None, batch={}, episodes=episodes, explore=False, shared_data={})
    flat = np.stack([episode.get_observations(0) for episode in episodes]).astype(np.float32)
    with torch.no_grad():
        logits = module.forward_inference({"obs": torch.as_tensor(flat)})["action_dist_inputs"]
    return logits.argmax(-1).numpy()


@pytest.mark.ray
@pytest.mark.parametrize("name", ["frozenlake", "dict", "masked"])
def test_structured_observations_train_evaluate_export_and_serve_as_rllib_acts(
    runs: dict[str, Path], name: str
) -> None:
    from rl_app.envs import observation_space
    from rl_app.policy.evaluate import checkpoint_env, evaluate
    from rl_app.policy.export import export_policy
    from rl_app.runs.checkpoints import list_checkpoints
    from rl_app.serve.policy import load_served_policy

    run_dir = runs[name]
    checkpoint = list_checkpoints(run_dir)[-1]
    space = observation_space(checkpoint_env(checkpoint, ""))
    assert not isinstance(space, gym.spaces.Box)
    stats = evaluate(str(run_dir), episodes=4)
    returns = [episode["episode_return"] for episode in stats["per_episode"]]
    assert len(returns) == 4 and all(0.0 <= r <= 20.0 for r in returns)

    space.seed(6)
    observations = [space.sample() for _ in range(32)]
    expected = rllib_actions(checkpoint, space, observations)
    assert len(set(expected.tolist())) > 1 or name == "frozenlake"  # a trained DictGoal policy reads the goal
    for fmt in ("onnx", "torchscript"):
        out = run_dir / f"export-{fmt}"
        export_policy(str(run_dir), fmt, out)
        spec = json.loads((out / "policy.json").read_text())
        assert spec["observation_space"] == describe(space)
        served = load_served_policy(out)
        if name == "frozenlake":  # the file takes the integer cell itself
            body = {"observations": [int(obs) for obs in observations]}
            assert spec["input"]["flattened"] is False
        else:
            body = {"observations": [_as_json(obs) for obs in observations]}
            assert spec["input"]["flattened"] is True
        request = parse_act_request(json.dumps(body).encode(), served.observations, max_rows=64)
        np.testing.assert_array_equal(served.act(request.observations), expected)


def _as_json(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {key: _as_json(value) for key, value in obs.items()}
    if isinstance(obs, tuple):
        return [_as_json(value) for value in obs]
    return np.asarray(obs).tolist()


@pytest.mark.ray
@pytest.mark.parametrize("name", ["masked", "masked_dqn"])
def test_a_masked_action_is_never_taken_in_training_evaluation_export_or_serving(
    runs: dict[str, Path], name: str
) -> None:
    import csv

    from spaces_envs import MaskedGoal

    from rl_app.policy.export import export_policy
    from rl_app.policy.module import load_policy
    from rl_app.runs.checkpoints import list_checkpoints
    from rl_app.serve.policy import load_served_policy

    run_dir = runs[name]
    # A masked action costs 100 and an episode earns at most 20: no training episode took one.
    with (run_dir / "progress.csv").open() as handle:
        assert min(float(row["return_min"]) for row in csv.DictReader(handle)) >= 0.0
    checkpoint = list_checkpoints(run_dir)[-1]
    env = MaskedGoal()
    for explore in (False, True):
        policy = load_policy(checkpoint, explore=explore)
        obs, _ = env.reset(seed=7)
        for _ in range(1000):
            obs, _, _, truncated, info = env.step(policy.act(obs))
            assert info["masked_actions"] == 0
            if truncated:
                obs, _ = env.reset()
    out = run_dir / "export-masked"
    export_policy(str(run_dir), "onnx", out)
    served = load_served_policy(out)
    env.observation_space.seed(8)
    observations = [env.observation_space.sample() for _ in range(64)]
    for obs in observations:
        obs["action_mask"][np.random.default_rng(0).integers(5)] = 1  # at least one action allowed
    body = json.dumps({"observations": [_as_json(obs) for obs in observations]}).encode()
    request = parse_act_request(body, served.observations, max_rows=64)
    masks = np.stack([obs["action_mask"] for obs in observations])
    rows = np.arange(len(observations))
    actions, dist_inputs = served.infer(request.observations)
    assert masks[rows, actions].all()
    if name == "masked_dqn":  # epsilon-greedy: a server answers the greedy action only
        assert dist_inputs is None
        return
    assert dist_inputs is not None
    rng = np.random.default_rng(9)
    for _ in range(50):
        assert masks[rows, served.sample(dist_inputs, rng)].all()


@pytest.mark.ray
def test_a_recurrent_policy_carries_its_state_through_an_episode(runs: dict[str, Path]) -> None:
    from rl_app.envs import make_env
    from rl_app.errors import UserError
    from rl_app.policy.evaluate import checkpoint_env
    from rl_app.policy.export import export_policy
    from rl_app.policy.module import load_policy
    from rl_app.runs.checkpoints import list_checkpoints

    checkpoint = list_checkpoints(runs["lstm"])[-1]
    policy = load_policy(checkpoint)
    assert policy.recurrent
    env = make_env(checkpoint_env(checkpoint, ""))
    obs, _ = env.reset(seed=3)
    policy.reset()
    observations, stepped = [], []
    for step in range(30):
        observations.append(obs)
        with torch.no_grad():
            batch = policy.module_inputs(torch.as_tensor(policy.prepare(obs)[None]))
            out = policy.module.forward_inference(batch)
        stepped.append(policy._dist_inputs(out)[0])
        obs, _, terminated, truncated, _ = env.step(step % 2)  # alternate: the pole stays up a while
        if terminated or truncated:
            break
    assert len(observations) >= 10
    # RLlib's module over the whole sequence at once, from its initial state: what carrying the
    # state from step to step must give.
    sequence = torch.as_tensor(np.stack(observations)[None], dtype=torch.float32)
    policy.reset()
    with torch.no_grad():
        whole = policy.module.forward_inference({"obs": sequence, "state_in": policy.state})
    np.testing.assert_allclose(torch.stack(stepped), whole["action_dist_inputs"][0], atol=1e-5)
    # Without the state (each step from the initial one) the outputs differ: the state matters.
    forgetful = []
    for row in observations:
        policy.reset()
        with torch.no_grad():
            out = policy.module.forward_inference(
                policy.module_inputs(torch.as_tensor(row[None], dtype=torch.float32))
            )
        forgetful.append(out["action_dist_inputs"][0, 0])
    assert not np.allclose(torch.stack(forgetful), torch.stack(stepped), atol=1e-4)
    with pytest.raises(UserError, match=r"a recurrent policy \(model\.use_lstm\)"):
        export_policy(str(runs["lstm"]), "onnx")
