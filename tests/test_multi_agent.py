"""Several agents: the multi_agent section, PettingZoo and RLlib MultiAgentEnv envs, self-play,
per-policy metrics, evaluation against a random player, one export per policy."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from serve_client import request, serving

from rl_app.config.schema import EnvSection, MultiAgentSection
from rl_app.envs.multi_agent import (
    MappingError,
    PolicyMapping,
    agent_ids,
    make_multi_agent_env,
    policy_mapping,
    policy_spaces,
)
from rl_app.runs.progress import read_progress


def section(**data: object) -> MultiAgentSection:
    return MultiAgentSection.model_validate(data)


AGENTS = ["adversary_0", "agent_0", "agent_1"]


def test_a_mapping_takes_the_first_pattern_that_matches_and_every_policy_acts() -> None:
    mapping = policy_mapping(
        section(policies=["red", "blue"], mapping={"adversary_*": "red", "*": "blue"}), AGENTS
    )
    assert [mapping.policy_of(a) for a in AGENTS] == ["red", "blue", "blue"]
    assert [mapping(a) for a in AGENTS] == ["red", "blue", "blue"]  # RLlib's form, no episode
    with pytest.raises(MappingError, match="policy 'blue' acts for no agent"):
        policy_mapping(section(policies=["red", "blue"], mapping={"*": "red"}), AGENTS)
    per_agent = policy_mapping(section(policies="per_agent"), AGENTS)
    assert [per_agent.policy_of(a) for a in AGENTS] == AGENTS
    assert pickle.loads(pickle.dumps(mapping)) == mapping  # it travels to remote env runners


def test_self_play_seats_the_learner_at_each_place_in_turn() -> None:
    play = section(policies=["me", "copy"], self_play={"learner": "me", "opponent": "copy"})
    mapping = policy_mapping(play, ["player_1", "player_2"])
    seats = [(mapping.policy_of("player_1", e), mapping.policy_of("player_2", e)) for e in range(4)]
    assert seats == [("me", "copy"), ("copy", "me")] * 2
    assert play.trained(["player_1", "player_2"]) == ["me"]  # the opponent is frozen

    class Episode:
        def __init__(self, id_: str) -> None:
            self.id_ = id_

    # RLlib's episodes: the seat follows the episode's id, and each id gives one learner seat.
    for id_ in ("0000000a" + "0" * 24, "0000000b" + "0" * 24):
        chosen = [mapping("player_1", Episode(id_)), mapping("player_2", Episode(id_))]
        assert sorted(chosen) == ["copy", "me"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"policies": ["a"], "mapping": {"*": "b"}}, "mapping '\\*' names unknown policy 'b'"),
        ({"policies": ["a"], "train": ["z"], "mapping": {"*": "a"}}, "train names unknown policy 'z'"),
        ({"policies": ["a", "a"], "mapping": {"*": "a"}}, "name each policy once"),
        ({"policies": ["a", "b"]}, "mapping: say which agents"),
        ({"policies": "shared", "mapping": {"*": "shared"}}, "needs named policies"),
        ({"policies": ["a"], "self_play": {"learner": "a", "opponent": "a"}}, "two policies"),
    ],
)
def test_the_section_refuses_names_that_do_not_add_up(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        section(**data)


def test_pettingzoo_envs_come_through_rllibs_wrappers_with_their_spaces() -> None:
    parallel = make_multi_agent_env(EnvSection(id="mpe2.simple_spread_v3", config={"N": 2}))
    turns = make_multi_agent_env(EnvSection(id="pettingzoo.classic.tictactoe_v3"))
    assert type(parallel).__name__ == "ParallelPettingZooEnv"
    assert type(turns).__name__ == "PettingZooEnv"
    assert agent_ids(parallel) == ["agent_0", "agent_1"]
    spaces = policy_spaces(turns, PolicyMapping(("player_1", "player_2"), self_play=("me", "copy")))
    assert set(spaces) == {"me", "copy"}
    assert spaces["me"][0]["action_mask"].shape == (9,)


# --- Training (Ray) ---------------------------------------------------------------------------

TINY = ["evaluation.interval=2", "evaluation.episodes=4", "stop.timesteps=100000", "stop.iterations=3"]


def _train(name: str, overrides: list[str], runs: Path) -> Path:
    from rl_app.training.run import train

    summary = train(name, overrides=tuple(overrides), runs_root=runs)
    assert summary.status == "finished", summary
    return summary.run_dir


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session", "shipped")
def test_self_play_on_tictactoe_masks_refreshes_evaluates_and_exports(tmp_path: Path) -> None:
    """The shipped self-play experiment, briefly, refreshing its opponent after every iteration."""
    import onnxruntime as ort
    import torch

    from rl_app.envs.spaces import flatten
    from rl_app.policy.evaluate import evaluate
    from rl_app.policy.export import export_policy
    from rl_app.policy.module import load_policy
    from rl_app.rllib.algorithm import load_module

    always = "multi_agent.self_play.refresh_return=-1"
    overrides = [*TINY, "training.train_batch_size_per_learner=500", always]
    run = _train("ppo_tictactoe_selfplay", overrides, tmp_path)
    rows = read_progress(run / "progress.csv")
    assert len(rows) == 3
    for row in rows:
        # A masked (illegal) move ends the game at -1 for the mover and 0 for the other: a game's
        # returns would no longer add up to zero. Early training plays almost at random.
        assert row["return_min"] == row["return_max"] == 0.0, row
        assert row["return_mean/learner"] == pytest.approx(-row["return_mean/opponent"])
    assert not np.isnan(rows[1]["eval_return_mean/learner"])

    # Refreshed after every iteration: the opponent is the learner, weight for weight.
    checkpoint = max((run / "checkpoints").iterdir())
    learner, opponent = (load_module(checkpoint, name).state_dict() for name in ("learner", "opponent"))
    assert learner.keys() == opponent.keys()
    assert all(torch.equal(learner[k], opponent[k]) for k in learner)

    report = evaluate(str(run), episodes=20, random_policies=("opponent",), seed=7)
    assert set(report["policies"]) == {"learner", "opponent"}
    seats = [episode["agent_policies"]["player_1"] for episode in report["per_episode"][:2]]
    assert seats == ["learner", "opponent"]  # the learner plays first, then second
    assert report["policies"]["learner"]["episodes"] == 20
    assert 0.0 <= report["policies"]["learner"]["win_rate"] <= 1.0
    assert json.loads((run / "eval.json").read_text())["random_policies"] == ["opponent"]

    written = export_policy(str(run), "onnx", tmp_path / "export")
    out = written.parent
    index = json.loads(written.read_text())
    assert index["policies"] == ["learner", "opponent"]
    env = make_multi_agent_env(EnvSection(id=index["env"]))
    obs, _ = env.reset(seed=3)
    (observation,) = obs.values()  # the first player's turn
    for name in index["policies"]:
        spec = json.loads((out / name / "policy.json").read_text())
        assert spec["input"]["flattened"] is True
        row = flatten(spec["observation_space"], observation)[None]
        session = ort.InferenceSession(str(out / name / "policy.onnx"))
        exported = session.run(["action"], {"obs": row})[0]
        policy = load_policy(checkpoint, name=name)
        assert int(exported[0]) == policy.act(observation)
        assert observation["action_mask"][int(exported[0])] == 1

    # `rl_app serve` of the whole export: a request names its policy.
    as_json = {key: np.asarray(value).tolist() for key, value in observation.items()}
    with serving(str(out)) as server:
        answers = {
            name: request(server.port, "POST", "/v1/act", {"policy": name, "observations": [as_json]})
            for name in index["policies"]
        }
        unnamed = request(server.port, "POST", "/v1/act", {"observations": [as_json]})
        unknown = request(server.port, "POST", "/v1/act", {"policy": "nobody", "observations": [as_json]})
        health = request(server.port, "GET", "/v1/health")
        reload = request(server.port, "POST", "/v1/reload")
    for name, answer in answers.items():
        assert answer.status == 200, answer.text
        assert answer.body["actions"] == [load_policy(checkpoint, name=name).act(observation)]
    assert unnamed.status == unknown.status == 422
    assert unnamed.body["field"] == unknown.body["field"] == "policy"
    assert "learner, opponent" in unknown.body["error"]
    assert set(health.body["policies"]) == {"learner", "opponent"}
    assert reload.status == 200 and set(reload.body["policies"]) == {"learner", "opponent"}


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session", "shipped")
def test_named_policies_on_a_users_multi_agent_env_report_each_policy(tmp_path: Path) -> None:
    """The user's own RLlib MultiAgentEnv, one policy per agent by pattern: per-policy columns
    that add up to the episode return."""
    from rl_app.policy.evaluate import evaluate

    overrides = [
        *TINY,
        "env=multi_agent_envs:Meeting",
        "training.train_batch_size_per_learner=400",
        "training.minibatch_size=200",
        'multi_agent={"policies": ["fast", "slow"], "mapping": {"run*": "fast", "*": "slow"}}',
    ]
    run = _train("ppo_simple_spread", overrides, tmp_path)
    header = (run / "progress.csv").read_text().splitlines()[0].split(",")
    assert [c for c in header if "/" in c] == [
        "return_mean/fast",
        "return_mean/slow",
        "eval_return_mean/fast",
        "eval_return_mean/slow",
    ]
    for row in read_progress(run / "progress.csv"):
        assert row["return_mean/fast"] + row["return_mean/slow"] == pytest.approx(row["return_mean"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    fast = [e.value for e in events.Scalars("rl_app/return_mean/fast")]
    assert fast == pytest.approx([row["return_mean/fast"] for row in read_progress(run / "progress.csv")])
    before = (run / "progress.csv").read_text().splitlines()

    # Resumed (RLlib's multi-agent runners re-seeded), it goes on from its checkpoint's iteration.
    from rl_app.training.run import train

    resumed = train(None, ["stop.iterations=4"], resume=str(run), runs_root=tmp_path)
    after = (run / "progress.csv").read_text().splitlines()
    assert resumed.status == "finished" and resumed.iterations == 4
    assert after[: len(before)] == before and len(after) == len(before) + 1
    assert not np.isnan(read_progress(run / "progress.csv")[-1]["return_mean/fast"])

    report = evaluate(str(run), episodes=4)
    assert {a: e for a, e in report["per_episode"][0]["agent_policies"].items()} == {
        "runner": "fast",
        "scout": "slow",
    }
    for episode in report["per_episode"]:  # both earn 1 when they meet, so the two are equal
        assert episode["agent_returns"]["runner"] == episode["agent_returns"]["scout"]
