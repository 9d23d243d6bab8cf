"""The task suite: the one list of tasks (:data:`TASKS`) and one module per task family with its env class.

A task is the defaults behind one registered environment id: where its prompts come from, which reward
scores it, and its token budgets. This module is the only place env ids are written down:
``textrl_envs/__init__.py`` registers every task in :data:`TASKS` with Gymnasium (its ``entry_point`` and
``vector_entry_point``) and derives ``textrl_envs.ENV_IDS`` from it; :func:`get_task` and :func:`all_tasks`
read it; each family module's env class takes its id from its :class:`Task`. Any default can be overridden
with keyword arguments to ``gym.make``.

Adding a task:

1. here, a prompt loader (a zero-argument function; load data lazily) and a ``Task(...)`` constant, added to
   :data:`TASKS`;
2. ``tasks/<family>.py``, the env class its ``entry_point`` names: a :class:`~textrl_envs.env.TextGenEnv`
   subclass with ``default_task = <TASK>.env_id`` and a docstring in the Gymnasium sections (Description,
   Action Space, ..., Version History);
3. a reward it names by registry name, if a new one (see :mod:`textrl_envs.rewards`).

An interactive task (the environment answers the agent, see :mod:`textrl_envs.interaction`) names no reward
(``reward=None``: its interaction pays per turn) and gives ``interaction``, a zero-argument function returning
its :class:`~textrl_envs.interaction.Interaction`, which imports the class lazily from a module that does not
import the env (:mod:`textrl_envs.tasks.interactions` for the built-in ones), plus its turn defaults.

An external suite (a task library behind an optional extra, :mod:`textrl_envs.suites`) is one ``Task`` with
``extra=`` (the ``pip install "textrl[<extra>]"``), ``kwargs={}`` (its ``task=`` argument names a task of the
suite), no ``prompts`` or ``reward`` (its env classes make them) and its own ``vector_entry_point``.

This module imports nothing heavy (``import textrl_envs`` imports it), and nothing else of the package at
module level: the family modules import it, never the other way round.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PromptItem = Any  # str, or a dict {"prompt": str, **metadata}

#: The batched env every text task uses as its Gymnasium ``vector_entry_point``.
VECTOR_ENTRY_POINT = "textrl_envs.vector:TextGenVectorEnv"


@dataclass(frozen=True)
class InstructDefaults:
    """A task's instruct mode (``instruct=True``, :mod:`textrl_envs.instruct`): how it asks an instruct model.

    :param question: The question for a prompt text (``None``: the text itself), e.g. ``"12+7="`` to
        ``"What is 12 + 7?"``.
    :param check: How its final answers are compared (:data:`textrl_envs.rewards.answers.CHECKS`): ``"math"``
        (Math-Verify) where the answer is math.
    :param max_new_tokens: The episode budget: room for a short explanation and the answer line (an interactive
        task's: every turn and reply).
    :param max_prompt_tokens: The prompt budget: the chat template's markers, a system message and the question.
    :param interaction: An interactive task's interaction for free text (a zero-argument function, as
        :attr:`Task.interaction`); ``None``: the task's own.
    :param max_turns: An interactive task's agent turns (``None``: the task's).
    :param max_turn_tokens: An interactive task's tokens per agent turn (``None``: the task's).
    """

    question: Callable[[str], str] | None = None
    check: str = "exact"
    max_new_tokens: int = 128
    max_prompt_tokens: int = 128
    interaction: Callable[[], Any] | None = None
    max_turns: int | None = None
    max_turn_tokens: int | None = None


@dataclass(frozen=True)
class Task:
    """Defaults of one registered environment id.

    :param env_id: The Gymnasium id, e.g. ``"TextGen-v0"``.
    :param entry_point: The documented env class, ``"module:Class"`` (Gymnasium's entry point).
    :param summary: One line for the README table.
    :param prompts: Zero-argument function returning the default prompts (loaded lazily); ``None`` for an
        external suite, whose env class builds its prompts from the suite's own arguments.
    :param reward: Registered reward name used by default (``None`` for an external suite: the suite scores).
    :param reward_kwargs: Keyword arguments for the default reward.
    :param max_new_tokens: Default generation budget.
    :param max_prompt_tokens: Default prompt budget.
    :param vector_entry_point: The batched env, ``"module:Class"`` (Gymnasium's ``vector_entry_point``).
    :param interaction: Interactive tasks: a zero-argument function returning the task's
        :class:`~textrl_envs.interaction.Interaction` (imported lazily, from a module that does not import the
        env); ``None`` for single-turn tasks.
    :param max_turns: Interactive tasks: default agent turns per episode.
    :param max_turn_tokens: Interactive tasks: default agent tokens per turn.
    :param turn_end: Interactive tasks: default turn-end token(s) (``None``: EOS).
    :param stop_at_eos: Whether the tokenizer's EOS ends an episode (``False``: episodes always run
        ``max_new_tokens`` tokens, and an EOS the policy writes is dropped from the text like any special token).
    :param extra: The ``pip install "textrl[<extra>]"`` an external suite needs (``None``: built in).
    :param kwargs: Keyword arguments registered with the id (``None``: ``{"task": env_id}``, which gives the
        generic env classes the task's defaults). A suite registers ``{}``: its ``task`` argument names a
        task of the suite.
    :param instruct: The task's instruct mode (``instruct=True``), where its answers are checkable (``None``: none).
    """

    env_id: str
    entry_point: str
    summary: str
    prompts: Callable[[], list[PromptItem]] | None = None
    reward: str | None = None
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 24
    max_prompt_tokens: int = 16
    vector_entry_point: str = VECTOR_ENTRY_POINT
    interaction: Callable[[], Any] | None = None
    max_turns: int | None = None
    max_turn_tokens: int | None = None
    turn_end: Any = None
    stop_at_eos: bool = True
    extra: str | None = None
    kwargs: dict[str, Any] | None = None
    instruct: InstructDefaults | None = None

    @property
    def registered_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``gym.register`` stores for this id."""
        return {"task": self.env_id} if self.kwargs is None else dict(self.kwargs)

    @property
    def install_hint(self) -> str | None:
        """``pip install "textrl[<extra>]"`` for an external suite, ``None`` for a built-in task."""
        return None if self.extra is None else f'pip install "textrl[{self.extra}]"'


# -- prompt loaders (the bundled corpus is imported only when prompts are needed) -------------------------


def sentiment_prompts() -> list[str]:
    """The review openers every review in the bundled corpus starts with (``"The movie was"``, ...)."""
    from textrl_envs.assets.corpus import review_openers

    return review_openers()


def arithmetic_prompts(n: int = 300, seed: int = 0) -> list[dict[str, str]]:
    """A fixed, seeded list of problems ``{"prompt": "12+7=", "answer": "19"}`` (duplicates dropped)."""
    from textrl_envs.assets.corpus import arithmetic_examples

    seen: dict[str, str] = {}
    for prompt, answer in arithmetic_examples(n, seed):
        seen.setdefault(prompt, answer)
    return [{"prompt": p, "answer": a} for p, a in seen.items()]


def arithmetic_question(prompt: str) -> str:
    """An arithmetic prompt as a question for an instruct model: ``"12+7="`` is ``"What is 12 + 7?"`` (a prompt of
    another form is asked as it is)."""
    import re

    match = re.fullmatch(r"\s*([-+]?\d+)\s*([-+*])\s*([-+]?\d+)\s*=\s*", prompt)
    return prompt if match is None else f"What is {match[1]} {match[2]} {match[3]}?"


def number_prompts(n: int = 64, seed: int = 0) -> list[str]:
    """``"Numbers:"`` and variants that start the sequence, such as ``"Numbers: 3 17"`` (seeded, distinct)."""
    from textrl_envs.assets.corpus import numbers_examples

    return list(dict.fromkeys(["Numbers:"] + numbers_examples(n, seed)))


def concept_prompts(n: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Concept prompts with references, ``{"prompt": "Concepts: actor, story, love. Sentence:",
    "references": [" The actor loved the story.", ...]}`` (seeded; duplicate prompts merged)."""
    from textrl_envs.assets.corpus import concept_examples

    merged: dict[str, list[str]] = {}
    for prompt, refs in concept_examples(n, seed):
        bucket = merged.setdefault(prompt, [])
        bucket.extend(r for r in refs if r not in bucket)
    return [{"prompt": p, "references": refs} for p, refs in merged.items()]


def keyword_prompts(n: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Keyword prompts, ``{"prompt": "Keywords: music, ending. Review:", "keywords": ["music", "ending"]}``
    (seeded, distinct prompts)."""
    from textrl_envs.assets.corpus import keyword_examples

    seen: dict[str, list[str]] = {}
    for prompt, keywords in keyword_examples(n, seed):
        seen.setdefault(prompt, list(keywords))
    return [{"prompt": p, "keywords": k} for p, k in seen.items()]


def guess_number_prompts() -> list[dict[str, Any]]:
    """The one ``GuessNumber-v0`` prompt, ``{"prompt": "Guess 1-8: x=", "low": 1, "high": 8}`` (the secret's range
    is metadata: prompts of your own may set other ranges, e.g. ``"Guess 1-16: x="`` with ``"high": 16``)."""
    return [{"prompt": "Guess 1-8: x=", "low": 1, "high": 8}]


def tool_arithmetic_prompts(n: int = 300, seed: int = 0) -> list[dict[str, str]]:
    """Products past what the bundled LM knows by heart, ``{"prompt": "Compute 37*12.", "answer": "444"}``:
    ``a`` in 13-99 and ``b`` in 3-19, a fixed seeded list (duplicates dropped)."""
    import random

    rng = random.Random(seed)
    seen: dict[str, str] = {}
    for _ in range(n):
        a, b = rng.randint(13, 99), rng.randint(3, 19)
        seen.setdefault(f"Compute {a}*{b}.", str(a * b))
    return [{"prompt": p, "answer": a} for p, a in seen.items()]


def guess_number_question(prompt: str) -> str:
    """``GuessNumber-v0``'s prompt as a question for an instruct model: ``"Guess 1-8: x="`` is the game's rules
    with that range (a prompt of another form is asked as it is)."""
    import re

    match = re.match(r"\s*Guess\s+(-?\d+)\s*-\s*(-?\d+)", prompt)
    if match is None:
        return prompt
    return (
        f"I am thinking of a whole number from {match[1]} to {match[2]}. Guess it: after each guess I tell you "
        "whether my number is higher or lower."
    )


def tool_arithmetic_question(prompt: str) -> str:
    """``ToolArithmetic-v0``'s prompt as a question for an instruct model: the problem and how to call the
    calculator."""
    return (
        f"{prompt} You may use a calculator: reply with a single line such as 'calc: 37*12' and it answers with the "
        "result. Then give your answer."
    )


def tool_use_prompts(n: int = 300, seed: int = 0) -> list[dict[str, str]]:
    """Two-step problems for the tools ``multiply`` and ``add``, ``{"prompt": "Compute 37*12+45.", "answer": "489"}``:
    ``a`` in 13-99, ``b`` in 3-19, ``c`` in 2-99, a fixed seeded list (duplicates dropped)."""
    import random

    rng = random.Random(seed)
    seen: dict[str, str] = {}
    for _ in range(n):
        a, b, c = rng.randint(13, 99), rng.randint(3, 19), rng.randint(2, 99)
        seen.setdefault(f"Compute {a}*{b}+{c}.", str(a * b + c))
    return [{"prompt": p, "answer": a} for p, a in seen.items()]


def code_prompts(n: int = 400, seed: int = 0) -> list[dict[str, str]]:
    """``CodeGen-v0``'s problems: procedural easy functions to complete, each ``{"prompt": code, "code_prefix": code,
    "test": "def check(candidate): ...", "entry_point": "add_7"}`` with ``code`` a signature and a docstring
    (:func:`textrl_envs.tasks.code_problems.easy_code_problems`; HumanEval's are
    :func:`~textrl_envs.tasks.code_problems.humaneval_problems`)."""
    from textrl_envs.tasks.code_problems import easy_code_problems

    return easy_code_problems(n, seed)


# -- interactions (imported lazily: their module must not import the env) -----------------------------------


def guess_number_interaction():
    """``GuessNumber-v0``'s :class:`~textrl_envs.tasks.interactions.GuessNumber` (secret 1-8 unless the prompt says)."""
    from textrl_envs.tasks.interactions import GuessNumber

    return GuessNumber(low=1, high=8)


def calculator_interaction():
    """``ToolArithmetic-v0``'s :class:`~textrl_envs.tasks.interactions.Calculator`."""
    from textrl_envs.tasks.interactions import Calculator

    return Calculator()


def guess_number_chat_interaction():
    """``GuessNumber-v0``'s interaction in instruct mode: guesses read from free text, replies as sentences."""
    from textrl_envs.tasks.interactions import GuessNumber

    return GuessNumber(low=1, high=8, chat=True)


def calculator_chat_interaction():
    """``ToolArithmetic-v0``'s interaction in instruct mode: a ``calc:`` line anywhere in a turn, answers in free
    text."""
    from textrl_envs.tasks.interactions import Calculator

    return Calculator(chat=True)


def tool_use_interaction():
    """``ToolUse-v0``'s :class:`~textrl_envs.tools.ToolCalling` with the tools ``add`` and ``multiply``."""
    from textrl_envs.tools.builtin import add, multiply
    from textrl_envs.tools.interaction import ToolCalling

    return ToolCalling([add, multiply])


def game_prompts(game: str) -> list[str]:
    """The one prompt of a game's id: the game's intro line (``"Tic-tac-toe, you are x."``)."""
    from textrl_envs.games.catalog import make_game

    return [make_game(game).intro]


def game_question(game: str, prompt: str) -> str:  # noqa: ARG001  (the instruct question's signature)
    """A game's prompt for an instruct model: its rules in plain language
    (:attr:`~textrl_envs.games.base.Game.chat_intro`)."""
    from textrl_envs.games.catalog import make_game

    return make_game(game).chat_intro


def game_chat_interaction(game: str):
    """A game's :class:`~textrl_envs.games.SelfPlay` in instruct mode: plain-language boards, each reply started for
    the model with the game's :attr:`~textrl_envs.games.base.Game.chat_reply_prefix` and its move read from the text
    after it, against a random opponent."""
    from textrl_envs.games.catalog import make_game
    from textrl_envs.games.selfplay import SelfPlay

    return SelfPlay(make_game(game), opponent="random", chat=True)


def game_instruct(game: str, max_turns: int, max_new_tokens: int) -> InstructDefaults:
    """A game's instruct mode: the rules, boards and moves in plain language; each reply starts with the game's
    prefix (``"I take cell"``), then 6 tokens a move."""
    return InstructDefaults(
        question=functools.partial(game_question, game),
        interaction=functools.partial(game_chat_interaction, game),
        max_turns=max_turns,
        max_turn_tokens=6,
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=192,
    )


def tictactoe_interaction():
    """``TicTacToe-v0``'s :class:`~textrl_envs.games.SelfPlay`: tic-tac-toe against a random opponent."""
    from textrl_envs.games.selfplay import SelfPlay
    from textrl_envs.games.tictactoe import TicTacToe

    return SelfPlay(TicTacToe(), opponent="random")


def nim_interaction():
    """``Nim-v0``'s :class:`~textrl_envs.games.SelfPlay`: one-heap Nim (5-12 stones) against a random opponent."""
    from textrl_envs.games.nim import Nim
    from textrl_envs.games.selfplay import SelfPlay

    return SelfPlay(Nim(), opponent="random")


def kuhn_interaction():
    """``KuhnPoker-v0``'s :class:`~textrl_envs.games.SelfPlay`: Kuhn poker against a random opponent."""
    from textrl_envs.games.kuhn import KuhnPoker
    from textrl_envs.games.selfplay import SelfPlay

    return SelfPlay(KuhnPoker(), opponent="random")


# -- the tasks -----------------------------------------------------------------------------------------------

SENTIMENT = Task(
    env_id="TextGen-v0",
    entry_point="textrl_envs.tasks.sentiment:SentimentEnv",
    summary="positive-sentiment steering: continue a movie-review opener; reward VADER compound in [-1, 1]",
    prompts=sentiment_prompts,
    reward="sentiment",
    reward_kwargs={},
    max_new_tokens=24,
    max_prompt_tokens=8,
)

ARITHMETIC = Task(
    env_id="Arithmetic-v0",
    entry_point="textrl_envs.tasks.arithmetic:ArithmeticEnv",
    summary="arithmetic (a+b, a-b with a, b in 0-20; a*b in 0-12): write the answer; exact 1, partial credit",
    prompts=arithmetic_prompts,
    reward="arithmetic",
    reward_kwargs={"partial_weight": 0.5, "format_weight": 0.1},
    max_new_tokens=4,
    max_prompt_tokens=8,
    instruct=InstructDefaults(question=arithmetic_question, check="math", max_new_tokens=64, max_prompt_tokens=96),
)

INCREASING_NUMBERS = Task(
    env_id="IncreasingNumbers-v0",
    entry_point="textrl_envs.tasks.numbers:IncreasingNumbersEnv",
    summary="increasing numbers (RL4LMs): continue 'Numbers:' with a strictly increasing integer sequence",
    prompts=number_prompts,
    reward="increasing-numbers",
    reward_kwargs={"target": 8},
    max_new_tokens=20,
    max_prompt_tokens=8,
)

COMMONGEN = Task(
    env_id="CommonGen-v0",
    entry_point="textrl_envs.tasks.commongen:CommonGenEnv",
    summary="CommonGen-style concept-to-sentence; reward ROUGE-L F1, best over 3 references",
    prompts=concept_prompts,
    reward="rouge-l",
    reward_kwargs={},
    max_new_tokens=20,
    max_prompt_tokens=16,
)

KEYWORDS = Task(
    env_id="Keywords-v0",
    entry_point="textrl_envs.tasks.constraints:KeywordsEnv",
    summary="constrained review: use the keywords, 4-20 words, no repeated bigrams; composite reward",
    prompts=keyword_prompts,
    reward="composite",
    # keyword coverage + length limits + repetition penalty, with their weights
    reward_kwargs={
        "components": [
            ("keywords", 1.0, {}),
            ("length", 0.5, {"min_words": 4, "max_words": 20, "per_word": 0.1, "cap": 1.0}),
            ("repetition", 0.5, {"n": 2}),
        ]
    },
    max_new_tokens=24,
    max_prompt_tokens=16,
)

LONG_REVIEW = Task(
    env_id="LongReview-v0",
    entry_point="textrl_envs.tasks.sentiment:LongReviewEnv",
    summary="long positive review: 96 tokens every episode (EOS does not end it); reward sentiment of the whole "
    "text + coherence under the reference LM + bigram-repetition penalty",
    prompts=sentiment_prompts,
    reward="composite",
    # each term in about [-1, 1]: positive, fluent (as the reference LM reads it) and not repeating itself
    reward_kwargs={
        "components": [
            ("sentiment", 1.0, {}),
            ("coherence", 1.0, {}),
            ("repetition", 1.0, {"n": 2}),
        ]
    },
    max_new_tokens=96,
    max_prompt_tokens=8,
    stop_at_eos=False,
)

GUESS_NUMBER = Task(
    env_id="GuessNumber-v0",
    entry_point="textrl_envs.tasks.guess_number:GuessNumberEnv",
    summary="interactive: guess a secret number in 1-8, the env answers higher / lower; reward 1 - 0.1 per extra turn",
    prompts=guess_number_prompts,
    reward=None,
    max_new_tokens=48,
    max_prompt_tokens=12,
    interaction=guess_number_interaction,
    max_turns=4,
    max_turn_tokens=3,
    instruct=InstructDefaults(
        question=guess_number_question,
        check="number",
        interaction=guess_number_chat_interaction,
        max_turns=4,
        max_turn_tokens=32,
        max_new_tokens=192,
        max_prompt_tokens=112,
    ),
)

TOOL_ARITHMETIC = Task(
    env_id="ToolArithmetic-v0",
    entry_point="textrl_envs.tasks.tool_arithmetic:ToolArithmeticEnv",
    summary="interactive: products such as 37*12 with a calculator ('calc: 37*12'), then the answer; exact match",
    prompts=tool_arithmetic_prompts,
    reward=None,
    max_new_tokens=48,
    max_prompt_tokens=12,
    interaction=calculator_interaction,
    max_turns=3,
    max_turn_tokens=12,
    instruct=InstructDefaults(
        question=tool_arithmetic_question,
        check="number",
        interaction=calculator_chat_interaction,
        max_turns=3,
        max_turn_tokens=48,
        max_new_tokens=192,
        max_prompt_tokens=128,
    ),
)

TICTACTOE = Task(
    env_id="TicTacToe-v0",
    entry_point="textrl_envs.tasks.games:TicTacToeEnv",
    summary="two-player game: tic-tac-toe against an opponent (random by default; any policy); reward 1 / 0 / -1",
    prompts=functools.partial(game_prompts, "tictactoe"),
    reward=None,
    max_new_tokens=96,
    max_prompt_tokens=16,
    interaction=tictactoe_interaction,
    max_turns=5,
    max_turn_tokens=2,
    instruct=game_instruct("tictactoe", max_turns=5, max_new_tokens=448),
)

NIM = Task(
    env_id="Nim-v0",
    entry_point="textrl_envs.tasks.games:NimEnv",
    summary="two-player game: one-heap Nim (take 1-3, the last stone wins) against an opponent; reward 1 / -1",
    prompts=functools.partial(game_prompts, "nim"),
    reward=None,
    max_new_tokens=72,
    max_prompt_tokens=16,
    interaction=nim_interaction,
    max_turns=6,
    max_turn_tokens=2,
    instruct=game_instruct("nim", max_turns=6, max_new_tokens=288),
)

KUHN_POKER = Task(
    env_id="KuhnPoker-v0",
    entry_point="textrl_envs.tasks.games:KuhnPokerEnv",
    summary="two-player game: Kuhn poker (J, Q, K; 0 pass or 1 bet) against an opponent; reward the chips won, -2 to 2",
    prompts=functools.partial(game_prompts, "kuhn"),
    reward=None,
    max_new_tokens=40,
    max_prompt_tokens=16,
    interaction=kuhn_interaction,
    max_turns=2,
    max_turn_tokens=2,
    instruct=game_instruct("kuhn", max_turns=2, max_new_tokens=128),
)

TOOL_USE = Task(
    env_id="ToolUse-v0",
    entry_point="textrl_envs.tasks.tool_use:ToolUseEnv",
    summary="interactive tool calling: Python tools by JSON schema through the chat template, calls in the model "
    "family's format (Hermes / Qwen, SmolLM2); reward: the transcript's final answer is right",
    prompts=tool_use_prompts,
    reward="final-answer",
    max_new_tokens=80,
    max_prompt_tokens=48,
    interaction=tool_use_interaction,
    max_turns=4,
    max_turn_tokens=64,
)

CODE_GEN = Task(
    env_id="CodeGen-v0",
    entry_point="textrl_envs.tasks.code_gen:CodeGenEnv",
    summary="code generation: complete a Python function (procedural easy ones; HumanEval's 164 with the code extra); "
    "reward: the fraction of its unit tests passed, run in a sandbox",
    prompts=code_prompts,
    reward="unit-tests",
    max_new_tokens=64,
    max_prompt_tokens=64,
)

# -- external suites (optional extras; their modules in textrl_envs/suites/ import the library when made) ------

REASONING_GYM = Task(
    env_id="ReasoningGym-v0",
    entry_point="textrl_envs.suites.reasoning:ReasoningGymEnv",
    vector_entry_point="textrl_envs.suites.reasoning:ReasoningGymVectorEnv",
    summary="any reasoning-gym task (or a weighted mix): answer its question; reward its own score_answer in [0, 1]",
    max_new_tokens=16,
    max_prompt_tokens=96,
    extra="reasoning",
    kwargs={},
    # the item's question as it is; graded by the task's own scorer (the suite's reward), on the final answer
    instruct=InstructDefaults(max_new_tokens=128, max_prompt_tokens=256),
)

TEXTARENA = Task(
    env_id="TextArena-v0",
    entry_point="textrl_envs.suites.textarena:TextArenaEnv",
    vector_entry_point="textrl_envs.suites.textarena:TextArenaVectorEnv",
    summary="interactive: a single-player TextArena game (GuessTheNumber-v0, TowerOfHanoi-v0, ...); the game's reward",
    # the game's rules and board come as the opening, inside the episode's budget
    max_new_tokens=1024,
    max_prompt_tokens=16,
    max_turn_tokens=16,
    extra="textarena",
    kwargs={},
)

#: Every task, in registration order: the one list of env ids.
TASKS: tuple[Task, ...] = (
    SENTIMENT,
    ARITHMETIC,
    INCREASING_NUMBERS,
    COMMONGEN,
    KEYWORDS,
    LONG_REVIEW,
    GUESS_NUMBER,
    TOOL_ARITHMETIC,
    TICTACTOE,
    NIM,
    KUHN_POKER,
    TOOL_USE,
    CODE_GEN,
    REASONING_GYM,
    TEXTARENA,
)

_BY_ID: dict[str, Task] = {task.env_id: task for task in TASKS}
if len(_BY_ID) != len(TASKS):
    raise ValueError(f"TASKS lists an env id twice: {sorted(t.env_id for t in TASKS)}")


def get_task(env_id: str) -> Task:
    """The :class:`Task` registered under ``env_id``."""
    try:
        return _BY_ID[env_id]
    except KeyError:
        raise ValueError(f"no task {env_id!r}; known: {', '.join(sorted(_BY_ID))}") from None


def builtin_tasks() -> list[Task]:
    """The tasks that need no extra (their prompts and reward are in the package)."""
    return [task for task in TASKS if task.extra is None]


def all_tasks() -> list[Task]:
    """Every registered task, in registration order."""
    return list(TASKS)
