"""Tic-tac-toe with a nine-character board: ``x`` is the player's own mark, ``o`` the opponent's, ``.`` empty."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from textrl_envs.games.base import MOVE_CUE, Game

__all__ = ["TicTacToe", "TicTacToeState"]

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_CELL = re.compile(r"[1-9]")


@dataclass(frozen=True)
class TicTacToeState:
    """``cells``: nine entries, ``-1`` empty or the player (0, 1) whose mark it is, row by row from the top left."""

    cells: tuple[int, ...] = (-1,) * 9

    @property
    def moves(self) -> int:
        return sum(c >= 0 for c in self.cells)


def winner(cells: tuple[int, ...]) -> int | None:
    """The player with three in a line, else ``None``."""
    for a, b, c in LINES:
        if cells[a] >= 0 and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return None


class TicTacToe(Game):
    """Tic-tac-toe. Cells are numbered 1-9 row by row from the top left; a move is the cell's digit.

    Each player sees the board from its own side, ``x`` its marks and ``o`` the opponent's, so one policy plays
    either role: the board `` x.o.x.... x=`` (13 tokens of the bundled tokenizer) ends where the move goes.
    Payoffs: win 1, loss -1, draw 0.
    """

    name = "tictactoe"
    intro = "Tic-tac-toe, you are x."
    chat_reply_prefix = "I take cell"
    chat_intro = (
        "Let's play tic-tac-toe. You are X and I am O; the first to get three in a row, column or diagonal wins. "
        "The cells are numbered 1 to 9, row by row from the top left, and the board shows each free cell's number. "
        "On your turn, choose a free cell."
    )

    def initial(self, rng: np.random.Generator) -> TicTacToeState:  # noqa: ARG002  (no chance in tic-tac-toe)
        return TicTacToeState()

    def to_move(self, state: TicTacToeState) -> int:
        return state.moves % 2

    def legal(self, state: TicTacToeState) -> list[int]:
        return [i + 1 for i, c in enumerate(state.cells) if c < 0]

    def play(self, state: TicTacToeState, move: int) -> TicTacToeState:
        if state.cells[move - 1] >= 0:
            raise ValueError(f"cell {move} is taken; legal moves: {self.legal(state)}")
        cells = list(state.cells)
        cells[move - 1] = self.to_move(state)
        return TicTacToeState(tuple(cells))

    def is_over(self, state: TicTacToeState) -> bool:
        return winner(state.cells) is not None or state.moves == 9

    def returns(self, state: TicTacToeState) -> tuple[float, float]:
        w = winner(state.cells)
        return (0.0, 0.0) if w is None else ((1.0, -1.0) if w == 0 else (-1.0, 1.0))

    def render(self, state: TicTacToeState, player: int) -> str:
        marks = {-1: ".", player: "x", 1 - player: "o"}
        return " " + "".join(marks[c] for c in state.cells) + MOVE_CUE

    def chat_render(self, state: TicTacToeState, player: int) -> str:
        marks = {player: "X", 1 - player: "O"}
        cells = [marks.get(c, str(i + 1)) for i, c in enumerate(state.cells)]
        rows = [" | ".join(cells[r : r + 3]) for r in (0, 3, 6)]
        free = ", ".join(str(m) for m in self.legal(state))
        return (
            "\n--+---+--\n".join(rows) + f"\n\nFree cells: {free}. Your move (X): reply with the number of a free cell."
        )

    def move_text(self, move: int) -> str:
        return f" {move}"

    def read(self, text: str) -> int | None:
        m = _CELL.search(text)
        return None if m is None else int(m.group())

    def initial_distribution(self) -> list[tuple[TicTacToeState, float]]:
        return [(TicTacToeState(), 1.0)]

    def heuristic_policy(self, state: TicTacToeState) -> list[tuple[int, float]]:
        """Win if it can, else block, else the centre, else a random corner, else a random cell."""
        me, legal = self.to_move(state), self.legal(state)
        for who in (me, 1 - me):
            for move in legal:
                cells = list(state.cells)
                cells[move - 1] = who
                if winner(tuple(cells)) == who:
                    return [(move, 1.0)]
        if 5 in legal:
            return [(5, 1.0)]
        corners = [m for m in (1, 3, 7, 9) if m in legal]
        pool = corners or legal
        return [(m, 1.0 / len(pool)) for m in pool]
