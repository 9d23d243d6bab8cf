"""Opponents of a learner in a two-player text game: who writes the other player's moves.

An opponent answers a batch of :class:`OpponentTurn` (one per game whose opponent is to move) with one move
text each, in one call: :meth:`Opponent.moves`. Its randomness comes from each turn's ``rng`` (the episode's
own generator), so a seeded episode replays the same opponent moves however the episodes are batched.

* :class:`RandomOpponent`: a uniform legal move.
* :class:`HeuristicOpponent`: the game's ``heuristic`` (win / block in tic-tac-toe, the multiple-of-four rule
  in Nim, bet the King in Kuhn poker).
* :class:`PolicyOpponent`: an LM policy (any SB3 policy over the text envs' ``Dict`` observation space; the
  learner's own class) that writes tokens from its side of the conversation until its turn ends;
  :meth:`PolicyOpponent.snapshot` freezes a copy of a policy that is training.
* any callable ``f(turn) -> str`` (:func:`as_opponent` wraps it).

An opponent may pick who plays an episode (:meth:`Opponent.pick`, e.g. a league of snapshots) and hear the
result (:meth:`Opponent.record`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from textrl_envs.games.base import Game

__all__ = ["HeuristicOpponent", "Opponent", "OpponentTurn", "PolicyOpponent", "RandomOpponent", "as_opponent"]


@dataclass
class OpponentTurn:
    """One opponent move to write.

    :ivar game: The :class:`~textrl_envs.games.base.Game`.
    :ivar state: The game state (the opponent is to move).
    :ivar player: The opponent's player number.
    :ivar text: The conversation from the opponent's side: the intro, the boards it was shown and its own moves,
        ending with the board it must move on (what an LM opponent reads).
    :ivar rng: The episode's generator (draw the opponent's randomness from it).
    """

    game: Game
    state: Any
    player: int
    text: str
    rng: np.random.Generator


class Opponent:
    """Base class: override :meth:`moves` (or :meth:`move`, one turn at a time)."""

    name = "opponent"

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
        heuristic = getattr(turn.game, "heuristic", None)
        if heuristic is None:
            raise TypeError(f"{type(turn.game).__name__} has no heuristic(state, rng); use RandomOpponent")
        return turn.game.move_text(heuristic(turn.state, turn.rng))


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


class PolicyOpponent(Opponent):
    """An LM policy as the opponent: it reads its side of the conversation and writes tokens until its turn ends.

    One batched forward pass per token for every game whose opponent is to move (no gradients, the policy in
    eval mode, on its own device). Tokens are sampled from the policy's distribution with each episode's own
    generator (``deterministic=True``: the most likely token), so seeded episodes replay.

    :param policy: A policy with ``get_distribution(obs)`` over the text envs' ``Dict`` observation (an SB3
        ``ActorCriticPolicy``, such as ``sb3_grpo``'s ``CausalLMPolicy``). It is used as given; call
        :meth:`snapshot` for a frozen copy of a policy that keeps training.
    :param tokenizer: The env's tokenizer (``None``: the bundled one).
    :param max_turn_tokens: Most tokens of a move.
    :param turn_end: Token ids that end a move (``None``: the tokenizer's EOS).
    :param deterministic: Greedy moves instead of sampled ones.
    :param name: How the opponent is named in logs.
    """

    def __init__(
        self,
        policy: Any,
        tokenizer: Any = None,
        max_turn_tokens: int = 2,
        turn_end: Sequence[int] | None = None,
        deterministic: bool = False,
        name: str = "policy",
    ) -> None:
        from textrl_envs.core import load_tokenizer

        if not callable(getattr(policy, "get_distribution", None)):
            raise TypeError(
                f"PolicyOpponent needs a policy with get_distribution(obs) (an SB3 policy); got {type(policy).__name__}"
            )
        self.policy, self.tokenizer = policy, load_tokenizer(tokenizer)
        self.max_turn_tokens, self.deterministic, self.name = int(max_turn_tokens), bool(deterministic), name
        eos = self.tokenizer.eos_token_id
        self.turn_end = tuple(turn_end) if turn_end is not None else (() if eos is None else (int(eos),))
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or 0)
        self.width = int(policy.observation_space["input_ids"].shape[0])

    @classmethod
    def snapshot(cls, policy: Any, **kwargs: Any) -> PolicyOpponent:
        """An opponent playing a frozen copy of ``policy``: deep-copied, in eval mode, every parameter without
        gradients, so training the original never changes it."""
        frozen = copy.deepcopy(policy)
        frozen.set_training_mode(False) if hasattr(frozen, "set_training_mode") else frozen.eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        return cls(frozen, **kwargs)

    def _window(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        ids = ids[-self.width :]
        out = np.full(self.width, self.pad, dtype=np.int64)
        mask = np.zeros(self.width, dtype=np.int64)
        if ids:
            out[-len(ids) :], mask[-len(ids) :] = ids, 1
        return out, mask

    def moves(self, turns: Sequence[OpponentTurn]) -> list[str]:
        import torch

        if not turns:
            return []
        convs = [list(self.tokenizer(t.text, add_special_tokens=False, verbose=False)["input_ids"]) for t in turns]
        written: list[list[int]] = [[] for _ in turns]
        live = list(range(len(turns)))
        device = getattr(self.policy, "device", torch.device("cpu"))
        for _ in range(self.max_turn_tokens):
            if not live:
                break
            windows = [self._window(convs[i] + written[i]) for i in live]
            obs = {
                "input_ids": torch.as_tensor(np.stack([w[0] for w in windows]), device=device),
                "attention_mask": torch.as_tensor(np.stack([w[1] for w in windows]), device=device),
            }
            with torch.no_grad():
                probs = self.policy.get_distribution(obs).distribution.probs.double().cpu().numpy()
            still = []
            for row, i in enumerate(live):
                p = probs[row]
                if self.deterministic:
                    token = int(np.argmax(p))
                else:
                    cdf = np.cumsum(p)
                    token = min(int(np.searchsorted(cdf, turns[i].rng.random() * cdf[-1], side="right")), len(p) - 1)
                written[i].append(token)
                if token not in self.turn_end:
                    still.append(i)
            live = still
        return [self.tokenizer.decode(w, skip_special_tokens=True) for w in written]

    def __repr__(self) -> str:
        return f"PolicyOpponent({self.name!r}, deterministic={self.deterministic})"
