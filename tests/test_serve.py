"""`rl_app serve` as a real process on a free 127.0.0.1 port, answered over real HTTP: actions equal
RLlib's, bad requests are 4xx and harmless, reload under load loses nothing, tokens, start-up
errors, the lightweight import set, and Ray Serve answering like the lightweight server."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import TINY_RUNS, rllib_actions
from serve_client import Answer, act, free_port, request, serving

from rl_app.runs.checkpoints import list_checkpoints
from rl_app.training.run import train

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray
TINY = {**TINY_RUNS, "qlearning_cartpole": ["training.steps_per_iteration=2000"]}
RLLIB = ["ppo_cartpole", "dqn_cartpole", "sac_pendulum"]


@pytest.fixture(scope="module")
def runs(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    root = tmp_path_factory.mktemp("runs")
    settings = ["stop.iterations=2", "evaluation.interval=0", "checkpoint.every=1"]
    return {name: train(name, [*extra, *settings], runs_root=root).run_dir for name, extra in TINY.items()}


@pytest.fixture(scope="module")
def exports(runs: dict[str, Path]) -> dict[str, Path]:
    """An ONNX export of each run's first and last checkpoint: ``<name>`` and ``<name>@1``."""
    from rl_app.policy.export import export_policy

    folders = {}
    for name, run_dir in runs.items():
        first, *_, last = list_checkpoints(run_dir)
        for key, checkpoint in ((f"{name}@1", first), (name, last)):
            folders[key] = run_dir / f"export-{key.replace('@', '-')}"
            export_policy(str(checkpoint), "onnx", folders[key])
    return folders


def sample_observations(count: int, space: dict[str, Any], seed: int = 0) -> np.ndarray:
    """Observations inside the space's bounds (and inside [-1, 1], where the policies were trained)."""
    low = np.maximum([-1.0 if v is None else v for v in space["low"]], -1.0)
    high = np.minimum([1.0 if v is None else v for v in space["high"]], 1.0)
    return np.random.default_rng(seed).uniform(low, high, size=(count, *space["shape"])).astype(np.float32)


@pytest.mark.parametrize("name", RLLIB)
def test_served_actions_equal_rllib_deterministic_actions(
    runs: dict[str, Path], exports: dict[str, Path], name: str
) -> None:
    # PPO is served straight from its run folder (exported on the fly), the others from an export.
    source = runs[name] if name == "ppo_cartpole" else exports[name]
    spec = json.loads((exports[name] / "policy.json").read_text())
    obs = sample_observations(32, spec["observation_space"])
    expected = rllib_actions(list_checkpoints(runs[name])[-1], obs)
    with serving(str(source)) as server:
        batch = act(server.port, obs.tolist())
        one_by_one = [act(server.port, [row.tolist()]) for row in obs[:8]]
        encoded = {
            "base64": base64.b64encode(obs.tobytes()).decode(),
            "dtype": "float32",
            "shape": list(obs.shape),
        }
        compact = act(server.port, encoded)
        metadata = request(server.port, "GET", "/v1/metadata").body

    assert batch.status == 200, batch.text
    assert batch.body["policy"] == f"{name}/{runs[name].name}" and batch.body["iteration"] == 2
    served = np.asarray(batch.body["actions"])
    singles = np.concatenate([np.asarray(answer.body["actions"]) for answer in one_by_one])
    if spec["action_space"]["type"] == "Discrete":
        np.testing.assert_array_equal(served, expected)
        np.testing.assert_array_equal(singles, expected[:8])
    else:
        low, high = spec["action_space"]["low"], spec["action_space"]["high"]
        assert served.shape == expected.shape and (served >= low).all() and (served <= high).all()
        np.testing.assert_allclose(served, expected, atol=1e-5)
        np.testing.assert_allclose(singles, expected[:8], atol=1e-5)
    assert compact.body["actions"] == batch.body["actions"]
    assert (
        metadata["algorithm"] == spec["algorithm"]
        and metadata["observation_space"] == spec["observation_space"]
    )
    assert metadata["versions"]["ray"] and metadata["iteration"] == 2


