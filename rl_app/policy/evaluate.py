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
from rl_app.errors import UserError
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
    # The real game: training-only parts (life-loss terminals, reward clipping) left out.
    env = make_env(env_spec, render_mode="rgb_array" if video_dir else None, evaluation=True)
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


@dataclass
class MultiAgentEpisodeResult:
    seed: int
    episode_return: float  # the sum over the agents, as RLlib counts an episode's return
    length: int  # env steps
    agent_returns: dict[str, float]
    agent_policies: dict[str, str]

    def policy_returns(self) -> dict[str, float]:
        """Each policy's return: the sum over the agents it acted for."""
        found: dict[str, float] = {}
        for agent, value in self.agent_returns.items():
            policy = self.agent_policies[agent]
            found[policy] = found.get(policy, 0.0) + value
        return found


def run_multi_agent_episodes(
    policies: dict[str, Any], env_spec: EnvSection, mapping: Any, episodes: list[tuple[int, int]]
) -> list[MultiAgentEpisodeResult]:
    """Play each ``(index, seed)`` episode of a multi-agent env: every agent acts with the policy
    ``mapping`` gives it in that episode (self-play seats alternate with ``index``); a policy given
    as None acts uniformly at random among the allowed actions."""
    import torch

    from rl_app.envs.multi_agent import agent_spaces, make_multi_agent_env, random_action

    torch.set_num_threads(1)
    env = make_multi_agent_env(env_spec)
    spaces = agent_spaces(env)
    results = []
    try:
        for index, seed in episodes:
            obs, _ = env.reset(seed=seed)
            seats = {agent: mapping.policy_of(agent, index) for agent in spaces}
            for policy in {policies[p] for p in seats.values()} - {None}:
                policy.reset()
            returns = dict.fromkeys(spaces, 0.0)
            length, done, rng = 0, False, seed
            while not done:
                actions = {}
                for agent, observation in obs.items():
                    policy = policies[seats[agent]]
                    rng += 1
                    actions[agent] = (
                        random_action(spaces[agent][1], observation, seed=rng)
                        if policy is None
                        else policy.act(observation)
                    )
                obs, rewards, terminated, truncated, _ = env.step(actions)
                for agent, reward in rewards.items():
                    returns[str(agent)] += float(reward)
                length += 1
                done = bool(terminated.get("__all__") or truncated.get("__all__"))
            results.append(MultiAgentEpisodeResult(seed, sum(returns.values()), length, returns, seats))
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
    random_policies: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Evaluate the policy at ``location``; print and return the statistics, write ``eval.json``.

    Several agents: each agent acts with its trained policy, except that those in
    ``random_policies`` act at random (a learner measured against a random player)."""
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
    numbered = list(enumerate(range(seed, seed + episodes)))
    if info.policies is not None:
        if video:
            raise UserError("--video records one agent's env; this run has several agents")
        return _evaluate_multi_agent(
            checkpoint, info, env_spec, numbered, explore, random_policies, out_dir, console
        )
    if random_policies:
        raise UserError("--random-policy is for several agents' policies; this run has one")
    policy = load_policy(checkpoint, explore=explore)
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


def _evaluate_multi_agent(
    checkpoint: Path,
    info: Any,
    env_spec: EnvSection,
    numbered: list[tuple[int, int]],
    explore: bool,
    random_policies: tuple[str, ...],
    out_dir: Path,
    console: Console,
) -> dict[str, Any]:
    """:func:`evaluate` for a checkpoint of several agents' policies: returns per agent and policy,
    and each policy's wins (episodes where its return is above every other policy's)."""
    from rl_app.envs.multi_agent import MappingError, multi_agent_section, multi_agent_setup
    from rl_app.policy.module import load_policy

    names = list(info.policies)
    unknown = [p for p in random_policies if p not in names]
    if unknown:
        raise UserError(f"--random-policy {unknown[0]}: no such policy (allowed: {', '.join(names)})")
    experiment = checkpoint_experiment(checkpoint)
    section = multi_agent_section(experiment) if experiment is not None else None
    if section is None:
        raise UserError(f"checkpoint '{checkpoint}' has no experiment.yaml beside it to map its agents")
    try:
        mapping = multi_agent_setup(env_spec, section).mapping
    except MappingError as exc:
        raise UserError(f"checkpoint '{checkpoint}': {exc}") from None
    policies = {
        name: None if name in random_policies else load_policy(checkpoint, explore=explore, name=name)
        for name in names
    }
    randomly = f"; {', '.join(random_policies)} at random" if random_policies else ""
    console.print(
        f"Evaluating {checkpoint} ({info.algorithm} on {info.env}, policies {', '.join(names)}{randomly}): "
        f"{len(numbered)} episodes, {'sampled' if explore else 'deterministic'} actions"
    )
    results = run_multi_agent_episodes(policies, env_spec, mapping, numbered)
    per_policy = [r.policy_returns() for r in results]
    report: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "algorithm": info.algorithm,
        "env": info.env,
        "iteration": info.iteration,
        "episodes": len(numbered),
        "explore": explore,
        "random_policies": list(random_policies),
        "return": _stats([r.episode_return for r in results]),
        "episode_length": _stats([float(r.length) for r in results]),
        "agents": {a: _stats([r.agent_returns[a] for r in results]) for a in mapping.agents},
        "policies": {},
        "per_episode": [asdict(r) for r in results],
        "evaluated_at": datetime.now(UTC).isoformat(),
    }
    for name in names:
        played = [returns for returns in per_policy if name in returns]
        if not played:
            continue
        row: dict[str, Any] = {**_stats([returns[name] for returns in played]), "episodes": len(played)}
        if len(names) > 1:
            won = sum(all(r[name] > v for p, v in r.items() if p != name) for r in played)
            row["win_rate"] = won / len(played)
        report["policies"][name] = row
    write_json(out_dir / "eval.json", report)
    r = report["return"]
    console.print(f"return {r['mean']:.2f} ± {r['std']:.2f} (the sum over the agents)")
    for name, row in report["policies"].items():
        record = f", won {row['win_rate']:.0%} of {row['episodes']}" if "win_rate" in row else ""
        console.print(f"  policy {name}: return {row['mean']:.2f} ± {row['std']:.2f}{record}")
    console.print(f"Wrote {out_dir / 'eval.json'}")
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
