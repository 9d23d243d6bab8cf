"""Exact values of the small games: the heuristics' move odds, the deals, and best responses against
hand computations, Kuhn's equilibrium and a plain expectimax."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from textrl_envs.games import KuhnPoker, Nim, TicTacToe
from textrl_envs.games.analysis import best_response, policy_value
from textrl_envs.games.base import draw_move
from textrl_envs.games.kuhn import KuhnState
from textrl_envs.games.nim import NimState

GAMES = [TicTacToe(), Nim(), KuhnPoker()]


def _states(game, limit=2000):
    """Every state reachable from the starting states (all moves of both players), up to ``limit``."""
    seen, todo = [], [s for s, _ in game.initial_distribution()]
    while todo and len(seen) < limit:
        s = todo.pop()
        if game.is_over(s) or s in seen:
            continue
        seen.append(s)
        todo += [game.play(s, m) for m in game.legal(s)]
    return seen


@pytest.mark.parametrize("game", GAMES, ids=lambda g: g.name)
def test_heuristic_policy_is_a_distribution_over_legal_moves_and_heuristic_draws_from_it(game):
    rng = np.random.default_rng(0)
    for state in _states(game)[:300]:
        policy = game.heuristic_policy(state)
        assert sum(p for _, p in policy) == pytest.approx(1.0)
        assert all(m in game.legal(state) and p > 0 for m, p in policy)
        if len(policy) > 1:  # the draws follow the odds
            n = 3000
            counts = Counter(game.heuristic(state, rng) for _ in range(n))
            for m, p in policy:
                assert abs(counts[m] / n - p) < 4 * np.sqrt(p * (1 - p) / n)


def test_kuhn_heuristic_draws_as_the_rule_says():
    # the rule written out with the generator it always used: Q facing a bet calls when rng.random() < 1/3
    g, facing = KuhnPoker(), KuhnState((2, 1), "b")  # the second player holds Q
    for seed in range(20):
        want = "b" if np.random.default_rng(seed).random() < 1 / 3 else "p"
        assert g.heuristic(facing, np.random.default_rng(seed)) == want
    assert g.heuristic_policy(KuhnState((0, 2), "p")) == [("b", 1.0)]  # K bets
    assert g.heuristic_policy(KuhnState((1, 0), "p")) == [("p", 1.0)]  # J second never bluffs


def test_draw_move():
    rng = np.random.default_rng(1)
    before = rng.bit_generator.state
    assert draw_move([("a", 1.0)], rng) == "a" and rng.bit_generator.state == before  # a sure move draws nothing
    same = [draw_move([(1, 0.5), (2, 0.5)], np.random.default_rng(s)) for s in range(50)]
    assert same == [[1, 2][int(np.random.default_rng(s).integers(2))] for s in range(50)]
    odds = [draw_move([("x", 0.25), ("y", 0.75)], np.random.default_rng(s)) for s in range(50)]
    assert odds == ["x" if np.random.default_rng(s).random() < 0.25 else "y" for s in range(50)]
    with pytest.raises(ValueError, match="at least one"):
        draw_move([], rng)


@pytest.mark.parametrize("game", GAMES, ids=lambda g: g.name)
def test_initial_distribution_matches_the_draws(game):
    dist = game.initial_distribution()
    assert sum(p for _, p in dist) == pytest.approx(1.0)
    rng, n = np.random.default_rng(0), 6000
    counts = Counter(game.initial(rng) for _ in range(n))
    assert set(counts) == {s for s, _ in dist}
    for s, p in dist:
        assert abs(counts[s] / n - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-9


@pytest.mark.parametrize("alpha", [0.0, 0.2, 1 / 3])
def test_kuhn_best_response_to_the_equilibrium_is_the_game_value(alpha):
    # against an equilibrium the best response earns exactly the value of the game: -1/18 first, +1/18 second
    g = KuhnPoker()
    eq = g.equilibrium_policy(alpha)
    assert best_response(g, 0, eq).value == pytest.approx(-1 / 18)
    assert best_response(g, 1, eq).value == pytest.approx(1 / 18)
    # and the equilibrium against itself earns it too
    assert policy_value(g, eq, eq, 0)[0] == pytest.approx(-1 / 18)
    # the strategy written out for one information set each: Q facing a bet second calls a third of the time
    assert eq(KuhnState((2, 1), "b")) == [("b", pytest.approx(1 / 3)), ("p", pytest.approx(2 / 3))]
    assert eq(KuhnState((1, 0), "pb"))[0] == ("b", pytest.approx(alpha + 1 / 3))


def test_an_equilibrium_scores_nothing_against_the_kuhn_heuristic():
    # the heuristic is close to an equilibrium: over both seats an equilibrium strategy earns exactly 0 against it,
    # less than the best response's 1/9
    g = KuhnPoker()
    for alpha in (0.0, 1 / 6, 1 / 3):
        eq = g.equilibrium_policy(alpha)
        both = (policy_value(g, eq, g.heuristic_policy, 0)[0] + policy_value(g, eq, g.heuristic_policy, 1)[0]) / 2
        assert both == pytest.approx(0.0, abs=1e-12)
    assert (best_response(g, 0).value + best_response(g, 1).value) / 2 == pytest.approx(1 / 9)
    with pytest.raises(ValueError, match="alpha must be in"):
        g.equilibrium_policy(0.5)


def test_kuhn_best_response_to_the_heuristic_by_hand():
    g = KuhnPoker()
    # second: the heuristic bets K always and J a third of the time, checks Q and J otherwise.
    # K: bet after a check (Q calls 1/3: 4/3; J folds: 1), call a bet (J's bluff: 2): 2/9 + 2/9;
    # Q: facing a bet (K, or J's bluff: call or fold both -2/9), after J's check +1 (1/9);
    # J: fold to K's bet (-1/6), bluff after Q's check (Q calls 1/3: 0). Total 4/9 - 1/9 - 1/6 = 1/6.
    second = best_response(g, 1)
    assert Fraction(second.value).limit_denominator(100) == Fraction(1, 6)
    assert second.moves[" K p, x="] == "b" and second.moves[" J p, x="] == "b"
    # first: K bets (Q calls 1/3, J folds): 7/6; Q checks and folds to a bet: 0; J: -1 whatever it does.
    # (7/6 + 0 - 1) / 3 = 1/18
    first = best_response(g, 0)
    assert Fraction(first.value).limit_denominator(100) == Fraction(1, 18)
    assert first.moves[" K -, x="] == "b" and first.moves[" Q pb, x="] == "p"


def test_nim_best_response_to_the_perfect_heuristic_wins_exactly_the_winning_heaps():
    g = Nim()
    heaps = range(g.low, g.high + 1)
    first_wins = Fraction(sum(h % (g.max_take + 1) != 0 for h in heaps), len(heaps))
    first, second = best_response(g, 0), best_response(g, 1)
    assert first.win == pytest.approx(float(first_wins)) and second.win == pytest.approx(float(1 - first_wins))
    assert first.value == pytest.approx(2 * float(first_wins) - 1)
    assert (first.value + second.value) / 2 == pytest.approx(0.0)  # over both sides: even at best


def _expectimax(game, state, learner, opponent):
    """A perfect-information game's best value, searched plainly (the learner sees every state)."""
    if game.is_over(state):
        return game.returns(state)[learner]
    children = (game.play(state, m) for m in game.legal(state))
    if game.to_move(state) == learner:
        return max(_expectimax(game, c, learner, opponent) for c in children)
    return sum(p * _expectimax(game, game.play(state, m), learner, opponent) for m, p in opponent(state))


