"""Self-play with a league: frozen snapshots of the learner as opponents, sampled per episode, rated by Elo.

A :class:`League` is the opponent of a two-player text game (:class:`~textrl_envs.games.SelfPlay`): each episode
it picks one member (``"latest"``, ``"uniform"`` or by ``"rating"``) with the episode's generator, so the
members of a group play the same opponent, and it hears each result, which moves the learner's and that
member's Elo ratings (:func:`elo_update`). Members are frozen snapshots of the learner
(:meth:`~textrl_envs.games.policy.PolicyOpponent.snapshot`: deep copies without gradients, never trained) and
any fixed opponents (random, heuristic). :class:`LeagueCallback` adds a snapshot every ``snapshot_every``
updates and logs the ratings::

    from textrl_envs.games import SelfPlay, TicTacToe
    from textrl_envs.sb3 import make_vec_env
    from sb3_grpo import GRPO
    from sb3_grpo.callbacks.league import League, LeagueCallback

    league = League(sampling="rating", fixed={"random": "random"})
    env = make_vec_env("TicTacToe-v0", n_envs=8, group_size=4, interaction=SelfPlay(TicTacToe(), league))
    model = GRPO("CausalLMPolicy", env, advantage="group")
    model.learn(20_000, callback=LeagueCallback(league, snapshot_every=5))

The league lives in the process that steps the envs (the batched text vector env, or SB3's ``DummyVecEnv``);
envs in subprocesses would each hold a copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo.callbacks._common import check_positive_int
from textrl_envs.games.opponents import Opponent, OpponentTurn, as_opponent
from textrl_envs.games.policy import PolicyOpponent

__all__ = ["League", "LeagueCallback", "LeagueMember", "elo_expected", "elo_update", "match_score"]

SAMPLING = ("latest", "uniform", "rating")


def elo_expected(rating_a: float, rating_b: float) -> float:
    """Elo's expected score of A against B: ``E_A = 1 / (1 + 10 ** ((R_B - R_A) / 400))`` (Elo 1978)."""
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / 400.0))


def elo_update(rating_a: float, rating_b: float, score_a: float, k: float = 32.0) -> tuple[float, float]:
    """Both ratings after one game: ``R_A' = R_A + K (S_A - E_A)``, ``R_B' = R_B - K (S_A - E_A)``.

    :param score_a: A's score: 1 a win, 0.5 a draw, 0 a loss.
    :param k: The K-factor (the most a rating moves in one game).
    """
    if not 0.0 <= score_a <= 1.0:
        raise ValueError(f"score_a must be in [0, 1] (1 win, 0.5 draw, 0 loss), got {score_a!r}")
    delta = k * (score_a - elo_expected(rating_a, rating_b))
    return rating_a + delta, rating_b - delta


def match_score(learner_return: float) -> float:
    """A game's score for Elo from the learner's payoff: 1 if positive, 0.5 if zero, 0 if negative."""
    return 1.0 if learner_return > 0 else 0.5 if learner_return == 0 else 0.0


@dataclass
class LeagueMember:
    """One opponent of the league, its Elo rating and its record against the learner (from the learner's side)."""

    name: str
    opponent: Opponent
    rating: float
    snapshot: bool = False
    games: int = 0
    learner_wins: int = 0
    learner_draws: int = 0
    history: list[float] = field(default_factory=list)


