"""Sampling speed of the expensive envs (make bench-env-speed, part of make bench): env steps/s on
this machine's cores, raw and under the runners, sampling on the driver as the experiment trains.

Pong (``ppo_pong``, the ``atari`` preset), per width (the shipped 8 envs, and 32), each round in turn:
- the Python path raw, random actions: ``SyncVectorEnv`` in this process and ``AsyncVectorEnv``
  (a subprocess per env, shared memory), the better of the two being the Python ceiling;
- ale-py's native ``AtariVectorEnv`` raw, random actions, in the threads a runner gets (the plan's
  ``env_threads``);
- the experiment's CNN acting: rl_app's runner on the Python path (``vectorize: sync``), rl_app's
  runner on the native env, RLlib's runner on it.

HalfCheetah (``ppo_halfcheetah``, RLlib's MeanStdFilter connector), its 8 envs: the raw
``SyncVectorEnv`` (MuJoCo has no vector env of its own), rl_app's runner (the filter applied per
vector step), RLlib's runner.

Targets (issue 39, fixed before the runs): Pong, at each width, rl_app's runner on the native env at
least 2x the Python ceiling and at least 70 % of the native env's raw rate; HalfCheetah, rl_app's
runner at least 50 % of the raw vector env. Ratios are paired by round; medians with bootstrap 95 %
intervals.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_experiment_algo, write_results
from stats import interval_text, median_interval, paired_ratio

EXPERIMENT = "ppo_pong"
WIDTHS = (8, 32)
TARGETS = {"native_sampler_vs_python_ceiling": 2.0, "native_sampler_vs_native_raw": 0.70}
FILTERED = "ppo_halfcheetah"
FILTERED_TARGET = 0.50
SAMPLERS = {
    "rl_app_python": ["env_runners.vectorize=sync"],
    "rl_app_native": [],
    "rllib_native": ["env_runners.runner=rllib"],
}


def raw_rate(envs: Any, steps: int) -> float:
    envs.reset(seed=0)
    envs.action_space.seed(0)
    for _ in range(4):  # warm-up
        envs.step(envs.action_space.sample())
    began = time.perf_counter()
    for _ in range(steps // envs.num_envs):
        envs.step(envs.action_space.sample())
    rate = (steps // envs.num_envs) * envs.num_envs / (time.perf_counter() - began)
    envs.close()
    return rate


def raw_rates(width: int, steps: int, threads: int) -> dict[str, float]:
    import gymnasium

    from rl_app.config import load_experiment
    from rl_app.envs import make_env, make_native_vector_env

    env = load_experiment(EXPERIMENT).config.env
    makers = [functools.partial(make_env, env)] * width
    return {
        "python_sync": raw_rate(gymnasium.vector.SyncVectorEnv(makers), steps),
        # Gymnasium's one async form: a subprocess per env, frames through shared memory; spawned,
        # as this process has Ray's and torch's threads.
        "python_async": raw_rate(
            gymnasium.vector.AsyncVectorEnv(makers, shared_memory=True, context="spawn"), steps
        ),
        "native": raw_rate(make_native_vector_env(env, width, threads=threads), steps),
    }


def sampler_rate(experiment: str, overrides: list[str], width: int, steps: int) -> float:
    """Env steps/s of the experiment's runner on the driver, its model acting (no learning)."""
    algo = build_experiment_algo(
        experiment,
        [
            "env_runners.num_env_runners=0",
            "evaluation.interval=0",
            f"env_runners.num_envs_per_env_runner={width}",
            *overrides,
        ],
        len(os.sched_getaffinity(0)),
        0,
    )
    try:
        runner = algo.env_runner
        runner.sample(num_timesteps=width * 20, random_actions=False)  # warm-up
        began = time.perf_counter()
        sampled = sum(len(e) for e in runner.sample(num_timesteps=steps, random_actions=False))
        return sampled / (time.perf_counter() - began)
    finally:
        algo.stop()