def test_served_tabular_actions_are_the_q_tables_greedy_ones(
    runs: dict[str, Path], exports: dict[str, Path]
) -> None:
    from rl_app.tabular.qlearning import greedy_actions, load_q_table

    q_table, discretizer = load_q_table(list_checkpoints(runs["qlearning_cartpole"])[-1])
    spec = json.loads((exports["qlearning_cartpole"] / "policy.json").read_text())
    obs = sample_observations(64, spec["observation_space"], seed=5)
    with serving(str(exports["qlearning_cartpole"])) as server:
        answer = act(server.port, obs.tolist())
        sampled = request(
            server.port, "POST", "/v1/act", {"observations": obs.tolist(), "deterministic": False}
        )
    assert (
        answer.status == 200 and answer.body["actions"] == greedy_actions(q_table, discretizer, obs).tolist()
    )
    assert sampled.status == 422  # a greedy table policy has no distribution to sample


BAD_REQUESTS: dict[str, tuple[Any, dict[str, str], int, str]] = {
    # name: (body, headers, expected status, field named in the error)
    "wrong shape": ({"observations": [[0.1, 0.2, 0.3]]}, {}, 422, "observations"),
    "strings": ({"observations": [["a", "b", "c", "d"]]}, {}, 422, "observations"),
    "NaN": (b'{"observations": [[NaN, 0, 0, 0]]}', {}, 422, "observations"),
    "infinity": (b'{"observations": [[Infinity, 0, 0, 0]]}', {}, 422, "observations"),
    "outside the space": ({"observations": [[9.0, 0, 0, 0]]}, {}, 422, "observations"),
    "empty batch": ({"observations": []}, {}, 422, "observations"),
    "ragged rows": ({"observations": [[0, 0, 0, 0], [0, 0]]}, {}, 422, "observations"),
    "batch above the limit": ({"observations": [[0, 0, 0, 0]] * 9}, {}, 413, "observations"),
    "body above the limit": ({"observations": [[0, 0, 0, 0]], "pad": "x" * 3000}, {}, 413, "body"),
    "wrong content type": (
        b'{"observations": [[0, 0, 0, 0]]}',
        {"content-type": "text/plain"},
        415,
        "content-type",
    ),
    "malformed JSON": (b'{"observations": [[0, 0, 0, 0]', {}, 400, "body"),
    "unknown field": ({"observations": [[0, 0, 0, 0]], "temperature": 1}, {}, 422, "temperature"),
    "not an object": ([[0, 0, 0, 0]], {}, 422, "body"),
    "missing observations": ({"deterministic": True}, {}, 422, "observations"),
    "deterministic not a bool": (
        {"observations": [[0, 0, 0, 0]], "deterministic": "no"},
        {},
        422,
        "deterministic",
    ),
    "seed without sampling": ({"observations": [[0, 0, 0, 0]], "seed": 3}, {}, 422, "seed"),
    "negative seed": ({"observations": [[0, 0, 0, 0]], "deterministic": False, "seed": -1}, {}, 422, "seed"),
    "bad base64": (
        {"observations": {"base64": "@@", "dtype": "float32", "shape": [1, 4]}},
        {},
        422,
        "base64",
    ),
    "base64 of the wrong size": (
        {
            "observations": {
                "base64": base64.b64encode(b"\0" * 12).decode(),
                "dtype": "float32",
                "shape": [1, 4],
            }
        },
        {},
        422,
        "base64",
    ),
    "unknown dtype": (
        {"observations": {"base64": "", "dtype": "complex64", "shape": [0, 4]}},
        {},
        422,
        "dtype",
    ),
}


