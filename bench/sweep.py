"""Does the shipped sweep find a configuration at least as good as the hand-tuned experiment?

    python bench/sweep.py [SWEEP_EXP]      (default: ppo_cartpole_sweep)

Runs the sweep as shipped, then trains the experiment it extends (the hand-tuned one)
under the same protocol: the sweep's per-trial stop rule and evaluation interval,
judged by the same metric.
Writes bench/results/sweep-<date>.json; exits 1 if the sweep's best is worse.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

from rl_app.config import load_experiment
from rl_app.config.loader import experiment_path
from rl_app.config.sweep import metric_name
from rl_app.sweep.run import run_sweep
from rl_app.training.run import train

RESULTS = Path(__file__).resolve().parent / "results"


def main(name: str) -> int:
    experiment = load_experiment(name).config
    base = yaml.safe_load(experiment_path(name).read_text()).get("extends")
    if base is None:
        raise SystemExit(f"{name} does not extend a hand-tuned experiment to compare with")
    sweep_stop = experiment.sweep.stop or experiment.stop
    metric = metric_name(experiment)
    with tempfile.TemporaryDirectory() as runs_root:
        began = time.monotonic()
        summary = run_sweep(name, runs_root=Path(runs_root))
        sweep_wall_s = time.monotonic() - began
        assert summary.best is not None
        protocol = [
            f"stop={json.dumps(sweep_stop.model_dump(by_alias=True, exclude_none=True))}",
            f"evaluation.interval={experiment.evaluation.interval}",
        ]
        baseline = train(base, protocol, runs_root=Path(runs_root))
        rows = (baseline.run_dir / "progress.csv").read_text().splitlines()
    header, last = rows[0].split(","), rows[-1].split(",")
    column = "eval_return_mean" if metric == "eval_return" else "return_mean"
    evaluated = [float(r.split(",")[header.index(column)] or "nan") for r in rows[1:]]
    baseline_score = next((v for v in reversed(evaluated) if not math.isnan(v)), math.nan)
    figures = {
        "sweep": name,
        "baseline": base,
        "metric": metric,
        "trial_stop": sweep_stop.model_dump(by_alias=True, exclude_none=True),
        "trials": len(summary.trials),
        "sweep_wall_s": round(sweep_wall_s, 1),
        "best_score": summary.best.score,
        "best_values": summary.best.values,
        "baseline_score": baseline_score,
        "baseline_timesteps": int(last[header.index("timesteps")]),
        "at_least_as_good": summary.best.score >= baseline_score,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"sweep-{date.today().isoformat()}.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(
        f"{name}: best {metric} {figures['best_score']:.1f} over {figures['trials']} trials "
        f"({figures['sweep_wall_s']:.0f} s) vs hand-tuned {base} {baseline_score:.1f}: "
        f"{'ok' if figures['at_least_as_good'] else 'WORSE'}"
    )
    print(f"wrote {out}")
    return 0 if figures["at_least_as_good"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "ppo_cartpole_sweep"))
