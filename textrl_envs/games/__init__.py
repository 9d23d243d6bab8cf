"""Two-player zero-sum text games, compact enough for a 128-position LM, and the ways to play them.

* The games, pure logic (:mod:`textrl_envs.games.base`): :class:`TicTacToe`, :class:`Nim`, :class:`KuhnPoker`.
* A single-agent view for SB3 (:class:`SelfPlay`, an :class:`~textrl_envs.interaction.Interaction`): the ids
  ``TicTacToe-v0``, ``Nim-v0`` and ``KuhnPoker-v0`` play the learner against an opponent
  (:mod:`textrl_envs.games.opponents`: random, heuristic, a frozen LM policy, a league).
* Both players as agents of a PettingZoo ``AECEnv`` (:mod:`textrl_envs.games.aec`, extra ``textrl[games]``).

Light: importing this package imports neither PettingZoo nor torch (an LM opponent imports torch when it plays).
"""

from __future__ import annotations

from textrl_envs.games.base import Forfeit, Game, play_moves
from textrl_envs.games.catalog import GAMES, make_game
from textrl_envs.games.kuhn import KuhnPoker
from textrl_envs.games.nim import Nim
from textrl_envs.games.opponents import (
    FunctionOpponent,
    HeuristicOpponent,
    Opponent,
    OpponentTurn,
    RandomOpponent,
    as_opponent,
)
from textrl_envs.games.policy import PolicyOpponent
from textrl_envs.games.selfplay import SelfPlay
from textrl_envs.games.tictactoe import TicTacToe

__all__ = [
    "GAMES",
    "Forfeit",
    "FunctionOpponent",
    "Game",
    "HeuristicOpponent",
    "KuhnPoker",
    "Nim",
    "Opponent",
    "OpponentTurn",
    "PolicyOpponent",
    "RandomOpponent",
    "SelfPlay",
    "TicTacToe",
    "as_opponent",
    "make_game",
    "play_moves",
]
