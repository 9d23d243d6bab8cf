"""Unit tests in the sandbox: the reward of code generation."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from textrl_envs.rewards.base import RewardModel
from textrl_envs.rewards.registry import register_reward

__all__ = ["STOP_SEQUENCES", "UnitTests", "program_of"]

#: Where a continuation of a function stops being its body (HumanEval's stop sequences, Chen et al. 2021).
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", flags=re.S)


def program_of(completion: str, code_prefix: str | None, entry_point: str) -> str:
    """The program a completion stands for.

    A completion with a fenced code block (a chat model's answer) is that block, or the prefix then the block when
    the block does not define ``entry_point``; any other completion continues ``code_prefix`` (the function's
    signature and docstring, HumanEval's form), cut at the first of :data:`STOP_SEQUENCES`.
    """
    fenced = _FENCE.search(completion)
    prefix = code_prefix or ""
    if fenced:
        block = fenced.group(1)
        return block if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", block, flags=re.M) else prefix + block
    body = completion
    for stop in STOP_SEQUENCES:
        cut = body.find(stop)
        if cut >= 0:
            body = body[:cut]
    return prefix + body


@register_reward("unit-tests")
class UnitTests(RewardModel):
    """The fraction of a problem's unit tests the completion's program passes, run in the sandbox:
    ``r = passed / units`` in [0, 1].

    Each completion becomes a program (:func:`program_of`), run with its test module in its own sandbox process
    (:func:`textrl_envs.sandbox.run_batch`: CPU, memory, file-size and process limits, no network, a folder of its
    own, a wall-clock kill); a batch runs side by side, in the env's background reward worker when rewards are
    deferred. A program that loops, crashes, breaks out or exits early passes the units it passed before, usually 0.

    Metadata: ``test`` (a module defining ``check(candidate)``, one ``assert`` per unit), ``entry_point`` (the
    function's name) and, optionally, ``code_prefix`` (what the completion continues).

    :param limits: The sandbox's :class:`~textrl_envs.sandbox.SandboxLimits` (default: 5 s of CPU, 10 s of wall
        clock, 1 GiB of memory).
    :param workers: Programs run at once (default: the CPU count).
    """

    required_kwargs = ("test", "entry_point")

    def __init__(self, limits: Any = None, workers: int | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.limits, self.workers = limits, workers

    def score(
        self,
        prompts: list[str],  # noqa: ARG002  (RewardModel.score signature)
        completions: list[str],
        test: Sequence[str],
        entry_point: Sequence[str],
        code_prefix: Sequence[str | None] | None = None,
        **_metadata: Any,
    ) -> list[float]:
        from textrl_envs.sandbox import SandboxJob, run_batch

        prefixes = code_prefix if code_prefix is not None else [None] * len(completions)
        jobs = [SandboxJob(program_of(c, p, e), t, e) for c, p, t, e in zip(completions, prefixes, test, entry_point)]
        #: The last batch's results (status, time, output tails), for inspection.
        self.last_results = run_batch(jobs, self.limits, self.workers)
        return [r.fraction for r in self.last_results]
