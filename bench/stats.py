"""The statistics every bench reports: medians with bootstrap 95 % intervals, paired ratios."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

RESAMPLES = 10_000


def median_interval(values: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """The median of ``values`` with a percentile-bootstrap 95 % interval (of the median), and n.

    With a handful of values the interval is close to their range: it says how little a median of
    three runs pins down, which is the point of printing it."""
    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        return {"median": None, "low": None, "high": None, "n": 0}
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(data, size=(RESAMPLES, len(data)), replace=True), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return {"median": float(statistics.median(data)), "low": float(low), "high": float(high), "n": len(data)}


def paired_ratio(ours: Sequence[float], theirs: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """Median of the per-seed ratios ours/theirs (both sides ran the same seeds), with its interval."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {**median_interval(ratios, seed), "per_seed": ratios}


def paired_difference(ours: Sequence[float], theirs: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """Median of the per-seed differences ours - theirs, with its interval (for returns that can be
    negative or near zero, where a ratio means nothing)."""
    differences = [a - b for a, b in zip(ours, theirs, strict=True)]
    return {**median_interval(differences, seed), "per_seed": differences}


def ratio_of_medians(ours: Sequence[float], theirs: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """median(ours) / median(theirs) for two unpaired samples (iterations of two runs), with a
    bootstrap 95 % interval: each side resampled on its own."""
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    rng = np.random.default_rng(seed)
    ratios = np.median(rng.choice(a, size=(RESAMPLES, len(a))), axis=1) / np.median(
        rng.choice(b, size=(RESAMPLES, len(b))), axis=1
    )
    low, high = np.percentile(ratios, [2.5, 97.5])
    ratio = statistics.median(a) / statistics.median(b)
    return {"median": float(ratio), "low": float(low), "high": float(high), "n": min(len(a), len(b))}


def interval_text(summary: dict[str, Any], digits: int = 1, suffix: str = "") -> str:
    """``median [low, high]`` as the bench's tables print it."""
    if summary.get("median") is None:
        return "n/a"
    f = f"{{:.{digits}f}}"
    median, low, high = (f.format(summary[k]) for k in ("median", "low", "high"))
    return f"{median}{suffix} [{low}, {high}]"
