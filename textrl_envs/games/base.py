"""The protocol of a two-player zero-sum text game: pure logic, no tokens, no env.

A :class:`Game` is stateless; its states are small immutable values that :meth:`Game.play` returns anew, so a
state can be kept, copied and compared freely (a test replays a game move by move). Players are ``0`` (moves
first) and ``1``. A move is what :meth:`Game.parse` reads out of a player's text and :meth:`Game.move_text`
writes back; :meth:`Game.render` is the board as one player sees it, the text an env writes before that
player's turn. An unreadable or illegal move loses the game (:meth:`Game.forfeit`), as in most text-game
arenas: the player learns the format from the result.

For an instruct (chat) model a game also speaks plain language (:class:`~textrl_envs.games.SelfPlay` with
``chat=True``): :attr:`Game.chat_intro` states the rules, :meth:`Game.chat_render` shows the position with the legal
moves listed, :meth:`Game.chat_read` reads the move from free text (the final answer first: ``Answer: 5``), and
:meth:`Game.chat_result` tells the end. :attr:`Game.chat_reply_prefix` starts each of the model's replies for it
(``"I take cell"``); the move is then the first one its text states (:meth:`Game.read`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MOVE_CUE", "Forfeit", "Game", "draw_move", "play_moves"]

#: How every board ends: where the move goes. The bundled LM answers ``x=`` with a number (its corpus has
#: ``x=`` before numbers), so a move written as a digit is within its reach before any training.
MOVE_CUE = " x="


@dataclass(frozen=True)
class Forfeit:
    """The final state of a game lost by ``player`` for an unreadable or illegal move (``text``)."""

    state: Any
    player: int
    text: str


class Game:
    """Base class of a two-player zero-sum game (override every method that raises).

    :cvar name: The game's short name (``"tictactoe"``).
    :cvar intro: The rules in a line: the prompt of an episode (the same for both players: each sees the board
        from its own side).
    """

    name = "game"
    intro = ""
    #: The rules for an instruct model, the first user message of a chat (``""``: no chat mode).
    chat_intro = ""
    #: How an instruct model's reply starts, written for it (an assistant prefill, :class:`SelfPlay`'s default
    #: ``reply_prefix``): the words before the move (``"I take cell"``), so that its next token states one.
    chat_reply_prefix = ""

    def initial(self, rng: np.random.Generator) -> Any:
        """The starting state (chance, such as a deal, drawn from ``rng``)."""
        raise NotImplementedError

    def to_move(self, state: Any) -> int:
        """The player to move (``0`` or ``1``) in a state that is not over."""
        raise NotImplementedError

    def legal(self, state: Any) -> list[Any]:
        """The legal moves of the player to move, in a fixed order."""
        raise NotImplementedError

    def play(self, state: Any, move: Any) -> Any:
        """The state after the player to move plays ``move`` (legal: see :meth:`legal`)."""
        raise NotImplementedError

    def is_over(self, state: Any) -> bool:
        """Whether the game has ended (a :class:`Forfeit` always has)."""
        raise NotImplementedError

    def returns(self, state: Any) -> tuple[float, float]:
        """Each player's payoff in a final state; they sum to 0."""
        raise NotImplementedError

    def render(self, state: Any, player: int) -> str:
        """The position as ``player`` sees it (its own marks, its own card), ending where its move goes."""
        raise NotImplementedError

    def move_text(self, move: Any) -> str:
        """A move as a player writes it (what :meth:`parse` reads back)."""
        raise NotImplementedError

    def read(self, text: str) -> Any:
        """The move written in ``text``, legal or not (``None``: none is written)."""
        raise NotImplementedError

    def initial_distribution(self) -> list[tuple[Any, float]]:
        """Every starting state :meth:`initial` can draw, with its probability (for exact analysis: see
        :mod:`textrl_envs.games.analysis`)."""
        raise NotImplementedError

    def heuristic_policy(self, state: Any) -> list[tuple[Any, float]]:
        """The fixed heuristic opponent's moves in ``state`` with their probabilities (a game with a heuristic
        overrides it; :meth:`heuristic` draws from it)."""
        raise NotImplementedError(f"{type(self).__name__} has no heuristic")

    def chat_render(self, state: Any, player: int) -> str:
        """The position as ``player`` sees it, in plain language for an instruct model, with the legal moves and the
        reply it asks for (a free cell's number, one word, ...)."""
        raise NotImplementedError(f"{type(self).__name__} has no chat mode")

    # -- shared by every game ---------------------------------------------------------------------------------

    def chat_read(self, text: str) -> Any:
        """The move an instruct model's free text states: :meth:`read` of its final answer (``Answer: 5``, else its
        last number: :func:`~textrl_envs.rewards.answers.final_answer`), else of the whole text."""
        from textrl_envs.rewards.answers import final_answer

        stated = final_answer(text)
        move = self.read(stated) if stated else None
        return move if move is not None else self.read(text)

    def chat_result(self, state: Any, player: int) -> str:
        """The end of the game as ``player`` reads it, in plain language."""
        mine = self.payoffs(state)[player]
        line = "You win." if mine > 0 else "You lose." if mine < 0 else "It is a draw."
        if isinstance(state, Forfeit):
            line += " Your move was not a legal move." if state.player == player else " My move was not legal."
        return line

    def heuristic(self, state: Any, rng: np.random.Generator) -> Any:
        """A move of the heuristic opponent, drawn from :meth:`heuristic_policy` with ``rng``
        (:func:`draw_move`)."""
        return draw_move(self.heuristic_policy(state), rng)

    def parse(self, state: Any, text: str, chat: bool = False) -> Any:
        """The legal move written in ``text`` for the player to move (read as free text with ``chat``:
        :meth:`chat_read`), else ``None``."""
        move = self.chat_read(text) if chat else self.read(text)
        return move if move is not None and move in self.legal(state) else None

    def forfeit(self, state: Any, player: int, text: str) -> Forfeit:
        """The final state of ``state`` lost by ``player`` for writing ``text``."""
        return Forfeit(state, player, text)

    def over(self, state: Any) -> bool:
        """:meth:`is_over`, forfeits included."""
        return isinstance(state, Forfeit) or self.is_over(state)

    def payoffs(self, state: Any) -> tuple[float, float]:
        """:meth:`returns`, forfeits included (the forfeiting player gets -1, the other +1)."""
        if isinstance(state, Forfeit):
            return (-1.0, 1.0) if state.player == 0 else (1.0, -1.0)
        return self.returns(state)

    def result_text(self, state: Any, player: int) -> str:
        """The end of the game as ``player`` reads it: `` win``, `` loss`` or `` draw`` (and why, for a forfeit)."""
        mine = self.payoffs(state)[player]
        word = " win" if mine > 0 else " loss" if mine < 0 else " draw"
        if isinstance(state, Forfeit):
            return word + (" (illegal)" if state.player == player else " (opponent illegal)")
        return word

    def step_text(self, state: Any, text: str, chat: bool = False) -> tuple[Any, bool]:
        """Play the move written in ``text`` by the player to move: ``(next state, whether it was legal)``; with
        ``chat``, the move is read from free text (:meth:`chat_read`)."""
        move = self.parse(state, text, chat)
        if move is None:
            return self.forfeit(state, self.to_move(state), text), False
        return self.play(state, move), True

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def draw_move(policy: Sequence[tuple[Any, float]], rng: np.random.Generator) -> Any:
    """One move drawn from ``policy`` (``(move, probability)`` pairs): a sure move draws nothing from ``rng``,
    equally likely moves one ``rng.integers(n)``, and other odds one ``rng.random()`` against the running sum
    of the probabilities in the order given."""
    if not policy:
        raise ValueError("draw_move needs at least one (move, probability) pair")
    if len(policy) == 1:
        return policy[0][0]
    probs = [p for _, p in policy]
    if all(p == probs[0] for p in probs):
        return policy[int(rng.integers(len(policy)))][0]
    u, total = float(rng.random()), 0.0
    for move, p in policy:
        total += p
        if u < total:
            return move
    return policy[-1][0]


def play_moves(game: Game, state: Any, texts: Sequence[str]) -> Any:
    """Play the moves written in ``texts`` in turn from ``state`` (a forfeit ends it); return the last state."""
    for text in texts:
        if game.over(state):
            raise ValueError(f"{game.name}: the game is over; {text!r} cannot be played")
        state, _ = game.step_text(state, text)
    return state
