"""Final answers in free text: where an instruct model states its answer, how it is compared, and the reward.

An instruct model explains before it answers ("17 + 25 = 42. Answer: 42"). :func:`final_answer` reads the answer
the way graders of math benchmarks do, in order of precedence:

1. the content of the last ``\\boxed{...}`` (braces balanced), the DeepSeekMath / MATH convention;
2. the rest of the line after the last ``Answer:`` (any case; ``answer is`` too), without a closing period (of a
   whole equation such as ``58 + 26 = 84``, what follows the last ``=``; a verdict such as ``yes`` capitalized as in 4)
   (a number check reads the first number there: ``Answer: 42 apples`` is 42);
3. the last number in the text;
4. a verdict the reply opens with, ``Yes``/``No``/``True``/``False`` (any case, as capitalized here), the way a chat
   model answers a yes-or-no question ("No, it does not follow...").

:func:`answers_match` compares it with the reference answer by one of :data:`CHECKS`: ``"math"`` with Hugging Face's
Math-Verify (``pip install "textrl[math]"``), which reads numbers, fractions, LaTeX and sets; ``"number"``, equal as
numbers (``"42"``, ``"42.0"``, ``"1,000"``, ``"3/4"``); ``"exact"``, equal as stripped, case-folded text.
:class:`FinalAnswerReward` (registered as ``"final-answer"``) is the reward of the instruct mode of the tasks with a
checkable answer (:mod:`textrl_envs.instruct`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from textrl_envs.rewards.base import RewardModel
from textrl_envs.rewards.registry import register_reward
from textrl_envs.validation import check_float, check_prefill

__all__ = [
    "ANSWER_STYLES",
    "CHECKS",
    "MATH_INSTALL_HINT",
    "FinalAnswerReward",
    "answers_match",
    "final_answer",
    "final_answer_text",
    "in_answer_style",
    "parse_number",
]

#: How a final answer is compared with the reference (see :func:`answers_match`).
CHECKS = ("math", "number", "exact")
#: How an instruction asks for the final answer: on a last line ``Answer: ...``, or in ``\boxed{...}``.
ANSWER_STYLES = ("answer-line", "boxed")
MATH_INSTALL_HINT = 'pip install "textrl[math]"  (or: pip install math-verify)'

_ANSWER = re.compile(r"\banswer(?:\s+is\s*:?|\s*[:=])[ \t]*", re.IGNORECASE)
_ANSWER_LINE = re.compile(r"^[ \t*]*answer[ \t*]*:[ \t*]*\S", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")
_VERDICT = re.compile(r"[\s*\"'(]*(yes|no|true|false)\b", re.IGNORECASE)
_VERDICT_ALONE = re.compile(r"[\s*\"'(]*(yes|no|true|false)[\s*\"')!.]*", re.IGNORECASE)


def final_answer_text(completion: Any) -> str:
    """The text a completion answers with: for TRL's conversational form (a list of messages, the transcript of a tool
    episode), the content of its last assistant message that calls no tool (``""`` when there is none); for a str, the
    str itself."""
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            return str(message.get("content", ""))
    return ""


#: An answer line that is a whole equation, ``58 + 26 = 84``: what it states is after the last ``=``.
_EQUATION = re.compile(r"[-+*/×÷()\d\s.,]+=\s*([^=]+)")


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` with balanced braces, or ``None``."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        depth, i = 0, start + len("\\boxed")
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i + 1 : j].strip()
        start = text.rfind("\\boxed{", 0, start)  # unclosed: an earlier one may be whole
    return None


def final_answer(text: str) -> str | None:
    """The final answer a completion states (see the module docstring for the order), or ``None``.

    >>> final_answer("17 + 25 = 42.\\nAnswer: 42.")
    '42'
    >>> final_answer("so it is \\\\boxed{\\\\frac{3}{4}}")
    '\\\\frac{3}{4}'
    >>> final_answer("5 - 3 = 2")
    '2'
    >>> final_answer("no, it does not logically follow.")
    'No'
    """
    boxed = _boxed(text)
    if boxed:
        return boxed
    found = list(_ANSWER.finditer(text))
    for match in reversed(found):
        line = text[match.end() :].split("\n", 1)[0].strip().rstrip(".").strip()
        equation = _EQUATION.fullmatch(line)  # "Answer: 58 + 26 = 84" states 84
        line = equation.group(1).strip() if equation else line
        verdict = _VERDICT_ALONE.fullmatch(line)
        if verdict:  # "Answer: **yes**" states the verdict "Yes"
            return verdict.group(1).capitalize()
        if line:
            return line
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1].strip()
    verdict = _VERDICT.match(text)
    return verdict.group(1).capitalize() if verdict else None


def in_answer_style(text: str, style: str) -> bool:
    """Whether ``text`` states its answer the way the instruction asked (:data:`ANSWER_STYLES`)."""
    if style == "boxed":
        return _boxed(text) is not None
    if style == "answer-line":
        return _ANSWER_LINE.search(text) is not None
    raise ValueError(f"answer style must be one of {ANSWER_STYLES}, got {style!r}")


def parse_number(text: Any) -> Fraction | None:
    """``text`` as an exact number (integers, decimals, thousands separators, ``a/b``, a leading ``$`` or a trailing
    ``%`` ignored), or ``None`` when it is not one number."""
    cleaned = str(text).strip().replace("−", "-").replace("$", "").rstrip("%").rstrip(".").replace(" ", "")
    if not re.fullmatch(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?", cleaned):
        return None
    try:
        return Fraction(cleaned.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _math_verify() -> tuple[Callable[..., Any], Callable[..., Any]]:
    try:
        from math_verify import parse, verify
    except ImportError as err:
        raise ImportError(
            f"check='math' compares answers with Math-Verify, which is not installed ({err}); install it with: "
            f"{MATH_INSTALL_HINT}; or pass check='number' (equal as numbers) or check='exact'"
        ) from err
    return parse, verify


def answers_match(given: str | None, reference: Any, check: str = "number") -> bool:
    """Whether the answer ``given`` equals ``reference`` under ``check`` (:data:`CHECKS`)."""
    if given is None or not str(given).strip():
        return False
    if check == "exact":
        return str(given).strip().casefold() == str(reference).strip().casefold()
    if check == "number":
        a, b = parse_number(given), parse_number(reference)
        if a is None:  # "42 apples": the first number of the stated answer
            first = _NUMBER.search(str(given))
            a = None if first is None else parse_number(first.group())
        return a is not None and a == b
    if check == "math":
        parse, verify = _math_verify()

        # Math-Verify's own time limits use signals, which work in the main thread only; rewards may run in a worker
        # thread, bounded by the env's reward_timeout instead
        def read(text: str) -> Any:
            return parse(f"${text}$", parsing_timeout=None) or parse(text, parsing_timeout=None)

        gold, pred = read(str(reference)), read(str(given))  # the answer is extracted already: one expression
        try:
            return bool(verify(gold, pred, timeout_seconds=None))
        except Exception:  # noqa: BLE001  (Math-Verify's sympy comparisons raise on odd input: not a match)
            return False
    raise ValueError(f"check must be one of {CHECKS}, got {check!r}")


@register_reward("final-answer")
class FinalAnswerReward(RewardModel):
    """The final answer in free text, checked against the reference, plus an optional format bonus.

    The reward of the tasks' instruct mode and of tool episodes. With chat prompts it gets the episode's transcript
    (``conversational = True``) and reads its last assistant message that calls no tool (:func:`final_answer_text`:
    a tool episode that never answered scores 0). With ``a = final_answer(that text)`` (:func:`final_answer`),
    ``ans`` the reference answer:
    ``r = [answers_match(a, ans, check)] + format_weight * [the completion states its answer in `style`]``.
    Range ``[0, 1 + format_weight]``; ``format_weight=0`` (default) is the plain 0/1 verifier.

    Needs the per-example metadata ``answer``.

    :param check: How answers are compared (:data:`CHECKS`): ``"math"`` (Math-Verify, the ``math`` extra),
        ``"number"`` or ``"exact"``.
    :param style: The answer format the instruction asked for (:data:`ANSWER_STYLES`), for the format bonus.
    :param format_weight: Weight of the format bonus (>= 0).
    :param answer_prefix: The text every reply was started with for the model (an assistant prefill, such as
        ``"Answer:"``: :class:`~textrl_envs.instruct.InstructFormat`'s ``answer_prefix``), read before the completion.
    :param name: Name used in messages and logs.
    """

    required_kwargs = ("answer",)
    conversational = True

    def __init__(
        self,
        check: str = "number",
        style: str = "answer-line",
        format_weight: float = 0.0,
        name: str | None = None,
        answer_prefix: str = "",
    ) -> None:
        super().__init__(name or "final-answer")
        if check not in CHECKS:
            raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
        if style not in ANSWER_STYLES:
            raise ValueError(f"style must be one of {ANSWER_STYLES}, got {style!r}")
        if check == "math":
            _math_verify()  # refuse a missing extra now, not at the first episode's end
        self.check, self.style = check, style
        self.format_weight = check_float("format_weight", format_weight, low=0, example=0.1)
        self.answer_prefix = check_prefill("answer_prefix", answer_prefix, "answer", hint=" (e.g. 'Answer:')")

    def score(self, prompts: list[str], completions: list[str], answer: Sequence[Any] = (), **_metadata: Any):
        out = []
        for i, completion in enumerate(completions):
            if answer[i] is None:
                raise ValueError(
                    f"reward {self.name!r} has no 'answer' for example #{i} (prompt {prompts[i]!r}); give prompts as "
                    "dicts {'prompt': ..., 'answer': ...}"
                )
            text = self.answer_prefix + final_answer_text(completion)
            correct = float(answers_match(final_answer(text), answer[i], self.check))
            styled = float(in_answer_style(text, self.style)) if self.format_weight else 0.0
            out.append(correct + self.format_weight * styled)
        return out
