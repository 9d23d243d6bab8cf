"""The research lab of textrl, outside the library: throughput (``perf``), the claims study (``claims``), the
comparisons with TRL (``trl``) and the studies behind the README's figures.

Run it as ``textrl-bench <command>`` or ``python -m benchmarks <command>`` (:mod:`benchmarks.cli` lists them); the
studies are also modules, ``python -m benchmarks.<module>``. The library (``sb3_grpo``, ``textrl_envs``) never
imports this package. Commands that measure figures for the docs write their results pages into
:data:`RESULTS_DIR` (through :func:`sb3_grpo.compare.pages.write_results_page`); nothing else writes there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Where the results pages of the docs live: ``docs/results/`` of the checkout these benchmarks run from.
RESULTS_DIR = Path(__file__).resolve().parents[1] / "docs" / "results"


def changed_settings(recorded: Mapping[str, Any], asked: Mapping[str, Any]) -> list[str]:
    """The settings a resumed study asks for that differ from those its kept runs used, as the options that would
    restore them: ``["--timesteps 64 (not 128)", ...]`` (empty: nothing changed).

    :param recorded: The settings the kept runs were made with, by argparse name (``n_envs``).
    :param asked: The settings of this command, by the same names.
    """
    return [f"--{name.replace('_', '-')} {recorded.get(name)!r} (not {value!r})" for name, value in asked.items()
            if recorded.get(name) != value]  # fmt: skip