def test_bad_requests_get_4xx_with_one_line_and_the_server_keeps_serving(exports: dict[str, Path]) -> None:
    limits = ["--max-batch-size", "8", "--max-body-bytes", "2000"]
    with serving(str(exports["ppo_cartpole"]), *limits) as server:
        answers = {}
        for name, (body, headers, _, _) in BAD_REQUESTS.items():
            answers[name] = request(server.port, "POST", "/v1/act", body, headers)
            assert act(server.port, [[0.0, 0.0, 0.0, 0.0]]).status == 200, f"not serving after {name!r}"
        wrong_method = request(server.port, "GET", "/v1/act")
        unknown_path = request(server.port, "POST", "/v2/act", {"observations": [[0, 0, 0, 0]]})
        metrics = request(server.port, "GET", "/metrics").text
        assert server.process.poll() is None

    for name, (_, _, status, field) in BAD_REQUESTS.items():
        answer = answers[name]
        assert answer.status == status, (name, answer.text)
        assert "\n" not in answer.text and field in answer.body["error"].split(":")[0], (name, answer.text)
    assert wrong_method.status == 405 and unknown_path.status == 404
    refused = sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("rl_app_serve_bad_requests_total")
    )
    assert refused == len(BAD_REQUESTS) + 2
    assert f'rl_app_serve_requests_total{{route="act",status="200"}} {float(len(BAD_REQUESTS))}' in metrics


def rllib_sampled_actions(checkpoint: Path, obs: np.ndarray, draws: int) -> np.ndarray:
    """``draws`` actions for ``obs`` sampled the way RLlib's env runners explore, then unsquashed."""
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModule
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    module = RLModule.from_checkpoint(str(checkpoint / "learner_group/learner/rl_module/default_policy"))
    torch.manual_seed(0)
    with torch.no_grad():
        out = module.forward_exploration({"obs": torch.as_tensor(np.repeat(obs[None], draws, axis=0))})
        actions = (
            module.get_exploration_action_dist_cls().from_logits(out["action_dist_inputs"]).sample().numpy()
        )
    return unsquash_action(actions, module.action_space) if actions.dtype.kind == "f" else actions


@pytest.mark.parametrize("name", ["ppo_cartpole", "sac_pendulum"])
def test_sampled_actions_follow_rllibs_exploration_distribution_and_repeat_with_a_seed(
    runs: dict[str, Path], exports: dict[str, Path], name: str
) -> None:
    spec = json.loads((exports[name] / "policy.json").read_text())
    one = sample_observations(1, spec["observation_space"], seed=3)[0]
    rows = [one.tolist()] * 250
    with serving(str(exports[name])) as server:
        sampled = [
            request(server.port, "POST", "/v1/act", {"observations": rows, "deterministic": False, "seed": s})
            for s in range(8)
        ]
        again = request(
            server.port, "POST", "/v1/act", {"observations": rows, "deterministic": False, "seed": 0}
        )
        unseeded = request(server.port, "POST", "/v1/act", {"observations": rows, "deterministic": False})
        metadata = request(server.port, "GET", "/v1/metadata").body

    assert all(answer.status == 200 for answer in [*sampled, again, unseeded]), sampled[0].text
    assert (
        again.body["actions"] == sampled[0].body["actions"]
        and sampled[1].body["actions"] != sampled[0].body["actions"]
    )
    served = np.concatenate([np.asarray(answer.body["actions"]) for answer in sampled])
    reference = rllib_sampled_actions(list_checkpoints(runs[name])[-1], one, len(served))
    if name == "ppo_cartpole":
        assert metadata["sampling"] == "categorical"
        # 2,000 draws each: frequencies agree within ~4 standard errors.
        assert abs(np.mean(served == 1) - np.mean(reference == 1)) < 0.045
    else:
        assert metadata["sampling"] == "squashed_gaussian"
        low, high = spec["action_space"]["low"][0], spec["action_space"]["high"][0]
        assert (served >= low).all() and (served <= high).all()
        assert abs(served.mean() - reference.mean()) < 4 * reference.std() / np.sqrt(len(served)) + 0.02
        assert abs(served.std() - reference.std()) < 0.1 * reference.std() + 0.02


