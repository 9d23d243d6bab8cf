"""Chat templates: prompts rendered for instruct models, as TRL's conversational format does.

With ``chat_template=True`` (the tokenizer's own template) or a Jinja template string, every prompt is rendered
with ``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` before it is tokenized (without adding
special tokens again: the template writes them). A prompt is either a str, taken as one user message, or a
list of messages ``[{"role": "system" | "user" | "assistant", "content": str}, ...]`` (TRL's conversational
format). As in TRL's ``apply_chat_template`` (``trl/data_utils.py``), a conversation that ends with a user
message gets the generation prompt (``add_generation_prompt=True``), and one that ends with an assistant
message is continued (``continue_final_message=True``).

The episode is the assistant's turn, so it ends at the template's end-of-turn token
(:func:`end_of_turn_id`, e.g. ``<|im_end|>`` for ChatML), which may differ from the tokenizer's EOS.
Interactive (multi-turn) envs take the same token as their default turn end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: A message text that no template writes, to find what the template puts after an assistant message.
_SENTINEL = "\x00textrl-end-of-turn-probe\x00"


def resolve_chat_template(tokenizer: Any, chat_template: Any) -> str | None:
    """The template to render prompts with: ``None`` (no rendering), the tokenizer's own, or the given string.

    :param tokenizer: The env's tokenizer.
    :param chat_template: ``None``/``False`` (no rendering), ``True`` (the tokenizer's template) or a Jinja string.
    :return: The template string, or ``None``.
    :raises ValueError: ``True`` with a tokenizer that has no template, or an empty string.
    :raises TypeError: anything else.
    """
    if chat_template is None or chat_template is False:
        return None
    if chat_template is True:
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError(
                f"chat_template=True, but the tokenizer ({type(tokenizer).__name__}, {tokenizer.name_or_path!r}) has "
                "no chat template; pass the template itself, chat_template='{% for m in messages %}...', or a "
                "tokenizer that has one"
            )
        if isinstance(template, dict):  # several named templates: the default one
            if "default" not in template:
                raise ValueError(
                    f"the tokenizer has named chat templates {sorted(template)} and no 'default'; pass one"
                )
            template = template["default"]
        return template
    if isinstance(chat_template, str):
        if not chat_template.strip():
            raise ValueError("chat_template is an empty string; pass True, a Jinja template, or None")
        return chat_template
    raise TypeError(
        f"chat_template must be None, True/False or a Jinja template str, got {type(chat_template).__name__}"
    )


def as_messages(prompt: Any, where: str) -> list[dict[str, Any]]:
    """A prompt as a conversation: a str is one user message; a list of messages is checked and kept."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        for j, message in enumerate(prompt):
            if not isinstance(message.get("role"), str) or "content" not in message:
                raise ValueError(f"{where}: message #{j} needs a str 'role' and a 'content', got {message!r}")
        return prompt
    raise TypeError(f"{where} must be a str or a list of chat messages {{'role': ..., 'content': ...}}; got {prompt!r}")


def render(
    tokenizer: Any,
    template: str,
    prompt: Any,
    where: str = "prompt",
    prepare: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text of ``prompt`` rendered with ``template`` (generation prompt or continuation as in TRL).

    :param tokenizer: The env's tokenizer.
    :param template: A resolved template (:func:`resolve_chat_template`).
    :param prompt: A str (one user message) or a list of messages.
    :param where: Names the prompt in error messages.
    :param prepare: Turns the messages into those rendered (a tool env's interaction describes its tools there).
    :param template_kwargs: Extra arguments of ``apply_chat_template`` (``tools=...``).
    """
    messages = as_messages(prompt, where)
    if prepare is not None:
        messages = prepare(messages)
    last_is_assistant = messages[-1]["role"] == "assistant"
    try:
        text = tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=not last_is_assistant,
            continue_final_message=last_is_assistant,
            **dict(template_kwargs or {}),
        )
    except Exception as err:  # noqa: BLE001  (jinja errors of all kinds: name the prompt and the cause)
        raise ValueError(f"the chat template failed to render {where} ({messages!r}): {err}") from err
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned a {type(text).__name__} for {where}, expected str")
    return text


def render_items(
    tokenizer: Any,
    template: str,
    items: list[Any],
    prepare: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Prompt items (``str`` or ``{"prompt": ..., **metadata}``) with every prompt rendered to its text
    (:func:`render`'s ``prepare`` and ``template_kwargs`` apply to each)."""
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and "prompt" in item:
            text = render(tokenizer, template, item["prompt"], f"prompt #{i}", prepare, template_kwargs)
            out.append({**item, "prompt": text})
        else:
            out.append(render(tokenizer, template, item, f"prompt #{i}", prepare, template_kwargs))
    return out


def end_of_turn_id(tokenizer: Any, template: str) -> int | None:
    """The token the template writes right after an assistant message (its end-of-turn token), or ``None``.

    Renders a user message and an assistant message with a sentinel text, and reads the first token after the
    sentinel, if it is one of the tokenizer's special tokens (``<|im_end|>`` for ChatML, ``</s>`` for Llama-2,
    ``<|eot_id|>`` for Llama-3).
    """
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
    except Exception:  # noqa: BLE001  (a template that cannot render an assistant turn has no end-of-turn token)
        return None
    if not isinstance(text, str) or _SENTINEL not in text:
        return None
    after = text.split(_SENTINEL, 1)[1]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    if not ids:
        return None
    added = getattr(tokenizer, "added_tokens_decoder", {}).get(ids[0])
    special = ids[0] in set(tokenizer.all_special_ids) or bool(getattr(added, "special", False))
    return int(ids[0]) if special else None
