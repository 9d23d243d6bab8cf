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
Interactive (multi-turn) envs take the same token as their default turn end, and the environment's replies come
as the template writes a user message after the assistant's turn, followed by the next generation prompt
(:func:`chat_reply`), so the conversation the model reads is the one the template would render.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


def with_system(messages: list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """``messages`` under a system message ``system_prompt`` (``None``, or a conversation that has its own system
    message: unchanged)."""
    if system_prompt is None or messages[0].get("role") == "system":
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def check_system_prompt(system_prompt: Any, template: str | None) -> str | None:
    """``system_prompt`` if it is ``None`` or a str and a chat template renders the prompts, else a clear error."""
    if system_prompt is None:
        return None
    if not isinstance(system_prompt, str):
        raise TypeError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}")
    if template is None:
        raise ValueError(
            "system_prompt is a message of the chat template, but prompts are not rendered with one; pass "
            "chat_template=True (or instruct=True) too, or put the text into the prompts"
        )
    return system_prompt


def render(
    tokenizer: Any,
    template: str,
    prompt: Any,
    where: str = "prompt",
    *,
    system_prompt: str | None = None,
    open_end: bool = False,
    prepare: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text of ``prompt`` rendered with ``template`` (generation prompt or continuation as in TRL).

    :param tokenizer: The env's tokenizer.
    :param template: A resolved template (:func:`resolve_chat_template`).
    :param prompt: A str (one user message) or a list of messages.
    :param where: Names the prompt in error messages.
    :param system_prompt: A system message put first (``None``: none; the template may write its own default).
    :param open_end: Leave the last message open (no end of turn, no generation prompt), for an interactive episode
        whose environment speaks first: its opening completes the message (:func:`chat_opening`).
    :param prepare: Turns the messages into those rendered (a tool env's interaction describes its tools there).
    :param template_kwargs: Extra arguments of ``apply_chat_template`` (``tools=...``).
    """
    messages = with_system(as_messages(prompt, where), system_prompt)
    if prepare is not None:
        messages = prepare(messages)
    last_is_assistant = open_end or messages[-1]["role"] == "assistant"
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


def render_items(tokenizer: Any, template: str, items: list[Any], **options: Any) -> list[Any]:
    """Prompt items (``str`` or ``{"prompt": ..., **metadata}``) with every prompt rendered to its text (``options``
    are :func:`render`'s: ``system_prompt``, ``open_end``, ``prepare``, ``template_kwargs``); a template that loses the
    user's message warns (:func:`check_rendered_prompts`)."""
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and "prompt" in item:
            out.append({**item, "prompt": render(tokenizer, template, item["prompt"], f"prompt #{i}", **options)})
        else:
            out.append(render(tokenizer, template, item, f"prompt #{i}", **options))
    raw = [item["prompt"] if isinstance(item, dict) and "prompt" in item else item for item in items]
    check_rendered_prompts(raw, [item["prompt"] if isinstance(item, dict) else item for item in out])
    return out


def check_rendered_prompts(raw: list[Any], rendered: list[str]) -> None:
    """Warn when a chat template loses the user's message: distinct prompts rendered to one text, or a text prompt
    whose words are not in its rendering (a template that drops or cuts the message trains on the same prompt for
    every item, silently)."""
    texts = [r.strip() for r in raw if isinstance(r, str) and r.strip()]
    lost = [r for r, out in zip(raw, rendered) if isinstance(r, str) and r.strip() and r.strip() not in out]
    same = len(set(texts)) > 1 and len({out for r, out in zip(raw, rendered) if isinstance(r, str)}) == 1
    if lost or same:
        import warnings

        shown = (lost or texts)[0]
        warnings.warn(
            f"the chat template loses the user's message: {len(lost)} of {len(texts)} prompts are not in their "
            f"rendered text{' and every prompt renders the same' if same else ''} (e.g. {shown[:60]!r}); check that "
            "the template writes each message's content in full (or pass chat_template=False)",
            UserWarning,
            stacklevel=4,
        )


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
    :param end_of_turn: The text of the end-of-turn token the agent wrote, left out of the reply (``""``: the agent's
        turn was cut before it, so the reply writes it).
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
    if not isinstance(text, str) or _SENTINEL not in text:
        raise ValueError("the chat template does not render assistant messages; interactive chat episodes need it to")
    after = text.split(_SENTINEL, 1)[1]
    return after[len(end_of_turn) :] if end_of_turn and after.startswith(end_of_turn) else after


def chat_reply(tokenizer: Any, template: str, text: str, turn_ended: bool) -> str:
    """An interactive task's reply ``text`` as a user message after the assistant's turn (:func:`render_reply`): the
    end-of-turn marker is left out when the agent wrote it (``turn_ended``)."""
    eot = end_of_turn_id(tokenizer, template) if turn_ended else None
    marker = tokenizer.decode([eot]) if eot is not None else ""
    return render_reply(tokenizer, template, [{"role": "user", "content": text}], marker)


def chat_opening(tokenizer: Any, template: str, text: str | None) -> str:
    """What completes a prompt rendered with an open last user message (``render(..., open_end=True)``) when the
    environment speaks first: ``text`` after a blank line (nothing when ``None`` or empty), the end of the user turn,
    and the generation prompt. The prompt and this together are the template's rendering of one user message that
    holds both."""
    content = _SENTINEL + (f"\n\n{text.strip()}" if text and text.strip() else "")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], chat_template=template, tokenize=False, add_generation_prompt=True
    )
    return rendered.split(_SENTINEL, 1)[1]
