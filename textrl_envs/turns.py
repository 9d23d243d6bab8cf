"""The turn mechanics of interactive episodes, shared by the single env and the vector env.

An interactive episode alternates agent turns and environment replies in one token window (see
:mod:`textrl_envs.core` for the layout and :mod:`textrl_envs.interaction` for the protocol):

* an agent turn ends at a turn-end token, after ``max_turn_tokens`` agent tokens, or when the episode's budget
  (``max_new_tokens``: every token after the prompt) is spent (:func:`turns_over`);
* every turn that ends is answered (:func:`textrl_envs.interaction.answer_turns`); the reply's tokens
  (:class:`ReplyEncoder`) are appended to the window in the same step;
* the episode then ends, ``terminated`` when the reply says so, ``truncated`` after ``max_turns`` turns or
  when the budget is spent (:func:`turn_episode_ends`).

:class:`TurnBook` keeps the per-episode Python state of the vector env's interactive rows (the interaction's
state, the tokens after the prompt, the current turn, the transcript) and runs a step's turn logic for the whole
batch; the window itself stays in the vector env's tensors (:func:`textrl_envs.bookkeeping.inject_tokens_`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from textrl_envs.chat import chat_opening, chat_reply
from textrl_envs.core import EpisodeSpec
from textrl_envs.interaction import answer_turns, start_episode

__all__ = [
    "ReplyEncoder",
    "TurnBook",
    "TurnResult",
    "turn_episode_ends",
    "turns_over",
    "turn_prefix",
    "written_opening",
    "written_reply",
]

#: Distinct reply texts whose token ids a :class:`ReplyEncoder` remembers.
REPLY_CACHE = 4096


def turns_over(
    tokens: np.ndarray,
    turn_lengths: np.ndarray,
    used: np.ndarray,
    turn_end_ids: Sequence[int],
    max_turn_tokens: int | None,
    budget: int,
) -> np.ndarray:
    """Which agent turns end with this step's tokens.

    :param tokens: ``(N,)`` the actions just appended.
    :param turn_lengths: ``(N,)`` agent tokens in the current turn, this step's included.
    :param used: ``(N,)`` tokens after the prompt (agent's and env's), this step's included.
    :param turn_end_ids: Ids that end a turn.
    :param max_turn_tokens: Agent tokens per turn (``None``: no limit).
    :param budget: The episode's token budget.
    :return: ``(N,)`` bool.
    """
    over = np.isin(tokens, np.asarray(turn_end_ids, dtype=np.int64)) | (used >= budget)
    if max_turn_tokens is not None:
        over |= turn_lengths >= max_turn_tokens
    return over


def turn_episode_ends(
    done: np.ndarray, turns: np.ndarray, used: np.ndarray, max_turns: int | None, budget: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(terminated, truncated)`` of episodes whose turn was just answered.

    Terminated when the reply says the episode is over; otherwise truncated after ``max_turns`` turns or when the
    tokens after the prompt (the reply's included) reach the budget.
    """
    terminated = np.asarray(done, dtype=bool)
    limit = used >= budget
    if max_turns is not None:
        limit = limit | (turns >= max_turns)
    return terminated, ~terminated & limit


