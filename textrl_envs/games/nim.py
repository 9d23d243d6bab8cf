"""Nim on one heap: take 1 to 3 stones; whoever takes the last stone wins."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from textrl_envs.games.base import MOVE_CUE, Game

__all__ = ["Nim", "NimState"]

_INT = re.compile(r"\d+")


@dataclass(frozen=True)
class NimState:
    """``heap``: stones left; ``player``: whose move it is."""

    heap: int
    player: int = 0


class Nim(Game):
    """One-heap Nim: a move takes 1 to ``max_take`` stones; whoever takes the last stone wins (payoff 1, else -1).

    The heap starts at a size drawn from ``low..high``; the board is `` 9 left, x=`` (7 tokens of the bundled
    tokenizer). The first player wins exactly when the heap is not a multiple of ``max_take + 1``, by leaving
    one (the heuristic opponent plays that).

    :param low: Smallest starting heap.
    :param high: Largest starting heap.
    :param max_take: Most stones a move takes.
    """

    name = "nim"
    chat_reply_prefix = "I take"

    def __init__(self, low: int = 5, high: int = 12, max_take: int = 3) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"Nim needs 1 <= low <= high, got low={low}, high={high}")
        if max_take < 1:
            raise ValueError(f"Nim needs max_take >= 1, got {max_take}")
        self.low, self.high, self.max_take = int(low), int(high), int(max_take)
        self.intro = f"Nim, take 1-{self.max_take}."
        self.chat_intro = (
            f"Let's play Nim. There is one heap of stones; we take turns, and each turn takes 1 to {self.max_take} "
            "stones. Whoever takes the last stone wins. On your turn, say how many stones you take."
        )

    def initial(self, rng: np.random.Generator) -> NimState:
        return NimState(int(rng.integers(self.low, self.high + 1)))

    def to_move(self, state: NimState) -> int:
        return state.player

    def legal(self, state: NimState) -> list[int]:
        return list(range(1, min(self.max_take, state.heap) + 1))

    def play(self, state: NimState, move: int) -> NimState:
        if move not in self.legal(state):
            raise ValueError(f"cannot take {move} from {state.heap}; legal moves: {self.legal(state)}")
        return NimState(state.heap - move, 1 - state.player)

    def is_over(self, state: NimState) -> bool:
        return state.heap == 0

    def returns(self, state: NimState) -> tuple[float, float]:
        # the player to move at an empty heap did not take the last stone
        return (-1.0, 1.0) if state.player == 0 else (1.0, -1.0)

    def render(self, state: NimState, player: int) -> str:  # noqa: ARG002  (both players see the same heap)
        return f" {state.heap} left," + MOVE_CUE

    def chat_render(self, state: NimState, player: int) -> str:  # noqa: ARG002  (both players see the same heap)
        legal = self.legal(state)
        choices = ", ".join(map(str, legal[:-1])) + (f" or {legal[-1]}" if len(legal) > 1 else str(legal[-1]))
        stones = "stone" if state.heap == 1 else "stones"
        there = f"There {'is' if state.heap == 1 else 'are'} {state.heap} {stones} left."
        return f"{there} You may take {choices}: reply with the number of stones you take."

    def move_text(self, move: int) -> str:
        return f" {move}"

    def read(self, text: str) -> int | None:
        m = _INT.search(text)
        return None if m is None else int(m.group())

    def initial_distribution(self) -> list[tuple[NimState, float]]:
        n = self.high - self.low + 1
        return [(NimState(heap), 1.0 / n) for heap in range(self.low, self.high + 1)]

    def heuristic_policy(self, state: NimState) -> list[tuple[int, float]]:
        """Leave a multiple of ``max_take + 1`` when it can (perfect play), else take a random legal number."""
        best = state.heap % (self.max_take + 1)
        if best:
            return [(best, 1.0)]
        legal = self.legal(state)
        return [(m, 1.0 / len(legal)) for m in legal]

    def __repr__(self) -> str:
        return f"Nim(low={self.low}, high={self.high}, max_take={self.max_take})"
