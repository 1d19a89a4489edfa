"""Soak: a long `rl_app train` with a checkpoint every iteration, watched from outside.

    python bench/soak.py [--minutes 20] [--experiment ppo_cartpole]

Every 5 s it reads, with psutil, the resident memory (RSS) of the driver and of each Ray worker
process the run started (its remote env runners among them), their open file descriptors and
threads, and the size of the run folder. It writes bench/results/soak-<date>.json and
docs/soak-rss.png, prints each process's RSS slope (MB per hour) over the warm-up (from the first
minute) and over the steady state (the second half of the run), and exits 1 if the driver's or a
runner's memory grows by more than 20 MB per hour in the steady state, the checkpoints keep
growing, or descriptors keep climbing. The warm-up is not judged: glibc's heap settles over the
first ~1,250 iterations (bytes in use stay flat while the free chunks between them grow to a
plateau; docs/reliability.md has the trace), and the end of a run (final checkpoint, summary,
reward-curve plot) is not a leak either. The per-iteration records (progress.csv,
TensorBoard events, rl_app.log) grow by design and are reported as MB per hour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PLOT = REPO / "docs" / "soak-rss.png"
WARM_UP_S = 60  # imports and the first checkpoints
WIND_DOWN_S = 30  # the end of a run (final checkpoint, summary, reward-curve plot) is not either
MAX_SLOPE_MB_PER_H = 20.0


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``; checkpoints pruned while it walks count as gone."""
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(parent, name)).st_size
            except FileNotFoundError:
                continue
    return total


def role(process: psutil.Process) -> str:
    try:
        title = " ".join(process.cmdline())
    except psutil.Error:
        return "?"
    for marker in ("RLAppEnvRunner", "SingleAgentEnvRunner", "EnvRunner"):
        if marker in title:
            return "env runner"
    if "raylet" in title:
        return "raylet"
    if "gcs_server" in title:
        return "gcs"
    if "default_worker" in title or title.startswith("ray::"):
        return "ray worker"
    return process.name()


def sample(driver: psutil.Process) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for process in [driver, *driver.children(recursive=True)]:
        try:
            with process.oneshot():
                rows[str(process.pid)] = {
                    "role": "driver" if process.pid == driver.pid else role(process),
                    "rss_mb": process.memory_info().rss / 2**20,
                    "fds": process.num_fds(),
                    "threads": process.num_threads(),
                }
        except psutil.Error:
            continue
    return rows


def slope_per_hour(times: list[float], values: list[float], start: float, end: float) -> float:
    """The least-squares slope of ``values`` per hour, from ``start`` to ``end - WIND_DOWN_S``."""
    kept = [(t, v) for t, v in zip(times, values, strict=True) if start <= t <= end - WIND_DOWN_S]
    if len(kept) < 3:
        return float("nan")
    t, v = np.array(kept).T
    return float(np.polyfit(t / 3600.0, v, 1)[0])