def _uniform(game):
    return lambda s: [(m, 1.0 / len(game.legal(s))) for m in game.legal(s)]


@pytest.mark.parametrize("game", [TicTacToe(), Nim(low=3, high=9)], ids=lambda g: g.name)
@pytest.mark.parametrize("learner", [0, 1])
def test_best_response_in_a_perfect_information_game_equals_expectimax(game, learner):
    for opponent in (game.heuristic_policy, _uniform(game)):
        want = sum(p * _expectimax(game, s, learner, opponent) for s, p in game.initial_distribution())
        assert best_response(game, learner, opponent).value == pytest.approx(want)


def test_tictactoe_first_player_forks_the_heuristic():
    g = TicTacToe()
    first = best_response(g, 0)
    assert first.value == pytest.approx(1.0) and first.win == pytest.approx(1.0)  # a corner, the far corner, a fork
    assert best_response(g, 1).value == pytest.approx(0.0)  # second: a draw at best


def test_policy_value_matches_simulated_games():
    g, rng = KuhnPoker(), np.random.default_rng(0)
    heuristic = g.heuristic_policy
    exact = policy_value(g, heuristic, heuristic, 0)[0]
    total, n = 0.0, 20000
    for _ in range(n):
        s = g.initial(rng)
        while not g.is_over(s):
            s = g.play(s, g.heuristic(s, rng))
        total += g.returns(s)[0]
    assert abs(total / n - exact) < 4 * 1.5 / np.sqrt(n)


def test_best_response_bad_input():
    with pytest.raises(ValueError, match="learner must be 0"):
        best_response(Nim(), 2)
    assert Nim().heuristic_policy(NimState(4)) == [(1, 1 / 3), (2, 1 / 3), (3, 1 / 3)]


def test_a_game_without_a_heuristic_says_so():
    from textrl_envs.games import HeuristicOpponent, OpponentTurn
    from textrl_envs.games.base import Game

    class Bare(Game):
        name = "bare"

    turn = OpponentTurn(Bare(), None, 1, "", np.random.default_rng(0))
    with pytest.raises(TypeError, match="Bare has no heuristic.*RandomOpponent"):
        HeuristicOpponent().moves([turn])
    with pytest.raises(NotImplementedError, match="Bare has no heuristic"):
        Bare().heuristic(None, np.random.default_rng(0))
