"""Results pages: a Markdown page of measured figures, starting with a stamp that says how they were made.

The stamp names the command line, the git commit of the checkout the code ran from (short hash, ``unknown``
outside a git checkout, ``+dirty`` when tracked files have changes), the hardware (CPU model and cores, the GPU
if any, the torch version) and the UTC date. ``sb3-grpo compare --results-page PATH`` writes one, and so do the
commands of the benchmarks (``textrl-bench perf``, ``claims``, ``trl``) into ``docs/results/``: those pages are
only ever written by the command that measured them.

The page is written atomically (a temporary file in the same folder, then :func:`os.replace`), so a failed write
leaves the previous page as it was.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sb3_grpo.compare.results import git_commit
from sb3_grpo.file_io import atomic_write

__all__ = ["git_commit", "hardware_summary", "results_stamp", "write_results_page"]


def hardware_summary(info: dict[str, Any] | None = None) -> str:
    """One line: CPU model and usable cores, the GPU (or "no GPU") and the torch version.

    :param info: :func:`sb3_grpo.compare.results.environment_info` output (default: measured now).
    """
    if info is None:
        from sb3_grpo.compare.results import environment_info

        info = environment_info("cpu")
    hw, versions = info["hardware"], info["versions"]
    gpu = hw.get("gpu") or "no GPU"
    return f"{hw.get('cpu')}, {hw.get('usable_cpus')} of {hw.get('cpu_count')} cores; {gpu}; torch {versions['torch']}"


def results_stamp(
    command: str,
    root: str | os.PathLike | None = None,
    info: dict[str, Any] | None = None,
    commit: str | None = None,
) -> str:
    """The stamp a results page starts with (Markdown lines: command, commit, hardware, UTC date).

    :param command: The command line that produced the figures.
    :param root: A folder in the git checkout (default: the one the library runs from).
    :param info: :func:`sb3_grpo.compare.results.environment_info` output (default: measured now).
    :param commit: The commit line's text (default: the checkout's commit now, in backquotes); a page written later
        from a run's records gives the commit the run recorded when it started.
    """
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit = f"`{git_commit(root)}`" if commit is None else commit
    return f"- Command: `{command}`\n- Commit: {commit}\n- Hardware: {hardware_summary(info)}\n- Date: {date}\n"


def write_results_page(
    path: str | os.PathLike,
    title: str,
    body_markdown: str,
    command: str,
    root: str | os.PathLike | None = None,
    info: dict[str, Any] | None = None,
    commit: str | None = None,
) -> Path:
    """Write a results page atomically: ``# title``, the stamp (:func:`results_stamp`), then ``body_markdown``.

    :param path: The page (its folder is created).
    :param title: The page's title.
    :param body_markdown: The figures (tables, notes) as Markdown.
    :param command: The command line that produced them.
    :param root: A folder in the git checkout whose commit is stamped (default: the one the library runs from).
    :param info: :func:`sb3_grpo.compare.results.environment_info` output (default: measured now).
    :param commit: The commit line's text (see :func:`results_stamp`).
    :return: The page's path.
    :raises ValueError: for an empty title or command.
    """
    if not title.strip():
        raise ValueError("write_results_page: title is empty; give the page a title, e.g. 'Throughput'")
    if not command.strip():
        raise ValueError("write_results_page: command is empty; give the command line that made the figures")
    text = f"# {title}\n\n{results_stamp(command, root, info, commit)}\n{body_markdown.rstrip()}\n"

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)
    return Path(path)
