"""TextArena's two-player games as PettingZoo AEC envs, both players as agents (extras ``textrl[textarena]`` and
``textrl[games]``).

:class:`TextArenaAECEnv` plays one TextArena two-player game (``TicTacToe-v0``, ``Nim-v0``, ``KuhnPoker-v0``,
``ConnectFour-v0``, ``SimpleNegotiation-v0``, ...: :data:`OFFLINE_TWO_PLAYER_GAMES`) token by token, with the
token mechanics of :mod:`textrl_envs.games.aec`: the player to move (``agent_selection``, TextArena's current
player) writes one token per ``step``; its turn ends at a turn-end token (EOS by default) or ``max_turn_tokens``
tokens, and the turn's text is the action (in brackets unless it has some, TextArena's convention). Each
player's observation is its own token window, the same ``Dict(input_ids, attention_mask)`` space as the text envs:
the game's messages to that player (its rules, the boards, the other player's moves), written into its window
when its turn comes, and its own moves. At the end both windows get their last messages and the reason the game
ended, and each reward is TextArena's reward for that player.

TextArena's prompts are long (a tic-tac-toe opening is about 150 tokens of the bundled tokenizer, Kuhn poker's
rules about 300), so these envs are for models with a longer context than the bundled LM's 128 positions:
``window`` (default 1024) is the observation's width, and a window keeps the latest tokens.

As in :mod:`textrl_envs.suites.textarena`, each env's games run on their own Python ``random`` state (seeded by
``reset(seed=...)``), never download (a game that needs data raises
:class:`~textrl_envs.suites.textarena.MissingGameData`), and a game that raises on a player's text ends with
reward 0 for both (warned once per env).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from textrl_envs.games.aec import _GameAgents, import_pettingzoo
from textrl_envs.interaction import TASK_SEED_BOUND
from textrl_envs.suites.textarena import (
    GAME_TAG,
    MissingGameData,
    check_game_id,
    load_textarena,
    no_downloads,
    own_random,
)

__all__ = ["OFFLINE_TWO_PLAYER_GAMES", "env", "make_env_class", "player_messages"]

#: Two-player games that run with no network and no data beyond the wheel (textarena 0.7.4; their variants too).
OFFLINE_TWO_PLAYER_GAMES = ("TicTacToe-v0", "Nim-v0", "KuhnPoker-v0", "ConnectFour-v0", "SimpleNegotiation-v0")


def player_messages(messages: Sequence[Any], player: int) -> str:
    """The messages TextArena queued for ``player`` as its window shows them: one ``[GAME] text`` line per game
    message, ``[Player k] text`` for the other player's moves (its own moves, which its window already holds, left
    out)."""
    from textarena.core import ObservationType

    lines = []
    for from_id, text, kind in messages:
        text = str(text).strip()
        if kind is ObservationType.PLAYER_ACTION:
            if from_id == player:
                continue
            lines.append(f"[Player {from_id}] {text}")
        elif text:
            lines.append(f"{GAME_TAG} {text}")
    return "\n".join(lines)


def env(game: str = "TicTacToe-v0", **kwargs: Any):
    """A ``TextArenaAECEnv`` (a PettingZoo ``AECEnv``) over TextArena's two-player ``game``; ``kwargs`` as
    :class:`_TextArenaAgents` takes them."""
    return make_env_class()(game=game, **kwargs)


class _TextArenaAgents(_GameAgents):
    """A TextArena two-player game as a PettingZoo AEC env, one token per step.

    :param game: A TextArena two-player game id (:data:`OFFLINE_TWO_PLAYER_GAMES` run offline).
    :param game_kwargs: Arguments of the game's class, over the id's.
    :param tokenizer: The tokenizer (``None``: the bundled one), or a path/name for ``AutoTokenizer``.
    :param window: Tokens in each player's observation window (the latest kept).
    :param max_turn_tokens: Most tokens of one move.
    :param turn_end: Token ids that end a move (``None``: EOS).
    :param bracket_actions: Wrap a move in ``[...]`` unless it has a bracket.
    :param render_mode: ``"ansi"`` (the log of the game's messages) or ``None``.
    :raises ValueError: unknown game, or one that is not a two-player game.
    """

    metadata = {"render_modes": ["ansi"], "name": "textarena_two_player_v0", "is_parallelizable": False}

    def __init__(
        self,
        game: str = "TicTacToe-v0",
        game_kwargs: Mapping[str, Any] | None = None,
        tokenizer: Any = None,
        window: int = 1024,
        max_turn_tokens: int = 16,
        turn_end: Sequence[int] | None = None,
        bracket_actions: bool = True,
        render_mode: str | None = None,
    ) -> None:
        super(_GameAgents, self).__init__()
        self.game = check_game_id(game)
        if game_kwargs is not None and not isinstance(game_kwargs, Mapping):
            raise TypeError(f"game_kwargs must be a dict (or None), got {type(game_kwargs).__name__}")
        self.game_kwargs = dict(game_kwargs or {})
        self.bracket_actions = bool(bracket_actions)
        self._setup_tokens(tokenizer, window, max_turn_tokens, turn_end, render_mode)
        self._warned = False
        self._random: dict[str, Any] = {"random": None}
        self._arena = self._make()  # fail now (bad kwargs, a game that is not two-player, missing data)
        self._reset_game(0)

    def _make(self) -> Any:
        ta = load_textarena()
        with no_downloads(self.game), own_random(self._random):
            try:
                arena = ta.make(self.game, **self.game_kwargs)
            except TypeError as err:
                raise ValueError(
                    f"TextArena game {self.game!r} rejected game_kwargs {self.game_kwargs}: {err}"
                ) from err
        while isinstance(arena, ta.Wrapper):  # the game itself: the env keeps each player's window
            arena = arena.env
        return arena

    def _reset_game(self, seed: int) -> None:
        from textarena.state import TwoPlayerState

        with no_downloads(self.game), own_random(self._random):
            try:
                self._arena.reset(num_players=2, seed=seed)
            except (AssertionError, ValueError) as err:
                raise ValueError(
                    f"TextArena game {self.game!r} is not a two-player game (reset(num_players=2) said: {err}); "
                    f"two-player games that run offline: {', '.join(OFFLINE_TWO_PLAYER_GAMES)}"
                ) from err
        if not isinstance(self._arena.state, TwoPlayerState):
            raise ValueError(
                f"TextArena game {self.game!r} is a {type(self._arena.state).__name__} game, not a two-player one; "
                f"two-player games that run offline: {', '.join(OFFLINE_TWO_PLAYER_GAMES)}"
            )

    def _deliver(self, player: int) -> None:
        """Write the messages queued for ``player`` into its window (and empty the queue)."""
        queue = self._arena.state.observations[player]
        text = player_messages(queue, player)
        self._arena.state.observations[player] = []
        if text:
            self._write(player, self._encode(text + "\n"))

    def action(self, text: str) -> str:
        """A move's text as the game's action: stripped, in brackets when it has none (``bracket_actions``)."""
        text = text.strip()
        if self.bracket_actions and "[" not in text and "]" not in text:
            return f"[{text}]"
        return text

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:  # noqa: ARG002  (PettingZoo's signature)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self._random = {"random": None}
        self.agents = list(self.possible_agents)
        self._conv = [[], []]
        self._turn = []
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        # a fresh game per episode: some keep state across resets (Kuhn poker shuffles its deck in place)
        self._arena = self._make()
        self._reset_game(int(self._rng.integers(TASK_SEED_BOUND)))
        mover = int(self._arena.state.current_player_id)
        self._deliver(mover)
        self.agent_selection = self.possible_agents[mover]

    def _end_turn(self, player: int, text: str) -> None:
        try:
            with no_downloads(self.game), own_random(self._random):
                done, _ = self._arena.step(self.action(text))
                outcome = self._arena.close() if done else None
        except MissingGameData:
            raise
        except Exception as err:  # noqa: BLE001  (a game's bug on odd text ends the game, scored 0; training goes on)
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"TextArena game {self.game!r} raised {err!r} on player {player}'s move {self.action(text)!r}; "
                    "the game ends with reward 0 for both (warned once per env)",
                    stacklevel=3,
                )
            self._finish([0.0, 0.0], [f"{GAME_TAG} The game failed on this move."] * 2)
            return
        if outcome is None:
            mover = int(self._arena.state.current_player_id)
            self._deliver(mover)
            self.agent_selection = self.possible_agents[mover]
            return
        rewards, game_info = outcome
        for p in range(2):
            self._deliver(p)
        reasons = [str((game_info or {}).get(p, {}).get("reason") or "") for p in range(2)]
        texts = [f"{GAME_TAG} {r}" if r else "" for r in reasons]
        self._finish([float((rewards or {}).get(p, 0.0)) for p in range(2)], texts)

    def _finish(self, payoffs: Sequence[float], texts: Sequence[str]) -> None:
        for p, a in enumerate(self.possible_agents):
            if texts[p]:
                self._write(p, self._encode(texts[p]))
            self.rewards[a] = float(payoffs[p])
            self.terminations[a] = True

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        return "\n".join(str(text) for _, text in self._arena.state.logs)


_CLASS: list[type] = []


def make_env_class() -> type:
    """The env class, :class:`_TextArenaAgents` over PettingZoo's ``AECEnv`` (built on first use)."""
    if not _CLASS:
        base = import_pettingzoo().AECEnv
        _CLASS.append(
            type(
                "TextArenaAECEnv",
                (_TextArenaAgents, base),
                {"__module__": __name__, "__doc__": _TextArenaAgents.__doc__},
            )
        )
    return _CLASS[0]


def __getattr__(name: str):
    if name == "TextArenaAECEnv":
        return make_env_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
