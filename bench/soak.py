"""Soak: a long `rl_app train` with a checkpoint every iteration, watched from outside.

    python bench/soak.py [--minutes 10] [--experiment ppo_cartpole]

Every 5 s it reads, with psutil, the resident memory (RSS) of the driver and of each Ray worker
process the run started (its remote env runners among them), their open file descriptors and
threads, and the size of the run folder. It writes bench/results/soak-<date>.json and
docs/soak-rss.png, prints each process's RSS slope after the first minute (MB per hour) and
exits 1 if the driver's or a runner's memory grows by more than 20 MB per hour, the run folder
keeps growing, or descriptors or threads keep climbing.
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
WARM_UP_S = 60  # imports, the first checkpoints and the buffers filling are not a leak
MAX_SLOPE_MB_PER_H = 20.0


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


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


def slope_per_hour(times: list[float], values: list[float]) -> float:
    kept = [(t, v) for t, v in zip(times, values, strict=True) if t >= WARM_UP_S]
    if len(kept) < 3:
        return float("nan")
    t, v = np.array(kept).T
    return float(np.polyfit(t / 3600.0, v, 1)[0])


def plot(samples: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (memory, disk) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    pids = sorted({pid for s in samples for pid in s["processes"]})
    for pid in pids:
        points = [(s["t"] / 60, s["processes"][pid]) for s in samples if pid in s["processes"]]
        name = points[0][1]["role"]
        if name not in ("driver", "env runner", "ray worker"):
            continue
        memory.plot([t for t, _ in points], [p["rss_mb"] for _, p in points], label=f"{name} {pid}")
    memory.set_ylabel("RSS (MB)")
    memory.set_title("rl_app train, checkpoint every iteration, keep 3")
    memory.legend(fontsize=7, loc="lower right")
    disk.plot([s["t"] / 60 for s in samples], [s["run_dir_mb"] for s in samples])
    disk.set_ylabel("run folder (MB)")
    disk.set_xlabel("minutes")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
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
        while process.poll() is None:
            run_dirs = list(Path(runs).glob(f"{args.experiment}/*"))
            try:
                processes = sample(driver)
            except psutil.Error:
                break
            samples.append(
                {
                    "t": time.monotonic() - began,
                    "processes": processes,
                    "run_dir_mb": folder_bytes(run_dirs[0]) / 2**20 if run_dirs else 0.0,
                }
            )
            time.sleep(5)
        returncode = process.wait()
    report: dict[str, Any] = {"minutes": args.minutes, "returncode": returncode, "slopes_mb_per_h": {}}
    failures = []
    for pid in sorted({pid for s in samples for pid in s["processes"]}):
        points = [(s["t"], s["processes"][pid]) for s in samples if pid in s["processes"]]
        name = points[0][1]["role"]
        if points[-1][0] - points[0][0] < args.minutes * 60 / 2:
            continue  # short-lived helper processes
        slope = slope_per_hour([t for t, _ in points], [p["rss_mb"] for _, p in points])
        fds = [p["fds"] for _, p in points if _ >= WARM_UP_S]
        threads = [p["threads"] for _, p in points if _ >= WARM_UP_S]
        report["slopes_mb_per_h"][f"{name} {pid}"] = {
            "rss_slope_mb_per_h": slope,
            "rss_first_mb": points[0][1]["rss_mb"],
            "rss_last_mb": points[-1][1]["rss_mb"],
            "fds_after_warm_up": [min(fds, default=0), max(fds, default=0)],
            "threads_after_warm_up": [min(threads, default=0), max(threads, default=0)],
        }
        print(
            f"{name:10s} {pid:>7}: RSS {points[0][1]['rss_mb']:.0f} -> {points[-1][1]['rss_mb']:.0f} MB, "
            f"slope after {WARM_UP_S} s {slope:+.1f} MB/h; fds {min(fds, default=0)}-{max(fds, default=0)}, "
            f"threads {min(threads, default=0)}-{max(threads, default=0)}"
        )
        if name in ("driver", "env runner") and slope > MAX_SLOPE_MB_PER_H:
            failures.append(f"{name} {pid} grows {slope:.1f} MB/h")
        if fds and fds[-1] > min(fds) + 20:
            failures.append(f"{name} {pid} descriptors climb {min(fds)} -> {fds[-1]}")
    disk = [s["run_dir_mb"] for s in samples if s["t"] >= WARM_UP_S]
    report["run_dir_mb"] = {"after_warm_up_max": max(disk, default=0), "last": disk[-1] if disk else 0}
    last_mb = disk[-1] if disk else 0.0
    print(f"run folder: at most {max(disk, default=0):.1f} MB after warm-up, {last_mb:.1f} MB at the end")
    if disk and max(disk) > 2 * min(disk) + 5:
        failures.append(f"run folder grows {min(disk):.1f} -> {max(disk):.1f} MB")
    report["samples"] = samples
    report["failures"] = failures
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"soak-{date.today().isoformat()}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    plot(samples, PLOT)
    print(f"wrote {out} and {PLOT}")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures or returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
