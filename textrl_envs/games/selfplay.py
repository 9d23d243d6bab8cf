"""A two-player game as a single-agent interactive task: the learner plays one side, an opponent the other.

:class:`SelfPlay` is an :class:`~textrl_envs.interaction.Interaction`, so any interactive text env plays it
(``gym.make("TicTacToe-v0")``, the batched :class:`~textrl_envs.vector.TextGenVectorEnv`, SB3 through
:mod:`textrl_envs.sb3`): the prompt is the game's intro, the opening is the board the learner moves on (after
the opponent's first move when the learner plays second), each learner turn is a move, and the reply is the
board after the opponent's answer, or the result. The game's payoff to the learner is the reward of the turn
that ends it; an unreadable or illegal move loses at once (-1 to its player). The episode's final info says which
side the learner played, the game and the opponent (:meth:`SelfPlay.episode_info`). When an opponent moving first
loses so, the opening is the result and the learner's first turn ends the episode (reward +1).

The episode's generator (seeded from the env's ``np_random``) draws, in this order, the learner's side (unless
``learner_player`` fixes it), the opponent (:meth:`~textrl_envs.games.opponents.Opponent.pick`) and the game's
chance (the deal), and then every random opponent move. Members of a group (``group_size=G``) therefore play
the same side, the same deal and the same opponent, and a seeded episode replays.

One step answers every learner turn that ended in it with one call of :meth:`SelfPlay.replies`, which asks
each opponent for all of its moves at once (:meth:`~textrl_envs.games.opponents.Opponent.moves`: one batched
forward pass per token for an LM opponent).

This module imports no env: the list of tasks points at it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from textrl_envs.games.base import Forfeit, Game
from textrl_envs.games.opponents import Opponent, OpponentTurn, as_opponent
from textrl_envs.interaction import Interaction, Reply
from textrl_envs.validation import check_prefill

__all__ = ["SelfPlay"]


class SelfPlay(Interaction):
    """The learner against an opponent in ``game``.

    :param game: The :class:`~textrl_envs.games.base.Game`.
    :param opponent: ``"random"``, ``"heuristic"``, an :class:`~textrl_envs.games.opponents.Opponent` (such as
        :class:`~textrl_envs.games.policy.PolicyOpponent` or a league) or a callable ``f(turn) -> str``.
    :param learner_player: ``0`` (the learner moves first), ``1`` (second), or ``None``: drawn per episode, so
        the learner plays both roles equally often.
    :param chat: Speak to an instruct model (instruct mode): the boards are the game's plain-language
        :meth:`~textrl_envs.games.base.Game.chat_render`, the learner's moves are read from free text
        (:meth:`~textrl_envs.games.base.Game.chat_read`), the end is :meth:`~textrl_envs.games.base.Game.chat_result`.
        Each opponent turn also carries the opponent's side as chat messages (``OpponentTurn.messages``), which a
        chat-speaking opponent reads (``PolicyOpponent(chat=True)``: its moves are read from free text too); the
        other opponents write the game's own move texts, as in text mode.
    :param reply_prefix: In chat mode, how each reply of the learner (and of a chat-speaking LM opponent) starts,
        written for it after the chat template's generation prompt (an assistant prefill): ``None`` takes the game's
        :attr:`~textrl_envs.games.base.Game.chat_reply_prefix` (tic-tac-toe ``"I take cell"``); ``""`` writes none.
        With a prefix, a move is the first one the reply states (:meth:`~textrl_envs.games.base.Game.read`); without
        one, its final answer (:meth:`~textrl_envs.games.base.Game.chat_read`).
    """

    def __init__(
        self,
        game: Game,
        opponent: Any = "random",
        learner_player: int | None = None,
        chat: bool = False,
        reply_prefix: str | None = None,
    ) -> None:
        if not isinstance(game, Game):
            raise TypeError(f"game must be a textrl_envs.games Game (TicTacToe(), Nim(), KuhnPoker()); got {game!r}")
        if learner_player not in (None, 0, 1):
            raise ValueError(
                f"learner_player must be 0 (first), 1 (second) or None (alternating); got {learner_player!r}"
            )
        if chat and not game.chat_intro:
            raise ValueError(f"{type(game).__name__} has no chat mode (no chat_intro / chat_render); pass chat=False")
        self.game, self.opponent, self.learner_player = game, as_opponent(opponent), learner_player
        if self.opponent.chat and not chat:
            raise ValueError(
                f"opponent {self.opponent!r} speaks chat, but this game is not in chat mode: pass "
                "SelfPlay(..., chat=True) (instruct mode)"
            )
        self.chat = bool(chat)
        self.reply_prefix = check_reply_prefix(reply_prefix, game, self.chat)

    # -- an episode -----------------------------------------------------------------------------------------------

    def start(self, prompt: str, metadata: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:  # noqa: ARG002  (the protocol's signature)
        side = int(rng.integers(2))
        learner = int(metadata.get("learner_player", self.learner_player if self.learner_player is not None else side))
        opponent = self.opponent.pick(rng)
        state = {
            "game": self.game.initial(rng),
            "learner": learner,
            "opponent": opponent,
            "rng": rng,
            "opponent_text": prompt,  # the conversation from the opponent's side
            "opponent_messages": [],  # the same, as chat messages (chat mode)
            "result": None,
        }
        if self.game.to_move(state["game"]) != learner:
            self._opponent_moves([state])
        return state

    def opening(self, state: dict[str, Any]) -> str | None:
        return self._board_or_result(state)[0]

    def reply(self, state: dict[str, Any], text: str, turn: int) -> Reply:
        return self.replies([state], [text], [turn])[0]

    def replies(self, states: Sequence[dict[str, Any]], texts: Sequence[str], turns: Sequence[int]) -> list[Reply]:  # noqa: ARG002  (the protocol's signature)
        game = self.game
        waiting = []
        for state, text in zip(states, texts):
            if state["result"] is not None:  # answered a turn after the end (cannot happen in the envs)
                continue
            if game.over(state["game"]):  # the opponent's first move ended it: this turn only collects the result
                continue
            state["game"], _ = game.step_text(state["game"], text, chat=self._free_text(self.chat))
            if not game.over(state["game"]):
                waiting.append(state)
        self._opponent_moves(waiting)
        out = []
        for state in states:
            text, done = self._board_or_result(state)
            reward = 0.0
            if done and state["result"] is None:
                reward = float(game.payoffs(state["game"])[state["learner"]])
                state["result"] = reward
                self.opponent.record(state["opponent"], reward, state["learner"])
            out.append(Reply(text, reward=reward, done=done))
        return out

    def episode_info(self, state: dict[str, Any]) -> dict[str, Any]:
        """The final info's ``learner_player`` (the side the learner played: 0 first, 1 second), ``game`` (the
        game's name), ``opponent`` (the name of the opponent it met) and ``forfeit`` (who lost by an unreadable or
        illegal move: ``"learner"``, ``"opponent"``, or ``""`` for a game played to its end): what role-conditioned
        advantages (``advantage="role"``), per-opponent win rates and illegal-move rates read."""
        final = state["game"]
        forfeit = ""
        if isinstance(final, Forfeit):
            forfeit = "learner" if final.player == state["learner"] else "opponent"
        return {
            "learner_player": int(state["learner"]),
            "game": self.game.name,
            "opponent": str(getattr(state["opponent"], "name", type(state["opponent"]).__name__)),
            "forfeit": forfeit,
        }

    # -- helpers --------------------------------------------------------------------------------------------------

    def _board_or_result(self, state: dict[str, Any]) -> tuple[str, bool]:
        game, learner = self.game, state["learner"]
        if game.over(state["game"]):
            result = game.chat_result if self.chat else game.result_text
            return result(state["game"], learner), True
        return (game.chat_render if self.chat else game.render)(state["game"], learner), False

    def _free_text(self, chat: bool) -> bool:
        """Whether a chat reply is read as free text (its final answer): chat without a reply prefix. After a prefix
        the move is the first one the reply states."""
        return chat and not self.reply_prefix

    def _opponent_moves(self, states: Sequence[dict[str, Any]]) -> None:
        """Every waiting opponent move, one call per opponent (a league may field several)."""
        by_opponent: dict[int, list[dict[str, Any]]] = {}
        for state in states:
            by_opponent.setdefault(id(state["opponent"]), []).append(state)
        for group in by_opponent.values():
            opponent: Opponent = group[0]["opponent"]
            turns = []
            for s in group:
                player = 1 - s["learner"]
                s["opponent_text"] += self.game.render(s["game"], player)
                messages = None
                if self.chat:
                    board = self.game.chat_render(s["game"], player)
                    first = not s["opponent_messages"]
                    content = f"{self.game.chat_intro}\n\n{board}" if first else board
                    s["opponent_messages"].append({"role": "user", "content": content})
                    messages = tuple(s["opponent_messages"])
                prefix = self.reply_prefix
                turns.append(OpponentTurn(self.game, s["game"], player, s["opponent_text"], s["rng"], messages, prefix))
            moves = opponent.moves(turns)
            if not isinstance(moves, (list, tuple)) or len(moves) != len(turns):
                raise ValueError(f"opponent {opponent!r} returned {moves!r} for {len(turns)} turns; one move text each")
            for s, move in zip(group, moves):
                s["opponent_text"] += move
                if self.chat:
                    s["opponent_messages"].append({"role": "assistant", "content": self.reply_prefix + move})
                s["game"], _ = self.game.step_text(s["game"], move, chat=self._free_text(opponent.chat))

    def __repr__(self) -> str:
        chat = ", chat=True" if self.chat else ""
        if self.chat and self.reply_prefix != self.game.chat_reply_prefix:
            chat += f", reply_prefix={self.reply_prefix!r}"
        return f"SelfPlay({self.game!r}, opponent={self.opponent!r}, learner_player={self.learner_player}{chat})"


def check_reply_prefix(reply_prefix: str | None, game: Game, chat: bool) -> str:
    """:class:`SelfPlay`'s reply prefix: the game's (``None``) in chat mode, ``""`` in text mode.

    :raises ValueError: a prefix outside chat mode, one that is not text, or one that ends in whitespace (the
        model writes the space before its move itself, as its tokenizer joins them).
    """
    if reply_prefix is None:
        return game.chat_reply_prefix if chat else ""
    check_prefill("reply_prefix", reply_prefix, "move", hint=" (or None: the game's own)")
    if reply_prefix and not chat:
        raise ValueError(
            f"reply_prefix={reply_prefix!r} starts a chat model's replies: pass chat=True, or leave it out"
        )
    return reply_prefix
