"""Evaluate, export, report and runs on real (tiny) checkpoints of each algorithm."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_RUNS, rllib_actions

from rl_app.errors import UserError
from rl_app.runs.checkpoints import list_checkpoints, read_info
from rl_app.training.run import train

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray
TINY = TINY_RUNS


@pytest.fixture(scope="module")
def runs(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    os.environ["RL_APP_EXPERIMENTS_DIR"] = str(REPO / "experiments")
    root = tmp_path_factory.mktemp("runs")
    return {
        name: train(name, [*extra, "stop.iterations=2", "evaluation.interval=0"], runs_root=root).run_dir
        for name, extra in TINY.items()
    }


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_exported_policy_acts_like_rllib_without_ray(runs: dict[str, Path], name: str, fmt: str) -> None:
    from rl_app.policy.export import export_policy

    run_dir = runs[name]
    out = run_dir / f"export-{fmt}"
    target = export_policy(str(run_dir), fmt, out)
    spec = json.loads((out / "policy.json").read_text())
    assert spec["file"] == target.name and spec["env"] in ("CartPole-v1", "Pendulum-v1")
    rng = np.random.default_rng(0)
    shape = spec["observation_space"]["shape"]
    obs = rng.uniform(-1, 1, size=(64, *shape)).astype(np.float32)
    np.save(out / "obs.npy", obs)
    # A fresh interpreter that never imports Ray or RLlib loads and runs the file.
    loader = {
        "torchscript": "import torch; p = torch.jit.load(sys.argv[1]); a = p(torch.as_tensor(obs)).numpy()",
        "onnx": "import onnxruntime as ort; a = ort.InferenceSession(sys.argv[1]).run(None, {'obs': obs})[0]",
    }[fmt]
    script = (
        f"import sys, numpy as np; obs = np.load(sys.argv[2]); {loader}; np.save(sys.argv[3], a); "
        "assert 'ray' not in sys.modules, 'ray was imported'"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(target), str(out / "obs.npy"), str(out / "actions.npy")],
        check=True,
    )
    exported = np.load(out / "actions.npy")
    expected = rllib_actions(list_checkpoints(run_dir)[-1], obs)
    if spec["action_space"]["type"] == "Discrete":
        np.testing.assert_array_equal(exported, expected)
    else:
        np.testing.assert_allclose(exported, expected, atol=1e-5)


def test_evaluate_writes_statistics_and_parallel_matches_serial(runs: dict[str, Path]) -> None:
    from rl_app.policy.evaluate import evaluate

    run_dir = runs["ppo_cartpole"]
    serial = evaluate(str(run_dir), episodes=4, workers=1)
    parallel = evaluate(str(run_dir), episodes=4, workers=2)
    saved = json.loads((run_dir / "eval.json").read_text())
    assert saved["episodes"] == 4 and len(saved["per_episode"]) == 4
    assert serial["per_episode"] == parallel["per_episode"]  # same seeds, same deterministic policy
    returns = [e["episode_return"] for e in serial["per_episode"]]
    assert serial["return"]["mean"] == pytest.approx(np.mean(returns))
    assert serial["return"]["min"] == min(returns) and serial["return"]["max"] == max(returns)


def test_evaluate_records_video(runs: dict[str, Path]) -> None:
    from rl_app.policy.evaluate import evaluate

    report = evaluate(str(runs["sac_pendulum"]), episodes=2, video=True)
    assert len(report["videos"]) == 2
    assert all(Path(v).stat().st_size > 1000 for v in report["videos"])


def test_tensorboard_and_system_usage_are_recorded(runs: dict[str, Path]) -> None:
    import csv

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = runs["dqn_cartpole"]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"rl_app/return_mean", "rl_app/steps_per_s", "rl_app/cpu_percent"} <= tags
    assert any(t.startswith("learners/default_policy/") and "loss" in t for t in tags), sorted(tags)[:20]
    with (run_dir / "progress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert all(float(r["memory_mb"]) > 50 and float(r["cpu_percent"]) >= 0 for r in rows)


def test_system_monitor_counts_the_cpu_of_child_processes() -> None:
    from rl_app.console.telemetry import SystemMonitor

    spin = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        monitor = SystemMonitor()  # starts each process's clock, the child's included
        time.sleep(1.0)  # this process sleeps; the child spins a core
        usage = monitor.sample()
    finally:
        child.wait(timeout=30)
    assert usage["cpu_percent"] > 50, usage
    assert usage["memory_mb"] > 50


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_reward_curve_is_drawn_by_the_helper_process_else_here(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_app.console import plots

    progress = runs["ppo_cartpole"] / "progress.csv"
    drawn_here: list[Path] = []
    draw_here = plots.plot_reward_curve

    def spy(progress_csv: Path, out_png: Path, title: str) -> Path:
        drawn_here.append(out_png)
        return draw_here(progress_csv, out_png, title)

    monkeypatch.setattr(plots, "plot_reward_curve", spy)  # this process only; the helper draws its own
    curve = plots.RewardCurveProcess()
    curve.draw(progress, tmp_path / "helper.png", "by the helper")
    assert curve.wait() == tmp_path / "helper.png" and not drawn_here
    assert (tmp_path / "helper.png").read_bytes()[:8] == PNG_MAGIC

    gone = plots.RewardCurveProcess()
    gone.close()  # the helper died before the run ended: this process draws
    gone.draw(progress, tmp_path / "here.png", "here")
    assert gone.wait() == tmp_path / "here.png" and drawn_here == [tmp_path / "here.png"]
    assert (tmp_path / "here.png").read_bytes()[:8] == PNG_MAGIC

    refused = plots.RewardCurveProcess()
    refused.draw(progress, tmp_path / "no such folder" / "curve.png", "refused")
    with pytest.raises(OSError):  # the helper fails; drawing here raises the disk's error
        refused.wait()

    unasked = plots.RewardCurveProcess()
    helper = unasked._process
    assert helper is not None and helper.poll() is None
    assert unasked.wait() is None  # a run that ended without asking stops its helper
    assert helper.poll() is not None


def test_the_reward_curve_shows_an_evaluation_of_an_iteration_without_training_episodes(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    import csv

    from rl_app.console.plots import reward_curve_rows

    with (runs["ppo_cartpole"] / "progress.csv").open() as handle:
        progress = list(csv.DictReader(handle))
    progress[-1] |= {"return_mean": "nan", "eval_return_mean": "483.2"}  # as ppo_cartpole's solving one
    edited = tmp_path / "progress.csv"
    with edited.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(progress[0]))
        writer.writeheader()
        writer.writerows(progress)
    trained, evaluated = reward_curve_rows(edited)
    assert len(trained) == sum(not math.isnan(float(r["return_mean"] or "nan")) for r in progress) >= 1
    assert [r["eval_return_mean"] for r in evaluated][-1] == pytest.approx(483.2)


def test_tensorboard_events_hold_what_add_scalar_would_write(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboardX import SummaryWriter

    from rl_app.console.telemetry import TensorBoardLog, flatten_numbers

    ours = {"return_mean": 21.5, "eval_return_mean": math.nan, "iteration": 3}
    result = {
        "env_runners": {"episode_return_mean": 21.5, "odd key (x)": 2, "flag": True, "inf": math.inf},
        "learners": {"default_policy": {"policy_loss": -0.25}},
        "/leading": 1.0,
        "date": "2026-12-05",
    }
    log = TensorBoardLog(tmp_path / "ours")
    reference = SummaryWriter(logdir=str(tmp_path / "reference" / "tensorboard"))
    for step in (256, 512):
        log.log(step, ours, result)
        for name, value in {**{f"rl_app/{k}": v for k, v in ours.items()}, **flatten_numbers(result)}.items():
            if math.isfinite(value):
                reference.add_scalar(name, value, step)
    log.close()
    reference.close()

    def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
        events = EventAccumulator(str(folder))
        events.Reload()
        return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in events.Tags()["scalars"]}

    written = scalars(tmp_path / "ours" / "tensorboard")
    assert written == scalars(tmp_path / "reference" / "tensorboard")
    assert written["env_runners/odd_key__x_"] == [(256, 2.0), (512, 2.0)]
    assert "leading" in written and "rl_app/eval_return_mean" not in written and "date" not in written


def test_report_compares_runs_and_runs_lists_them(runs: dict[str, Path], tmp_path: Path) -> None:
    from rich.console import Console

    from rl_app.console.commands import list_runs
    from rl_app.console.plots import report_runs

    pngs = report_runs([runs["ppo_cartpole"], runs["dqn_cartpole"]], tmp_path / "compare.png")
    assert len(pngs) == 3 and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    console = Console(record=True, width=200)
    list_runs(runs["ppo_cartpole"].parents[1], console)
    text = console.export_text()
    for name in TINY:
        assert name in text
    assert text.count("finished") == 3


def test_missing_runs_are_one_line_errors(tmp_path: Path) -> None:
    from rl_app.console.plots import report_runs
    from rl_app.policy.evaluate import evaluate

    with pytest.raises(UserError, match="does not exist"):
        evaluate(str(tmp_path / "nope"))
    with pytest.raises(UserError, match=r"no progress\.csv"):
        report_runs([tmp_path])


def test_a_second_export_keeps_the_first_described(runs: dict[str, Path], tmp_path: Path) -> None:
    from rl_app.policy.export import export_policy

    out = tmp_path / "export"
    export_policy(str(runs["ppo_cartpole"]), "onnx", out)
    export_policy(str(runs["ppo_cartpole"]), "torchscript", out)
    spec = json.loads((out / "policy.json").read_text())
    assert spec["file"] == "policy.pt"  # the latest
    assert {name: entry["format"] for name, entry in spec["files"].items()} == {
        "policy.onnx": "onnx",
        "policy.pt": "torchscript",
    }


def test_videos_are_named_by_episode_and_seed(
    runs: dict[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    from rl_app.policy.evaluate import evaluate

    report = evaluate(str(runs["sac_pendulum"]), episodes=3, video=True, video_episodes=2, seed=7)
    assert "ALSA" not in capfd.readouterr().err  # rendering probes no sound card
    assert [Path(v).name for v in report["videos"]] == ["episode-000-seed7.mp4", "episode-001-seed8.mp4"]
    folder = Path(report["videos"][0]).parent
    assert all(Path(video).stat().st_size > 1000 for video in report["videos"])
    assert not (folder / "episode-002-seed9.mp4").exists()  # only the first --video-episodes
    assert [e["seed"] for e in report["per_episode"]] == [7, 8, 9]


def test_report_puts_the_comparison_next_to_the_runs_and_shows_identical_runs(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from rl_app.console.plots import comparison_curves, report_runs

    twin = tmp_path / "ppo_cartpole" / "twin"  # the same run twice: same seed, same curve
    shutil.copytree(runs["ppo_cartpole"], twin)
    monkeypatch.chdir(tmp_path)
    written = report_runs([runs["ppo_cartpole"], twin])
    comparison = written[-1]
    assert comparison.parent.parent == runs["ppo_cartpole"].parents[1] / "reports"
    assert comparison.name == "comparison.png" and not (tmp_path / "comparison.png").exists()
    first, second = comparison_curves([runs["ppo_cartpole"], twin])
    assert first.identical_to is None and second.identical_to is not None
    assert "identical to" in second.label
    assert [r["return_mean"] for r in second.points] == [r["return_mean"] for r in first.points] != []


def test_runs_list_never_cuts_ids_and_speaks_json(runs: dict[str, Path]) -> None:
    root = runs["ppo_cartpole"].parents[1]
    piped = subprocess.run(
        [sys.executable, "-m", "rl_app", "runs", "--runs-dir", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "60"},
    )
    assert piped.returncode == 0, piped.stderr
    for name, run_dir in runs.items():
        assert f"{name}/{run_dir.name}" in piped.stdout  # whole, on one line
    assert "CartPole-v1" in piped.stdout and "Pendulum-v1" in piped.stdout
    listed = subprocess.run(
        [sys.executable, "-m", "rl_app", "runs", "--runs-dir", str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = {row["run"]: row for row in json.loads(listed.stdout)}
    row = rows[f"ppo_cartpole/{runs['ppo_cartpole'].name}"]
    assert row["env"] == "CartPole-v1" and row["status"] == "finished" and row["iterations"] == 2


def test_evaluate_says_what_to_do_with_folders_that_are_not_a_finished_run(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    from rl_app.policy.evaluate import evaluate

    with pytest.raises(UserError, match=r"is a folder of 1 runs, not a run; the latest is .*ppo_cartpole/"):
        evaluate(str(runs["ppo_cartpole"].parent))
    running = tmp_path / "ppo_cartpole" / "running"
    shutil.copytree(runs["ppo_cartpole"], running, ignore=shutil.ignore_patterns("checkpoints"))
    (running / "status.json").write_text(
        json.dumps({"status": "running", "pid": os.getpid(), "hostname": os.uname().nodename})
    )
    every = __import__("yaml").safe_load((running / "experiment.yaml").read_text())["checkpoint"]["every"]
    with pytest.raises(UserError, match=rf"still running .* first comes at iteration {every}"):
        evaluate(str(running))


def test_a_checkpoint_of_another_ray_version_is_refused_before_anything_is_touched(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    from rl_app.policy.evaluate import evaluate
    from rl_app.policy.export import export_policy
    from rl_app.runs.checkpoints import MARKER
    from rl_app.training.run import train

    run_dir = tmp_path / "ppo_cartpole" / "old"
    shutil.copytree(runs["ppo_cartpole"], run_dir)
    marker = list_checkpoints(run_dir)[-1] / MARKER
    stamp = json.loads(marker.read_text())
    assert stamp["versions"]["ray"] == "2.60.0" and {"torch", "gymnasium", "rl_app"} <= set(stamp["versions"])
    stamp["versions"]["ray"] = "2.59.0"
    marker.write_text(json.dumps(stamp))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    refusal = r"written with Ray 2\.59\.0, this is Ray 2\.60\.0; .*--allow-version-mismatch"
    for attempt in (
        lambda: evaluate(str(run_dir), episodes=1),
        lambda: export_policy(str(run_dir), "onnx"),
        lambda: train(None, ["stop.iterations=3"], resume=str(run_dir), runs_root=tmp_path),
        lambda: train("ppo_cartpole", ["stop.iterations=1"], init_from=str(run_dir), runs_root=tmp_path),
    ):
        with pytest.raises(UserError, match=refusal):
            attempt()
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    assert [p.name for p in (tmp_path / "ppo_cartpole").iterdir()] == ["old"]
    report = evaluate(str(run_dir), episodes=1, allow_version_mismatch=True)
    assert report["episodes"] == 1


def test_explored_dqn_actions_are_epsilon_greedy_at_the_epsilon_training_reached(
    runs: dict[str, Path],
) -> None:
    """``evaluate --explore`` of a DQN run: RLlib's epsilon-greedy, its epsilon where the schedule
    stood at the checkpoint (dqn_cartpole: 1.0 to 0.04 over the first 8,000 steps)."""
    from rl_app.policy.evaluate import evaluate
    from rl_app.policy.module import load_policy

    checkpoint = list_checkpoints(runs["dqn_cartpole"])[-1]
    timesteps = read_info(checkpoint).timesteps
    epsilon = 1.0 + (0.04 - 1.0) * min(timesteps, 8000) / 8000
    obs = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, size=(4000, 4)).astype(np.float32))
    explored = load_policy(checkpoint, explore=True)(obs).numpy()
    greedy = load_policy(checkpoint)(obs).numpy()
    # A random action of two differs from the greedy one half the time.
    expected, differing = epsilon / 2, float(np.mean(explored != greedy))
    assert abs(differing - expected) < 4 * np.sqrt(expected * (1 - expected) / len(obs)) + 1e-9, (
        differing,
        expected,
    )
    report = evaluate(str(checkpoint), episodes=2, explore=True)
    assert report["episodes"] == 2 and report["explore"] is True