def measure(rounds: int, steps: int) -> dict[str, Any]:
    import ray

    from rl_app.cluster.resources import plan_resources
    from rl_app.cluster.session import shutdown_ray
    from rl_app.config import load_experiment

    cores = len(os.sched_getaffinity(0))
    widths: dict[str, Any] = {}
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    try:
        for width in WIDTHS:
            config = load_experiment(EXPERIMENT, [f"env_runners.num_envs_per_env_runner={width}"]).config
            threads = plan_resources(config, cores, 0).env_threads
            rows: list[dict[str, float]] = []
            for round_ in range(rounds):
                row = raw_rates(width, steps, threads)
                for name, overrides in SAMPLERS.items():
                    row[name] = sampler_rate(EXPERIMENT, overrides, width, steps)
                row["python_ceiling"] = max(row["python_sync"], row["python_async"])
                rates = ", ".join(f"{k} {v:,.0f}" for k, v in row.items())
                print(f"{width} envs, round {round_ + 1}: {rates}", flush=True)
                rows.append(row)
            series = {key: [r[key] for r in rows] for key in rows[0]}
            vs_ceiling = paired_ratio(series["rl_app_native"], series["python_ceiling"])
            vs_raw = paired_ratio(series["rl_app_native"], series["native"])
            widths[str(width)] = {
                "env_threads": threads,
                "rounds": rows,
                "steps_per_s": {key: median_interval(values) for key, values in series.items()},
                "native_sampler_vs_python_ceiling": vs_ceiling,
                "native_sampler_vs_native_raw": vs_raw,
                "native_sampler_vs_python_sampler": paired_ratio(
                    series["rl_app_native"], series["rl_app_python"]
                ),
                "rl_app_vs_rllib_on_native": paired_ratio(series["rl_app_native"], series["rllib_native"]),
                "met": {
                    key: ratio["median"] >= TARGETS[key]
                    for key, ratio in (
                        ("native_sampler_vs_python_ceiling", vs_ceiling),
                        ("native_sampler_vs_native_raw", vs_raw),
                    )
                },
            }
        filtered = measure_filtered(rounds, steps)
    finally:
        shutdown_ray(local=True)
    return {"pong": widths, "halfcheetah": filtered}


def measure_filtered(rounds: int, steps: int) -> dict[str, Any]:
    """HalfCheetah with RLlib's MeanStdFilter: the raw vector env against both runners."""
    import gymnasium

    from rl_app.config import load_experiment
    from rl_app.envs import make_env
    from rl_app.rllib.accel import plan_acceleration

    config = load_experiment(FILTERED).config
    width = config.env_runners.num_envs_per_env_runner
    assert plan_acceleration(config).uses("runner"), "ppo_halfcheetah must sample with rl_app's runner"
    rows = []
    for round_ in range(rounds):
        makers = [functools.partial(make_env, config.env)] * width
        row = {
            "raw": raw_rate(gymnasium.vector.SyncVectorEnv(makers), steps),
            "rl_app": sampler_rate(FILTERED, [], width, steps),
            "rllib": sampler_rate(FILTERED, ["env_runners.runner=rllib"], width, steps),
        }
        print(
            f"{FILTERED}, round {round_ + 1}: " + ", ".join(f"{k} {v:,.0f}" for k, v in row.items()),
            flush=True,
        )
        rows.append(row)
    series = {key: [r[key] for r in rows] for key in rows[0]}
    vs_raw = paired_ratio(series["rl_app"], series["raw"])
    return {
        "num_envs": width,
        "rounds": rows,
        "steps_per_s": {key: median_interval(values) for key, values in series.items()},
        "rl_app_vs_raw": vs_raw,
        "rllib_vs_raw": paired_ratio(series["rllib"], series["raw"]),
        "rl_app_vs_rllib": paired_ratio(series["rl_app"], series["rllib"]),
        "met": vs_raw["median"] >= FILTERED_TARGET,
    }