class ReplyEncoder:
    """Token ids of reply (and opening) texts, remembered per text, cut to the window with a warning once.

    :param tokenizer: The env's tokenizer.
    :param width: The observation window ``W``: a reply longer than that keeps its last ``W`` tokens.
    :param where: Who the warning names (the env id or the interaction).
    """

    def __init__(self, tokenizer: Any, width: int, where: str) -> None:
        self.tokenizer, self.width, self.where = tokenizer, width, where
        self._ids: dict[str, tuple[int, ...]] = {}
        self.warned = False

    def whole(self, text: str) -> tuple[int, ...]:
        """All of ``text``'s token ids, uncut."""
        ids = self._ids.get(text)
        if ids is None:
            ids = tuple(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
            if len(self._ids) >= REPLY_CACHE:
                self._ids.clear()
            self._ids[text] = ids
        return ids

    def __call__(self, text: str) -> tuple[int, ...]:
        ids = self.whole(text)
        if len(ids) > self.width:
            if not self.warned:
                self.warned = True
                warnings.warn(
                    f"{self.where}: a reply of {len(ids)} tokens is longer than the observation window ({self.width} "
                    f"tokens); only its last {self.width} tokens are kept (this warning is shown once). Shorten the "
                    "replies or raise max_prompt_tokens / max_new_tokens",
                    stacklevel=4,
                )
            ids = ids[-self.width :]
        return ids


def env_writes_chat(spec: EpisodeSpec) -> bool:
    """Whether the env wraps replies in chat messages: a chat template, and an interaction that does not render its
    replies itself (tool results)."""
    return spec.chat_template is not None and not getattr(spec.interaction, "writes_chat", False)


def turn_prefix(spec: EpisodeSpec) -> str:
    """The text the env writes at the start of each agent turn: the interaction's
    :attr:`~textrl_envs.interaction.Interaction.reply_prefix` when the env writes chat (:func:`env_writes_chat`),
    else ``""``."""
    if not env_writes_chat(spec):
        return ""
    return str(getattr(spec.interaction, "reply_prefix", "") or "")


def written_reply(spec: EpisodeSpec, reply: str, last_token: int, done: bool = False) -> str:
    """A reply as the observation holds it: as it is, or with a chat template, stripped, as a user message after the
    assistant's turn and before the next one's generation prompt (:func:`~textrl_envs.chat.chat_reply`; the turn's
    end-of-turn marker is written too unless the agent's ``last_token`` was it), then the next turn's
    :func:`turn_prefix` unless the reply ends the episode (``done``)."""
    if not env_writes_chat(spec):
        return reply
    written = chat_reply(spec.tokenizer, spec.chat_template, reply.strip(), last_token in spec.turn_end_ids)
    return written if done else written + turn_prefix(spec)


def written_opening(spec: EpisodeSpec, opening: str | None) -> str | None:
    """An episode's opening as the observation holds it: as it is, or, when the prompts were rendered with an open
    user message (:attr:`~textrl_envs.core.EpisodeSpec.chat_open`), what completes that message and asks the
    assistant (:func:`~textrl_envs.chat.chat_opening`; also when the opening is ``None``); then the first turn's
    :func:`turn_prefix` (after a prompt that already asks the assistant, the prefix is the whole opening)."""
    prefix = turn_prefix(spec)
    if not spec.chat_open:
        return (opening or "") + prefix if prefix else opening
    return chat_opening(spec.tokenizer, spec.chat_template, opening) + prefix


def who(spec: EpisodeSpec) -> str:
    """How messages name an interactive env: its task id, else its interaction's class."""
    return f"task {spec.task_id!r}" if spec.task_id else f"interaction {type(spec.interaction).__name__}"


class TurnResult:
    """What a step's turn logic hands back to the vector env.

    :ivar rewards: ``(N,)`` rewards of the step (the replies' rewards on rows that ended a turn).
    :ivar terminated: ``(N,)`` bool.
    :ivar truncated: ``(N,)`` bool.
    :ivar inject_rows: Rows whose window gets reply tokens, and :ivar inject_ids: those tokens, one tuple per row.
    """

    def __init__(self, n: int) -> None:
        self.rewards = np.zeros(n, dtype=np.float64)
        self.terminated = np.zeros(n, dtype=bool)
        self.truncated = np.zeros(n, dtype=bool)
        self.inject_rows: list[int] = []
        self.inject_ids: list[tuple[int, ...]] = []


class TurnBook:
    """The Python-side state of N interactive episodes (the vector env's rows), and a step's turn logic.

    :param spec: The env's spec (its interaction, turn settings, tokenizer).
    :param num_envs: ``N``.
    :param width: The observation window ``W``.
    :param decode: ``decode(ids) -> str`` without special tokens (the env's fast decoder).
    """

    def __init__(self, spec: EpisodeSpec, num_envs: int, width: int, decode: Any) -> None:
        self.spec = spec
        self.decode = decode
        self.encode = ReplyEncoder(spec.tokenizer, width, who(spec))
        self.states: list[Any] = [None] * num_envs
        self.conversation: list[list[int]] = [[] for _ in range(num_envs)]  # every token after the prompt
        self.turn_start = np.zeros(num_envs, dtype=np.int64)  # where the current turn begins in `conversation`
        self.turns = np.zeros(num_envs, dtype=np.int64)
        self.transcripts: list[list[dict[str, str]]] = [[] for _ in range(num_envs)]
        self.nonfinite = np.zeros(num_envs, dtype=bool)

    def start(self, envs: Sequence[int], prompts: Sequence[str], metadata: Sequence[dict], seeds: Sequence[int]):
        """Begin the episodes of ``envs``; return the opening tokens of each (empty tuple: none).

        :raises ValueError: an opening that leaves the agent no token of the budget.
        """
        openings = []
        for env, prompt, meta, seed in zip(envs, prompts, metadata, seeds):
            state, opening = start_episode(self.spec.interaction, prompt, meta, int(seed), self.spec.task_id)
            written = written_opening(self.spec, opening)
            ids = self.encode.whole(written) if written else ()
            check_opening(self.spec, len(ids))  # its whole length: one past the window is refused, never cut
            self.states[env] = state
            self.conversation[env] = list(ids)
            self.turn_start[env] = len(ids)
            self.turns[env] = 0
            self.nonfinite[env] = False
            self.transcripts[env] = [{"role": "env", "text": prompt}]
            if opening:
                self.transcripts[env].append({"role": "env", "text": opening})
            openings.append(ids)
        return openings

    def step(self, tokens: Sequence[int], used: np.ndarray) -> TurnResult:
        """Record this step's actions and answer every turn they end, in one batched call.

        :param tokens: ``(N,)`` the actions (host ints).
        :param used: ``(N,)`` tokens after the prompt, this step's action included; the replies' tokens are added
            in place.
        """
        spec, n = self.spec, len(tokens)
        out = TurnResult(n)
        for conv, t in zip(self.conversation, tokens.tolist()):
            conv.append(t)
        lengths = used - self.turn_start
        over = np.flatnonzero(turns_over(tokens, lengths, used, spec.turn_end_ids, spec.max_turn_tokens, spec.budget))
        if not over.size:
            return out
        texts = [self.decode(self.conversation[e][self.turn_start[e] :]) for e in over.tolist()]
        self.turns[over] += 1
        reply_texts, rewards, done, bad = answer_turns(
            spec.interaction,
            [self.states[e] for e in over.tolist()],
            texts,
            self.turns[over].tolist(),
            task=spec.task_id,
            timeout=spec.reward_timeout,
            nonfinite=spec.nonfinite_reward,
        )
        out.rewards[over] = rewards
        self.nonfinite[over] |= bad
        for e, text, reply, ends in zip(over.tolist(), texts, reply_texts, done):
            self.transcripts[e].append({"role": "agent", "text": text})
            if reply is not None:
                ids = self.encode(written_reply(spec, reply, self.conversation[e][-1], bool(ends)))
                self.transcripts[e].append({"role": "env", "text": reply})
                self.conversation[e].extend(ids)
                used[e] += len(ids)
                out.inject_rows.append(e)
                out.inject_ids.append(ids)
            self.turn_start[e] = len(self.conversation[e])
        out.terminated[over], out.truncated[over] = turn_episode_ends(
            done, self.turns[over], used[over], spec.max_turns, spec.budget
        )
        return out


def check_opening(spec: EpisodeSpec, n_tokens: int) -> None:
    """Raise unless an opening of ``n_tokens`` tokens leaves the agent at least one token of the budget."""
    if n_tokens >= spec.budget:
        raise ValueError(
            f"{who(spec)}: the opening has {n_tokens} tokens, which leaves the agent none of the episode's budget "
            f"max_new_tokens={spec.budget} (every token after the prompt counts); raise max_new_tokens"
        )
