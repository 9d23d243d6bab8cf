"""Both players of a text game as agents of a PettingZoo ``AECEnv`` (extra ``pip install "textrl[games]"``).

:class:`TextGameAECEnv` plays a :class:`~textrl_envs.games.base.Game` token by token: the agent to move
(``agent_selection``) writes one token per ``step``, its turn ends as an interactive text turn ends (a
turn-end token, EOS by default, or ``max_turn_tokens`` tokens), the env reads the move from the turn's text and
plays it, and the board as the next player sees it is written into that player's window before its turn. Each
player's observation is its own token window, the same ``Dict(input_ids, attention_mask)`` space as the text
envs: the intro, then the boards it was shown and its own moves, right-aligned, pad on the left. At the end of
the game each player's window gets the result and its reward is its payoff (an unreadable or illegal move
loses at once). Turn-based games have one mover at a time, so the parallel API does not fit them; wrap the AEC
env as PettingZoo's tools do when a library needs it.

PettingZoo is imported when the env is made; without it, an ``ImportError`` names the extra.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from textrl_envs.core import load_tokenizer
from textrl_envs.games.base import Game
from textrl_envs.games.catalog import make_game
from textrl_envs.validation import check_int

__all__ = ["env", "import_pettingzoo", "make_env_class"]


def import_pettingzoo():
    """``pettingzoo``, or an ``ImportError`` that says how to install it."""
    try:
        return importlib.import_module("pettingzoo")
    except ImportError as err:
        raise ImportError(
            f"the PettingZoo game envs need the optional package 'pettingzoo', which could not be imported ({err}); "
            'install it with: pip install "textrl[games]"'
        ) from err


def _aec_base():
    return import_pettingzoo().AECEnv


def env(game: str | Game = "tictactoe", **kwargs: Any):
    """A ``TextGameAECEnv`` (a PettingZoo ``AECEnv``) over ``game``: a name (``"tictactoe"``, ``"nim"``,
    ``"kuhn"``) or a :class:`~textrl_envs.games.base.Game`; ``kwargs`` as :class:`_GameAgents` takes them."""
    return make_env_class()(game=game, **kwargs)


class _GameAgents:
    """A two-player text game as a PettingZoo AEC env, one token per step.

    :param game: A :class:`~textrl_envs.games.base.Game` or its name.
    :param tokenizer: The tokenizer (``None``: the bundled one), or a path/name for ``AutoTokenizer``.
    :param window: Tokens in each player's observation window (the bundled LM reads 128).
    :param max_turn_tokens: Most tokens of one move.
    :param turn_end: Token ids that end a move (``None``: EOS).
    :param render_mode: ``"ansi"`` (the board as player 0 sees it) or ``None``.
    """

    metadata = {"render_modes": ["ansi"], "name": "textrl_game_v0", "is_parallelizable": False}

    def __init__(
        self,
        game: str | Game = "tictactoe",
        tokenizer: Any = None,
        window: int = 96,
        max_turn_tokens: int = 2,
        turn_end: Sequence[int] | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__()
        self.game = make_game(game)
        self._setup_tokens(tokenizer, window, max_turn_tokens, turn_end, render_mode)

    def _setup_tokens(
        self, tokenizer: Any, window: int, max_turn_tokens: int, turn_end: Sequence[int] | None, render_mode: str | None
    ) -> None:
        """The token mechanics both players share: tokenizer, window, turn end, spaces."""
        self.tokenizer = load_tokenizer(tokenizer)
        self.window = check_int("window", window, low=1)
        self.max_turn_tokens = check_int("max_turn_tokens", max_turn_tokens, low=1)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be 'ansi' or None, got {render_mode!r}")
        self.render_mode = render_mode
        eos = self.tokenizer.eos_token_id
        self.turn_end = (
            tuple(int(t) for t in turn_end) if turn_end is not None else ((int(eos),) if eos is not None else ())
        )
        pad = self.tokenizer.pad_token_id
        self.pad = int(pad if pad is not None else (eos or 0))
        vocab = len(self.tokenizer)
        self.possible_agents = ["player_0", "player_1"]
        self.agents: list[str] = []
        self._obs_space = spaces.Dict(
            {
                "input_ids": spaces.Box(0, vocab - 1, shape=(self.window,), dtype=np.int64),
                "attention_mask": spaces.Box(0, 1, shape=(self.window,), dtype=np.int64),
            }
        )
        self._act_space = spaces.Discrete(vocab)
        self.observation_spaces = {a: self._obs_space for a in self.possible_agents}
        self.action_spaces = {a: self._act_space for a in self.possible_agents}
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str):
        return self.observation_spaces[agent]

    def action_space(self, agent: str):
        return self.action_spaces[agent]

    # -- the token mechanics ------------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def _write(self, player: int, ids: Sequence[int]) -> None:
        self._conv[player].extend(int(i) for i in ids)

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        ids = self._conv[self.possible_agents.index(agent)][-self.window :]
        out = np.full(self.window, self.pad, dtype=np.int64)
        mask = np.zeros(self.window, dtype=np.int64)
        if ids:
            out[-len(ids) :], mask[-len(ids) :] = ids, 1
        return {"input_ids": out, "attention_mask": mask}

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:  # noqa: ARG002  (PettingZoo's signature)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.game_state = self.game.initial(self._rng)
        intro = self._encode(self.game.intro)
        self._conv = [list(intro), list(intro)]
        self._turn: list[int] = []
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        mover = self.game.to_move(self.game_state)
        self._write(mover, self._encode(self.game.render(self.game_state, mover)))
        self.agent_selection = self.possible_agents[mover]

    def step(self, action) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        a = np.asarray(action)
        if a.size != 1 or not np.issubdtype(a.dtype, np.integer) or not 0 <= int(a) < self._act_space.n:
            raise ValueError(f"action must be one token id in [0, {self._act_space.n}), got {action!r}")
        token, player = int(a), self.possible_agents.index(agent)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self._turn.append(token)
        self._write(player, [token])
        if token in self.turn_end or len(self._turn) >= self.max_turn_tokens:
            text = self.tokenizer.decode(self._turn, skip_special_tokens=True)
            self._turn = []
            self.infos[agent] = {"move": text}
            self._end_turn(player, text)
        self._accumulate_rewards()
        if self.render_mode == "ansi":
            self.render()

    def _end_turn(self, player: int, text: str) -> None:  # noqa: ARG002  (the player to move is the game's; a subclass reads it)
        """Play the move ``player`` wrote (``text``); write the next player's board, or both players' results."""
        self.game_state, _ = self.game.step_text(self.game_state, text)
        if self.game.over(self.game_state):
            self._finish(list(self.game.payoffs(self.game_state)),
                         [self.game.result_text(self.game_state, p) for p in range(2)])  # fmt: skip
        else:
            mover = self.game.to_move(self.game_state)
            self._write(mover, self._encode(self.game.render(self.game_state, mover)))
            self.agent_selection = self.possible_agents[mover]

    def _finish(self, payoffs: Sequence[float], texts: Sequence[str]) -> None:
        """End the game: each player's window gets its text, its reward is its payoff."""
        for p, a in enumerate(self.possible_agents):
            self._write(p, self._encode(texts[p]))
            self.rewards[a] = float(payoffs[p])
            self.terminations[a] = True

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        return self.game.render(getattr(self.game_state, "state", self.game_state), 0)

    def close(self) -> None:
        pass


_CLASS: list[type] = []


def make_env_class() -> type:
    """The env class, :class:`_GameAgents` over PettingZoo's ``AECEnv`` (built on first use)."""
    if not _CLASS:
        base = _aec_base()
        _CLASS.append(
            type("TextGameAECEnv", (_GameAgents, base), {"__module__": __name__, "__doc__": _GameAgents.__doc__})
        )
    return _CLASS[0]


def __getattr__(name: str):
    if name == "TextGameAECEnv":
        return make_env_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
