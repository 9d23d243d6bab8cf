"""Interactive (multi-turn) episodes: the protocol a task implements to answer the agent.

An interactive task is an :class:`Interaction`: it *starts* an episode from the prompt (and the episode's own
random generator) and *replies* to every agent turn that ends, with a :class:`Reply`: the text the environment
appends to the observation (or none), the reward of that turn, and whether the episode is over. The env owns the
token mechanics (see :mod:`textrl_envs.turns`): an agent turn ends at a turn-end token (EOS by default), after
``max_turn_tokens`` tokens, or when the episode's token budget is spent; the reply's tokens are written into the
observation window in the same step; the agent acts only its own tokens.

Writing one (a complete task; ``examples/interactive_task.py`` trains on it)::

    from textrl_envs.interaction import Interaction, Reply

    class Echo(Interaction):
        '''Say the secret word: the env tells you the word once you ask for it with "?".'''

        def start(self, prompt, metadata, rng):
            return {"word": metadata.get("word", "cat")}

        def reply(self, state, text, turn):
            if state["word"] in text:
                return Reply(" Yes!", reward=1.0, done=True)
            return Reply(f" The word is {state['word']}." if "?" in text else " No.")

    env = gym.make("TextGen-v0", prompts=[{"prompt": "Say the word:", "word": "dog"}], interaction=Echo(),
                   max_turns=3)

An interaction holds no per-episode state itself (one object serves every env of a vector env and of a
``SyncVectorEnv``): :meth:`Interaction.start` returns the episode's state, which the env hands back to every
:meth:`Interaction.reply` of that episode (the reply may update it in place). The env calls
:meth:`Interaction.replies` once per step with every turn that ended in that step, through :func:`answer_turns`,
the one function that runs it (with the env's ``reward_timeout``) and checks what it returns.

This module is light (numpy and the reward-timeout helper): task lists may point at interactions defined on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any, NamedTuple

import numpy as np

from textrl_envs.rewards.base import call_with_timeout

__all__ = [
    "TASK_SEED_BOUND",
    "Interaction",
    "Reply",
    "answer_turns",
    "bind_interaction",
    "check_interaction",
    "episode_infos",
    "episode_messages",
    "start_episode",
]

#: Task seeds are drawn as ``rng.integers(TASK_SEED_BOUND)`` from the env's ``np_random``, once per episode.
TASK_SEED_BOUND = 2**31


class Reply(NamedTuple):
    """The environment's answer to one agent turn.

    :param text: Text appended to the observation after the agent's turn (``None`` or ``""``: nothing).
    :param reward: The reward of this turn (paid on the step that ended it).
    :param done: Whether the episode is over (the env then reports ``terminated``).
    """

    text: str | None = None
    reward: float = 0.0
    done: bool = False


class Interaction:
    """Base class of an interactive task: it starts episodes and answers the agent's turns.

    Subclass it and override :meth:`reply` (and :meth:`start` when an episode needs state, such as a secret
    number; :meth:`opening` when the environment speaks first; :meth:`replies` to answer a batch of turns at
    once, e.g. with one call to a model). See the module docstring for an example.
    """

    #: Whether :meth:`reply` writes its text in the chat template's format itself (as tool results do); otherwise,
    #: with a chat template, the env writes each reply as a user message (:func:`~textrl_envs.chat.chat_reply`).
    writes_chat: bool = False

    #: With a chat template, the start of every agent turn, written by the env after the template's generation prompt
    #: (an assistant prefill: ``"I take cell"`` makes a cell's number the model's likely next token). The text
    #: :meth:`reply` reads, and the ``transcript``'s agent entry holds, is what the agent writes after it; the prefix
    #: is in the observation and the ``completion``, as the env's tokens. ``""`` (the default): none.
    reply_prefix: str = ""

    def start(self, prompt: str, metadata: Mapping[str, Any], rng: np.random.Generator) -> Any:  # noqa: ARG002  (the protocol's signature; this default keeps no state)
        """Begin an episode and return its state (``None`` by default).

        :param prompt: The episode's prompt text.
        :param metadata: The prompt's metadata (the keys of a dict prompt other than ``"prompt"``; empty for a
            prompt given as text to ``reset``).
        :param rng: The episode's own generator, seeded from the env's ``np_random`` (one draw per episode), so
            that members of a prompt group start from the same state and seeded resets repeat.
        """
        return None

    def opening(self, state: Any) -> str | None:  # noqa: ARG002  (the protocol's signature)
        """Text the environment appends after the prompt before the agent's first turn (``None``: nothing)."""
        return None

    def reply(self, state: Any, text: str, turn: int) -> Reply:
        """Answer one finished agent turn.

        :param state: The episode's state, as :meth:`start` returned it (update it in place if needed).
        :param text: The agent's turn, decoded without special tokens (so without EOS; a turn-end token that is
            not special, such as ``"\\n"``, stays in the text).
        :param turn: The turn's number, 1 for the first.
        :return: A :class:`Reply` (or a tuple ``(text, reward, done)``).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement reply(state, text, turn) -> Reply")

    def episode_info(self, state: Any) -> dict[str, Any]:  # noqa: ARG002  (the protocol's signature)
        """Entries the env adds to the final info of the episode whose state is ``state`` (none by default), such
        as the side a game's learner played (``learner_player``), which role-conditioned advantages read. Values
        are ints or strings, the same keys for every episode of the task."""
        return {}

    def bind(self, tokenizer: Any, chat_template: str | None) -> Interaction:  # noqa: ARG002  (the protocol's signature; this default needs neither)
        """The interaction an env with this tokenizer and chat template (``None``: none) uses: ``self`` by default.

        Called once when the env is built (:func:`bind_interaction`). An interaction that writes its replies in the
        chat template's format (:class:`~textrl_envs.tools.ToolCalling`) returns a copy that knows them, and may set
        ``chat_template`` (the template to render with when the env has none), ``chat_template_kwargs`` (extra
        arguments of ``apply_chat_template``, such as ``tools``) and ``prompt_messages(messages)`` (the prompt's
        messages as the model should see them), which the env then uses to render its prompts.
        """
        return self

    def messages(self, state: Any) -> list[dict[str, Any]] | None:  # noqa: ARG002  (the protocol's signature)
        """The episode's conversation after the prompt as chat messages, what a TRL-style reward gets as the
        completion with chat prompts (``None`` by default: the conversation's text as one assistant message)."""
        return None

    def replies(self, states: Sequence[Any], texts: Sequence[str], turns: Sequence[int]) -> list[Reply]:
        """Answer a batch of finished turns (one per episode that ended a turn this step); calls :meth:`reply`.

        :return: One :class:`Reply` per turn, in order.
        """
        return [self.reply(s, t, n) for s, t, n in zip(states, texts, turns)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_interaction(interaction: Any) -> Any:
    """Check that ``interaction`` implements the protocol (``start``, ``opening``, ``replies``); return it.

    :raises TypeError: naming what is missing.
    """
    missing = [m for m in ("start", "opening", "replies") if not callable(getattr(interaction, m, None))]
    if missing:
        raise TypeError(
            f"interaction must be an instance of textrl_envs.interaction.Interaction (or implement start, opening "
            f"and replies); got {type(interaction).__name__}, without {', '.join(missing)}"
        )
    return interaction


def episode_infos(interaction: Any, states: Sequence[Any]) -> list[dict[str, Any]]:
    """The extra final-info entries of the episodes ``states`` (:meth:`Interaction.episode_info`; none for an
    interaction without the method).

    :raises TypeError: if it returns something other than a dict.
    """
    info = getattr(interaction, "episode_info", None)
    if info is None:
        return [{} for _ in states]
    out = [info(s) for s in states]
    for extra in out:
        if not isinstance(extra, dict):
            raise TypeError(
                f"{type(interaction).__name__}.episode_info returned {_short(extra)}; it must return a dict of "
                "final-info entries"
            )
    return out


def bind_interaction(interaction: Any, tokenizer: Any, chat_template: str | None) -> Any:
    """The interaction an env uses: ``interaction.bind(tokenizer, chat_template)`` where it has ``bind``, else itself.

    :raises TypeError: if ``bind`` returns something that is not an interaction.
    """
    bind = getattr(interaction, "bind", None)
    if interaction is None or not callable(bind):
        return interaction
    bound = bind(tokenizer, chat_template)
    return check_interaction(bound)


def episode_messages(interaction: Any, states: Sequence[Any]) -> list[list[dict[str, Any]] | None] | None:
    """Each episode's conversation as chat messages (:meth:`Interaction.messages`); ``None`` when the interaction
    gives none."""
    fn = getattr(interaction, "messages", None)
    if not callable(fn):
        return None
    out = [fn(s) for s in states]
    return out if any(m is not None for m in out) else None


def _who(interaction: Any, task: str | None) -> str:
    name = type(interaction).__name__
    return f"task {task!r} (interaction {name})" if task else f"interaction {name}"


def _short(text: Any, limit: int = 60) -> str:
    s = str(text).replace("\n", "\\n")
    return repr(s if len(s) <= limit else s[: limit - 3] + "...")


def start_episode(
    interaction: Any, prompt: str, metadata: Mapping[str, Any], seed: int, task: str | None
) -> tuple[Any, str | None]:
    """Start one episode: ``(state, opening text or None)``.

    :param seed: The task seed (a draw of the env's ``np_random``); the interaction gets ``default_rng(seed)``.
    :raises RuntimeError: if ``start`` or ``opening`` raises (naming the task and the prompt).
    :raises TypeError: if the opening is neither a str nor ``None``.
    """
    who = _who(interaction, task)
    try:
        state = interaction.start(prompt, metadata, np.random.default_rng(seed))
        opening = interaction.opening(state)
    except Exception as exc:  # re-raised with context
        raise RuntimeError(
            f"{who} raised {type(exc).__name__} when starting an episode on prompt {_short(prompt)}: {exc}"
        ) from exc
    if opening is not None and not isinstance(opening, str):
        raise TypeError(f"{who} returned an opening of type {type(opening).__name__}; it must be a str or None")
    return state, opening or None


def _check_reply(reply: Any, who: str, turn: int, text: str) -> Reply:
    where = f"turn {turn} (agent text {_short(text)})"
    if not isinstance(reply, Reply):
        if not isinstance(reply, tuple) or len(reply) != 3:
            raise TypeError(f"{who} returned {_short(reply)} for {where}; expected Reply(text, reward, done)")
        reply = Reply(*reply)
    if reply.text is not None and not isinstance(reply.text, str):
        raise TypeError(
            f"{who} returned a reply text of type {type(reply.text).__name__} ({_short(reply.text)}) for {where}; "
            "the text must be a str or None"
        )
    if isinstance(reply.reward, bool) or not isinstance(reply.reward, Real):
        raise TypeError(
            f"{who} returned a reward of type {type(reply.reward).__name__} ({_short(reply.reward)}) for {where}; "
            "it must be a real number"
        )
    if not isinstance(reply.done, (bool, np.bool_)):
        raise TypeError(f"{who} returned done={_short(reply.done)} for {where}; it must be a bool")
    return reply


def answer_turns(
    interaction: Any,
    states: Sequence[Any],
    texts: Sequence[str],
    turns: Sequence[int],
    *,
    task: str | None = None,
    timeout: float | None = None,
    nonfinite: str = "raise",
) -> tuple[list[str | None], np.ndarray, np.ndarray, np.ndarray]:
    """The replies to every agent turn that ended in one step: one call to ``interaction.replies``.

    The one place where replies are computed (the single env calls it with one turn, the vector env with every
    row that ended a turn in the step), so that it can later run off the critical path.

    :param interaction: The :class:`Interaction`.
    :param states: Each episode's state.
    :param texts: Each agent turn's text.
    :param turns: Each turn's number (1-based).
    :param task: The env id, for error messages.
    :param timeout: Seconds the batch may take (``None``: no limit): the env's ``reward_timeout``.
    :param nonfinite: ``"raise"``: a NaN/inf reward raises; ``"skip"``: it is scored 0 and flagged.
    :return: ``(texts, rewards, done, nonfinite)``: reply texts (``None``: nothing to append), ``float64``
        rewards, ``bool`` done flags and ``bool`` flags of non-finite rewards scored 0, one per turn.
    :raises RuntimeError: the interaction raised (naming the task and the first turn).
    :raises TimeoutError: it ran longer than ``timeout``.
    :raises TypeError: it returned something other than replies of the documented types.
    :raises ValueError: wrong number of replies, or a non-finite reward with ``nonfinite="raise"``.
    """
    who = _who(interaction, task)
    n = len(texts)
    first = f"turn {turns[0]} (agent text {_short(texts[0])})" if n else "no turn"

    def call() -> Any:
        return interaction.replies(list(states), list(texts), [int(t) for t in turns])

    def on_timeout() -> Exception:
        return TimeoutError(
            f"{who} did not reply within reward_timeout={timeout:g} s (batch of {n}; first: {first}); the "
            "interaction hangs or is too slow: fix it, or raise reward_timeout"
        )

    try:
        out = call() if timeout is None else call_with_timeout(call, timeout, on_timeout)
    except TimeoutError:
        raise
    except Exception as exc:  # re-raised with context
        raise RuntimeError(
            f"{who} raised {type(exc).__name__} while replying (batch of {n}; first: {first}): {exc}"
        ) from exc
    out = list(out) if isinstance(out, (list, tuple)) else out
    if not isinstance(out, list) or len(out) != n:
        got = f"{len(out)} replies" if isinstance(out, list) else type(out).__name__
        raise ValueError(f"{who}.replies returned {got} for {n} turns; it must return one Reply per turn")
    replies = [_check_reply(r, who, int(t), x) for r, t, x in zip(out, turns, texts)]
    rewards = np.array([float(r.reward) for r in replies], dtype=np.float64)
    bad = ~np.isfinite(rewards)
    if bad.any():
        if nonfinite != "skip":
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{who} returned a non-finite reward ({rewards[i]}) for turn {int(turns[i])} (agent text "
                f"{_short(texts[i])}); non-finite rewards never enter training (nonfinite_reward='skip' scores "
                "them 0 and flags the episode)"
            )
        rewards = np.where(bad, 0.0, rewards)
    return [r.text or None for r in replies], rewards, np.array([bool(r.done) for r in replies]), bad
