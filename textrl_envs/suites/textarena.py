"""``TextArena-v0``: TextArena's single-player games as interactive episodes (extra ``textrl[textarena]``).

`TextArena <https://github.com/LeonGuertler/TextArena>`_ (MIT) holds about 100 text games. Its API is not
Gymnasium's: ``ta.make(game_id)``, ``env.reset(num_players=1, seed=...)``, ``env.get_observation()`` (the player
id and the messages since the last call, ``(from_id, text, ObservationType)``), ``env.step(action: str)`` ->
``(done, info)``, and ``env.close()`` -> ``(rewards, game_info)`` with the rewards by player id.

:class:`TextArenaGame` is the :class:`~textrl_envs.interaction.Interaction` over one game: each episode is a fresh
game reset with a seed drawn from the episode's generator (so the members of a group play the same game), its
first messages are the opening, every agent turn is the action (in brackets, TextArena's convention, unless it
has some), the game's messages after it are the reply, and the game's own reward is paid on the turn that ends
it. :class:`TextArenaEnv` and :class:`TextArenaVectorEnv` are the generic interactive text envs over it.

Three things keep a game honest inside an RL loop:

* **Its randomness is its own.** TextArena seeds and draws from Python's global ``random``; every call into a
  game runs on that episode's own saved ``random`` state and puts the caller's back afterwards
  (:func:`own_random`), so episodes do not disturb each other (or the user's ``random``) however their steps
  interleave, and the vector env equals ``SyncVectorEnv``.
* **No network.** Word games call ``nltk.download(...)`` at import or reset. Inside every call into TextArena
  ``nltk.download`` only looks for the data on disk (``nltk.data.path``, which ``NLTK_DATA`` extends) and, when
  it is missing, raises :class:`MissingGameData` naming the packages and how to install them
  (:func:`no_downloads`).
* **A game's bug ends the episode, not training.** A game that raises on the agent's text ends the episode with
  reward 0 (warned once per game).
"""

from __future__ import annotations

import contextlib
import difflib
import random
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from textrl_envs.env import TextGenEnv
from textrl_envs.interaction import TASK_SEED_BOUND, Interaction, Reply
from textrl_envs.suites import import_extra
from textrl_envs.tasks import TEXTARENA
from textrl_envs.vector import TextGenVectorEnv

__all__ = [
    "OFFLINE_GAMES",
    "NLTK_PACKAGES",
    "MissingGameData",
    "TextArenaEnv",
    "TextArenaGame",
    "TextArenaVectorEnv",
    "game_ids",
]

#: The game made when none is named.
DEFAULT_GAME = "GuessTheNumber-v0"
#: Single-player games that run with no network and no data beyond the wheel (textarena 0.7.4; each variant
#: such as ``Minesweeper-v0-small`` too). Word games (Wordle, Hangman, WordLadder, SpellingBee, ...) need NLTK's
#: ``words`` corpus on disk; games judged by an LLM need an OpenRouter key and are out of reach offline.
OFFLINE_GAMES = (
    "2048-v0",
    "Bandit-v0",
    "Blackjack-v0",
    "Countdown-v0",
    "Crosswords-v0",
    "Cryptarithm-v0",
    "FifteenPuzzle-v0",
    "FrozenLake-v0",
    "GuessTheNumber-v0",
    "LightsOut-v0",
    "LogicPuzzle-v0",
    "Mastermind-v0",
    "Minesweeper-v0",
    "PegJump-v0",
    "RushHour-v0",
    "Secretary-v0",
    "Set-v0",
    "Slitherlink-v0",
    "Sokoban-v0",
    "Sudoku-v0",
    "ThreeCardMonte-v0",
    "TowerOfHanoi-v0",
)
#: The NLTK data packages TextArena's word games ask for (textarena 0.7.4).
NLTK_PACKAGES = ("words", "averaged_perceptron_tagger_eng")
#: Where NLTK keeps a data package of a given id (``nltk.data.find("<category>/<id>")``).
_NLTK_CATEGORIES = ("corpora", "taggers", "tokenizers", "chunkers", "grammars", "misc", "models", "stemmers")
#: The speaker tag of the game's messages in the observation (TextArena's own ``[GAME]``).
GAME_TAG = "[GAME]"


