"""Kuhn poker: three cards, one each, one round of betting."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from textrl_envs.games.base import MOVE_CUE, Game

__all__ = ["KuhnPoker", "KuhnState"]

CARDS = "JQK"
#: Betting histories that end the hand (``p`` pass: check or fold; ``b`` bet: bet or call).
TERMINAL = ("pp", "bp", "bb", "pbp", "pbb")
_WORDS = {"p": "p", "b": "b", "0": "p", "1": "b", "check": "p", "pass": "p", "fold": "p", "bet": "b", "call": "b"}
_MOVE = re.compile(r"\b(" + "|".join(sorted(_WORDS, key=len, reverse=True)) + r")\b")


@dataclass(frozen=True)
class KuhnState:
    """``cards``: each player's card (0 J, 1 Q, 2 K); ``history``: the moves so far, ``"p"`` / ``"b"`` each."""

    cards: tuple[int, int]
    history: str = ""


class KuhnPoker(Game):
    """Kuhn poker (Kuhn 1950): a deck of J, Q, K; each player antes 1 and gets one card; one betting round.

    A move is ``p`` or ``0`` (pass: check, or fold to a bet) or ``b`` or ``1`` (bet 1, or call a bet);
    ``check``, ``fold``, ``bet`` and ``call`` are read too. Player 0 acts first. The hand ends at ``pp``
    (showdown for 1), ``bp`` / ``pbp`` (a fold: the bettor wins 1), ``bb`` / ``pbb`` (showdown for 2); at a
    showdown the higher card wins.
    The board is the player's own card and the history, `` K pb, x=`` (7 tokens of the bundled tokenizer); the
    end shows the opponent's card.
    """

    name = "kuhn"
    intro = "Kuhn, 0 pass 1 bet."
    chat_reply_prefix = "I choose to"
    chat_intro = (
        "Let's play Kuhn poker. The deck has three cards, Jack < Queen < King; we each put 1 chip in and get one "
        "card. On your turn you either pass (check, or fold to a bet) or bet (bet 1 chip, or call a bet). A hand "
        "ends when both pass (the higher card wins 1), when a bet is folded to (the bettor wins 1), or when a bet is "
        "called (the higher card wins 2)."
    )

    def initial(self, rng: np.random.Generator) -> KuhnState:
        deal = rng.permutation(3)
        return KuhnState((int(deal[0]), int(deal[1])))

    def to_move(self, state: KuhnState) -> int:
        return len(state.history) % 2

    def legal(self, state: KuhnState) -> list[str]:  # noqa: ARG002  (pass and bet are always legal)
        return ["p", "b"]

    def play(self, state: KuhnState, move: str) -> KuhnState:
        if move not in ("p", "b"):
            raise ValueError(f"a Kuhn poker move is 'p' or 'b', got {move!r}")
        return KuhnState(state.cards, state.history + move)

    def is_over(self, state: KuhnState) -> bool:
        return state.history in TERMINAL

    def returns(self, state: KuhnState) -> tuple[float, float]:
        h = state.history
        if h == "bp":
            return (1.0, -1.0)
        if h == "pbp":
            return (-1.0, 1.0)
        stake = 2.0 if h in ("bb", "pbb") else 1.0
        return (stake, -stake) if state.cards[0] > state.cards[1] else (-stake, stake)

    def render(self, state: KuhnState, player: int) -> str:
        return f" {CARDS[state.cards[player]]} {state.history or '-'}," + MOVE_CUE

    def result_text(self, state, player: int) -> str:
        text = super().result_text(state, player)
        inner = getattr(state, "state", state)  # a forfeit keeps the state it ended
        return f"{text}, {CARDS[inner.cards[1 - player]]}"

    def chat_render(self, state: KuhnState, player: int) -> str:
        names = {"p": "passed", "b": "bet"}
        said = [("You" if (i % 2) == player else "I") + " " + names[m] for i, m in enumerate(state.history)]
        card = {"J": "the Jack", "Q": "the Queen", "K": "the King"}[CARDS[state.cards[player]]]
        so_far = ("So far: " + ", ".join(said) + ". ") if said else "You act first. "
        facing = state.history.endswith("b")
        options, words = ("fold (pass) or call (bet)", "fold or call") if facing else ("pass or bet", "pass or bet")
        return f"Your card is {card}. {so_far}Do you {options}? Reply with one word: {words}."

    def chat_result(self, state, player: int) -> str:
        inner = getattr(state, "state", state)
        card = {"J": "the Jack", "Q": "the Queen", "K": "the King"}[CARDS[inner.cards[1 - player]]]
        return f"{super().chat_result(state, player)} I had {card}."

    def move_text(self, move: str) -> str:
        return f" {move}"

    def read(self, text: str) -> str | None:
        m = _MOVE.search(text.lower())
        return None if m is None else _WORDS[m.group(1)]

    def initial_distribution(self) -> list[tuple[KuhnState, float]]:
        return [(KuhnState((a, b)), 1.0 / 6) for a in range(3) for b in range(3) if a != b]

    def equilibrium_policy(self, alpha: float = 0.0):
        """A Nash equilibrium strategy (Kuhn 1950), as ``f(state) -> [(move, probability), ...]`` for both
        seats: first to act, bet J with ``alpha``, check Q and call a bet with ``alpha + 1/3``, bet K with
        ``3 alpha`` and call with it; second, bet or call with K, check Q and call a bet a third of the time,
        bluff J a third of the time after a check and fold it to a bet. The first player's value is -1/18.

        :param alpha: In ``[0, 1/3]``: every such ``alpha`` is an equilibrium.
        """
        if not 0.0 <= alpha <= 1 / 3:
            raise ValueError(f"alpha must be in [0, 1/3] for Kuhn's equilibrium; got {alpha!r}")
        bets = {"": (alpha, 0.0, 3 * alpha), "pb": (0.0, alpha + 1 / 3, 1.0), "p": (1 / 3, 0.0, 1.0)}

        def policy(state: KuhnState) -> list[tuple[str, float]]:
            card = state.cards[self.to_move(state)]
            p = bets.get(state.history, (0.0, 1 / 3, 1.0))[card]  # "b": the second player facing a bet
            return [("b", p), ("p", 1.0 - p)] if 0.0 < p < 1.0 else [("b" if p >= 1.0 else "p", 1.0)]

        return policy

    def heuristic_policy(self, state: KuhnState) -> list[tuple[str, float]]:
        """Bet or call with K; with Q check, and call a bet a third of the time; with J bluff a third of the
        time when first to act, else pass."""
        card, facing_bet = state.cards[self.to_move(state)], state.history.endswith("b")
        if card == 2:
            return [("b", 1.0)]
        if (card == 1 and facing_bet) or (card == 0 and not state.history):
            return [("b", 1 / 3), ("p", 2 / 3)]
        return [("p", 1.0)]
