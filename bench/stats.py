"""Medians, percentiles and ratios, so every scenario reports figures the same way."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(value: float, base: float) -> float | None:
    """``value / base`` rounded for reports; None when either is missing."""
    if not base or value != value or base != base:
        return None
    return round(value / base, 3)