def test_a_policy_without_a_distribution_refuses_sampling(exports: dict[str, Path]) -> None:
    with serving(str(exports["dqn_cartpole"])) as server:
        answer = act_sampled = request(
            server.port, "POST", "/v1/act", {"observations": [[0.0, 0.0, 0.0, 0.0]], "deterministic": False}
        )
        metadata = request(server.port, "GET", "/v1/metadata").body
    assert act_sampled.status == 422 and answer.body["field"] == "deterministic"
    assert metadata["sampling"] is None


def test_requests_arriving_together_run_as_one_batch(exports: dict[str, Path]) -> None:
    with serving(str(exports["ppo_cartpole"])) as server:
        barrier = threading.Barrier(32)
        statuses: list[int] = []

        def client() -> None:  # one keep-alive connection, as a real client (and bench-serve) keeps
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            body = json.dumps({"observations": [[0.0, 0.0, 0.0, 0.0]]})
            barrier.wait()
            try:
                for _ in range(20):
                    connection.request("POST", "/v1/act", body, {"content-type": "application/json"})
                    response = connection.getresponse()
                    response.read()
                    statuses.append(response.status)
            finally:
                connection.close()

        threads = [threading.Thread(target=client) for _ in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        metrics = request(server.port, "GET", "/metrics").text
    assert statuses == [200] * 640
    values = {
        line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line and line[0] != "#"
    }
    assert values["rl_app_serve_batch_rows_sum"] == 640
    assert values["rl_app_serve_batch_rows_count"] < 640  # some model calls took several requests


def test_reload_under_load_loses_no_request_and_refuses_other_spaces(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    served = tmp_path / "served"
    shutil.copytree(exports["ppo_cartpole@1"], served)
    with serving(str(served)) as server:
        stop = threading.Event()
        answers: list[Answer] = []

        def client() -> None:
            while not stop.is_set():
                answers.append(act(server.port, [[0.01, 0.0, 0.0, 0.0]]))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        shutil.copytree(exports["ppo_cartpole"], served, dirs_exist_ok=True)  # a newer export, same run
        reloaded = request(server.port, "POST", "/v1/reload")
        time.sleep(0.5)
        shutil.copytree(exports["sac_pendulum"], served, dirs_exist_ok=True)  # another env's policy
        refused = request(server.port, "POST", "/v1/reload")
        time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join()
        after_refusal = act(server.port, [[0.01, 0.0, 0.0, 0.0]])
        shutil.copytree(exports["ppo_cartpole@1"], served, dirs_exist_ok=True)
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while request(server.port, "GET", "/v1/health").body["iteration"] != 1:
            assert time.monotonic() < deadline, "SIGHUP did not reload"
            time.sleep(0.1)

    assert reloaded.status == 200 and reloaded.body["iteration"] == 2, reloaded.text
    assert refused.status == 409 and "space" in refused.body["error"]
    assert answers and all(answer.status == 200 for answer in answers)
    iterations = [answer.body["iteration"] for answer in answers]
    assert iterations[0] == 1 and iterations[-1] == 2 and set(iterations) == {1, 2}
    assert after_refusal.status == 200 and after_refusal.body["iteration"] == 2


def test_a_token_is_required_off_loopback_and_checked_on_every_route_but_health(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    exposed = subprocess.run(
        [sys.executable, "-m", "rl_app", "serve", str(exports["ppo_cartpole"]), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert exposed.returncode == 2 and "--token-file" in exposed.stderr
    assert len(exposed.stderr.strip().splitlines()) == 1
    token = "s3cret-token-for-tests"
    (tmp_path / "token").write_text(token + "\n")
    with serving(str(exports["ppo_cartpole"]), "--token-file", str(tmp_path / "token")) as server:
        missing = act(server.port, [[0.0, 0.0, 0.0, 0.0]])
        wrong = act(server.port, [[0.0, 0.0, 0.0, 0.0]], authorization="Bearer nope")
        right = act(server.port, [[0.0, 0.0, 0.0, 0.0]], authorization=f"Bearer {token}")
        metadata = request(server.port, "GET", "/v1/metadata")
    assert (missing.status, wrong.status, right.status, metadata.status) == (401, 401, 200, 401)


def test_a_missing_or_corrupt_policy_at_start_up_is_one_line_and_exit_2(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt"
    shutil.copytree(exports["ppo_cartpole"], corrupt)
    (corrupt / "policy.onnx").write_bytes(b"not an onnx model")
    unreadable = tmp_path / "unreadable"
    shutil.copytree(exports["ppo_cartpole"], unreadable)
    (unreadable / "policy.json").write_text("{")
    missing_file = tmp_path / "missing-file"
    shutil.copytree(exports["ppo_cartpole"], missing_file)
    (missing_file / "policy.onnx").unlink()
    cases = {
        corrupt: "policy.onnx",
        unreadable: "policy.json",
        missing_file: "policy.json",
        tmp_path / "nowhere": "",
    }
    for folder, named in cases.items():
        result = subprocess.run(
            [sys.executable, "-m", "rl_app", "serve", str(folder), "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, (folder, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and named in result.stderr, result.stderr


def test_serving_an_export_imports_neither_ray_nor_torch(exports: dict[str, Path]) -> None:
    script = """
import sys, numpy as np
import rl_app.cli
from rl_app.serve.app import PolicyService, ServeSettings, build_app
from rl_app.serve.policy import load_served_policy
from rl_app.serve.protocol import parse_act_request
import rl_app.serve.server
policy = load_served_policy(__import__("pathlib").Path(sys.argv[1]))
build_app(PolicyService(policy, ServeSettings()))
parsed = parse_act_request(b'{"observations": [[0, 0, 0, 0]]}', policy.observations, 8)
assert policy.act(parsed.observations).shape == (1,)
heavy = sorted(m for m in ("ray", "torch", "gymnasium", "rich", "pydantic") if m in sys.modules)
assert not heavy, heavy
"""
    subprocess.run([sys.executable, "-c", script, str(exports["ppo_cartpole"])], check=True, timeout=60)


def test_ray_serve_answers_like_the_lightweight_server(exports: dict[str, Path]) -> None:
    from ray import serve

    from rl_app.serve.app import ServeSettings
    from rl_app.serve.policy import load_served_policy
    from rl_app.serve.ray_serve import deploy_policy

    space = json.loads((exports["ppo_cartpole"] / "policy.json").read_text())["observation_space"]
    obs = sample_observations(16, space, seed=1).tolist()
    with serving(str(exports["ppo_cartpole"])) as server:
        expected = [act(server.port, obs), act(server.port, [[0.1, 0.2, 0.3]])]
    port = free_port()
    deploy_policy(load_served_policy(exports["ppo_cartpole"]), ServeSettings(max_batch_size=8), port=port)
    try:
        answers = [act(port, obs[:8]), act(port, [[0.1, 0.2, 0.3]]), act(port, obs[:9])]
        concurrent: list[Answer] = [Answer(0, {}, "")] * 8

        def one(i: int) -> None:
            concurrent[i] = act(port, [obs[i]])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        serve.shutdown()
    assert answers[0].status == 200 and answers[0].body["actions"] == expected[0].body["actions"][:8]
    assert answers[0].body["policy"] == expected[0].body["policy"]
    assert (answers[1].status, answers[1].body["error"]) == (expected[1].status, expected[1].body["error"])
    assert answers[2].status == 413
    assert [a.body["actions"][0] for a in concurrent] == expected[0].body["actions"][:8]