def load_textarena():
    """Import ``textarena`` (never touching the network), or raise an ``ImportError`` naming the pip install."""
    with no_downloads("textarena"):
        return import_extra("textarena", TEXTARENA, "textarena")


def game_ids() -> list[str]:
    """Every id TextArena registers (single- and multi-player; :data:`OFFLINE_GAMES` lists the ones known to work)."""
    from textarena.envs.registration import ENV_REGISTRY

    load_textarena()
    return sorted(ENV_REGISTRY)


# -- keeping a game offline and its randomness its own ------------------------------------------------------------


class MissingGameData(RuntimeError):
    """A TextArena game needs NLTK data that is not on disk (``TextArena-v0`` never downloads it)."""


def _on_disk(nltk: Any, package: str) -> bool:
    for category in _NLTK_CATEGORIES:
        try:
            nltk.data.find(f"{category}/{package}")
        except LookupError:
            continue
        return True
    return False


@contextlib.contextmanager
def no_downloads(game: str) -> Iterator[None]:
    """Inside this block ``nltk.download`` never downloads: data on disk passes, missing data raises.

    :param game: The game named in the error.
    :raises MissingGameData: when the game asks for an NLTK package that ``nltk.data.path`` (``NLTK_DATA``) lacks.
    """
    try:
        import nltk
    except ImportError:  # no nltk, no downloads to stop
        yield
        return

    def download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:  # noqa: ARG001  (nltk.download's signature)
        wanted = [info_or_id] if isinstance(info_or_id, str) else list(info_or_id or [])
        missing = [p for p in wanted if not _on_disk(nltk, str(p))]
        if missing:
            names = " ".join(map(str, missing))
            raise MissingGameData(
                f"TextArena game {game!r} needs the NLTK data {missing}, which is not on this machine, and "
                f"{TEXTARENA.env_id} never downloads at run time. Install it once where there is network: "
                f"`python -m nltk.downloader {names}` (TextArena's word games use {' and '.join(NLTK_PACKAGES)}: "
                f"`python -m nltk.downloader {' '.join(NLTK_PACKAGES)}` installs both), or copy an nltk_data directory "
                "here and point the NLTK_DATA environment variable at it. The games in "
                "textrl_envs.suites.textarena.OFFLINE_GAMES need no data."
            )
        return True

    saved = nltk.download
    nltk.download = download
    try:
        yield
    finally:
        nltk.download = saved


@contextlib.contextmanager
def own_random(state: dict[str, Any]) -> Iterator[None]:
    """Run a block on ``state["random"]`` (a ``random.getstate()``), save what it leaves there, restore the caller's.

    TextArena games draw from Python's global ``random`` (``reset`` seeds it): this gives each episode its own
    stream, whatever else runs in between.
    """
    caller = random.getstate()
    if state.get("random") is not None:
        random.setstate(state["random"])
    try:
        yield
    finally:
        state["random"] = random.getstate()
        random.setstate(caller)


# -- the interaction ---------------------------------------------------------------------------------------------


def render_messages(messages: Sequence[Any]) -> str:
    """The game's messages as the observation shows them, one ``[GAME] text`` line each (the player's own actions,
    which the window already holds, left out)."""
    from textarena.core import ObservationType

    lines = [f"{GAME_TAG} {str(m[1]).strip()}" for m in messages if m[2] is not ObservationType.PLAYER_ACTION]
    return "\n".join(line for line in lines if line != GAME_TAG)


