"""How the perf rows are measured and recorded: paired timings, rows with ratios and targets.

Paired measurements alternate their calls (A, B, A, B, ...) after one warm-up each and report medians, so a load
spike on a shared machine does not land on one side only. Process CPU time (all of this process's threads) hardly
depends on what other processes do, so its ratios are the steadier figure on a shared machine; wall-clock is what a
user waits. On CUDA every timed call ends with a synchronisation, so the time is the device's too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Target", "interleaved", "length_reward", "make_row", "rate_row", "ratio", "synchronizer", "zero_reward"]

#: A target on a row's ratio: ``(">=", 1.0)`` or ``("<=", 3.0)``.
Target = tuple[str, float]


def ratio(ours: float | None, baseline: float | None, higher_is_better: bool) -> float | None:
    """``ours / baseline`` for throughputs, ``baseline / ours`` for times (so above 1 is better for both), or
    ``None`` when a figure is missing or not positive."""
    if ours is None or baseline is None or ours <= 0 or baseline <= 0:
        return None
    return ours / baseline if higher_is_better else baseline / ours


def make_row(
    name: str,
    ours: float | None,
    baseline: float | None,
    unit: str,
    notes: str,
    higher_is_better: bool,
    cpu: tuple[float | None, float | None] | None = None,
    target: Target | None = None,
    slowdown: bool = False,
) -> dict:
    """One measurement: its figures, the ratio on wall-clock (and on process CPU time when ``cpu`` is given), and
    whether the ratio meets ``target``.

    :param name: What is measured against what.
    :param ours: Our figure.
    :param baseline: The baseline's figure.
    :param unit: The figures' unit.
    :param notes: The set-up.
    :param higher_is_better: Whether the unit is a throughput (else a time or a size).
    :param cpu: ``(ours, baseline)`` in process CPU time.
    :param target: The target on the ratio.
    :param slowdown: Report ``ours / baseline`` of a time (a cost factor, lower is better) instead of the speed-up.
    """
    if slowdown:
        wall = ratio(baseline, ours, higher_is_better)
        cpu_ratio = ratio(cpu[1], cpu[0], higher_is_better) if cpu is not None else None
    else:
        wall = ratio(ours, baseline, higher_is_better)
        cpu_ratio = ratio(*cpu, higher_is_better) if cpu is not None else None
    met = None
    if target is not None and wall is not None:
        op, value = target
        met = wall >= value if op == ">=" else wall <= value
    return {
        "name": name,
        "ours": ours,
        "baseline": baseline,
        "ratio": wall,
        "cpu_ratio": cpu_ratio,
        "unit": unit,
        "notes": notes,
        "target": None if target is None else f"{target[0]} {target[1]:g}x",
        "met": met,
    }


def rate_row(
    name: str,
    n: float | tuple[float, float],
    times: tuple[dict[Any, float], dict[Any, float]],
    keys: tuple[Any, Any],
    unit: str,
    notes: str,
    target: Target | None = None,
) -> dict:
    """A throughput row from :func:`interleaved`'s medians: ``n`` units of work per call, ours against the baseline.

    :param name: What is measured against what.
    :param n: Units of work (tokens, env steps) one timed call does, or ``(ours, baseline)`` where they differ.
    :param times: ``(wall, cpu)`` from :func:`interleaved`.
    :param keys: ``(ours, baseline)``: the timers' names.
    :param unit: The throughput's unit.
    :param notes: The set-up.
    :param target: The target on the ratio.
    """
    (wall, cpu), (ours, base) = times, keys
    n_ours, n_base = n if isinstance(n, tuple) else (n, n)
    return make_row(
        name,
        n_ours / wall[ours],
        n_base / wall[base],
        unit,
        notes,
        True,
        cpu=(n_ours / cpu[ours], n_base / cpu[base]),
        target=target,
    )


def synchronizer(device: Any) -> Callable[[], None]:
    """A function that waits for ``device``'s queued work (a no-op off CUDA; ``"auto"`` as everywhere)."""
    import torch as th

    from textrl_envs.devices import resolve_device

    dev = resolve_device(device)
    if dev.type == "cuda":
        return lambda: th.cuda.synchronize(dev)
    return lambda: None


def interleaved(
    timers: dict[Any, Callable[[], Any]], repeats: int, sync: Callable[[], None] | None = None
) -> tuple[dict[Any, float], dict[Any, float]]:
    """Median wall-clock and process-CPU seconds of each zero-argument callable, calls alternating.

    :param timers: ``{name: fn}``; each call does one unit of work.
    :param repeats: Timed calls per callable.
    :param sync: Called after every call (see :func:`synchronizer`).
    :return: ``({name: median wall seconds}, {name: median CPU seconds})``.
    """
    sync = sync or (lambda: None)
    for fn in timers.values():
        fn()
        sync()
    wall: dict[Any, list[float]] = {name: [] for name in timers}
    cpu: dict[Any, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, fn in timers.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            sync()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return (
        {name: statistics.median(v) for name, v in wall.items()},
        {name: statistics.median(v) for name, v in cpu.items()},
    )


def length_reward(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
    """Cheap reward (characters of the completion) so that env benchmarks time the env, not a reward model."""
    return [float(len(c)) for c in completions]


def zero_reward(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
    """A reward that costs nothing: the baseline of the reward-cost rows."""
    return [0.0] * len(completions)