def plot(samples: list[dict[str, Any]], steady_from_s: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (memory, disk) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    pids = sorted({pid for s in samples for pid in s["processes"]})
    for pid in pids:
        points = [(s["t"] / 60, s["processes"][pid]) for s in samples if pid in s["processes"]]
        name = points[-1][1]["role"]  # a worker is "ray::IDLE" until it becomes an actor
        if name not in ("driver", "env runner", "ray worker"):
            continue
        memory.plot([t for t, _ in points], [p["rss_mb"] for _, p in points], label=f"{name} {pid}")
    memory.axvspan(steady_from_s / 60, samples[-1]["t"] / 60, color="0.92", label="steady state (judged)")
    memory.set_ylabel("RSS (MB)")
    memory.set_title("rl_app train, checkpoint every iteration, keep 3")
    memory.legend(fontsize=7, loc="lower right")
    minutes = [s["t"] / 60 for s in samples]
    disk.plot(minutes, [s["checkpoints_mb"] for s in samples], label="checkpoints/ (keep 3)")
    disk.plot(minutes, [s["records_mb"] for s in samples], label="progress.csv, TensorBoard, log")
    disk.set_ylabel("MB on disk")
    disk.legend(fontsize=8, loc="upper left")
    disk.set_xlabel("minutes")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--experiment", default="ppo_cartpole")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runs:
        command = [
            sys.executable, "-m", "rl_app", "train", args.experiment, "--runs-dir", runs,
            "--set", f"stop.time_s={args.minutes * 60:g}", "--set", "stop.timesteps=1000000000",
            "--set", "stop.return=null", "--set", "checkpoint.every=1", "--set", "checkpoint.keep=3",
            "--set", "env_runners.num_env_runners=1", "--set", "evaluation.interval=10",
        ]  # fmt: skip
        env = {**os.environ, "RL_APP_EXPERIMENTS_DIR": str(REPO / "experiments")}
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        driver = psutil.Process(process.pid)
        began, samples = time.monotonic(), []
        try:
            while process.poll() is None:
                run_dirs = list(Path(runs).glob(f"{args.experiment}/*"))
                try:
                    processes = sample(driver)
                except psutil.Error:
                    break
                total = folder_bytes(run_dirs[0]) / 2**20 if run_dirs else 0.0
                checkpoints = folder_bytes(run_dirs[0] / "checkpoints") / 2**20 if run_dirs else 0.0
                samples.append(
                    {
                        "t": time.monotonic() - began,
                        "processes": processes,
                        "run_dir_mb": total,
                        "checkpoints_mb": checkpoints,
                        # progress.csv, TensorBoard events, rl_app.log: a row per iteration, by design
                        "records_mb": total - checkpoints,
                    }
                )
                time.sleep(5)
        finally:
            if process.poll() is None:  # the soak itself failed: do not leave the run behind
                process.terminate()
        returncode = process.wait()
    times = [s["t"] for s in samples]
    steady_from = args.minutes * 60 / 2
    report: dict[str, Any] = {
        "minutes": args.minutes,
        "returncode": returncode,
        "steady_state_from_s": steady_from,
        "slopes_mb_per_h": {},
    }
    failures = []
    for pid in sorted({pid for s in samples for pid in s["processes"]}):
        points = [(s["t"], s["processes"][pid]) for s in samples if pid in s["processes"]]
        name = points[-1][1]["role"]  # a worker is "ray::IDLE" until it becomes an actor
        if points[-1][0] - points[0][0] < args.minutes * 60 / 2:
            continue  # short-lived helper processes
        point_times, rss = [t for t, _ in points], [p["rss_mb"] for _, p in points]
        warm_up_slope = slope_per_hour(point_times, rss, WARM_UP_S, steady_from + WIND_DOWN_S)
        slope = slope_per_hour(point_times, rss, steady_from, times[-1])
        steady_points = [p for t, p in points if WARM_UP_S <= t <= times[-1] - WIND_DOWN_S]
        fds = [p["fds"] for p in steady_points]
        threads = [p["threads"] for p in steady_points]
        report["slopes_mb_per_h"][f"{name} {pid}"] = {
            "rss_slope_mb_per_h": slope,
            "rss_warm_up_slope_mb_per_h": warm_up_slope,
            "rss_first_mb": points[0][1]["rss_mb"],
            "rss_last_mb": points[-1][1]["rss_mb"],
            "fds_after_warm_up": [min(fds, default=0), max(fds, default=0)],
            "threads_after_warm_up": [min(threads, default=0), max(threads, default=0)],
        }
        print(
            f"{name:10s} {pid:>7}: RSS {points[0][1]['rss_mb']:.0f} -> {points[-1][1]['rss_mb']:.0f} MB, "
            f"slope {warm_up_slope:+.1f} MB/h warming up, {slope:+.1f} MB/h steady; "
            f"fds {min(fds, default=0)}-{max(fds, default=0)}, "
            f"threads {min(threads, default=0)}-{max(threads, default=0)}"
        )
        if name in ("driver", "env runner") and slope > MAX_SLOPE_MB_PER_H:
            failures.append(f"{name} {pid} grows {slope:.1f} MB/h")
        if fds and fds[-1] > min(fds) + 20:
            failures.append(f"{name} {pid} descriptors climb {min(fds)} -> {fds[-1]}")
    steady = [s for s in samples if WARM_UP_S <= s["t"] <= times[-1] - WIND_DOWN_S]
    checkpoints = [s["checkpoints_mb"] for s in steady]
    records_slope = slope_per_hour(times, [s["records_mb"] for s in samples], WARM_UP_S, times[-1])
    report["disk"] = {
        "checkpoints_mb": [min(checkpoints, default=0), max(checkpoints, default=0)],
        "records_mb_per_h": records_slope,
        "run_dir_mb_at_end": samples[-1]["run_dir_mb"] if samples else 0,
    }
    print(
        f"checkpoints: {min(checkpoints, default=0):.2f}-{max(checkpoints, default=0):.2f} MB after warm-up "
        f"(keep 3); records (progress.csv, TensorBoard, log) grow {records_slope:.1f} MB/h"
    )
    if checkpoints and max(checkpoints) > 2 * min(checkpoints) + 1:
        failures.append(f"checkpoints grow {min(checkpoints):.2f} -> {max(checkpoints):.2f} MB")
    report["samples"] = samples
    report["failures"] = failures
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"soak-{date.today().isoformat()}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    plot(samples, steady_from, PLOT)
    print(f"wrote {out} and {PLOT}")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures or returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
