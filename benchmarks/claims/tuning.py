"""The claims study's tuning: the same budget of trials for every algorithm, drawn from a documented grid.

Each algorithm gets ``n`` trials. Trial 0 is its defaults (the shared text defaults plus its own), so tuning can
only help it on the tuning seeds; trials ``1 .. n-1`` are drawn without replacement from the product of its grid
(:data:`SEARCH_SPACE`: the common knobs, plus GRPO's own) by a NumPy generator seeded with :data:`TUNING_SEED`,
a random search in the sense of Bergstra and Bengio (JMLR 2012), which on a budget this small finds as good a
configuration as a grid would and can spend every trial on a different value of every knob. Each trial is trained
on the tuning seeds (disjoint from the evaluation seeds) and scored by the mean of their final evaluation rewards;
the best trial (the first, on ties) is the algorithm's configuration for the evaluation runs. Every trial, its
configuration and its score are written to ``results.json`` and listed in ``claims.md``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

__all__ = ["SEARCH_SPACE", "TUNING_SEED", "best_trial", "trial_configs"]

#: Seed of the draw of the trials (the same draw for every study, so every budget tunes on a prefix of it).
TUNING_SEED = 20240917

#: The grid per algorithm: the knobs the issue names (learning rate, clip, entropy coefficient) for every
#: algorithm, and GRPO's own (``grad_var_coef``, ``explore_alpha``, the ``adaptive_clip`` scales).
_COMMON: dict[str, list[Any]] = {
    "learning_rate": [1e-4, 3e-4, 1e-3],
    "clip_range": [0.1, 0.2, 0.3],
    "ent_coef": [0.0, 0.01],
}
SEARCH_SPACE: dict[str, dict[str, list[Any]]] = {
    "ppo": dict(_COMMON),
    "grpo": {
        **_COMMON,
        "grad_var_coef": [0.001, 0.01, 0.1],
        "explore_alpha": [0.0, 0.02, 0.05],
        "adaptive_clip": [[1.1, 0.9], [1.25, 0.75], [1.0, 1.0]],
    },
}


def trial_configs(algo: str, n_trials: int) -> list[dict[str, Any]]:
    """The overrides of each of ``n_trials`` trials of ``algo`` (trial 0: ``{}``, the defaults).

    :param algo: A key of :data:`SEARCH_SPACE`.
    :param n_trials: Trials (>= 1); at most the grid's size plus one.
    :return: One dict of constructor overrides per trial.
    """
    if algo not in SEARCH_SPACE:
        raise ValueError(f"no search space for {algo!r}; tunable: {', '.join(SEARCH_SPACE)}")
    space = SEARCH_SPACE[algo]
    names = list(space)
    grid = list(itertools.product(*(space[k] for k in names)))
    if not 1 <= n_trials <= len(grid) + 1:
        raise ValueError(f"n_trials must be in [1, {len(grid) + 1}] for {algo}, got {n_trials}")
    order = np.random.default_rng(TUNING_SEED).permutation(len(grid))[: n_trials - 1]
    return [{}] + [dict(zip(names, grid[i])) for i in order]


def best_trial(scores: list[float | None]) -> int | None:
    """Index of the best score (the first on ties; trials without a score are skipped; ``None`` if none has one)."""
    best, index = None, None
    for i, score in enumerate(scores):
        if score is not None and np.isfinite(score) and (best is None or score > best):
            best, index = score, i
    return index
