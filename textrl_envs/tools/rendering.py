"""The conversation of a tool episode as the chat template writes it: the prompt with the tools, and each reply.

The agent's turn is an assistant message that the agent writes itself, up to the template's end-of-turn token (the
episode's turn end). What the environment appends after it is the rest of the conversation as the template renders
it: the end of the assistant's turn, each ``tool`` message, and the header of the next assistant turn.
:func:`render_reply` finds that text by rendering the conversation with a sentinel in place of the agent's text and
keeping what follows the sentinel and the end-of-turn token the agent already wrote, so the window holds what
``apply_chat_template`` would have rendered for the whole conversation, and a reply never repeats the end-of-turn
marker.

:data:`FALLBACK_TEMPLATE` serves tokenizers without a chat template (the bundled one): a compact plain-text template
that lists the tools by signature and ends the assistant's turn with the tokenizer's EOS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from textrl_envs.tools.formats import ToolCallFormat, renders_tools

__all__ = ["FALLBACK_TEMPLATE", "prompt_with_tools", "render_reply"]

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

#: Text no template writes, standing for the agent's turn while the reply after it is rendered.
_SENTINEL = "\x00textrl-agent-turn\x00"


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


def render_reply(
    tokenizer: Any,
    template: str,
    messages: Sequence[Mapping[str, Any]],
    end_of_turn: str,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text an environment appends after an agent's turn in a chat model's format: the template's rendering of
    ``messages`` (``tool`` results, or a ``user`` reply of any interactive task) and of the next assistant turn's
    header, after the end-of-turn token the agent wrote, so the marker is never doubled.

    For example, with ChatML and ``[{"role": "user", "content": "Higher."}]`` the reply is
    ``"\\n<|im_start|>user\\nHigher.<|im_end|>\\n<|im_start|>assistant\\n"``: the agent's ``<|im_end|>`` is already in
    the window.

    :param tokenizer: The env's tokenizer.
    :param template: The chat template.
    :param messages: The messages answering the turn.
    :param end_of_turn: The text of the end-of-turn token (the agent's turn end), left out of the reply.
    :param template_kwargs: The template's extra arguments (``tools``).
    :raises ValueError: when the template cannot render the messages after an assistant turn.
    """
    conversation = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": _SENTINEL},
        *[dict(m) for m in messages],
    ]
    try:
        text = tokenizer.apply_chat_template(
            conversation, chat_template=template, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
        )
    except Exception as err:  # noqa: BLE001  (jinja errors of all kinds)
        raise ValueError(f"the chat template cannot render {messages!r} after an assistant turn: {err}") from err
    after = text.split(_SENTINEL, 1)[1]
    return after[len(end_of_turn) :] if end_of_turn and after.startswith(end_of_turn) else after
