"""What a single env and the vector env share: resolving arguments into a checked episode spec.

Both :class:`~textrl_envs.env.TextGenEnv` and :class:`~textrl_envs.vector.TextGenVectorEnv` call
:func:`build_spec` with the same keyword arguments, so they validate input identically and
tokenize prompts identically. Nothing here touches a model.

Observation layout (the padding convention)
-------------------------------------------
Observations have a fixed width ``W = max_prompt_tokens + max_new_tokens``. The sequence so far
(prompt tokens, then generated tokens) is **right-aligned** in the window, Hugging Face's left-padding
convention: the newest token is always at index ``W - 1``, the slots on the left hold
``pad_token_id`` with ``attention_mask`` 0, and the mask is a contiguous run of ones at the right.
Each step appends the action: the window shifts left by one and the token lands at ``W - 1``.

Interactive episodes (an :class:`~textrl_envs.interaction.Interaction` answers the agent) append the
environment's reply the same way, several tokens at once, in the step that ended the agent's turn. Every token
after the prompt counts against the episode's budget ``max_new_tokens``, the agent's and the environment's alike,
so an episode always fits its window while the agent acts; only a final reply that overshoots the budget
(or is longer than the whole window) pushes the oldest tokens out on the left, and the episode then ends.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from textrl_envs.chat import (
    as_messages,
    check_system_prompt,
    end_of_turn_id,
    render,
    render_items,
    resolve_chat_template,
    with_system,
)
from textrl_envs.data import load_prompts
from textrl_envs.gguf import gguf_folder, is_gguf_name
from textrl_envs.hf_loading import load_from_hub, looks_like_hub_id
from textrl_envs.interaction import bind_interaction
from textrl_envs.rewards.base import (
    DEFAULT_REWARD_TIMEOUT,
    RewardModel,
    call_reward,
    check_reward_timeout,
    reward_name,
)
from textrl_envs.rewards.calls import TrainerState, check_reward_call, updated_trainer_state
from textrl_envs.rewards.composite import reward_sum
from textrl_envs.rewards.registry import resolve_reward
from textrl_envs.tasks import InstructDefaults, PromptItem, Task, all_tasks, get_task
from textrl_envs.validation import check_choice, check_int, check_mapping

TRUNCATION_SIDES = ("left", "right", "error")
#: What an env does with a NaN/inf reward: raise (default), or score it 0 and flag ``info["reward_nonfinite"]``.
NONFINITE_REWARD = ("raise", "skip")
#: The cap on the observation width ``W = max_prompt_tokens + max_new_tokens``, in tokens (2**17, the context of
#: the longest common LMs). A vector env keeps ``16 * W`` bytes per env on its device and every rollout step
#: stores a window, so a window past this is a typo (``max_new_tokens=10**9`` would ask for gigabytes) rather
#: than a plan; a policy bounds ``W`` further by its model's context. Raise it here if you really need more.
MAX_WINDOW = 1 << 17
#: Conversations of prompts given at reset that a spec remembers for its rewards (the oldest are forgotten past it).
RESET_MESSAGES_KEPT = 4096
#: Files one of which a local tokenizer directory holds (``tokenizer.save_pretrained(dir)`` writes them).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
)


@dataclass
class EpisodeSpec:
    """The resolved, validated configuration of a text-generation episode.

    :ivar tokenizer: The Hugging Face tokenizer.
    :ivar prompt_texts: Prompt strings.
    :ivar prompt_ids: Token ids of each prompt (after truncation to ``max_prompt_tokens``).
    :ivar metadata: Per-prompt metadata lists (keys of dict prompts other than ``"prompt"``).
    :ivar reward: The reward callable.
    :ivar max_new_tokens: Generation budget ``T``.
    :ivar max_prompt_tokens: Prompt budget ``P``.
    :ivar eos_token_id: Id that terminates an episode (``None``: episodes end only by truncation).
    :ivar pad_token_id: Id written in padded slots.
    :ivar vocab_size: ``len(tokenizer)``, the size of the action space.
    :ivar nonfinite_reward: ``"raise"`` or ``"skip"`` (see :meth:`score_flagged`).
    :ivar reward_timeout: Seconds a reward call may take (``None``: no limit; built specs default to
        :data:`~textrl_envs.rewards.base.DEFAULT_REWARD_TIMEOUT`).
    :ivar episode_budget: Tokens per episode when lowered below ``max_new_tokens`` by
        ``set_max_new_tokens`` (a curriculum); ``None``: ``max_new_tokens``. The window stays the same.
    :ivar interaction: The :class:`~textrl_envs.interaction.Interaction` that answers the agent's turns
        (``None``: a single-turn episode); ``reward`` is then ``None`` unless an end-of-episode reward was asked for.
    :ivar max_turns: Agent turns per interactive episode (``None``: no limit but the token budget).
    :ivar turn_end_ids: Token ids that end an agent turn (interactive episodes).
    :ivar max_turn_tokens: Agent tokens per turn (``None``: no limit but the token budget).
    :ivar chat_template: The chat template prompts are rendered with (``None``: prompts are used as they are).
    :ivar system_prompt: The system message prompts are rendered under (``None``: none given).
    :ivar chat_open: Whether the prompts were rendered with their last user message open: a chat template and an
        interaction that speaks first, whose opening completes the message (:func:`~textrl_envs.chat.chat_opening`).
    :ivar instruct: The instruct format of the prompts (:mod:`textrl_envs.instruct`; ``None``: off).
    :ivar prompt_messages: With a chat template, each prompt as the conversation it was given as (a str prompt is one
        user message): what a TRL-style reward gets as ``prompts`` (``None`` without a template).
    :ivar chat_prepare: What the prompt's messages become before rendering (a tool env describes its tools), or
        ``None``.
    :ivar chat_kwargs: Extra arguments of ``apply_chat_template`` when prompts are rendered (``tools``).
    :ivar trainer_state: How far training has come, handed to rewards as ``trainer_state=``
        (:class:`~textrl_envs.rewards.calls.TrainerState`; :meth:`TextSpecAccess.set_trainer_state` replaces it).
    """

    tokenizer: Any
    prompt_texts: list[str]
    prompt_ids: list[np.ndarray]
    metadata: dict[str, list[Any]]
    reward: Any
    max_new_tokens: int
    max_prompt_tokens: int
    eos_token_id: int | None
    pad_token_id: int
    vocab_size: int
    task_id: str | None = None
    nonfinite_reward: str = "raise"
    reward_timeout: float | None = None
    episode_budget: int | None = None
    interaction: Any = None
    max_turns: int | None = None
    turn_end_ids: tuple[int, ...] = ()
    max_turn_tokens: int | None = None
    chat_template: str | None = None
    system_prompt: str | None = None
    chat_open: bool = False
    instruct: Any = None
    prompt_messages: list[list[dict[str, Any]]] | None = None
    chat_prepare: Any = None
    chat_kwargs: dict[str, Any] = field(default_factory=dict)
    trainer_state: TrainerState = field(default_factory=TrainerState)
    #: Conversations of prompts given at reset (rendered text -> messages), for the rewards' ``prompts``.
    reset_messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    @property
    def interactive(self) -> bool:
        """Whether an interaction answers the agent (multi-turn episodes)."""
        return self.interaction is not None

    @property
    def max_agent_steps(self) -> int:
        """The most steps (agent tokens) an episode can take now: the budget, or in an interactive episode at most
        ``max_turns * max_turn_tokens`` when both are set (the budget also counts the environment's replies)."""
        if self.interactive and self.max_turns is not None and self.max_turn_tokens is not None:
            return min(self.budget, self.max_turns * self.max_turn_tokens)
        return self.budget

    def render(self, prompt: Any, where: str = "options['prompt']") -> str:
        """A prompt given at reset as the env shows it: rendered with the chat template, if there is one."""
        if self.chat_template is None:
            return prompt
        if self.instruct is not None:  # asked like the prompt list: the task's question, then the instruction
            from textrl_envs.instruct import instruct_prompts

            asked = get_task(self.task_id).instruct if self.task_id is not None else None
            prompt = instruct_prompts([prompt], self.instruct, asked.question if asked else None)[0]
        text = render(
            self.tokenizer,
            self.chat_template,
            prompt,
            where,
            system_prompt=self.system_prompt,
            open_end=self.chat_open,
            prepare=self.chat_prepare,
            template_kwargs=self.chat_kwargs,
        )
        if len(self.reset_messages) >= RESET_MESSAGES_KEPT:
            self.reset_messages.clear()
        self.reset_messages[text] = as_messages(prompt, where)
        return text

    def chat_prompts(self, prompt_indices: Sequence[int], texts: Sequence[str]) -> list[Any] | None:
        """The episodes' prompts as conversations (``None`` without a chat template): those of the prompt list, or of
        a prompt given at reset (its text when it was not rendered here)."""
        if self.prompt_messages is None:
            return None
        return [
            self.prompt_messages[i] if i >= 0 else self.reset_messages.get(t, [{"role": "user", "content": t}])
            for i, t in zip(prompt_indices, texts)
        ]

    @property
    def budget(self) -> int:
        """Tokens an episode may generate now: ``episode_budget`` if set, else ``max_new_tokens``."""
        return self.max_new_tokens if self.episode_budget is None else self.episode_budget

    def set_budget(self, n: int | None) -> None:
        """Lower the per-episode budget to ``n`` tokens (``None``: back to ``max_new_tokens``).

        The observation width ``W`` does not change; episodes in progress that already have ``n``
        tokens end (truncated) at their next step.

        :raises ValueError: unless ``1 <= n <= max_new_tokens``.
        """
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= self.max_new_tokens:
                raise ValueError(
                    f"max_new_tokens budget must be an int in [1, {self.max_new_tokens}] (the env's max_new_tokens, "
                    f"which fixes the observation width), got {n!r}; build the env with a larger max_new_tokens "
                    "to allow longer episodes"
                )
            n = int(n)
        self.episode_budget = n

    @property
    def window(self) -> int:
        """Observation width ``W = max_prompt_tokens + max_new_tokens``."""
        return self.max_prompt_tokens + self.max_new_tokens

    def decode(self, ids: Sequence[int]) -> str:
        """Completion text: ``ids`` decoded without special tokens (so without EOS)."""
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=True)

    def score(
        self, prompt_indices: Sequence[int], completions: Sequence[str], prompt_texts=None, completion_ids=None
    ) -> np.ndarray:
        """Rewards of finished episodes, one batched call to the reward model.

        :param prompt_indices: Which prompt each episode used (``-1`` for a prompt given through
            ``reset(options={"prompt": ...})``; its text must then be in ``prompt_texts``).
        :param completions: Completion texts.
        :param prompt_texts: Prompt texts per episode, when some are not from the prompt list.
        :param completion_ids: Each completion's token ids (the reward's ``completion_ids``).
        """
        return self.score_flagged(prompt_indices, completions, prompt_texts, completion_ids)[0]

    def score_flagged(
        self, prompt_indices: Sequence[int], completions: Sequence[str], prompt_texts=None, completion_ids=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`score_detailed` without the components: ``(rewards, nonfinite)``."""
        return self.score_detailed(prompt_indices, completions, prompt_texts, completion_ids)[:2]

    def score_detailed(
        self,
        prompt_indices: Sequence[int],
        completions: Sequence[str],
        prompt_texts=None,
        completion_ids=None,
        trainer_state: TrainerState | None = None,
        completion_messages=None,
    ) -> tuple[np.ndarray, np.ndarray, list[dict[str, float]] | None]:
        """Rewards of finished episodes and which of them were non-finite.

        With ``nonfinite_reward="raise"`` a NaN/inf reward raises (naming the reward, prompt and
        completion) and the flags are all ``False``; with ``"skip"`` it is replaced by 0.0 and flagged,
        so that the env can set ``info["reward_nonfinite"] = True`` and the algorithm drop the episode.
        ``reward_timeout`` bounds the call (see :func:`~textrl_envs.rewards.base.call_reward`). The reward is called
        as TRL calls its reward functions (prompts, completions, ``completion_ids``, ``trainer_state`` and the
        metadata columns, as keywords; conversations with a chat template); a score of ``None`` counts as a
        non-finite one.

        :param completion_ids: Each completion's token ids (``None``: the reward gets no ``completion_ids``).
        :param trainer_state: The state the reward sees (default: :attr:`trainer_state` now; the reward worker passes
            the one of the step the episodes ended in).
        :param completion_messages: Each interactive episode's conversation as chat messages
            (:meth:`~textrl_envs.interaction.Interaction.messages`): a TRL-style reward's completions with chat
            prompts (``None``: each completion's text as one assistant message).

        A reward with components (a :class:`~textrl_envs.rewards.CompositeReward`: its ``score_components``) also
        gives each episode's components, ``{label: unweighted score}``.

        :return: ``(rewards, nonfinite, components)``: ``float64`` and ``bool`` arrays, one entry per episode, and
            one dict per episode (``None`` for a reward without components).
        """
        texts = list(prompt_texts) if prompt_texts is not None else [self.prompt_texts[i] for i in prompt_indices]
        meta = {k: [v[i] if i >= 0 else None for i in prompt_indices] for k, v in self.metadata.items()}
        on_nonfinite = "nan" if self.nonfinite_reward == "skip" else "raise"
        reward, parts = self.reward, None
        if callable(getattr(reward, "score_components", None)):
            parts = {}
            reward = _RecordComponents(reward, parts)
        values = call_reward(
            reward,
            texts,
            completions,
            meta,
            completion_ids=completion_ids,
            trainer_state=self.trainer_state if trainer_state is None else trainer_state,
            chat_prompts=self.chat_prompts(prompt_indices, texts),
            chat_completions=completion_messages,
            on_nonfinite=on_nonfinite,
            timeout=self.reward_timeout,
        )
        bad = ~np.isfinite(values)
        if bad.any():
            values = np.where(bad, 0.0, values)
        components = None
        if parts:
            components = [{label: float(v[j]) for label, v in parts.items()} for j in range(len(values))]
        return values, bad, components


class _RecordComponents(RewardModel):
    """A reward with components, called as the reward itself (same name in errors), that keeps the components of its
    call in ``parts`` (a dict of the caller's: the call may run in another thread, with a timeout)."""

    def __init__(self, reward: Any, parts: dict[str, np.ndarray]) -> None:
        super().__init__(getattr(reward, "name", type(reward).__name__))
        self.reward, self.parts = reward, parts

    def __call__(
        self, prompts: list[str], completions: list[str], chat_prompts: Any = None, chat_completions: Any = None,
        **kwargs: Any,
    ) -> np.ndarray | list[float | None]:  # fmt: skip
        return self.score(
            list(prompts), list(completions), chat_prompts=chat_prompts, chat_completions=chat_completions, **kwargs
        )

    def score(
        self, prompts: list[str], completions: list[str], chat_prompts: Any = None, chat_completions: Any = None,
        **kwargs: Any,
    ) -> np.ndarray | list[float | None]:  # fmt: skip
        total, parts = self.reward.score_components(
            prompts, completions, chat_prompts=chat_prompts, chat_completions=chat_completions, **kwargs
        )
        self.parts.update({label: np.asarray(v, dtype=np.float64) for label, v in parts.items()})
        return total


class TextSpecAccess:
    """What the single and the vector text env expose of their :class:`EpisodeSpec` (``self.text_spec``)."""

    text_spec: EpisodeSpec

    @property
    def tokenizer(self):
        """The tokenizer that maps actions to text."""
        return self.text_spec.tokenizer

    @property
    def max_new_tokens(self) -> int:
        """Generation budget the env was built with (it fixes the observation width)."""
        return self.text_spec.max_new_tokens

    def set_max_new_tokens(self, n: int | None) -> None:
        """Lower the episode budget to ``n <= max_new_tokens`` tokens (``None``: the full budget).

        For a curriculum (:class:`sb3_grpo.callbacks.MaxNewTokensCurriculum`); on a vector env call it between
        rollouts. The observation width does not change; episodes in progress that already have ``n``
        tokens end (truncated) at their next step. Through SB3: ``venv.env_method("set_max_new_tokens", n)``.

        :raises ValueError: unless ``1 <= n <= max_new_tokens``.
        """
        self.text_spec.set_budget(n)

    def set_trainer_state(self, **fields: int) -> None:
        """Tell the rewards how far training has come: the ``trainer_state`` they get from now on
        (:class:`~textrl_envs.rewards.calls.TrainerState`'s fields ``global_step``, ``max_steps``, ``num_timesteps``,
        ``total_timesteps``; those not given keep their values). The algorithms of :mod:`sb3_grpo` call it at each
        rollout's start (through SB3: ``venv.env_method("set_trainer_state", global_step=...)``).

        :raises TypeError: for a field it does not have, or a value that is not an int >= 0.
        """
        self.text_spec.trainer_state = updated_trainer_state(self.text_spec.trainer_state, fields)


def load_tokenizer(tokenizer: Any = None, revision: str | None = None):
    """Resolve ``tokenizer``: ``None`` (the bundled one), a local path, a Hugging Face Hub id, a GGUF file or packaged
    model's name (:mod:`textrl_envs.gguf`: the tokenizer and chat template stored in the file), or a tokenizer object.

    A Hub id (``"org/name"``, a string that names no local directory) loads as ``AutoTokenizer.from_pretrained``
    loads it, at ``revision``: downloaded online, from the Hugging Face cache with ``HF_HUB_OFFLINE=1``
    (:func:`~textrl_envs.hf_loading.load_from_hub`).

    Fallbacks (Hugging Face conventions): a tokenizer without a pad token uses its EOS token as pad;
    one without EOS gets a warning and episodes then end only by truncation (pad falls back to 0).
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    if tokenizer is None:
        from textrl_envs.assets import tokenizer_path

        tokenizer = tokenizer_path()
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if is_gguf_name(path):
            tokenizer = gguf_folder(path)  # the GGUF's tokenizer, from its converted folder (converted on first use)
        elif not os.path.isdir(path) and looks_like_hub_id(path):
            tokenizer = load_from_hub(AutoTokenizer.from_pretrained, path, "tokenizer", revision)
        elif not os.path.isdir(path):
            raise ValueError(
                f"tokenizer path {path!r} is not a directory; pass a local Hugging Face tokenizer directory, a Hub "
                "id such as 'org/name' (from the Hugging Face cache, or downloaded when online) or a "
                "PreTrainedTokenizerBase object"
            )
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        todo = "pass a directory written by tokenizer.save_pretrained(dir), or a PreTrainedTokenizerBase object"
        if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
            held = sorted(os.listdir(path))[:8]
            raise ValueError(
                f"tokenizer directory {path!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}; it holds "
                f"{held or 'nothing'}); {todo}"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise ValueError(
                f"tokenizer directory {path!r} could not be loaded ({type(err).__name__}: {err}); {todo}"
            ) from err
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(
            "tokenizer must be None, a local directory, a Hub id or a PreTrainedTokenizerBase; got "
            f"{type(tokenizer).__name__}"
        )
    return tokenizer


def _special_ids(tokenizer) -> tuple[int | None, int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        warnings.warn(
            "the tokenizer has no EOS token: episodes will end only by truncation at max_new_tokens; "
            "set tokenizer.eos_token to let the policy stop early",
            stacklevel=3,
        )
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = eos if eos is not None else 0
    return eos, int(pad)


def _check_prompt_list(prompts: Any) -> Sequence[PromptItem]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(
            f"prompts must be a list of str (or of dicts with a 'prompt' key); got {type(prompts).__name__}"
        )
    if len(prompts) == 0:
        raise ValueError("prompts is empty; give at least one prompt, e.g. prompts=['The movie was']")
    return prompts


def _split_prompts(prompts: Sequence[PromptItem]) -> tuple[list[str], dict[str, list[Any]]]:
    _check_prompt_list(prompts)
    texts: list[str] = []
    keys: list[str] | None = None
    rows: list[dict[str, Any]] = []
    for i, item in enumerate(prompts):
        if isinstance(item, str):
            text, meta = item, {}
        elif isinstance(item, dict):
            if isinstance(item.get("prompt"), list):
                raise ValueError(
                    f"prompt #{i} is a list of chat messages; pass chat_template=True (or a template) to render it"
                )
            if "prompt" not in item or not isinstance(item["prompt"], str):
                raise ValueError(f"prompt #{i} is a dict without a str 'prompt' key: {item!r}")
            text, meta = item["prompt"], {k: v for k, v in item.items() if k != "prompt"}
        else:
            raise TypeError(f"prompt #{i} must be a str or a dict with a 'prompt' key; got {type(item).__name__}")
        if keys is None:
            keys = sorted(meta)
        elif sorted(meta) != keys:
            raise ValueError(f"prompt #{i} has metadata keys {sorted(meta)}, but prompt #0 has {keys}; all must match")
        texts.append(text)
        rows.append(meta)
    metadata = {k: [r[k] for r in rows] for k in (keys or [])}
    return texts, metadata


#: A UTF-8 character is at most 4 bytes, so a cut inside one leaves at most 3 stray byte tokens.
_MAX_STRAY_BYTES = 3


def on_character_boundary(tokenizer, ids: list[int], side: str) -> list[int]:
    """``ids`` (a prompt cut on ``side``) without the tokens of a character the cut split, where possible.

    A byte-level tokenizer may split a multi-byte character over several tokens; a cut between them leaves
    bytes that decode to U+FFFD (mojibake the model would read). Up to 3 such tokens are dropped at the cut
    (one is always kept); a prompt whose text has U+FFFD of its own is left alone.
    """
    for _ in range(_MAX_STRAY_BYTES):
        if len(ids) < 2:
            break
        text = tokenizer.decode(ids)
        if not (text.startswith("\ufffd") if side == "left" else text.endswith("\ufffd")):
            break
        ids = ids[1:] if side == "left" else ids[:-1]
    return ids


def _encode(spec_tokenizer, text: str, max_prompt_tokens: int, truncation: str, where: str) -> tuple[np.ndarray, int]:
    """``(ids, length before the cut)`` of one prompt (see :func:`encode_prompt`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate (e.g. half of an emoji cut from a UTF-16 source)
        raise ValueError(
            f"{where} holds {text[err.start]!r} at character {err.start}, a lone UTF-16 surrogate that is not text "
            "(no tokenizer can encode it); fix the source text, e.g. text.encode('utf-16', 'surrogatepass')"
            ".decode('utf-16'), or drop it with text.encode('utf-8', 'ignore').decode()"
        ) from None
    ids = spec_tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]  # we truncate below
    if len(ids) == 0:
        raise ValueError(f"{where} {_quote(text)} tokenizes to no tokens; every prompt needs at least one token")
    full = len(ids)
    if full > max_prompt_tokens:
        if truncation == "error":
            raise ValueError(
                f"{where} {_quote(text)} has {full} tokens, over max_prompt_tokens={max_prompt_tokens}; raise "
                "max_prompt_tokens, shorten the prompt, or pass prompt_truncation='left' or 'right'"
            )
        ids = ids[-max_prompt_tokens:] if truncation == "left" else ids[:max_prompt_tokens]
        if "\ufffd" not in text:
            ids = on_character_boundary(spec_tokenizer, list(ids), truncation)
    return np.asarray(ids, dtype=np.int64), full


def _quote(text: str, limit: int = 200) -> str:
    """``repr(text)``, shortened in the middle for a message (a 1 MB prompt is not quoted whole)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[: limit // 2]!r}...{text[-limit // 2 :]!r} ({len(text):,} characters)"


def encode_prompt(
    spec_tokenizer, text: str, max_prompt_tokens: int, truncation: str, where: str, warn: bool = True
) -> np.ndarray:
    """Token ids of one prompt, truncated to ``max_prompt_tokens`` (or an error, by option), cut on a character
    boundary where the tokenizer allows it (:func:`on_character_boundary`).

    :param warn: Warn when the prompt is cut (:func:`encode_prompts` warns once for a whole list instead).
    """
    ids, full = _encode(spec_tokenizer, text, max_prompt_tokens, truncation, where)
    if warn and full > max_prompt_tokens:
        warnings.warn(
            f"{where} is longer than max_prompt_tokens={max_prompt_tokens} and was cut on the {truncation}; raise "
            "max_prompt_tokens to keep such prompts whole, or pass prompt_truncation='error' to refuse them",
            UserWarning,
            stacklevel=3,
        )
    return ids


def encode_prompts(
    spec_tokenizer, texts: Sequence[str], max_prompt_tokens: int, truncation: str, chat_template: str | None = None
) -> list[np.ndarray]:
    """Token ids of every prompt (:func:`encode_prompt`), with one warning when any was cut: the share of prompts cut,
    the budget that keeps them all whole, and, with a chat template, that its role markers count in the budget.

    :param chat_template: The template the prompts were rendered with (``None``: none).
    """
    encoded = [_encode(spec_tokenizer, t, max_prompt_tokens, truncation, f"prompt #{i}") for i, t in enumerate(texts)]
    lengths = [full for _, full in encoded]
    cut = sum(n > max_prompt_tokens for n in lengths)
    if cut:
        message = (
            f"{cut} of {len(lengths)} prompts ({cut / len(lengths):.0%}) are longer than max_prompt_tokens="
            f"{max_prompt_tokens} and were cut on the {truncation} (the longest has {max(lengths)} tokens): the "
            f"policy sees only part of them. Pass max_prompt_tokens={max(lengths)} to keep every prompt whole, or "
            "prompt_truncation='error' to refuse over-long prompts"
        )
        if chat_template is not None:
            message += (
                f". The chat template adds its role markers to every prompt, which count in the budget: the rendered "
                f"prompts have {min(lengths)} to {max(lengths)} tokens"
                + (
                    ", so every prompt was cut and the policy may see only the template's end (e.g. the assistant "
                    "header), not the question"
                    if cut == len(lengths)
                    else ""
                )
            )
        warnings.warn(message, UserWarning, stacklevel=4)
    return [ids for ids, _ in encoded]


def check_budgets(max_new_tokens: Any, max_prompt_tokens: Any) -> tuple[int, int]:
    """``(max_new_tokens, max_prompt_tokens)`` as ints >= 1 whose window ``W`` is within :data:`MAX_WINDOW`.

    :raises TypeError: for a non-integer.
    :raises ValueError: for a value < 1, or a window over the cap (with the figure).
    """
    t = check_int("max_new_tokens", max_new_tokens, low=1, example=24)
    p = check_int("max_prompt_tokens", max_prompt_tokens, low=1, example=16)
    if p + t > MAX_WINDOW:
        raise ValueError(
            f"max_prompt_tokens + max_new_tokens = {p:,} + {t:,} = {p + t:,} tokens is over the window cap "
            f"MAX_WINDOW = {MAX_WINDOW:,} (textrl_envs.core; each env holds 16 bytes per window token and every "
            "rollout step stores a window); lower max_new_tokens or max_prompt_tokens (a policy's model bounds the "
            "window further: the bundled LM reads 128 tokens)"
        )
    return t, p


def _check_choices(prompt_truncation: str, nonfinite_reward: str) -> None:
    """Raise a ``ValueError`` for a ``prompt_truncation`` or ``nonfinite_reward`` that is not a known choice."""
    check_choice("prompt_truncation", prompt_truncation, TRUNCATION_SIDES)
    check_choice(
        "nonfinite_reward",
        nonfinite_reward,
        NONFINITE_REWARD,
        hint="'raise': stop with an error; 'skip': score 0 and flag info['reward_nonfinite']",
    )


#: Keyword arguments that only interactive episodes take.
TURN_KWARGS = ("max_turns", "turn_end", "max_turn_tokens")


def resolve_turn_end(tokenizer, turn_end: Any, vocab_size: int) -> tuple[int, ...]:
    """Token ids that end an agent turn: ``None`` (EOS), a token id, a token's text, or a sequence of those.

    :raises ValueError: for an id outside ``[0, vocab_size)`` or a text that is not exactly one token.
    """
    if turn_end is None:
        eos = tokenizer.eos_token_id
        return () if eos is None else (int(eos),)
    items = list(turn_end) if isinstance(turn_end, (list, tuple)) else [turn_end]
    if not items:
        raise ValueError("turn_end is empty; give a token (its text or id), a list of them, or None for EOS")
    ids = []
    for item in items:
        if isinstance(item, str):
            encoded = tokenizer(item, add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise ValueError(
                    f"turn_end {item!r} is {len(encoded)} tokens ({encoded}) with this tokenizer; a turn ends at one "
                    "token: give a single token's text or its id"
                )
            ids.append(int(encoded[0]))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            if not 0 <= item < vocab_size:
                raise ValueError(
                    f"turn_end token id {int(item)} is outside the vocabulary (ids 0..{vocab_size - 1}, "
                    f"len(tokenizer) = {vocab_size}); give a token of the env's tokenizer"
                )
            ids.append(int(item))
        else:
            raise TypeError(f"turn_end must be None, a token id, a token's text or a list of them; got {item!r}")
    return tuple(dict.fromkeys(ids))


def _resolve_turns(defaults, interaction, given: dict[str, Any]) -> tuple[Any, int | None, Any, int | None]:
    """``(interaction, max_turns, turn_end, max_turn_tokens)`` from the user's arguments and the task's defaults."""
    from_task = interaction is None and defaults is not None and defaults.interaction is not None
    if from_task:
        interaction = defaults.interaction()
    if interaction is None:
        extra = sorted(k for k, v in given.items() if v is not None)
        if extra:
            interactive = ", ".join(t.env_id for t in all_tasks() if t.interaction is not None)
            raise ValueError(
                f"{', '.join(extra)} only apply to interactive episodes; pass interaction=... (a "
                f"textrl_envs.interaction.Interaction) or use an interactive id ({interactive})"
            )
        return None, None, None, None
    from textrl_envs.interaction import check_interaction

    check_interaction(interaction)
    task_turns = defaults if defaults is not None and defaults.interaction is not None else None
    values = {k: given[k] if given[k] is not None else getattr(task_turns, k, None) for k in TURN_KWARGS}
    for name in ("max_turns", "max_turn_tokens"):
        if values[name] is not None:
            values[name] = check_int(name, values[name], low=1, hint="or None (no limit); e.g. 4")
    return interaction, values["max_turns"], values["turn_end"], values["max_turn_tokens"]


def _resolve_reward(defaults, reward, reward_kwargs, interaction, interaction_given: bool):
    """The reward callable (``None``: an interactive episode paid only by its interaction)."""
    if reward is None:
        if interaction is not None and (interaction_given or defaults is None or defaults.reward is None):
            return None
        if defaults is None or defaults.reward is None:
            raise ValueError(
                f"reward is required when {_no_defaults(defaults, 'reward')} (or an interaction=... that pays per turn)"
            )
        reward = defaults.reward
        if reward_kwargs is None:
            reward_kwargs = dict(defaults.reward_kwargs)
    if isinstance(reward, list):  # TRL's reward_funcs: their sum
        if reward_kwargs:
            raise TypeError("reward_kwargs are only used with a registered reward name, not with a list of rewards")
        return reward_sum(reward)
    return resolve_reward(reward, **(reward_kwargs or {}))


# Over 80 lines for its signature and documented argument list (16 of them); each resolution step is a helper.
def _task_default(defaults: Task | None, name: str) -> Any:
    """The task's value of field ``name``, or (no task) the default that :class:`~textrl_envs.tasks.Task` declares
    for it, so the budgets without a task are the ones a task gets when it states none."""
    if defaults is not None:
        return getattr(defaults, name)
    return next(f.default for f in fields(Task) if f.name == name)


def build_spec(
    task: str | None = None,
    *,
    prompts: Sequence[PromptItem] | None = None,
    reward: Any = None,
    reward_kwargs: dict[str, Any] | None = None,
    tokenizer: Any = None,
    max_new_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
    prompt_truncation: str = "left",
    nonfinite_reward: str = "raise",
    reward_timeout: float | None = DEFAULT_REWARD_TIMEOUT,
    interaction: Any = None,
    max_turns: int | None = None,
    turn_end: Any = None,
    max_turn_tokens: int | None = None,
    chat_template: bool | str | None = None,
    system_prompt: str | None = None,
    instruct: Any = None,
    tools: Sequence[Any] | None = None,
) -> EpisodeSpec:
    """Resolve environment arguments (task defaults overridden by the user's) into an :class:`EpisodeSpec`.

    :param task: Registered env id whose defaults to start from (``None``: no defaults; then
        ``prompts`` and ``reward`` (or ``interaction``) are required).
    :param prompts: List of prompt strings, or dicts ``{"prompt": str, **metadata}``; metadata is
        passed to the reward as keyword lists (TRL's convention). Also a path to a ``.jsonl``, ``.json``,
        ``.csv`` or ``.txt`` file, or a ``datasets.Dataset``, with a ``prompt`` column (:mod:`textrl_envs.data`).
    :param reward: Registered reward name, :class:`~textrl_envs.rewards.RewardModel`, or callable. In an
        interactive episode it is optional: given, it scores the episode at its end (prompt, and the
        conversation after it as the completion) and is added to the last step's reward.
    :param reward_kwargs: Keyword arguments for a reward given by name.
    :param tokenizer: ``None`` (bundled), a local directory, or a ``PreTrainedTokenizerBase``.
    :param max_new_tokens: Token budget of an episode (>= 1): every token after the prompt, the agent's and,
        in interactive episodes, the environment's replies.
    :param max_prompt_tokens: Prompt budget (>= 1).
    :param prompt_truncation: What to do with a prompt over ``max_prompt_tokens``: ``"left"``
        (default) drops tokens on the left and keeps the end, which the LM continues; ``"right"``
        drops tokens on the right; ``"error"`` raises.
    :param nonfinite_reward: ``"raise"`` (default): a NaN/inf reward raises a ``ValueError`` naming the
        reward, prompt and completion; ``"skip"``: it is scored 0.0 and the episode's final info gets
        ``reward_nonfinite=True`` (GRPO then drops the episode and counts it in ``rollout/skipped_episodes``).
    :param reward_timeout: Seconds a reward call (or a batch of interactive replies) may take; one that runs
        longer raises a ``TimeoutError`` naming it. Default
        :data:`~textrl_envs.rewards.base.DEFAULT_REWARD_TIMEOUT` (600 s: only a reward that hangs trips it);
        ``None``: no limit.
    :param interaction: An :class:`~textrl_envs.interaction.Interaction` that answers the agent's turns (the
        task's own for interactive ids); makes the episode interactive.
    :param max_turns: Interactive episodes: agent turns before the episode is truncated (>= 1; ``None``: the
        task's default, or no limit).
    :param turn_end: Interactive episodes: the token(s) that end an agent turn (a token id, a token's text, or
        a list of them; ``None``: the task's default, else EOS).
    :param max_turn_tokens: Interactive episodes: agent tokens per turn (>= 1; ``None``: the task's default,
        or no limit).
    :param chat_template: ``True`` renders every prompt with the tokenizer's chat template (a str prompt is one
        user message; a list of messages is TRL's conversational format), a str is a Jinja template to use
        instead, ``None``/``False`` leaves prompts as they are (:mod:`textrl_envs.chat`). Episodes then end at
        the template's end-of-turn token (EOS if the template has none), and so do an interactive episode's
        turns unless ``turn_end`` says otherwise. The reward and ``info["prompt"]``
        get the rendered text.
    :param system_prompt: With a chat template: a system message every prompt is rendered under (a conversation
        with its own system message keeps it; ``None``: none, so the template may write its default).
    :param instruct: ``True`` (or an :class:`~textrl_envs.instruct.InstructFormat`, or a dict of its fields) asks
        a task with a checkable answer the instruct way (:mod:`textrl_envs.instruct`): its question and an
        instruction that states the answer format, rendered with the chat template (``chat_template`` defaults to
        ``True``), graded by :class:`~textrl_envs.rewards.answers.FinalAnswerReward` unless ``reward`` is given, with
        the task's instruct budgets unless given. ``None``/``False``: off.
    :param tools: Python functions the model may call (:class:`~textrl_envs.tools.ToolCalling`): makes the episode
        interactive, the tools described through the chat template (the tokenizer's own, or a plain fallback) and
        each call answered by a ``tool`` message; the reward (the task's unless given) scores the transcript at the
        end. Not with ``interaction``.
    """
    defaults = get_task(task) if task is not None else None
    prompts = _resolve_prompts(defaults, prompts)
    fmt, asked = _resolve_instruct(defaults, instruct)
    if fmt is not None:
        from textrl_envs.instruct import instruct_prompts

        if fmt.answer_prefix and (asked.interaction is not None or interaction is not None or tools is not None):
            raise ValueError(
                f"instruct answer_prefix={fmt.answer_prefix!r} starts a single-turn reply; an interactive task's turns "
                "start with its interaction's reply_prefix (textrl_envs.interaction.Interaction.reply_prefix)"
            )

        prompts = instruct_prompts(list(_check_prompt_list(prompts)), fmt, asked.question)
        chat_template = True if chat_template is None else chat_template
        if chat_template is False:
            raise ValueError("instruct=True renders prompts with a chat template; leave chat_template unset or True")
        max_new_tokens = asked.max_new_tokens if max_new_tokens is None else max_new_tokens
        max_prompt_tokens = asked.max_prompt_tokens if max_prompt_tokens is None else max_prompt_tokens
        if reward is None and (defaults is None or defaults.reward is not None):
            reward, reward_kwargs = _instruct_reward(fmt, asked), None
        if asked.interaction is not None:  # an interactive task: its interaction reads and answers free text
            interaction = asked.interaction() if interaction is None else interaction
            max_turns = asked.max_turns if max_turns is None else max_turns
            max_turn_tokens = asked.max_turn_tokens if max_turn_tokens is None else max_turn_tokens
    given_turns = {"max_turns": max_turns, "turn_end": turn_end, "max_turn_tokens": max_turn_tokens}
    interaction_given = interaction is not None
    if tools is not None:
        interaction = _tool_interaction(tools, interaction)  # the task's reward still scores the episode
    interaction, max_turns, turn_end, max_turn_tokens = _resolve_turns(defaults, interaction, given_turns)
    max_new_tokens, max_prompt_tokens = check_budgets(
        max_new_tokens if max_new_tokens is not None else _task_default(defaults, "max_new_tokens"),
        max_prompt_tokens if max_prompt_tokens is not None else _task_default(defaults, "max_prompt_tokens"),
    )
    _check_choices(prompt_truncation, nonfinite_reward)
    reward_timeout = check_reward_timeout(reward_timeout)
    reward_kwargs = check_mapping("reward_kwargs", reward_kwargs, hint="e.g. reward_kwargs={'target': 'positive'}")
    tok = load_tokenizer(tokenizer)
    template = resolve_chat_template(tok, chat_template)
    interaction = bind_interaction(interaction, tok, template)
    if template is None:  # an interaction that speaks in chat messages (tools) brings a template if the env has none
        template = getattr(interaction, "chat_template", None)
    system_prompt = check_system_prompt(system_prompt, template)
    chat_open = template is not None and speaks_first(interaction)
    prepare = getattr(interaction, "prompt_messages", None)
    template_kwargs = dict(getattr(interaction, "chat_template_kwargs", None) or {})
    messages = None
    if template is not None:
        items = list(_check_prompt_list(prompts))
        messages = [with_system(prompt_conversation(item, i), system_prompt) for i, item in enumerate(items)]
        prompts = render_items(
            tok,
            template,
            items,
            system_prompt=system_prompt,
            open_end=chat_open,
            prepare=prepare,
            template_kwargs=template_kwargs,
        )
    texts, metadata = _split_prompts(prompts)
    reward_fn = _resolve_reward(defaults, reward, reward_kwargs, interaction, interaction_given)
    if reward_fn is not None:
        check_reward_call(reward_fn, list(metadata), reward_name(reward_fn))
    eos, pad, turn_end_ids = _end_ids(tok, template, defaults, interaction, turn_end)
    ids = encode_prompts(tok, texts, max_prompt_tokens, prompt_truncation, template)
    return EpisodeSpec(
        tokenizer=tok,
        prompt_texts=texts,
        prompt_ids=ids,
        metadata=metadata,
        reward=reward_fn,
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        eos_token_id=eos,
        pad_token_id=pad,
        vocab_size=len(tok),
        task_id=task,
        nonfinite_reward=nonfinite_reward,
        reward_timeout=reward_timeout,
        interaction=interaction,
        max_turns=max_turns,
        turn_end_ids=turn_end_ids,
        max_turn_tokens=max_turn_tokens,
        chat_template=template,
        system_prompt=system_prompt,
        chat_open=chat_open,
        instruct=fmt,
        prompt_messages=messages,
        chat_prepare=prepare,
        chat_kwargs=template_kwargs,
    )


def speaks_first(interaction: Any) -> bool:
    """Whether an interaction may open its episodes (its class overrides ``opening``)."""
    if interaction is None:
        return False
    from textrl_envs.interaction import Interaction

    own = getattr(type(interaction), "opening", None)
    return own is not None and own is not Interaction.opening


def _resolve_instruct(defaults: Task | None, instruct: Any) -> tuple[Any, InstructDefaults]:
    """``(format, the task's instruct defaults)``, or ``(None, ...)`` when instruct mode is off; a task without an
    instruct mode is refused, naming the tasks that have one."""
    from textrl_envs.instruct import resolve_instruct

    fmt = resolve_instruct(instruct)
    asked = InstructDefaults() if defaults is None else defaults.instruct
    if fmt is not None and asked is None:
        with_mode = ", ".join(t.env_id for t in all_tasks() if t.instruct is not None)
        raise ValueError(
            f"{defaults.env_id} has no instruct mode (its answers are not checkable as a final answer); tasks with "
            f"one: {with_mode}. For your own prompts with an 'answer' column, pass instruct=True without a task "
            "(TextGenEnv) or a chat_template=True and a reward of your own"
        )
    return fmt, asked


def _instruct_reward(fmt: Any, asked: InstructDefaults) -> Any:
    """The instruct mode's grader: the final answer checked by the format's check (else the task's)."""
    from textrl_envs.rewards.answers import FinalAnswerReward

    check = fmt.check or asked.check
    return FinalAnswerReward(check, fmt.style, fmt.format_weight, answer_prefix=fmt.answer_prefix)


def _tool_interaction(tools: Any, interaction: Any) -> Any:
    """The :class:`~textrl_envs.tools.ToolCalling` of ``tools=``; refused beside an ``interaction``."""
    if interaction is not None:
        raise ValueError(
            "give either tools=[...] (functions the model may call) or interaction=..., not both; a ToolCalling "
            "interaction with options of its own goes in interaction=ToolCalling(tools, timeout=...)"
        )
    from textrl_envs.tools.interaction import ToolCalling

    return ToolCalling(tools)


def prompt_conversation(item: Any, i: int) -> list[dict[str, Any]]:
    """A prompt item (``str``, messages, or ``{"prompt": ..., **metadata}``) as its conversation."""
    prompt = item["prompt"] if isinstance(item, dict) and "prompt" in item else item
    return as_messages(prompt, f"prompt #{i}")


def _resolve_prompts(defaults: Any, prompts: Any) -> Any:
    """The user's prompts (a file or a ``datasets.Dataset`` loaded into a list), else the task's."""
    if prompts is not None:
        prompts = load_prompts(prompts)  # a file or a datasets.Dataset becomes a list; a list stays as it is
    if prompts is None:
        if defaults is None or defaults.prompts is None:
            raise ValueError(f"prompts is required when {_no_defaults(defaults, 'prompts')}")
        prompts = defaults.prompts()
    return prompts


def _end_ids(
    tok: Any, template: str | None, defaults: Any, interaction: Any, turn_end: Any
) -> tuple[int | None, int, tuple[int, ...]]:
    """``(eos, pad, turn_end_ids)``: the token that ends an episode (the chat template's end of turn when there is
    one; ``None`` for a task whose episodes always run their budget), the padding token, and the tokens that end an
    interactive episode's turns."""
    eos, pad = _special_ids(tok)
    if template is not None:  # the episode is the assistant's turn: it ends at the template's end of turn
        eot = end_of_turn_id(tok, template)
        eos = eot if eot is not None else eos
        if turn_end is None and eos is not None:
            turn_end = eos  # an interactive episode's turns end there too
    turn_end_ids = resolve_turn_end(tok, turn_end, len(tok)) if interaction is not None else ()
    if defaults is not None and not defaults.stop_at_eos:
        eos = None  # the task's episodes always run their budget (pad keeps the EOS id, masked)
    return eos, pad, turn_end_ids


def _no_defaults(defaults: Any, what: str) -> str:
    """Why ``what`` has no default: no task given, or a suite task whose env class makes it."""
    if defaults is None:
        return "no task is given"
    return f"the task is the suite {defaults.env_id} (its env class {defaults.entry_point} makes the {what})"


def check_kwargs(kwargs: dict[str, Any], where: str, known: Sequence[str]) -> None:
    """Raise a clear TypeError for unknown keyword arguments."""
    if kwargs:
        raise TypeError(
            f"{where} got unknown keyword argument(s) {', '.join(sorted(kwargs))}; known: {', '.join(known)}"
        )
