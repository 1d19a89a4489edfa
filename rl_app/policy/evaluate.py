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
from rl_app.console.tables import output_console, warner
from rl_app.runs.files import write_json
from rl_app.runs.layout import checkpoint_experiment, is_run_dir
from rl_app.runs.remote import open_checkpoint

DEFAULT_VIDEO_EPISODES = 3


@dataclass
class EpisodeResult:
    seed: int
    episode_return: float
    length: int


def video_name(index: int, seed: int) -> str:
    """The mp4 of episode ``index`` (0-based) of an evaluation, reset with ``seed``."""
    return f"episode-{index:03d}-seed{seed}.mp4"


def _write_video(frames: list[Any], fps: float, path: Path) -> None:
    from moviepy.video.io.ImageSequenceClip import ImageSequenceClip

    clip = ImageSequenceClip(frames, fps=fps)
    clip.write_videofile(str(path), logger=None)
    clip.close()


def run_episodes(
    policy: Any,
    env_spec: EnvSection,
    episodes: list[tuple[int, int]],
    video_dir: str | None = None,
    video_episodes: int = DEFAULT_VIDEO_EPISODES,
) -> list[EpisodeResult]:
    """Play each ``(index, seed)`` episode with ``policy``; those with index < ``video_episodes``
    are recorded to ``video_dir`` as :func:`video_name` mp4s."""
    import torch

    from rl_app.envs import make_env

    torch.set_num_threads(1)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # render offscreen: no display needed
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # and no sound card probed (ALSA's noise)
    env = make_env(env_spec, render_mode="rgb_array" if video_dir else None)
    fps = float(env.metadata.get("render_fps") or 30)
    results = []
    try:
        for index, seed in episodes:
            record = video_dir is not None and index < video_episodes
            obs, _ = env.reset(seed=seed)
            policy.reset()
            frames = [env.render()] if record else []
            total, length, done = 0.0, 0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policy.act(obs))
                total += float(reward)
                length += 1
                done = terminated or truncated
                if record:
                    frames.append(env.render())
            if record and video_dir is not None:
                _write_video(frames, fps, Path(video_dir) / video_name(index, seed))
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


def checkpoint_env(checkpoint: Path, env_id: str) -> EnvSection:
    """The env the checkpoint was trained on: its experiment's (config and wrappers), else the bare id."""
    experiment = checkpoint_experiment(checkpoint)
    return experiment.env if experiment is not None else EnvSection.model_validate({"id": env_id})


def evaluate(
    location: str,
    *,
    episodes: int = 10,
    workers: int = 1,
    video: bool = False,
    video_episodes: int = DEFAULT_VIDEO_EPISODES,
    explore: bool = False,
    seed: int = 1000,
    runs_root: Path = Path("runs"),
    verbose: bool = False,
    allow_version_mismatch: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Evaluate the policy at ``location``; print and return the statistics, write ``eval.json``."""
    from rl_app.library_logs import capture_rllib_logs, library_log_note, write_library_logs
    from rl_app.policy.module import load_policy

    if not verbose:
        capture_rllib_logs()
    console = console or output_console()
    checkpoint, info = open_checkpoint(location, runs_root, allow_version_mismatch, warn=warner(console))
    env_spec = checkpoint_env(checkpoint, info.env)
    run_dir = checkpoint.parent.parent
    out_dir = run_dir if is_run_dir(run_dir) else checkpoint
    if not verbose:
        write_library_logs(out_dir)
    policy = load_policy(checkpoint, explore=explore)
    numbered = list(enumerate(range(seed, seed + episodes)))
    video_dir = str((out_dir / "videos" / checkpoint.name).resolve()) if video else None
    if video_dir:
        Path(video_dir).mkdir(parents=True, exist_ok=True)
    workers = min(workers, episodes)
    console.print(
        f"Evaluating {checkpoint} ({info.algorithm} on {info.env}): {episodes} episodes, "
        f"{'sampled' if explore else 'deterministic'} actions, {workers} worker(s)"
    )
    if workers == 1:
        results = run_episodes(policy, env_spec, numbered, video_dir, video_episodes)
    else:
        results = _run_in_parallel(policy, env_spec, numbered, workers, video_dir, video_episodes)
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
        "videos": [str(Path(video_dir) / video_name(index, s)) for index, s in numbered[:video_episodes]]
        if video_dir
        else [],
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
    note = None if verbose else library_log_note(out_dir)
    if note:
        console.print(note)
    return report


def _run_in_parallel(
    policy: Any,
    env_spec: EnvSection,
    episodes: list[tuple[int, int]],
    workers: int,
    video_dir: str | None,
    video_episodes: int,
) -> list[EpisodeResult]:
    """Split the episodes over Ray tasks; the policy goes into the object store once for all of them."""
    import ray

    from rl_app.cluster.session import ray_session

    with ray_session():
        policy_ref = ray.put(policy)
        task = ray.remote(num_cpus=1)(run_episodes)
        shares = [episodes[i::workers] for i in range(workers)]
        futures = [task.remote(policy_ref, env_spec, share, video_dir, video_episodes) for share in shares]
        results = [r for batch in ray.get(futures) for r in batch]
    return sorted(results, key=lambda r: r.seed)
