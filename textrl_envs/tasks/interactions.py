"""The interactions of the built-in interactive tasks (``GuessNumber-v0``, ``ToolArithmetic-v0``).

Light on purpose (the protocol of :mod:`textrl_envs.interaction`, ``re`` and numpy): the list of tasks points
at these classes, so this module must not import the env. The env classes that document the ids live in
:mod:`textrl_envs.tasks.guess_number` and :mod:`textrl_envs.tasks.tool_arithmetic`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from textrl_envs.interaction import Interaction, Reply

__all__ = ["MAX_DIGITS", "Calculator", "GuessNumber", "NumberTooLong", "parse_int"]

_INT = re.compile(r"-?\d+")
#: The most digits a number in an agent's turn may have (a longer one is answered, not parsed: Python's ``int()``
#: refuses strings over 4,300 digits, and such numbers mean nothing here).
MAX_DIGITS = 100


class NumberTooLong(ValueError):
    """A number in an agent's turn has more than :data:`MAX_DIGITS` digits."""


def parse_int(text: str) -> int:
    """``int(text)`` for a number of at most :data:`MAX_DIGITS` digits.

    :raises NumberTooLong: for a longer one.
    """
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise NumberTooLong(f"a number of {len(text.lstrip('-'))} digits")
    return int(text)


def first_int(text: str) -> int | None:
    """The first integer written in ``text`` (``None`` if there is none).

    :raises NumberTooLong: when it has more than :data:`MAX_DIGITS` digits.
    """
    m = _INT.search(text)
    return None if m is None else parse_int(m.group())


def stated_int(text: str) -> int | None:
    """The integer a free-text turn states: its final answer's (:func:`~textrl_envs.rewards.answers.final_answer`:
    ``Answer: 4``, ``\\boxed{4}``, else the last number), ``None`` if it states none."""
    from textrl_envs.rewards.answers import final_answer, parse_number

    value = parse_number(final_answer(text) or "")
    return None if value is None or value.denominator != 1 else int(value)


class GuessNumber(Interaction):
    """Guess a secret integer; the environment says whether it is higher or lower.

    Each episode draws the secret uniformly from ``low..high`` (the prompt's metadata ``low`` / ``high`` if it
    has them, else the constructor's) with the episode's generator. A turn's guess is the first integer in its
    text. Replies: ``"Higher. x="`` / ``"Lower. x="`` (the secret is higher / lower than the guess),
    ``"Correct!"`` (the episode ends, reward ``max(0, 1 - turn_penalty * (turn - 1))``), or, for a turn without a
    number, ``"Say a number. x="``, and for one of more than :data:`MAX_DIGITS` digits ``"Too many digits (at most
    100). x="`` (wasted turns). Every other turn pays 0; so does running out of turns.

    With ``chat=True`` (instruct mode, :mod:`textrl_envs.instruct`) a turn's guess is the integer it states
    (:func:`stated_int`: ``Answer: 4``, else its last number) and the replies are sentences: ``"Higher."``,
    ``"Lower."``, ``"Correct!"``, ``"Please guess one whole number."``.

    :param low: Smallest secret.
    :param high: Largest secret.
    :param turn_penalty: Reward lost per turn before the right guess.
    :param chat: Read and answer free text (an instruct model's turns).
    """

    def __init__(self, low: int = 1, high: int = 16, turn_penalty: float = 0.1, chat: bool = False) -> None:
        if not low <= high:
            raise ValueError(f"GuessNumber needs low <= high, got low={low}, high={high}")
        self.low, self.high, self.turn_penalty = int(low), int(high), float(turn_penalty)
        self.chat = bool(chat)

    def start(self, prompt: str, metadata: Mapping[str, Any], rng: np.random.Generator) -> dict[str, int]:  # noqa: ARG002  (the protocol's signature)
        low, high = int(metadata.get("low", self.low)), int(metadata.get("high", self.high))
        return {"secret": int(rng.integers(low, high + 1))}

    def reply(self, state: dict[str, int], text: str, turn: int) -> Reply:
        prompt = "" if self.chat else " x="
        try:
            guess = stated_int(text) if self.chat else first_int(text)
        except NumberTooLong:
            return Reply(f"Too many digits (at most {MAX_DIGITS}).{prompt}")
        if guess is None:
            return Reply("Please guess one whole number." if self.chat else "Say a number. x=")
        if guess == state["secret"]:
            return Reply("Correct!", reward=max(0.0, 1.0 - self.turn_penalty * (turn - 1)), done=True)
        return Reply(("Higher." if guess < state["secret"] else "Lower.") + prompt)

    def __repr__(self) -> str:
        chat = ", chat=True" if self.chat else ""
        return f"GuessNumber(low={self.low}, high={self.high}, turn_penalty={self.turn_penalty}{chat})"