def check_game_id(game: Any) -> str:
    """``game`` if TextArena registers it, else an error listing the close matches."""
    if not isinstance(game, str):
        raise TypeError(f"game must be a TextArena game id (str), e.g. 'GuessTheNumber-v0'; got {game!r}")
    known = game_ids()
    if game not in known:
        close = difflib.get_close_matches(game, known, n=5, cutoff=0.6)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise ValueError(
            f"TextArena has no game {game!r}; {hint}single-player games that run offline: {', '.join(OFFLINE_GAMES)}"
        )
    return game


class TextArenaGame(Interaction):
    """A single-player TextArena game: the opening is the game's first messages, each turn one action.

    :param game: A TextArena game id (``"GuessTheNumber-v0"``, ``"TowerOfHanoi-v0"``, ``"Minesweeper-v0-small"``);
        any registered variant plays the game itself, without TextArena's observation wrappers.
    :param game_kwargs: Arguments of the game's class, over the id's (e.g. ``{"max_number": 8}``).
    :param bracket_actions: Wrap a turn in ``[...]`` unless it has a bracket (TextArena's
        ``ActionFormattingWrapper``): the agent may write ``5`` for ``[5]``.
    :raises ValueError: unknown game, bad ``game_kwargs``, or a game that is not single-player.
    :raises MissingGameData: the game needs NLTK data that is not on disk.
    """

    def __init__(self, game: str = DEFAULT_GAME, game_kwargs: Mapping[str, Any] | None = None, bracket_actions=True):
        self.game = check_game_id(game)
        if game_kwargs is not None and not isinstance(game_kwargs, Mapping):
            raise TypeError(f"game_kwargs must be a dict (or None), got {type(game_kwargs).__name__}")
        if not isinstance(bracket_actions, bool):
            raise TypeError(f"bracket_actions must be a bool, got {bracket_actions!r}")
        self.game_kwargs = dict(game_kwargs or {})
        self.bracket_actions = bracket_actions
        self._warned = False
        self.start("", {}, np.random.default_rng(0))  # fail now (bad kwargs, a multi-player game, missing data)

    def _make(self) -> Any:
        ta = load_textarena()
        try:
            env = ta.make(self.game, **self.game_kwargs)
        except TypeError as err:
            raise ValueError(f"TextArena game {self.game!r} rejected game_kwargs {self.game_kwargs}: {err}") from err
        except (SyntaxError, ImportError, AttributeError) as err:  # TextArena's own code for that game is broken here
            raise ValueError(
                f"TextArena game {self.game!r} cannot be made with the installed textarena ({type(err).__name__} in "
                f"textarena's own code: {err}); pick another game, e.g. {', '.join(OFFLINE_GAMES[:4])}, or another "
                "textarena version"
            ) from err
        while isinstance(env, ta.Wrapper):  # the game itself: the env keeps the conversation, we add the brackets
            env = env.env
        return env

    def _reset_error(self, err: BaseException) -> ValueError:
        """The game's own error at ``reset``, naming the game and its ``game_kwargs`` (usually a bad value there)."""
        given = f"game_kwargs {self.game_kwargs}" if self.game_kwargs else "its default settings"
        return ValueError(
            f"TextArena game {self.game!r} failed to start with {given} ({type(err).__name__}: {err}); check the "
            "values in game_kwargs against the game class's arguments"
        )

    def start(self, prompt: str, metadata: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:  # noqa: ARG002  (the protocol's signature)
        """A fresh game, reset with a seed from the episode's generator; its first messages wait in the state."""
        seed = int(rng.integers(TASK_SEED_BOUND))
        state: dict[str, Any] = {"random": None, "seed": seed}
        with no_downloads(self.game), own_random(state):
            env = state["env"] = self._make()
            try:
                env.reset(num_players=1, seed=seed)
            except (AssertionError, ValueError) as err:
                if "player" not in str(err).lower():  # not about the number of players: the game's own error
                    raise self._reset_error(err) from err
                raise ValueError(
                    f"TextArena game {self.game!r} is not a single-player game (reset(num_players=1) said: {err}); "
                    f"{TEXTARENA.env_id} plays single-player games, e.g. {', '.join(OFFLINE_GAMES[:6])}, ..."
                ) from err
            except (TypeError, KeyError, IndexError, ZeroDivisionError) as err:  # e.g. a bad value in game_kwargs
                raise self._reset_error(err) from err
            state["opening"] = render_messages(env.get_observation()[1])
        from textarena.state import SinglePlayerState

        if not isinstance(env.state, SinglePlayerState):
            raise ValueError(
                f"TextArena game {self.game!r} is a {type(env.state).__name__} game, not a single-player one; "
                f"{TEXTARENA.env_id} plays single-player games, e.g. {', '.join(OFFLINE_GAMES[:6])}, ..."
            )
        return state

    def opening(self, state: dict[str, Any]) -> str | None:
        """The game's rules and first board, ending in a newline for the agent's first action."""
        return state.pop("opening") + "\n" if state.get("opening") else None

    def action(self, text: str) -> str:
        """The agent's turn as the game's action: stripped, and in brackets when it has none (``bracket_actions``)."""
        text = text.strip()
        if self.bracket_actions and "[" not in text and "]" not in text:
            return f"[{text}]"
        return text

    def reply(self, state: dict[str, Any], text: str, turn: int) -> Reply:
        """Play the turn; the game's messages are the reply, its reward is paid when it ends."""
        env = state["env"]
        try:
            with no_downloads(self.game), own_random(state):
                done, _ = env.step(self.action(text))
                messages = render_messages(env.get_observation()[1])
                rewards, game_info = env.close() if done else (None, None)
                reward = float((rewards or {}).get(0, 0.0))  # a game that sets a non-number is a game's bug too
        except MissingGameData:
            raise
        except Exception as err:  # noqa: BLE001  (a game's bug on odd text ends the episode, scored 0; training goes on)
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"TextArena game {self.game!r} raised {err!r} on turn {turn} (action {self.action(text)!r}); the "
                    "episode ends with reward 0 (warned once per game)",
                    stacklevel=2,
                )
            return Reply(f"\n{GAME_TAG} The game failed on this move.", reward=0.0, done=True)
        if not done:
            return Reply(f"\n{messages}\n" if messages else None)
        reason = (game_info or {}).get(0, {}).get("reason")
        if reason:
            messages = f"{messages}\n{GAME_TAG} {reason}" if messages else f"{GAME_TAG} {reason}"
        return Reply(f"\n{messages}" if messages else None, reward=reward, done=True)

    def __repr__(self) -> str:
        return f"TextArenaGame({self.game!r}, game_kwargs={self.game_kwargs}, bracket_actions={self.bracket_actions})"


