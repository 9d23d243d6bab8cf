"""Exact values of the small games against a fixed opponent: what the best possible learner would score.

A fixed opponent (the game's heuristic, :meth:`~textrl_envs.games.base.Game.heuristic_policy`) makes a two-player
game a one-player decision problem for the learner, and its best response is the most any learner can score
against it. :func:`best_response` computes it exactly by walking the whole game tree: chance
(:meth:`~textrl_envs.games.base.Game.initial_distribution`) and the opponent's moves are averaged over, and at
each of its decision points the learner picks the move that is best on average over every state it cannot tell
apart from this one. The learner tells states apart by what it sees, the board that
:meth:`~textrl_envs.games.base.Game.render` writes for it (its own card and the betting in Kuhn poker; the whole
position in Nim and tic-tac-toe), so a best response in a game of hidden cards does not peek. The games here have
perfect recall (the board a player sees holds every move so far, or it is a game of perfect information), where
this backward walk is exact.

Only legal moves are considered: a learner that writes an illegal move forfeits, which never helps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textrl_envs.games.base import Game

__all__ = ["BestResponse", "best_response", "policy_value"]

Policy = Callable[[Any], list[tuple[Any, float]]]


@dataclass(frozen=True)
class BestResponse:
    """The learner's best response to a fixed opponent, playing side ``learner``.

    :ivar value: its expected payoff.
    :ivar win: the probability that it ends with a positive payoff (a best response maximises the payoff, not
        this).
    :ivar moves: its move for each board it sees (``render`` text) where it is to move.
    """

    learner: int
    value: float
    win: float
    moves: dict[str, Any]


def _reach(game: Game, opponent: Policy, learner: int) -> dict[str, list[tuple[Any, float]]]:
    """Every board the learner moves on, with the states behind it and their chance-and-opponent weights
    (the learner's own moves are not weighted: every one of them is followed)."""
    found: dict[str, list[tuple[Any, float]]] = {}

    def walk(state: Any, weight: float) -> None:
        if weight == 0.0 or game.is_over(state):
            return
        if game.to_move(state) == learner:
            found.setdefault(game.render(state, learner), []).append((state, weight))
            for move in game.legal(state):
                walk(game.play(state, move), weight)
        else:
            for move, p in opponent(state):
                walk(game.play(state, move), weight * p)

    for state, p in game.initial_distribution():
        walk(state, p)
    return found


def policy_value(
    game: Game, learner_moves: Callable[[Any], list[tuple[Any, float]]], opponent: Policy, learner: int
) -> tuple[float, float]:
    """The learner's expected payoff and probability of a positive payoff, both players' policies given as
    ``f(state) -> [(move, probability), ...]`` and the learner on side ``learner``."""

    def walk(state: Any) -> tuple[float, float]:
        if game.is_over(state):
            r = game.returns(state)[learner]
            return r, float(r > 0)
        policy = learner_moves(state) if game.to_move(state) == learner else opponent(state)
        value = win = 0.0
        for move, p in policy:
            v, w = walk(game.play(state, move))
            value, win = value + p * v, win + p * w
        return value, win

    value = win = 0.0
    for state, p in game.initial_distribution():
        v, w = walk(state)
        value, win = value + p * v, win + p * w
    return value, win


def best_response(game: Game, learner: int, opponent: Policy | None = None) -> BestResponse:
    """The learner's best response on side ``learner`` (``0`` moves first) to ``opponent`` (``f(state) ->
    [(move, probability), ...]``; ``None``: the game's heuristic).

    The move on a board is the one with the highest payoff summed over the board's states, each weighted by how
    likely chance and the opponent make it, with the best response played after it; boards are decided
    deepest first (a later board's states all descend from an earlier board's, by perfect recall), memoised.
    """
    if learner not in (0, 1):
        raise ValueError(f"learner must be 0 (moves first) or 1 (second); got {learner!r}")
    opponent = game.heuristic_policy if opponent is None else opponent
    boards = _reach(game, opponent, learner)
    chosen: dict[str, Any] = {}
    values: dict[Any, float] = {}

    def value(state: Any) -> float:
        if state not in values:
            if game.is_over(state):
                values[state] = game.returns(state)[learner]
            elif game.to_move(state) == learner:
                values[state] = value(game.play(state, choose(game.render(state, learner))))
            else:
                values[state] = sum(p * value(game.play(state, move)) for move, p in opponent(state))
        return values[state]

    def choose(board: str) -> Any:
        if board not in chosen:
            states = boards[board]
            moves = game.legal(states[0][0])
            totals = [sum(w * value(game.play(s, m)) for s, w in states) for m in moves]
            chosen[board] = moves[max(range(len(moves)), key=lambda i: (totals[i], -i))]
        return chosen[board]

    for board in boards:
        choose(board)
    v, win = policy_value(game, lambda s: [(chosen[game.render(s, learner)], 1.0)], opponent, learner)
    return BestResponse(learner, v, win, dict(chosen))