LABELS = {
    "python_sync": "Python path raw, SyncVectorEnv (1 process)",
    "python_async": "Python path raw, AsyncVectorEnv (a process per env)",
    "native": "ale-py AtariVectorEnv raw",
    "rl_app_python": "rl_app's runner, Python path",
    "rl_app_native": "rl_app's runner, native env",
    "rllib_native": "RLlib's runner, native env",
}


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Sampling speed of the expensive envs, {results['date']}",
        "",
        f"`{EXPERIMENT}`'s env (ALE/Pong-v5, the `atari` preset) on {results['cores']} cores, "
        f"{results['rounds']} rounds of {results['steps']:,} env steps per measure; the runners sample on "
        "the driver with the experiment's CNN acting. Medians with bootstrap 95 % intervals; ratios paired "
        "by round. Targets, fixed before the runs: rl_app's runner on the native env >= "
        f"{TARGETS['native_sampler_vs_python_ceiling']:g}x the Python ceiling (the better raw Python "
        f"vector env) and >= {TARGETS['native_sampler_vs_native_raw']:.0%} of the native env's raw rate.",
        "",
    ]
    for width, case in results["envs"]["pong"].items():
        lines += [
            f"## Pong, {width} envs ({case['env_threads']} ale-py threads)",
            "",
            "| measure | env steps/s |",
            "|---|---|",
        ]
        for key, label in LABELS.items():
            lines.append(f"| {label} | {interval_text(case['steps_per_s'][key], 0)} |")
        lines += [
            "",
            "| ratio | median [95 % interval] | target | met |",
            "|---|---|---|---|",
            f"| rl_app's runner on the native env / the Python ceiling | "
            f"{interval_text(case['native_sampler_vs_python_ceiling'], 2, '×')} | "
            f">= {TARGETS['native_sampler_vs_python_ceiling']:g}× | "
            f"{'yes' if case['met']['native_sampler_vs_python_ceiling'] else 'no'} |",
            f"| rl_app's runner on the native env / the native env raw | "
            f"{interval_text(case['native_sampler_vs_native_raw'], 2, '×')} | "
            f">= {TARGETS['native_sampler_vs_native_raw']:g}× | "
            f"{'yes' if case['met']['native_sampler_vs_native_raw'] else 'no'} |",
            f"| rl_app's runner, native env / Python path | "
            f"{interval_text(case['native_sampler_vs_python_sampler'], 2, '×')} | | |",
            f"| rl_app's runner / RLlib's runner, native env | "
            f"{interval_text(case['rl_app_vs_rllib_on_native'], 2, '×')} | | |",
            "",
        ]
    case = results["envs"]["halfcheetah"]
    rates = case["steps_per_s"]
    lines += [
        f"## HalfCheetah with RLlib's MeanStdFilter, {case['num_envs']} envs",
        "",
        f"`{FILTERED}` as shipped; the raw env is gymnasium's SyncVectorEnv with random actions. Target, "
        f"fixed before the run: rl_app's runner >= {FILTERED_TARGET:.0%} of the raw vector env.",
        "",
        "| measure | env steps/s |",
        "|---|---|",
        f"| raw SyncVectorEnv | {interval_text(rates['raw'], 0)} |",
        f"| rl_app's runner (the filter per vector step) | {interval_text(rates['rl_app'], 0)} |",
        f"| RLlib's runner (its MeanStdFilter connector) | {interval_text(rates['rllib'], 0)} |",
        "",
        "| ratio | median [95 % interval] | target | met |",
        "|---|---|---|---|",
        f"| rl_app's runner / raw | {interval_text(case['rl_app_vs_raw'], 2, '×')} | "
        f">= {FILTERED_TARGET:g}× | {'yes' if case['met'] else 'no'} |",
        f"| RLlib's runner / raw | {interval_text(case['rllib_vs_raw'], 2, '×')} | | |",
        f"| rl_app's runner / RLlib's runner | {interval_text(case['rl_app_vs_rllib'], 2, '×')} | | |",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8_000, help="env steps per measure")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    measured = measure(args.rounds, args.steps)
    results = {
        "date": stamp,
        "experiment": EXPERIMENT,
        "cores": len(os.sched_getaffinity(0)),
        "rounds": args.rounds,
        "steps": args.steps,
        "targets": {**TARGETS, "filtered_sampler_vs_raw": FILTERED_TARGET},
        "envs": measured,
    }
    write_results(f"env-speed-{stamp}", results, markdown(results))


if __name__ == "__main__":
    main()
