"""The conversation of a tool episode as the chat template writes it: the prompt with the tools, and each reply.

The agent's turn is an assistant message that the agent writes itself, up to the template's end-of-turn token (the
episode's turn end). What the environment appends after it is the rest of the conversation as the template renders
it: the end of the assistant's turn, each ``tool`` message, and the header of the next assistant turn.
:func:`~textrl_envs.chat.render_reply` finds that text by rendering the conversation with a sentinel in place of
the agent's text and keeping what follows the sentinel and the end-of-turn token the agent already wrote, so the
window holds what ``apply_chat_template`` would have rendered for the whole conversation, and a reply never repeats
the end-of-turn marker.

:data:`FALLBACK_TEMPLATE` serves tokenizers without a chat template (the bundled one): a compact plain-text template
that lists the tools by signature and ends the assistant's turn with the tokenizer's EOS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from textrl_envs.chat import render_reply
from textrl_envs.tools.formats import ToolCallFormat, renders_tools

__all__ = ["FALLBACK_TEMPLATE", "prompt_with_tools", "render_reply"]  # render_reply lives in textrl_envs.chat

#: The chat template of a tool episode whose tokenizer has none: one line listing the tools by signature, then
#: ``Q:`` / ``A:`` / ``R:`` lines (user, assistant, tool); the assistant's turn ends at the tokenizer's EOS. Compact on
#: purpose (about 45 tokens of the bundled tokenizer for ``ToolUse-v0``'s prompts): calls are read in the Hermes format.
FALLBACK_TEMPLATE = (
    "{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}("
    "{{ t.function.parameters.properties | join(', ') }}){% endfor %}.{{ '\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content }}{{ '\\n' }}"
    "{% elif m.role == 'user' %}Q: {{ m.content }}{{ '\\n' }}"
    "{% elif m.role == 'assistant' %}A:{{ m.content }}{{ eos_token }}{{ '\\n' }}"
    "{% elif m.role == 'tool' %}R: {{ m.content }}{{ '\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def prompt_with_tools(
    messages: Sequence[Mapping[str, Any]], schemas: Sequence[Mapping[str, Any]], fmt: ToolCallFormat, template: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The prompt's messages and the template's extra arguments that describe the tools to the model.

    A template that renders ``tools=`` (Qwen2.5's, the fallback) gets them as ``tools``; for one that does not
    (SmolLM2's) the format's description goes into the system message (before the prompt's own system text, if any).

    :return: ``(messages, template_kwargs)``.
    """
    messages = [dict(m) for m in messages]
    if renders_tools(template):
        return messages, {"tools": list(schemas)}
    described = fmt.system_prompt(schemas)
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{described}\n\n{messages[0]['content']}"
    else:
        messages.insert(0, {"role": "system", "content": described})
    return messages, {}
