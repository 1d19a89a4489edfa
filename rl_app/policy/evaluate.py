"""Evaluate a trained policy: N deterministic episodes, optionally in parallel and on video."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from rl_app.config import EnvSection
from rl_app.runs.checkpoints import read_info
from rl_app.runs.files import write_json
from rl_app.runs.layout import checkpoint_experiment, is_run_dir
from rl_app.runs.remote import locate_checkpoint

VIDEO_EPISODES = 3


@dataclass
class EpisodeResult:
    seed: int
    episode_return: float
    length: int


def run_episodes(
    policy: Any, env_spec: EnvSection, seeds: list[int], video_dir: str | None = None
) -> list[EpisodeResult]:
    """Play one episode per seed with ``policy``; record the first few to ``video_dir`` as mp4."""
    import torch

    from rl_app.envs import make_env

    torch.set_num_threads(1)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # render offscreen: no display needed
    env = make_env(env_spec, render_mode="rgb_array" if video_dir else None)
    if video_dir:
        from gymnasium.wrappers import RecordVideo

        env = RecordVideo(
            env,
            video_folder=video_dir,
            name_prefix=f"seed{seeds[0]}",
            episode_trigger=lambda index: index < VIDEO_EPISODES,
            disable_logger=True,
        )
    results = []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            total, length, done = 0.0, 0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
                total += float(reward)
                length += 1
                done = terminated or truncated
            results.append(EpisodeResult(seed, total, length))
    finally:
        env.close()
    return results


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def _env_of(checkpoint: Path, env_id: str) -> EnvSection:
    """The env the checkpoint was trained on: its experiment's (config and wrappers), else the bare id."""
    experiment = checkpoint_experiment(checkpoint)
    return experiment.env if experiment is not None else EnvSection.model_validate({"id": env_id})


def evaluate(
    location: str,
    *,
    episodes: int = 10,
    workers: int = 1,
    video: bool = False,
    explore: bool = False,
    seed: int = 1000,
    runs_root: Path = Path("runs"),
    console: Console | None = None,
) -> dict[str, Any]:
    """Evaluate the policy at ``location``; print and return the statistics, write ``eval.json``."""
    from rl_app.policy.module import load_policy

    console = console or Console()
    checkpoint = locate_checkpoint(location, runs_root)
    info = read_info(checkpoint)
    env_spec = _env_of(checkpoint, info.env)
    run_dir = checkpoint.parent.parent
    out_dir = run_dir if is_run_dir(run_dir) else checkpoint
    policy = load_policy(checkpoint, explore=explore)
    seeds = list(range(seed, seed + episodes))
    video_dir = str((out_dir / "videos" / checkpoint.name).resolve()) if video else None
    workers = min(workers, episodes)
    console.print(
        f"Evaluating {checkpoint} ({info.algorithm} on {info.env}): {episodes} episodes, "
        f"{'sampled' if explore else 'deterministic'} actions, {workers} worker(s)"
    )
    if workers == 1:
        results = run_episodes(policy, env_spec, seeds, video_dir)
    else:
        results = _run_in_parallel(policy, env_spec, seeds, workers, video_dir)
    returns = [r.episode_return for r in results]
    lengths = [float(r.length) for r in results]
    report: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "algorithm": info.algorithm,
        "env": info.env,
        "iteration": info.iteration,
        "episodes": episodes,
        "explore": explore,
        "return": _stats(returns),
        "episode_length": _stats(lengths),
        "per_episode": [asdict(r) for r in results],
        "videos": sorted(str(p) for p in Path(video_dir).glob("*.mp4")) if video_dir else [],
        "evaluated_at": datetime.now(UTC).isoformat(),
    }
    write_json(out_dir / "eval.json", report)
    r, n = report["return"], report["episode_length"]
    console.print(
        f"return {r['mean']:.1f} ± {r['std']:.1f} (min {r['min']:.1f}, max {r['max']:.1f}); "
        f"episode length {n['mean']:.0f} (min {n['min']:.0f}, max {n['max']:.0f})"
    )
    console.print(f"Wrote {out_dir / 'eval.json'}" + (f" and videos in {video_dir}" if video_dir else ""))
    if not all(math.isfinite(x) for x in returns):
        console.print("[yellow]warning: some episode returns are not finite[/yellow]")
    return report


def _run_in_parallel(
    policy: Any, env_spec: EnvSection, seeds: list[int], workers: int, video_dir: str | None
) -> list[EpisodeResult]:
    """Split the seeds over Ray tasks; the policy goes into the object store once for all of them."""
    import ray

    from rl_app.cluster.session import ray_session

    with ray_session():
        policy_ref = ray.put(policy)
        task = ray.remote(num_cpus=1)(run_episodes)
        shares = [seeds[i::workers] for i in range(workers)]
        futures = [
            task.remote(policy_ref, env_spec, share, video_dir if i == 0 else None)
            for i, share in enumerate(shares)
        ]
        results = [r for batch in ray.get(futures) for r in batch]
    return sorted(results, key=lambda r: r.seed)
