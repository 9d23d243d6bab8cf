"""Instruct mode: tasks with a checkable answer, asked the way an instruct (chat) model is asked.

The built-in tasks speak to the bundled LM, which continues ``"12+7="`` with ``"19"``. A pretrained instruct model
needs a question, an instruction that states the answer format, its chat template, room to reason, and a grader that
finds the answer in free text. ``instruct=True`` on a task that has an instruct mode (its
:class:`~textrl_envs.tasks.InstructDefaults`) switches all of that on at once::

    env = gym.make("Arithmetic-v0", tokenizer="smollm2-135m-instruct", instruct=True)

* each prompt becomes a chat: an optional system message (``system_prompt=``; ``None`` leaves the template's own
  default) and one user message, the task's question followed by the instruction, e.g. ``"What is 12 + 7?\\n\\nEnd
  your reply with a last line 'Answer: <your answer>'."``; ``chat_template`` defaults to ``True``;
* the reward reads the final answer (:func:`~textrl_envs.rewards.answers.final_answer`: ``\\boxed{}``, ``Answer:``,
  the last number) and checks it (:class:`~textrl_envs.rewards.answers.FinalAnswerReward`, Math-Verify for math
  answers), with an optional format bonus;
* the budgets are the task's instruct budgets (room for the chat template and some reasoning) unless given.

``instruct=`` also takes an :class:`InstructFormat` (or a dict of its fields) to choose the answer style, the
instruction's text, the check and the format bonus. The bundled-LM defaults (``instruct=False``) are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from textrl_envs.rewards.answers import ANSWER_STYLES, CHECKS
from textrl_envs.validation import check_float

__all__ = ["INSTRUCTIONS", "InstructFormat", "instruct_prompts", "resolve_instruct"]

#: The default instruction of each answer style (:data:`~textrl_envs.rewards.answers.ANSWER_STYLES`).
INSTRUCTIONS = {
    "answer-line": "End your reply with a last line 'Answer: <your answer>'.",
    "boxed": "Put your final answer within \\boxed{}.",
}


@dataclass(frozen=True)
class InstructFormat:
    """How a task asks an instruct model and grades its reply.

    :param style: Where the answer goes (:data:`~textrl_envs.rewards.answers.ANSWER_STYLES`): ``"answer-line"``, a last
        line ``Answer: ...``; ``"boxed"``, ``\\boxed{...}``. The grader reads either; the style sets the instruction
        and what the format bonus checks.
    :param instruction: The text after the question (``None``: :data:`INSTRUCTIONS` of the style).
    :param check: How the answer is compared (:data:`~textrl_envs.rewards.answers.CHECKS`; ``None``: the task's own,
        ``"math"`` for math answers).
    :param format_weight: The format bonus: ``format_weight`` more reward for an answer stated in ``style`` (>= 0;
        0: none).
    """

    style: str = "answer-line"
    instruction: str | None = None
    check: str | None = None
    format_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.style not in ANSWER_STYLES:
            raise ValueError(f"instruct style must be one of {ANSWER_STYLES}, got {self.style!r}")
        if self.instruction is not None and not isinstance(self.instruction, str):
            raise TypeError(f"instruct instruction must be a str or None, got {type(self.instruction).__name__}")
        if self.check is not None and self.check not in CHECKS:
            raise ValueError(f"instruct check must be one of {CHECKS} or None (the task's), got {self.check!r}")
        object.__setattr__(self, "format_weight", check_float("format_weight", self.format_weight, low=0, example=0.1))

    @property
    def text(self) -> str:
        """The instruction appended to every question."""
        return INSTRUCTIONS[self.style] if self.instruction is None else self.instruction


def resolve_instruct(value: Any) -> InstructFormat | None:
    """``instruct=`` as an :class:`InstructFormat`: ``None``/``False`` (off), ``True`` (the defaults), a dict of its
    fields, or an :class:`InstructFormat`."""
    if value is None or value is False:
        return None
    if value is True:
        return InstructFormat()
    if isinstance(value, InstructFormat):
        return value
    if isinstance(value, Mapping):
        known = [f.name for f in fields(InstructFormat)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"instruct= got unknown field(s) {unknown}; known: {', '.join(known)}")
        return InstructFormat(**value)
    raise TypeError(
        "instruct must be True/False, None, a textrl_envs.instruct.InstructFormat or a dict of its fields "
        f"(e.g. {{'style': 'boxed'}}); got {type(value).__name__}"
    )


def instruct_prompts(
    items: Sequence[Any], fmt: InstructFormat, question: Callable[[str], str] | None = None
) -> list[dict[str, Any] | list[dict[str, str]]]:
    """Prompt items asked the instruct way: each prompt text becomes one user message, the question then the
    instruction (metadata kept; a prompt already given as a list of messages is left as it is).

    :param items: Prompt items (``str`` or ``{"prompt": str, **metadata}``).
    :param fmt: The format.
    :param question: The task's question for a prompt text (``None``: the text itself), e.g. ``"12+7="`` to
        ``"What is 12 + 7?"``.
    """

    def ask(prompt: Any) -> Any:
        if not isinstance(prompt, str):
            return prompt
        text = question(prompt) if question is not None else prompt
        return [{"role": "user", "content": f"{text}\n\n{fmt.text}"}]

    return [{**item, "prompt": ask(item["prompt"])} if isinstance(item, dict) else ask(item) for item in items]
