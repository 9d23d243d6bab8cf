"""The built-in games by name (:data:`GAMES`, :func:`make_game`)."""

from __future__ import annotations

from textrl_envs.games.base import Game
from textrl_envs.games.kuhn import KuhnPoker
from textrl_envs.games.nim import Nim
from textrl_envs.games.tictactoe import TicTacToe

__all__ = ["GAMES", "make_game"]

#: The built-in games by name.
GAMES: dict[str, type[Game]] = {"tictactoe": TicTacToe, "nim": Nim, "kuhn": KuhnPoker}


def make_game(game: str | Game) -> Game:
    """A :class:`~textrl_envs.games.base.Game` by name (``"tictactoe"``, ``"nim"``, ``"kuhn"``), or ``game``
    itself.

    :raises ValueError: for an unknown name.
    """
    if isinstance(game, Game):
        return game
    if game not in GAMES:
        raise ValueError(f"unknown game {game!r}; known: {', '.join(sorted(GAMES))} (or pass a Game instance)")
    return GAMES[game]()
