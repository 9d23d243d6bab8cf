"""The final answer of a conversation: the reward of tool episodes, which reads the whole transcript."""

from __future__ import annotations

import re
from typing import Any

from textrl_envs.rewards.base import RewardModel
from textrl_envs.rewards.registry import register_reward

__all__ = ["FinalAnswer", "final_answer_text"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_answer_text(completion: Any) -> str:
    """The text of a completion's answer: for TRL's conversational form (a list of messages, the transcript of a tool
    episode), the content of its last assistant message that calls no tool; for a str, the str itself."""
    if isinstance(completion, str):
        return completion
    for message in reversed(list(completion)):
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            return str(message.get("content", ""))
    return ""


@register_reward("final-answer")
class FinalAnswer(RewardModel):
    """1 when the answer's first number equals the prompt's ``answer``, else 0: ``r = [first_number(answer_text) ==
    answer]``, in {0, 1}.

    The answer text is :func:`final_answer_text` of the completion: with chat prompts the reward gets the episode's
    transcript (``conversational = True``), so a tool episode that never answered, or whose last turn still called a
    tool, scores 0. Numbers compare as numbers (``"12.0"`` equals ``"12"``).
    """

    required_kwargs = ("answer",)
    conversational = True

    def score(self, prompts: list[str], completions: list[Any], answer: list[Any], **_metadata: Any) -> list[float]:  # noqa: ARG002  (RewardModel.score signature)
        out = []
        for completion, expected in zip(completions, answer):
            found = _NUMBER.search(final_answer_text(completion))
            out.append(1.0 if found is not None and float(found.group()) == float(expected) else 0.0)
        return out