class Calculator(Interaction):
    """Arithmetic with a calculator tool: call it with ``calc: a*b`` or answer with a number.

    A turn that starts with ``calc`` is a call: ``calc: <int> <op> <int>`` with ``op`` one of ``+ - *`` gets the
    reply ``" = <value>."``; a call that does not parse gets ``" error: write calc: a*b."``, and one with a number of
    more than :data:`MAX_DIGITS` digits ``" error: at most 100 digits."`` (replies, not crashes). Any other turn is
    the final answer: the episode ends, reward 1 when its text (stripped) is exactly the answer (the prompt's
    metadata ``answer``, else the value of the first ``a op b`` in the prompt), else 0.

    With ``chat=True`` (instruct mode) a turn that has a line ``calc: a op b`` and states no ``Answer:`` is a call,
    answered ``"calc: a op b = <value>"`` (a line ``calc:`` that does not parse: ``"The calculator reads lines
    like 'calc: 37*12'."``); any other turn is the final answer, read as free text's final answer
    (:func:`~textrl_envs.rewards.answers.final_answer`) and compared as a number.

    :param chat: Read and answer free text (an instruct model's turns).
    """

    CALL = re.compile(r"^\s*calc:\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*$")
    PROBLEM = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")
    CHAT_CALL = re.compile(r"^[ \t*`]*calc\s*:\s*(-?\d+)\s*([-+*x×])\s*(-?\d+)[ \t*`.]*$", re.IGNORECASE | re.MULTILINE)
    CHAT_LINE = re.compile(r"^[ \t*`]*calc\s*:", re.IGNORECASE | re.MULTILINE)
    ANSWER_LINE = re.compile(r"^[ \t*]*answer[ \t*]*:", re.IGNORECASE | re.MULTILINE)

    def __init__(self, chat: bool = False) -> None:
        self.chat = bool(chat)

    @staticmethod
    def evaluate(a: int, op: str, b: int) -> int:
        """``a op b`` for ``op`` in ``+ - *``."""
        return a + b if op == "+" else a - b if op == "-" else a * b

    def start(self, prompt: str, metadata: Mapping[str, Any], rng: np.random.Generator) -> dict[str, str]:  # noqa: ARG002  (the protocol's signature)
        answer = metadata.get("answer")
        if answer is None:
            m = self.PROBLEM.search(prompt)
            if m is None:
                raise ValueError(f"prompt {prompt!r} has no 'answer' metadata and no problem 'a op b' in it")
            answer = self.evaluate(int(m.group(1)), m.group(2), int(m.group(3)))
        return {"answer": str(answer).strip()}

    def reply(self, state: dict[str, str], text: str, turn: int) -> Reply:  # noqa: ARG002  (the protocol's signature)
        if self.chat:
            return self._chat_reply(state, text)
        if text.lstrip().startswith("calc"):
            m = self.CALL.match(text)
            if m is None:
                return Reply(" error: write calc: a*b.")
            try:
                return Reply(f" = {self.evaluate(parse_int(m.group(1)), m.group(2), parse_int(m.group(3)))}.")
            except NumberTooLong:
                return Reply(f" error: at most {MAX_DIGITS} digits.")
        return Reply(None, reward=1.0 if text.strip() == state["answer"] else 0.0, done=True)

    def _chat_reply(self, state: dict[str, str], text: str) -> Reply:
        from textrl_envs.rewards.answers import answers_match, final_answer

        if self.CHAT_LINE.search(text) and not self.ANSWER_LINE.search(text):
            calls = self.CHAT_CALL.findall(text)
            if not calls:
                return Reply("The calculator reads lines like 'calc: 37*12'.")
            a, op, b = calls[-1]
            op = "*" if op in "x×" else op
            try:
                return Reply(f"calc: {a}{op}{b} = {self.evaluate(parse_int(a), op, parse_int(b))}")
            except NumberTooLong:
                return Reply(f"The calculator takes numbers of at most {MAX_DIGITS} digits.")
        correct = answers_match(final_answer(text), state["answer"], "number")
        return Reply(None, reward=1.0 if correct else 0.0, done=True)

    def __repr__(self) -> str:
        return "Calculator(chat=True)" if self.chat else "Calculator()"
