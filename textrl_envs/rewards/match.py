"""Verifiable rewards: exact match, arithmetic with partial credit, and increasing number sequences."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from textrl_envs.rewards.base import RewardModel
from textrl_envs.rewards.registry import register_reward
from textrl_envs.validation import check_float, check_int

_INT = re.compile(r"[-+]?\d+")
_WHOLE_INT = re.compile(r"[-+]?\d+\Z")
_EXPR = re.compile(r"\s*([-+]?\d+)\s*([-+*])\s*([-+]?\d+)\s*=\s*\Z")


def normalise(text: str, strip: bool = True, casefold: bool = True) -> str:
    """The text compared by :class:`ExactMatch`: optionally stripped of surrounding whitespace and
    case-folded."""
    text = str(text)
    if strip:
        text = text.strip()
    if casefold:
        text = text.casefold()
    return text


def _missing(reward: str, key: str, i: int, prompt: str) -> ValueError:
    return ValueError(
        f"reward {reward!r} has no {key!r} for example #{i} (prompt {prompt!r}); give prompts as dicts "
        f"{{'prompt': ..., {key!r}: ...}}, or pick a prompt from the env's list"
    )


@register_reward("exact-match")
class ExactMatch(RewardModel):
    """1 if the normalised completion equals the normalised ``answer``, else 0.

    Formula: ``r = 1.0 if normalise(completion) == normalise(answer) else 0.0`` where
    :func:`normalise` strips surrounding whitespace (``strip``) and case-folds (``casefold``). An
    ``answer`` that is a list or tuple accepts any of its items. Range ``{0, 1}``.

    Needs the per-example metadata ``answer``.

    :param strip: Strip surrounding whitespace before comparing.
    :param casefold: Compare case-insensitively.
    :param name: Name used in messages and logs.
    """

    required_kwargs = ("answer",)

    def __init__(self, strip: bool = True, casefold: bool = True, name: str | None = None) -> None:
        super().__init__(name or "exact-match")
        self.strip = strip
        self.casefold = casefold

    def score(
        self, prompts: list[str], completions: list[str], answer: Sequence[Any] = (), **_metadata: Any
    ) -> list[float]:
        out = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            a = answer[i]
            if a is None:
                raise _missing(self.name, "answer", i, p)
            options = a if isinstance(a, (list, tuple)) else [a]
            got = normalise(c, self.strip, self.casefold)
            out.append(float(any(got == normalise(o, self.strip, self.casefold) for o in options)))
        return out


def infer_answer(prompt: str) -> int | None:
    """The value of a prompt of the form ``"<int> <op> <int> ="`` (``op`` in ``+ - *``), else ``None``."""
    m = _EXPR.search(prompt)
    if not m:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return a + b if op == "+" else a - b if op == "-" else a * b


def arithmetic_score(completion: str, answer: int, partial_weight: float = 0.5, format_weight: float = 0.1) -> float:
    """Score one arithmetic completion (see :class:`ArithmeticReward` for the formula)."""
    text = completion.strip()
    well_formed = bool(_WHOLE_INT.match(text))
    if well_formed and int(text) == answer:
        return 1.0
    m = _INT.search(text)
    if m is None:
        return 0.0
    pred = int(m.group())
    closeness = max(0.0, 1.0 - abs(pred - answer) / (abs(answer) + 1))
    return format_weight * float(well_formed) + partial_weight * closeness


@register_reward("arithmetic")
class ArithmeticReward(RewardModel):
    """Arithmetic answers, with partial credit for near misses and a well-formed integer.

    With ``s = completion.strip()``, ``ans`` the integer answer:

    * ``r = 1.0`` if ``s`` is a well-formed integer (``[-+]?\\d+``, nothing else) equal to ``ans``;
    * else, if ``s`` contains no integer, ``r = 0.0``;
    * else, with ``pred`` the first integer in ``s``:
      ``r = format_weight * [s is a well-formed integer]
      + partial_weight * max(0, 1 - |pred - ans| / (|ans| + 1))``.

    Example (defaults, ``ans = 19``): ``"19"`` gives 1.0; ``"18"`` gives
    ``0.1 + 0.5 * (1 - 1/20) = 0.575``; ``"19 apples"`` gives ``0.5``; ``"abc"`` gives 0.0.
    Range ``[0, 1]``; any wrong answer scores below ``partial_weight + format_weight < 1``.
    ``partial_weight=0, format_weight=0`` gives a plain exact-match verifier.

    Uses the per-example metadata ``answer`` (an int or an integer string); when it is missing or
    ``None`` the answer is computed from a prompt of the form ``"12+7="`` (``+``, ``-``, ``*``).

    :param partial_weight: Weight of the closeness credit.
    :param format_weight: Credit for a completion that is exactly one integer.
    :param name: Name used in messages and logs.
    """

    def __init__(self, partial_weight: float = 0.5, format_weight: float = 0.1, name: str | None = None) -> None:
        super().__init__(name or "arithmetic")
        partial_weight = check_float("partial_weight", partial_weight, low=0, example=0.5)
        format_weight = check_float("format_weight", format_weight, low=0, example=0.1)
        if partial_weight < 0 or format_weight < 0 or partial_weight + format_weight >= 1:
            raise ValueError(
                "partial_weight and format_weight must be >= 0 with partial_weight + format_weight < 1 "
                f"(so that an exact answer scores highest); got {partial_weight} and {format_weight}"
            )
        self.partial_weight = float(partial_weight)
        self.format_weight = float(format_weight)

    def score(
        self, prompts: list[str], completions: list[str], answer: Sequence[Any] | None = None, **_metadata: Any
    ) -> list[float]:
        out = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            a = answer[i] if answer is not None else None
            if a is None:
                a = infer_answer(p)
                if a is None:
                    raise _missing(self.name, "answer", i, p)
            try:
                a = int(str(a).strip())
            except ValueError:
                raise ValueError(f"reward {self.name!r}: answer {a!r} of example #{i} is not an integer") from None
            out.append(arithmetic_score(c, a, self.partial_weight, self.format_weight))
        return out


def _is_glued(prompt: str, completion: str) -> bool:
    return bool(prompt) and bool(completion) and prompt[-1].isdigit() and completion[0].isdigit()


def increasing_run(words: Sequence[str], start: int | None = None) -> int:
    """Length of the strictly increasing run of integers at the start of the numbers in ``words``.

    Non-integer words are skipped; the run starts at the first integer (which must exceed ``start``
    when ``start`` is given) and stops at the first integer that is not larger than the previous one.
    """
    run, prev = 0, start
    for w in words:
        if not _WHOLE_INT.match(w):
            continue
        v = int(w)
        if prev is not None and v <= prev:
            break
        run, prev = run + 1, v
    return run


@register_reward("increasing-numbers")
class IncreasingNumbersReward(RewardModel):
    """RL4LMs' synthetic "increasing numbers" task: write a strictly increasing sequence of integers.

    With ``words = completion.split()`` (whitespace-separated) and ``run`` the length of the strictly
    increasing run at the start of the integers among ``words`` (non-integer words are skipped but
    counted; the run stops at the first integer not larger than the previous one):

    ``r = run / max(len(words), target)``, range ``[0, 1]``.

    A word is an integer only when all of it is one (``[-+]?\\d+``): ``"3,"`` and ``"3.5"`` are
    other words. So extra words lower the reward and sequences shorter than ``target`` get partial credit
    (RL4LMs' ``IncreasingNumbersinText`` with ``target = min_tokens / 2``). Examples, ``target=5``:
    ``"1 2 3 4 5"`` gives 1.0; ``"3 8 15"`` gives 0.6; ``"1 2 a 3 1 9"`` gives 3/6 = 0.5; ``""`` gives 0.

    With ``continue_prompt=True`` (default), a prompt that ends in an integer (e.g. ``"Numbers: 3"``)
    sets the start: the first number must exceed it. When the completion begins with a digit right
    after the prompt's final digit, the digits join into one number (``"Numbers: 3"`` + ``"5 8"``
    reads ``35 8``): that joined number is the completion's first word and no start applies.

    :param target: The sequence length that earns full credit (>= 1).
    :param continue_prompt: Let a trailing integer in the prompt set the start.
    :param name: Name used in messages and logs.
    """

    def __init__(self, target: int = 8, continue_prompt: bool = True, name: str | None = None) -> None:
        super().__init__(name or "increasing-numbers")
        self.target = check_int("target", target, low=1, example=8)
        self.continue_prompt = continue_prompt

    def score_one(self, prompt: str, completion: str) -> float:
        """Reward of one completion."""
        words = completion.split()
        start = None
        if self.continue_prompt:
            prompt_words = prompt.split()
            if _is_glued(prompt, completion) and prompt_words:
                words = [prompt_words[-1] + words[0]] + words[1:]
            elif prompt_words and _WHOLE_INT.match(prompt_words[-1]):
                start = int(prompt_words[-1])
        return increasing_run(words, start) / max(len(words), self.target)

    def score(self, prompts: list[str], completions: list[str], **_metadata: Any) -> list[float]:
        return [self.score_one(p, c) for p, c in zip(prompts, completions)]
