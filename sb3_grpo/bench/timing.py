"""How ``sb3-grpo perf`` times and records a measurement: interleaved medians of wall-clock and CPU time, and rows."""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["interleaved", "ratio", "row"]


def ratio(ours: float | None, baseline: float | None, higher_is_better: bool) -> float | None:
    """``ours / baseline`` (throughputs) or ``baseline / ours`` (times); ``None`` when either is missing or <= 0."""
    if ours is None or baseline is None or ours <= 0 or baseline <= 0:
        return None
    return ours / baseline if higher_is_better else baseline / ours


def row(
    name: str,
    ours: float | None,
    baseline: float | None,
    unit: str,
    notes: str,
    higher_is_better: bool,
    cpu: tuple[float | None, float | None] | None = None,
) -> dict:
    """One measurement: wall-clock figures, and the same ratio on process CPU time when ``cpu`` is given."""
    return {
        "name": name,
        "ours": ours,
        "baseline": baseline,
        "ratio": ratio(ours, baseline, higher_is_better),
        "cpu_ratio": ratio(*cpu, higher_is_better) if cpu is not None else None,
        "unit": unit,
        "notes": notes,
    }


def interleaved(timers: dict[Any, Any], repeats: int) -> tuple[dict[Any, float], dict[Any, float]]:
    """Median wall-clock and process-CPU seconds of each zero-argument callable, calls alternating.

    Alternating (A, B, A, B, ...) after one warm-up call each, rather than timing A's repeats then B's, keeps a
    load spike on a shared machine from landing on one side of a comparison only. Process CPU time (all of this
    process's threads) hardly depends on what other processes do, so its ratios are the steadier figure on a
    shared machine; wall-clock is what a user waits.

    :param timers: ``{name: fn}``; each call does one unit of work.
    :param repeats: Timed calls per callable.
    :return: ``({name: median wall seconds}, {name: median CPU seconds})``.
    """
    for fn in timers.values():
        fn()
    wall: dict[Any, list[float]] = {name: [] for name in timers}
    cpu: dict[Any, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, fn in timers.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return (
        {name: statistics.median(v) for name, v in wall.items()},
        {name: statistics.median(v) for name, v in cpu.items()},
    )
