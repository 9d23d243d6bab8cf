"""How a reward is called: Hugging Face TRL's keyword convention, our older positional one, and what each gets.

TRL's ``GRPOTrainer`` calls every reward function with keywords only::

    reward(prompts=prompts, completions=completions, completion_ids=completion_ids, trainer_state=state, **columns)

where ``columns`` are the dataset's other columns (``answer=[...]``), each a list aligned with the batch. So do the
environments here (:func:`~textrl_envs.rewards.base.call_reward`), which makes TRL's reward functions (those of
``trl.rewards`` too) plug in unchanged: ``def f(completions, **kwargs)``, ``def f(completions, solution, **kwargs)``
or ``def f(completion_ids, **kwargs)`` each get what they name. :func:`call_style` reads a reward's signature once:

* ``"keywords"`` (TRL's): the signature names ``prompts``, ``completions`` or ``completion_ids`` and its first
  parameter is one of TRL's names, or it takes only ``**kwargs``. A function without ``**kwargs`` gets only the
  keywords it names.
* ``"positional"`` (this package's older form, kept working): a function whose first parameter has another name and
  that takes two positional arguments, ``lambda p, c: ...`` or ``def f(_prompts, completions)``, is called
  ``f(prompts, completions, **columns)``, with the columns it can take as keywords.

:func:`check_reward_call` refuses, when the env is built, a reward that names an argument no call gives, with the
list of what calls give.

Conversational completions (TRL's convention): when the env renders its prompts with a chat template, a keyword-style
reward gets ``prompts`` as the conversations (lists of ``{"role", "content"}`` messages, as given) and each
completion as ``[{"role": "assistant", "content": text}]``, unless its ``completions`` parameter is annotated as
plain text (``list[str]``). :class:`~textrl_envs.rewards.RewardModel` subclasses get text unless their class sets
``conversational = True``.

``trainer_state`` is a :class:`TrainerState`: how far training has come, for rewards that change with it (TRL passes
transformers' ``TrainerState``, whose ``global_step`` and ``max_steps`` this one has too).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from textrl_envs.rewards.model import RewardModel

__all__ = [
    "CALL_KEYWORDS",
    "TrainerState",
    "call_style",
    "check_reward_call",
    "conversational_completions",
    "reward_arguments",
    "updated_trainer_state",
    "wants_conversations",
]

#: What every call offers besides the metadata columns (TRL's names).
CALL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state")
#: Parameter annotations that ask for completions as plain text even with chat prompts.
_TEXT_ANNOTATIONS = frozenset({"list[str]", "List[str]", "typing.List[str]", "Sequence[str]", "Iterable[str]"})


@dataclasses.dataclass(frozen=True)
class TrainerState:
    """How far training has come, as a reward sees it (``trainer_state=``).

    The algorithms of :mod:`sb3_grpo` set it on the training env at the start of every rollout; with stock SB3 ``PPO``
    add :class:`sb3_grpo.callbacks.TrainerStateCallback`. An env never trained says 0 everywhere.

    :param global_step: Rollout-and-update iterations done so far (TRL's ``global_step`` counts optimizer steps; with
        one update per rollout, as TRL's default, the two agree).
    :param max_steps: Iterations the current ``learn()`` call will do (0: unknown).
    :param num_timesteps: Env steps (tokens, summed over the envs) so far: SB3's ``num_timesteps``.
    :param total_timesteps: Env steps the current ``learn()`` call trains for (0: unknown).
    """

    global_step: int = 0
    max_steps: int = 0
    num_timesteps: int = 0
    total_timesteps: int = 0

    @property
    def progress(self) -> float:
        """``global_step / max_steps`` in ``[0, 1]`` (0 while ``max_steps`` is unknown)."""
        return min(1.0, self.global_step / self.max_steps) if self.max_steps > 0 else 0.0


def updated_trainer_state(state: TrainerState, fields: Mapping[str, Any]) -> TrainerState:
    """``state`` with ``fields`` replaced (a new object: a reward scored in another thread keeps the one it got).

    :raises TypeError: for a field :class:`TrainerState` does not have, or a value that is not an int >= 0.
    """
    known = [f.name for f in dataclasses.fields(TrainerState)]
    for key, value in fields.items():
        if key not in known:
            raise TypeError(f"set_trainer_state() got {key!r}; TrainerState's fields are {', '.join(known)}")
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise TypeError(f"set_trainer_state({key}={value!r}): it must be an int >= 0")
    return dataclasses.replace(state, **{k: int(v) for k, v in fields.items()})


@dataclasses.dataclass(frozen=True)
class _Signature:
    style: str
    any_keyword: bool  # takes **kwargs
    names: frozenset[str]  # parameters that can be passed by keyword
    required: tuple[str, ...]  # parameters without a default that a call must give
    text_completions: bool  # `completions` annotated as plain text


def _target(reward: Any) -> Callable:
    """The callable whose signature says what ``reward`` takes: a RewardModel's ``score`` (its ``__call__``, when a
    subclass overrides it), else the reward itself."""
    if isinstance(reward, RewardModel):
        overridden = type(reward).__call__ is not RewardModel.__call__
        return reward.__call__ if overridden else reward.score
    return reward


def _analyse(fn: Callable) -> _Signature:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: the older positional form, every column
        return _Signature("positional", True, frozenset(), (), False)
    params = list(sig.parameters.values())
    kw_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    names = frozenset(p.name for p in params if p.kind in kw_kinds)
    positional = [
        p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    completions = sig.parameters.get("completions")
    annotation = "" if completions is None else completions.annotation
    text = isinstance(annotation, str) and annotation.replace(" ", "") in _TEXT_ANNOTATIONS
    if not isinstance(annotation, str) and annotation is not inspect.Parameter.empty:
        text = str(annotation).replace(" ", "") in _TEXT_ANNOTATIONS
    first = positional[0].name if positional else None
    trl_named = bool(names & {"prompts", "completions", "completion_ids"}) and first in (None, *CALL_KEYWORDS)
    if trl_named or (any_keyword and not positional and not var_positional):
        required = tuple(p.name for p in params if p.kind in kw_kinds and p.default is inspect.Parameter.empty)
        positional_only = [p.name for p in positional if p.kind is inspect.Parameter.POSITIONAL_ONLY]
        return _Signature("keywords", any_keyword, names, (*positional_only, *required), text)
    if len(positional) >= 2 or var_positional:
        rest = tuple(p.name for p in positional[2:] if p.default is inspect.Parameter.empty) + tuple(
            p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
        )
        return _Signature("positional", any_keyword, names - {p.name for p in positional[:2]}, rest, False)
    return _Signature("unusable", any_keyword, names, tuple(p.name for p in params), text)


@functools.lru_cache(maxsize=256)
def _analyse_cached(fn: Callable) -> _Signature:
    return _analyse(fn)


def _signature(reward: Any) -> _Signature:
    fn = _target(reward)
    try:
        return _analyse_cached(fn)
    except TypeError:  # unhashable callable
        return _analyse(fn)


def call_style(reward: Any) -> str:
    """``"keywords"`` (TRL's convention) or ``"positional"`` (``f(prompts, completions, **columns)``): how
    :func:`~textrl_envs.rewards.base.call_reward` calls ``reward``; ``"unusable"`` for a signature that fits neither
    (:func:`check_reward_call` says why). A :class:`~textrl_envs.rewards.RewardModel` is always called with
    keywords."""
    if isinstance(reward, RewardModel):
        return "keywords"
    return _signature(reward).style


def wants_conversations(reward: Any) -> bool:
    """Whether ``reward`` gets TRL's conversational prompts and completions when the env's prompts are chat
    conversations (see the module docstring)."""
    if isinstance(reward, RewardModel):
        return bool(getattr(reward, "conversational", False))
    sig = _signature(reward)
    return sig.style == "keywords" and not sig.text_completions


def conversational_completions(
    completions: Sequence[str], messages: Sequence[Any] | None = None
) -> list[list[dict[str, Any]]]:
    """Each completion as TRL's conversational completion: its messages where ``messages`` has them (an interactive
    episode's transcript, assistant and ``tool`` messages), else ``[{"role": "assistant", "content": text}]``."""
    if messages is None:
        messages = [None] * len(completions)
    return [[{"role": "assistant", "content": c}] if m is None else list(m) for c, m in zip(completions, messages)]


def reward_arguments(
    reward: Any, metadata: Mapping[str, Sequence[Any]], context: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of the call of ``reward``.

    :param reward: The reward.
    :param metadata: The metadata columns.
    :param context: ``prompts``, ``completions`` (in the form the reward gets), and, where known, ``completion_ids``
        and ``trainer_state``.
    """
    sig = _signature(reward)
    if isinstance(reward, RewardModel):  # every metadata column (its required_kwargs are checked), the rest if taken
        extra = {
            k: v
            for k, v in context.items()
            if k in ("prompts", "completions") or k in sig.names or (sig.any_keyword and k in CALL_KEYWORDS)
        }
        return (), {**metadata, **extra}
    if sig.style == "positional":
        kwargs = {k: v for k, v in metadata.items() if sig.any_keyword or k in sig.names}
        return (context["prompts"], context["completions"]), kwargs
    given = {**metadata, **{k: v for k, v in context.items() if k in CALL_KEYWORDS}}
    return (), {k: v for k, v in given.items() if sig.any_keyword or k in sig.names}


def check_reward_call(reward: Any, metadata_keys: Sequence[str], name: str) -> None:
    """Refuse, before any episode, a reward whose signature asks for an argument no call gives.

    :param reward: The reward (a plain callable or a :class:`~textrl_envs.rewards.RewardModel`).
    :param metadata_keys: The metadata columns of the env's prompts.
    :param name: The reward's name, for the message.
    :raises TypeError: naming the argument, what calls give, and how to write the reward.
    """
    if isinstance(reward, RewardModel) or not callable(reward):
        return
    sig = _signature(reward)
    given = set(CALL_KEYWORDS) | set(metadata_keys)
    columns = ", ".join(metadata_keys) or "none here"
    how = (
        "rewards are called as TRL calls them, with keywords: prompts=, completions=, completion_ids=, trainer_state= "
        f"and the prompts' metadata columns ({columns}); write it e.g. def {name}(completions, **kwargs)"
    )
    if sig.style == "unusable":
        raise TypeError(f"reward {name!r} takes ({', '.join(sig.required)}), which no call fills: {how}")
    missing = [r for r in sig.required if r not in given]
    if missing:
        raise TypeError(f"reward {name!r} needs the argument(s) {', '.join(missing)}, which no call gives: {how}")
