"""Opponents of a learner in a two-player text game: who writes the other player's moves.

An opponent answers a batch of :class:`OpponentTurn` (one per game whose opponent is to move) with one move
text each, in one call: :meth:`Opponent.moves`. Its randomness comes from each turn's ``rng`` (the episode's
own generator), so a seeded episode replays the same opponent moves however the episodes are batched.

* :class:`RandomOpponent`: a uniform legal move.
* :class:`HeuristicOpponent`: the game's ``heuristic`` (win / block in tic-tac-toe, the multiple-of-four rule
  in Nim, bet the King in Kuhn poker).
* :class:`~textrl_envs.games.policy.PolicyOpponent`: an LM policy (any SB3 policy over the text envs'
  ``Dict`` observation space; the learner's own class) that writes tokens from its side of the conversation
  until its turn ends;
  :meth:`~textrl_envs.games.policy.PolicyOpponent.snapshot` freezes a copy of a policy that is training.
* any callable ``f(turn) -> str`` (:func:`as_opponent` wraps it).

An opponent may pick who plays an episode (:meth:`Opponent.pick`, e.g. a league of snapshots) and hear the
result (:meth:`Opponent.record`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from textrl_envs.games.base import Game

__all__ = ["FunctionOpponent", "HeuristicOpponent", "Opponent", "OpponentTurn", "RandomOpponent", "as_opponent"]


@dataclass
class OpponentTurn:
    """One opponent move to write.

    :ivar game: The :class:`~textrl_envs.games.base.Game`.
    :ivar state: The game state (the opponent is to move).
    :ivar player: The opponent's player number.
    :ivar text: The conversation from the opponent's side: the intro, the boards it was shown and its own moves,
        ending with the board it must move on (what an LM opponent reads).
    :ivar rng: The episode's generator (draw the opponent's randomness from it).
    :ivar messages: In chat mode (``SelfPlay(chat=True)``), the same conversation as chat messages: a user message
        with the rules and each board (:meth:`~textrl_envs.games.base.Game.chat_render`), an assistant message with
        each of the opponent's own moves (what a chat-speaking LM opponent reads); ``None`` otherwise.
    :ivar reply_prefix: In chat mode, how the opponent's reply starts, written for it after the generation prompt
        (:class:`~textrl_envs.games.SelfPlay`'s ``reply_prefix``); its move is the text it writes after it.
    """

    game: Game
    state: Any
    player: int
    text: str
    rng: np.random.Generator
    messages: tuple[dict[str, str], ...] | None = None
    reply_prefix: str = ""


class Opponent:
    """Base class: override :meth:`moves` (or :meth:`move`, one turn at a time)."""

    name = "opponent"
    #: Its moves are free text, read as a chat model's are (:meth:`~textrl_envs.games.base.Game.chat_read`); the
    #: others write the game's own move texts (:meth:`~textrl_envs.games.base.Game.move_text`).
    chat = False

    def move(self, turn: OpponentTurn) -> str:
        """The move text of one turn."""
        raise NotImplementedError(f"{type(self).__name__} must implement move(turn) or moves(turns)")

    def moves(self, turns: Sequence[OpponentTurn]) -> list[str]:
        """One move text per turn, in order (one call per step for every game whose opponent is to move)."""
        return [self.move(t) for t in turns]

    def pick(self, rng: np.random.Generator) -> Opponent:  # noqa: ARG002  (the protocol's signature)
        """Who plays one episode (drawn from ``rng``, the episode's generator); this opponent by default."""
        return self

    def record(self, opponent: Opponent, learner_return: float, learner_player: int) -> None:
        """Hear the result of an episode that ``opponent`` (what :meth:`pick` returned) played; ignored here."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomOpponent(Opponent):
    """A legal move drawn uniformly."""

    name = "random"

    def move(self, turn: OpponentTurn) -> str:
        legal = turn.game.legal(turn.state)
        return turn.game.move_text(legal[int(turn.rng.integers(len(legal)))])


class HeuristicOpponent(Opponent):
    """The game's ``heuristic(state, rng)`` move (every built-in game has one)."""

    name = "heuristic"

    def move(self, turn: OpponentTurn) -> str:
        game = turn.game
        cls = type(game)
        if cls.heuristic is Game.heuristic and cls.heuristic_policy is Game.heuristic_policy:
            raise TypeError(f"{cls.__name__} has no heuristic (heuristic_policy(state)); use RandomOpponent")
        return game.move_text(game.heuristic(turn.state, turn.rng))


class FunctionOpponent(Opponent):
    """An opponent made of a callable ``f(turn) -> str``."""

    def __init__(self, fn: Callable[[OpponentTurn], str], name: str | None = None) -> None:
        self.fn, self.name = fn, name or getattr(fn, "__name__", "function")

    def move(self, turn: OpponentTurn) -> str:
        text = self.fn(turn)
        if not isinstance(text, str):
            raise TypeError(f"opponent {self.name!r} returned {type(text).__name__}; it must return the move as a str")
        return text

    def __repr__(self) -> str:
        return f"FunctionOpponent({self.name!r})"


def as_opponent(opponent: Any) -> Opponent:
    """``opponent`` as an :class:`Opponent`: ``"random"``, ``"heuristic"``, an :class:`Opponent` or a callable.

    :raises TypeError: for anything else.
    """
    if isinstance(opponent, Opponent):
        return opponent
    if opponent == "random":
        return RandomOpponent()
    if opponent == "heuristic":
        return HeuristicOpponent()
    if callable(opponent) and not isinstance(opponent, type):
        return FunctionOpponent(opponent)
    raise TypeError(
        f"opponent must be 'random', 'heuristic', an Opponent (e.g. PolicyOpponent.snapshot(model.policy)) or a "
        f"callable f(turn) -> str; got {opponent!r}"
    )
