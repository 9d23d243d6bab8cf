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
instruction's text, the check, the format bonus and an answer prefix: ``instruct={"answer_prefix": "Answer:"}`` starts
every reply with ``Answer:`` for the model (an assistant prefill, as TRL renders a conversation that ends with an
assistant message), so that a small model answers at once instead of explaining. The bundled-LM defaults
(``instruct=False``) are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from textrl_envs.rewards.answers import ANSWER_STYLES, CHECKS
from textrl_envs.validation import check_float, check_prefill

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
    :param answer_prefix: How every reply starts, written for the model after the chat template's generation prompt
        (an assistant prefill: each conversation ends with ``{"role": "assistant", "content": answer_prefix}``,
        rendered with ``continue_final_message``). The task's grader reads the prefix and the completion together
        (``"Answer:" + " 42"``); the completion (``info["completion"]``) is what the model wrote. End it at its last
        word: the model writes the space. ``""`` (the default): none. Single-turn tasks only (an interactive task's
        turns start with its interaction's :attr:`~textrl_envs.interaction.Interaction.reply_prefix`).
    """

    style: str = "answer-line"
    instruction: str | None = None
    check: str | None = None
    format_weight: float = 0.0
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        if self.style not in ANSWER_STYLES:
            raise ValueError(f"instruct style must be one of {ANSWER_STYLES}, got {self.style!r}")
        if self.instruction is not None and not isinstance(self.instruction, str):
            raise TypeError(f"instruct instruction must be a str or None, got {type(self.instruction).__name__}")
        if self.check is not None and self.check not in CHECKS:
            raise ValueError(f"instruct check must be one of {CHECKS} or None (the task's), got {self.check!r}")
        object.__setattr__(self, "format_weight", check_float("format_weight", self.format_weight, low=0, example=0.1))
        check_prefill("instruct answer_prefix", self.answer_prefix, "answer", hint=" (e.g. 'Answer:')")

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
    instruction (metadata kept; a prompt already given as a list of messages is left as it is); with an
    ``answer_prefix``, every conversation then ends with it as an assistant message (the prefill).

    :param items: Prompt items (``str`` or ``{"prompt": str, **metadata}``).
    :param fmt: The format.
    :param question: The task's question for a prompt text (``None``: the text itself), e.g. ``"12+7="`` to
        ``"What is 12 + 7?"``.
    :raises ValueError: with an ``answer_prefix``, a conversation that already ends with an assistant message.
    """

    def ask(prompt: Any) -> Any:
        if isinstance(prompt, str):
            text = question(prompt) if question is not None else prompt
            prompt = [{"role": "user", "content": f"{text}\n\n{fmt.text}"}]
        if not fmt.answer_prefix:
            return prompt
        messages = list(prompt)
        if messages and isinstance(messages[-1], Mapping) and messages[-1].get("role") == "assistant":
            raise ValueError(
                f"instruct answer_prefix={fmt.answer_prefix!r} ends every conversation with an assistant message, "
                f"and this prompt already ends with one ({messages[-1].get('content')!r}); drop one of the two"
            )
        return [*messages, {"role": "assistant", "content": fmt.answer_prefix}]

    return [{**item, "prompt": ask(item["prompt"])} if isinstance(item, dict) else ask(item) for item in items]