class League(Opponent):
    """A pool of opponents for self-play; one is drawn per episode, and results move Elo ratings.

    :param sampling: ``"latest"`` (the newest member), ``"uniform"``, or ``"rating"`` (a member with weight
        ``E_member`` of beating the learner, ``1 / (1 + 10 ** ((R_learner - R_member) / 400))``: the stronger
        opponents more often).
    :param fixed: Opponents that are members from the start, by name (``{"random": "random", "heuristic":
        "heuristic"}``); they are rated but never replaced.
    :param max_snapshots: The most snapshots kept (the oldest is dropped first); ``None``: all.
    :param k: Elo's K-factor.
    :param initial_rating: The learner's starting rating and the fixed opponents'; a snapshot starts at the
        learner's rating when it is taken.
    """

    name = "league"

    def __init__(
        self,
        sampling: str = "latest",
        fixed: Mapping[str, Any] | None = None,
        max_snapshots: int | None = None,
        k: float = 32.0,
        initial_rating: float = 1000.0,
    ) -> None:
        if sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLING)}; got {sampling!r}")
        if max_snapshots is not None:
            check_positive_int("max_snapshots", max_snapshots)
        self.sampling, self.max_snapshots, self.k = sampling, max_snapshots, float(k)
        self.learner_rating = float(initial_rating)
        self.members: list[LeagueMember] = []
        self.snapshots = 0
        self.results: list[tuple[str, float, int]] = []  # (member, learner return, learner player), in order
        for name, opponent in (fixed or {}).items():
            self.add(as_opponent(opponent), name=name, rating=initial_rating)

    def add(self, opponent: Opponent, name: str, rating: float | None = None, snapshot: bool = False) -> LeagueMember:
        """Add ``opponent`` as a member rated ``rating`` (``None``: the learner's current rating)."""
        if any(m.name == name for m in self.members):
            raise ValueError(f"the league already has a member named {name!r}")
        member = LeagueMember(name, opponent, self.learner_rating if rating is None else float(rating), snapshot)
        self.members.append(member)
        return member

    def add_snapshot(self, policy: Any, name: str | None = None, **kwargs: Any) -> LeagueMember:
        """Add a frozen copy of ``policy`` (:meth:`PolicyOpponent.snapshot`, ``kwargs`` its arguments), rated as
        the learner is now; drop the oldest snapshot past ``max_snapshots``."""
        name = name or f"snapshot_{self.snapshots}"
        member = self.add(PolicyOpponent.snapshot(policy, name=name, **kwargs), name=name, snapshot=True)
        self.snapshots += 1
        snaps = [m for m in self.members if m.snapshot]
        if self.max_snapshots is not None and len(snaps) > self.max_snapshots:
            self.members.remove(snaps[0])
        return member

    def weights(self) -> np.ndarray:
        """The probability of each member being drawn for the next episode."""
        n = len(self.members)
        if not n:
            return np.zeros(0)
        if self.sampling == "latest":
            w = np.zeros(n)
            w[-1] = 1.0
            return w
        if self.sampling == "uniform":
            return np.full(n, 1.0 / n)
        w = np.array([elo_expected(m.rating, self.learner_rating) for m in self.members])
        return w / w.sum()

    def pick(self, rng: np.random.Generator) -> Opponent:
        if not self.members:
            raise RuntimeError(
                "the league has no members yet: give it fixed opponents, call add_snapshot(model.policy), or train "
                "with LeagueCallback, which adds the first snapshot when training starts"
            )
        cdf = np.cumsum(self.weights())
        i = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1)
        return self.members[i].opponent

    def moves(self, turns: list[OpponentTurn]) -> list[str]:  # noqa: ARG002  (the protocol's signature)
        raise RuntimeError("a League plays through the member it picks per episode (pick); it has no moves itself")

    def record(self, opponent: Opponent, learner_return: float, learner_player: int) -> None:
        for member in self.members:
            if member.opponent is opponent:
                break
        else:  # a snapshot dropped while its episode ran: the result is kept, no rating moves
            self.results.append(("(dropped)", float(learner_return), int(learner_player)))
            return
        score = match_score(learner_return)
        self.learner_rating, member.rating = elo_update(self.learner_rating, member.rating, score, self.k)
        member.games += 1
        member.learner_wins += score == 1.0
        member.learner_draws += score == 0.5
        member.history.append(member.rating)
        self.results.append((member.name, float(learner_return), int(learner_player)))

    def ratings(self) -> dict[str, float]:
        """Every rating by name, the learner's under ``"learner"``."""
        return {"learner": self.learner_rating, **{m.name: m.rating for m in self.members}}

    def __repr__(self) -> str:
        return f"League(sampling={self.sampling!r}, members={[m.name for m in self.members]})"


class LeagueCallback(BaseCallback):
    """Keep a :class:`League`: a frozen snapshot of the learner every ``snapshot_every`` updates, ratings logged.

    Snapshots are taken at rollout boundaries (an update never mixes opponents of two leagues), the first when
    training starts. Logged at each rollout end: ``league/learner_rating``, ``league/size``, ``league/games``
    (results so far), ``league/win_rate`` (the learner's, over the games since the last log), and
    ``league/rating/<member>`` for every member.

    :param league: The league the envs' :class:`~textrl_envs.games.SelfPlay` plays.
    :param snapshot_every: Updates between snapshots.
    :param opponent_kwargs: Arguments of each snapshot's
        :class:`~textrl_envs.games.policy.PolicyOpponent` (``max_turn_tokens``, ``deterministic``, ...).
    """

    def __init__(self, league: League, snapshot_every: int = 10, opponent_kwargs: Mapping[str, Any] | None = None):
        super().__init__()
        if not isinstance(league, League):
            raise TypeError(f"league must be a League, got {type(league).__name__}")
        self.league, self.snapshot_every = league, check_positive_int("snapshot_every", snapshot_every)
        self.opponent_kwargs = dict(opponent_kwargs or {})
        self.rollouts = 0
        self._logged = 0

    def _snapshot(self) -> None:
        self.league.add_snapshot(self.model.policy, **self.opponent_kwargs)

    def _on_training_start(self) -> None:
        if not any(m.snapshot for m in self.league.members):
            self._snapshot()

    def _on_rollout_start(self) -> None:
        if self.rollouts and self.rollouts % self.snapshot_every == 0:
            self._snapshot()

    def _on_rollout_end(self) -> None:
        self.rollouts += 1
        league = self.league
        new = league.results[self._logged :]
        self._logged = len(league.results)
        self.logger.record("league/learner_rating", league.learner_rating)
        self.logger.record("league/size", len(league.members))
        self.logger.record("league/games", len(league.results))
        if new:
            self.logger.record("league/win_rate", float(np.mean([r > 0 for _, r, _ in new])))
        for member in league.members:
            self.logger.record(f"league/rating/{member.name}", member.rating)

    def _on_step(self) -> bool:
        return True