# -- the envs ------------------------------------------------------------------------------------------------------

_GAME_ARGS = ("game", "game_kwargs", "bracket_actions")


def spec_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The text env's keyword arguments: the game's popped out of ``kwargs`` into its interaction, defaults added."""
    if kwargs.get("interaction") is not None:
        raise TypeError(
            f"{TEXTARENA.env_id} makes its interaction from game=, game_kwargs= and bracket_actions=; it takes no "
            "interaction= (for an interaction of your own, give it to TextGenEnv(prompts=..., interaction=...))"
        )
    game = TextArenaGame(**{k: kwargs.pop(k) for k in _GAME_ARGS if k in kwargs})
    out = dict(kwargs, task=TEXTARENA.env_id, interaction=game)
    if out.get("prompts") is None:
        out["prompts"] = [f"{game.game}\n"]
    if out.get("max_turn_tokens") is None:
        out["max_turn_tokens"] = TEXTARENA.max_turn_tokens
    return out


class TextArenaEnv(TextGenEnv):
    """A single-player TextArena game, played turn by turn: the game's messages in, the agent's moves out.

    Needs the optional extra: ``pip install "textrl[textarena]"`` (the ``textarena`` package). Without it,
    ``gym.make`` raises an ``ImportError`` that says so.

    ## Description
    ``gym.make("TextArena-v0", game="GuessTheNumber-v0")`` plays TextArena's game through
    :class:`TextArenaGame`: the prompt names the game; the game's first messages (its rules, the board) follow as
    the opening, one ``[GAME] ...`` line each; then the agent writes a move and ends its turn with EOS, the game
    plays it and its messages come back as the reply, until the game is over. A move without brackets is sent in
    brackets (``5`` -> ``[5]``, TextArena's convention; ``bracket_actions=False`` sends it as written). The logic
    games run offline (``OFFLINE_GAMES``: ``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ``FrozenLake-v0``,
    ``Minesweeper-v0``, ``Countdown-v0``, ``Mastermind-v0``, ``Sudoku-v0``, ...); word games need NLTK data on
    disk, and say which (``MissingGameData``); multi-player games are refused.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the agent's next token. The agent acts only its own tokens; the
    game's messages are written into the observation in the step that ends the agent's turn.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``16 + 1024``): the prompt, then the conversation,
    right-aligned, pad on the left with mask 0. The games' rules are long (about 250 tokens of the bundled
    tokenizer for GuessTheNumber, 600 for FrozenLake): play them with a model whose context holds that.

    ## Rewards
    The game's own reward (``env.close()`` of TextArena, usually 1 for a win, partial credit or -1 otherwise) on
    the step that ends the game; 0 on every other step. An episode the env cuts first (``max_turns`` or the token
    budget) was never scored by the game: it gets 0.

    ## Starting State
    A fresh game reset with a seed drawn from a generator seeded by one draw of the env's ``np_random`` per
    episode, so ``reset(seed=s)`` repeats a game and the members of a group (``group_size=G``) play the same
    game. Each game draws from its own copy of Python's ``random``, whatever else runs.

    ## Episode End
    Terminated when the game is over; truncated after ``max_turns`` turns (default ``None``: the game's own
    turn limit decides) or when ``max_new_tokens`` tokens (the opening and the replies included) are spent. A turn
    ends at EOS or after ``max_turn_tokens = 16`` tokens. The final ``info`` holds ``turns`` and ``transcript``;
    the last reply holds the game's reason for ending (``[GAME] Congratulations! ...``).

    ## Arguments
    ``gym.make("TextArena-v0", game="GuessTheNumber-v0", game_kwargs=None, bracket_actions=True, prompts=None,
    tokenizer=None, max_new_tokens=1024, max_prompt_tokens=16, max_turns=None, max_turn_tokens=16,
    turn_end=None, reward=None, reward_timeout=600.0, render_mode=None)``. ``game_kwargs`` are the game class's
    arguments (``{"max_number": 8, "max_turns": 4}`` for GuessTheNumber). ``interaction=`` is not accepted.

    ## Vectorized environment
    ``gym.make_vec("TextArena-v0", num_envs=N, device=..., group_size=G, game=...)`` returns
    :class:`TextArenaVectorEnv`, which equals ``SyncVectorEnv`` over ``gym.make`` envs.

    ## Version History
    * v0: Initial version (textarena 0.7.x).
    """

    default_task = TEXTARENA.env_id

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        super().__init__(render_mode=render_mode, **spec_kwargs(kwargs))
        self.game: TextArenaGame = self.text_spec.interaction


class TextArenaVectorEnv(TextGenVectorEnv):
    """The batched :class:`TextArenaEnv`: :class:`~textrl_envs.vector.TextGenVectorEnv` over the same game.

    Takes the vector env's arguments (``num_envs``, ``device``, ``group_size``, ``obs_backend``) and the single
    env's; one game per row, its replies computed in the step that ends the row's turn.
    """

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "auto",
        group_size: int = 1,
        obs_backend: str = "numpy",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_envs=num_envs,
            device=device,
            group_size=group_size,
            obs_backend=obs_backend,
            render_mode=render_mode,
            **spec_kwargs(kwargs),
        )
        self.game: TextArenaGame = self.text_spec.interaction
