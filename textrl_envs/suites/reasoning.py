"""``ReasoningGym-v0``: every reasoning-gym task generator as a text-generation env (extra ``textrl[reasoning]``).

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (Apache-2.0) holds about 100 procedural,
seeded task generators: ``reasoning_gym.create_dataset(name, size=..., seed=..., **config)`` gives items
``{"question", "answer", "metadata"}`` and ``dataset.score_answer(answer, entry)`` scores an answer (1.0 when
exact). Nothing is downloaded: the generators and their word lists ship with the package.

:class:`ReasoningGymSuite` builds the dataset, turns its items into prompt dicts (TRL's convention: the prompt
plus metadata columns that reach the reward) and holds :class:`ReasoningGymReward`, which scores a completion
with the dataset's own ``score_answer``. :class:`ReasoningGymEnv` and :class:`ReasoningGymVectorEnv` are the
generic single and vector text envs over those prompts and that reward, so everything the text envs do
(groups, the SB3 adapter, the fast path) works unchanged.
"""

from __future__ import annotations

import difflib
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from textrl_envs.env import TextGenEnv
from textrl_envs.rewards.answers import final_answer, in_answer_style
from textrl_envs.rewards.base import RewardModel
from textrl_envs.suites import import_extra
from textrl_envs.tasks import REASONING_GYM
from textrl_envs.validation import check_bool, check_prefill
from textrl_envs.vector import TextGenVectorEnv

#: The reasoning-gym task made when none is named.
DEFAULT_TASK = "leg_counting"
#: Items generated per env (reasoning-gym's own default).
DEFAULT_SIZE = 500
#: The prompt: the item's question as it is.
DEFAULT_TEMPLATE = "{question}"
#: How the answer is read from a completion (or a callable ``str -> str | None``), see :func:`extract_answer`.
ANSWER_FORMATS = ("plain", "tag", "prefix", "final")
#: ``create_dataset`` arguments that the env sets itself (``size``, ``seed``), not ``task_kwargs``.
_ENV_OWNED = ("size", "seed")

_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_PREFIX = re.compile(r"answer\s*:", re.IGNORECASE)


def load_reasoning_gym():
    """Import ``reasoning_gym``, or raise an ``ImportError`` naming ``pip install "textrl[reasoning]"``."""
    return import_extra("reasoning_gym", REASONING_GYM, "reasoning-gym")


def task_names() -> list[str]:
    """Every task name reasoning-gym registers (``"composite"`` left out: pass several names instead)."""
    rg = load_reasoning_gym()
    return sorted(name for name in rg.factory.DATASETS if name != "composite")


# -- arguments ------------------------------------------------------------------------------------------------


def check_task_name(name: Any, known: Sequence[str]) -> str:
    """``name`` if reasoning-gym has that task, else a ``ValueError`` listing the close matches."""
    if not isinstance(name, str):
        raise TypeError(f"a reasoning-gym task name must be a str, got {type(name).__name__} ({name!r})")
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise ValueError(
            f"reasoning-gym has no task {name!r}; {hint}{len(known)} tasks are known, e.g. "
            f"{', '.join(known[:8])}, ... (textrl_envs.suites.reasoning.task_names() lists them all)"
        )
    return name


def resolve_mix(task: Any, task_kwargs: Mapping[str, Any] | None) -> list[tuple[str, float, dict[str, Any]]]:
    """The tasks of an env as ``(name, weight, config)`` triples.

    :param task: A task name; a list of names (equal weights); or a dict ``{name: weight}``.
    :param task_kwargs: For one task, its config (``{"min_animals": 2}``); for several, ``{name: config}``.
    :return: One triple per task (names not yet checked against reasoning-gym).
    """
    if task_kwargs is not None and not isinstance(task_kwargs, Mapping):
        raise TypeError(f"task_kwargs must be a dict (or None), got {type(task_kwargs).__name__}")
    kwargs = dict(task_kwargs or {})
    if isinstance(task, str):
        return [(task, 1.0, kwargs)]
    if isinstance(task, Mapping):
        weights = dict(task)
    elif isinstance(task, Sequence) and not isinstance(task, bytes):
        weights = {name: 1.0 for name in task}
        if len(weights) != len(task):
            raise ValueError(f"task lists a name twice: {list(task)}")
    else:
        raise TypeError(
            f"task must be a reasoning-gym task name, a list of names or a dict {{name: weight}}; got {task!r}"
        )
    if not weights:
        raise ValueError("task is empty; name at least one reasoning-gym task, e.g. task='leg_counting'")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"the weight of task {name!r} must be a finite number > 0, got {weight!r}")
    stray = sorted(set(kwargs) - set(weights))
    if stray:
        raise ValueError(
            f"with several tasks, task_kwargs maps task names to configs; {stray} are not among the tasks "
            f"{sorted(weights)}"
        )
    return [(name, float(weight), dict(kwargs.get(name) or {})) for name, weight in weights.items()]


def check_config(rg, name: str, config: Mapping[str, Any]) -> None:
    """Build and validate task ``name``'s config; reasoning-gym's errors become ``ValueError``\\ s with its options."""
    import dataclasses

    config_cls = rg.factory.DATASETS[name][1]
    options = [f.name for f in dataclasses.fields(config_cls) if f.name not in _ENV_OWNED]
    owned = sorted(set(config) & set(_ENV_OWNED))
    if owned:
        raise ValueError(f"task_kwargs of {name!r} set {owned}; give them as the env's own size= and seed= arguments")
    unknown = sorted(set(config) - set(options))
    if unknown:
        raise ValueError(f"reasoning-gym task {name!r} has no option {unknown}; its options: {', '.join(options)}")
    try:
        cfg = config_cls(**config)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except (AssertionError, ValueError, TypeError) as err:
        raise ValueError(
            f"reasoning-gym task {name!r} rejected task_kwargs {dict(config)}: {err or 'invalid'}"
        ) from err


def make_dataset(
    task: Any = DEFAULT_TASK,
    task_kwargs=None,
    size: int = DEFAULT_SIZE,
    seed: int | None = 0,
    levels: Any = None,
):
    """The reasoning-gym dataset of an env: one task's, or a weighted composite of several; with ``levels``, one
    such dataset per difficulty level of reasoning-gym's own curricula (:class:`LeveledDataset`).

    :param task: See :func:`resolve_mix`.
    :param task_kwargs: See :func:`resolve_mix`.
    :param size: Items in the dataset (>= 1); with ``levels``, items per level.
    :param seed: Seed of the generator (``None``: a random one, as in reasoning-gym); level ``l`` uses ``seed + l``.
    :param levels: ``None`` (the task's config as given), a list of curriculum levels, or ``"all"`` (see
        :func:`check_levels`).
    :return: A ``reasoning_gym`` ``ProceduralDataset``, or a :class:`LeveledDataset` of them.
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size (items generated) must be an int >= 1, got {size!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError(f"seed (of the item generator) must be an int or None, got {type(seed).__name__}")
    rg = load_reasoning_gym()
    mix = resolve_mix(task, task_kwargs)
    known = task_names()
    for name, _, config in mix:
        check_task_name(name, known)
        if levels is None:
            check_config(rg, name, config)
    size, seed = int(size), None if seed is None else int(seed)
    if levels is None:
        return _mix_dataset(rg, mix, size, seed)
    chosen = check_levels(levels, level_count(rg, [name for name, _, _ in mix]))
    by_level = {}
    for level in chosen:
        at_level = [(name, weight, level_config(rg, name, level, config)) for name, weight, config in mix]
        by_level[level] = _mix_dataset(rg, at_level, size, None if seed is None else seed + level)
    return LeveledDataset(by_level)


def _mix_dataset(rg, mix: list[tuple[str, float, dict[str, Any]]], size: int, seed: int | None):
    if len(mix) == 1:
        name, _, config = mix[0]
        return rg.create_dataset(name, size=size, seed=seed, **config)
    from reasoning_gym.composite import DatasetSpec

    specs = [DatasetSpec(name=name, weight=weight, config=config) for name, weight, config in mix]
    return rg.create_dataset("composite", size=size, seed=seed, datasets=specs)


# -- difficulty levels (reasoning-gym's curricula) --------------------------------------------------------------

#: The metadata key that holds an item's difficulty level, in the item's ``metadata`` and as a prompt column.
LEVEL_KEY = "level"


def _curriculum(rg, name: str):
    if not rg.factory.has_curriculum(name):
        with_levels = sorted(n for n in rg.factory.CURRICULA if n != "composite")
        raise ValueError(
            f"reasoning-gym task {name!r} has no curriculum, so it has no difficulty levels; leave levels=None and "
            f"set its difficulty with task_kwargs, or pick a task with levels (e.g. {', '.join(with_levels[:6])}, "
            f"... {len(with_levels)} in all)"
        )
    return rg.factory.create_curriculum(name)


def _curriculum_fields(curriculum) -> set[str]:
    """The config fields a reasoning-gym curriculum sets from its levels."""
    fields = set()
    for attr in curriculum.attributes.values():
        for key in ("lower_field_name", "upper_field_name", "field_name"):
            if getattr(attr, key, None):
                fields.add(getattr(attr, key))
    return fields


def level_count(rg, names: Sequence[str]) -> int:
    """The levels an env of these tasks has: the most levels any of their curricula's attributes has (an attribute
    with fewer stays at its top level above them, as reasoning-gym's ``set_global_level`` does)."""
    return max(max(len(a.levels) for a in _curriculum(rg, name).attributes.values()) for name in names)


def check_levels(levels: Any, count: int) -> list[int]:
    """``levels`` as a sorted list of distinct levels in ``[0, count)``: ``"all"`` is every level, else a list of
    ints (a ``range`` too)."""
    if isinstance(levels, str) and levels == "all":
        return list(range(count))
    bad = isinstance(levels, (str, bytes)) or not isinstance(levels, (Sequence, range)) or len(levels) == 0
    if not bad:
        bad = any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < count for v in levels)
    if bad:
        raise ValueError(
            f"levels must be 'all' or a non-empty list of ints in [0, {count - 1}] (the curriculum levels of these "
            f"tasks), got {levels!r}"
        )
    if len(set(levels)) != len(levels):
        raise ValueError(f"levels lists a level twice: {list(levels)}")
    return sorted(int(v) for v in levels)


def level_config(rg, name: str, level: int, config: Mapping[str, Any]) -> dict[str, Any]:
    """Task ``name``'s config at curriculum level ``level``: reasoning-gym's
    ``curriculum.set_global_level(level)`` and ``generate_configuration``, with ``config`` for the fields the
    curriculum does not set.

    :raises ValueError: when ``config`` sets a field the curriculum sets (the level decides it).
    """
    import dataclasses

    curriculum = _curriculum(rg, name)
    taken = sorted(set(config) & _curriculum_fields(curriculum))
    if taken:
        raise ValueError(
            f"with levels=, reasoning-gym's curriculum of {name!r} sets {taken} at each level; leave them out of "
            "task_kwargs (or leave levels=None and set them yourself)"
        )
    check_config(rg, name, config)
    curriculum.set_global_level(level)
    generated = curriculum.generate_configuration(dict(config))
    out = {k: v for k, v in dataclasses.asdict(generated).items() if k not in _ENV_OWNED}
    check_config(rg, name, out)
    return out


class LeveledDataset:
    """Items of one dataset per difficulty level, in order of level, each item's ``metadata`` with its ``level``;
    an answer is scored by its own level's dataset.

    :param datasets: ``{level: reasoning-gym dataset}``.
    """

    def __init__(self, datasets: Mapping[int, Any]) -> None:
        self.datasets = dict(sorted(datasets.items()))
        self._index = [(level, i) for level, ds in self.datasets.items() for i in range(len(ds))]
        self.levels = [level for level, _ in self._index]

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, Any]:
        level, i = self._index[index]
        item = dict(self.datasets[level][i])
        item["metadata"] = {**item["metadata"], LEVEL_KEY: level}
        return item

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
        return self.datasets[entry["metadata"][LEVEL_KEY]].score_answer(answer, entry)


def check_template(template: Any) -> str:
    """``template`` if it is a str that formats with ``{question}`` alone, else a ``ValueError``."""
    if not isinstance(template, str) or "{question}" not in template:
        raise ValueError(
            f"template must be a str containing '{{question}}', e.g. 'Q: {{question}}\\nA:'; got {template!r}"
        )
    try:
        template.format(question="")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"template {template!r} does not format with question= alone ({err!r}); write other braces as {{{{ }}}}"
        ) from None
    return template


def extract_answer(completion: str, answer_format: str | Callable[[str], str | None] = "plain") -> str | None:
    """The answer a completion gives.

    :param completion: The generated text.
    :param answer_format: ``"plain"``: the whole completion, stripped; ``"tag"``: the last
        ``<answer>...</answer>`` (reasoning-gym's own convention), stripped; ``"prefix"``: the rest of the line
        after the last ``answer:`` (any case), stripped; ``"final"``: the final answer of free text, as an instruct
        model writes it (:func:`~textrl_envs.rewards.answers.final_answer`: ``\boxed{}``, ``Answer:``, the last
        number); or a callable ``str -> str | None``.
    :return: The answer, or ``None`` when the completion gives none (scored 0 by reasoning-gym).
    """
    if callable(answer_format):
        return answer_format(completion)
    if answer_format == "plain":
        return completion.strip()
    if answer_format == "tag":
        found = _TAG.findall(completion)
        return found[-1].strip() if found else None
    if answer_format == "prefix":
        found = list(_PREFIX.finditer(completion))
        return completion[found[-1].end() :].split("\n", 1)[0].strip() if found else None
    if answer_format == "final":
        return final_answer(completion)
    raise ValueError(
        f"answer_format must be one of {ANSWER_FORMATS} or a callable str -> str | None, got {answer_format!r}"
    )


# -- the reward ------------------------------------------------------------------------------------------------


class ReasoningGymReward(RewardModel):
    """A completion's score by its dataset's own ``score_answer`` (1.0 for the exact answer, task-specific below).

    The reward needs the item of each prompt, which the env passes as metadata (``question``, ``answer``,
    ``metadata``). A scorer that raises on a completion scores it 0.0 (with one warning per reward object):
    a model's output must not stop training.

    With ``format_weight > 0`` a completion that states its answer in ``style`` (``"answer-line"``, ``"boxed"``:
    :func:`~textrl_envs.rewards.answers.in_answer_style`) gets ``format_weight`` more (instruct mode's format bonus).

    Partial credit: reasoning-gym's default scorer gives an answer that contains the right one
    ``len(right) / len(given)``, so ``"10"`` earns 0.5 on an item whose answer is ``"1"`` and another whose answer is
    ``"0"``. A policy learns to write such answers. ``partial_credit=False`` scores a completion 1.0 when the
    task's score is 1.0 and 0.0 otherwise (the all-or-nothing reward of DeepSeekMath's and TRL's verifiable tasks).

    :param dataset: The reasoning-gym dataset whose items the prompts are.
    :param answer_format: See :func:`extract_answer`.
    :param format_weight: The format bonus (>= 0; 0: none).
    :param style: The answer style the bonus checks.
    :param partial_credit: ``True``: the task's own score in ``[0, 1]``; ``False``: 1.0 for a full score, else 0.0.
    :param answer_prefix: The text every reply was started with for the model (an assistant prefill, such as
        ``"Answer:"``: :class:`~textrl_envs.instruct.InstructFormat`'s ``answer_prefix``), read before the completion.
    """

    required_kwargs = ("question", "answer", "metadata")

    def __init__(
        self,
        dataset: Any,
        answer_format: str | Callable[[str], str | None] = "plain",
        format_weight: float = 0.0,
        style: str = "answer-line",
        partial_credit: bool = True,
        answer_prefix: str = "",
    ) -> None:
        super().__init__(name=f"reasoning-gym:{type(dataset).__name__}")
        answer_prefix = check_prefill("answer_prefix", answer_prefix, "answer", hint=" (e.g. 'Answer:')")
        partial_credit = check_bool("partial_credit", partial_credit)
        if not callable(answer_format) and answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format must be one of {ANSWER_FORMATS} or a callable str -> str | None, got {answer_format!r}"
            )
        self.dataset = dataset
        self.answer_format = answer_format
        self.format_weight, self.style = float(format_weight), style
        self.partial_credit = partial_credit
        self.answer_prefix = answer_prefix
        self._warned = False

    def score(self, prompts, completions, question, answer, metadata, **kwargs) -> list[float]:  # noqa: ARG002  (RewardModel.score signature)
        out = []
        for written, q, a, meta in zip(completions, question, answer, metadata):
            completion = self.answer_prefix + written
            if meta is None:
                raise ValueError(
                    f"{REASONING_GYM.env_id} scores only the items of its dataset, and this prompt is not one of "
                    "them; start episodes on an item with reset(options={'prompt_index': i})"
                )
            score = self._score_one(completion, {"question": q, "answer": a, "metadata": meta})
            if self.format_weight:
                score += self.format_weight * float(in_answer_style(completion, self.style))
            out.append(score)
        return out

    def _score_one(self, completion: str, entry: dict[str, Any]) -> float:
        given = extract_answer(completion, self.answer_format)
        try:
            score = float(self.dataset.score_answer(given, entry))
        except Exception as err:  # noqa: BLE001  (a scorer's bug on odd text scores 0; training goes on)
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"{self.name}: score_answer raised {err!r} on the answer {given!r}; scored 0.0 (warned once)",
                    stacklevel=2,
                )
            return 0.0
        return score if self.partial_credit or score >= 1.0 else 0.0


# -- the suite behind one env -----------------------------------------------------------------------------------


class ReasoningGymSuite:
    """The dataset of one env, its items as prompt dicts, and the reward that scores them.

    :param task: A reasoning-gym task name, a list of names, or ``{name: weight}`` (a weighted composite).
    :param task_kwargs: The task's config, or ``{name: config}`` for several tasks.
    :param size: Items generated (the prompt list; ``reset(options={"prompt_index": i})`` picks item ``i``).
    :param seed: Seed of the item generator (not of the episodes: that is ``reset(seed=...)``).
    :param template: The prompt, a str with ``{question}``.
    :param answer_format: How the answer is read from a completion (:func:`extract_answer`).
    :param levels: Difficulty levels of reasoning-gym's curricula (:func:`make_dataset`): ``size`` items at each,
        and a ``level`` prompt column.
    :param instruct: The env's ``instruct=`` (:mod:`textrl_envs.instruct`): when on, answers are read as free text's
        final answer (``answer_format`` defaults to ``"final"``) and its format bonus joins the reward.
    :param partial_credit: Whether the reward keeps the task's partial credit (:class:`ReasoningGymReward`).
    """

    def __init__(
        self,
        task: Any = DEFAULT_TASK,
        task_kwargs: Mapping[str, Any] | None = None,
        size: int = DEFAULT_SIZE,
        seed: int | None = 0,
        template: str = DEFAULT_TEMPLATE,
        answer_format: str | Callable[[str], str | None] | None = None,
        levels: Any = None,
        instruct: Any = None,
        partial_credit: bool = True,
    ) -> None:
        from textrl_envs.instruct import resolve_instruct

        partial_credit = check_bool("partial_credit", partial_credit)  # before the items are generated
        self.template = check_template(template)
        self.dataset = make_dataset(task, task_kwargs, size, seed, levels)
        fmt = resolve_instruct(instruct)
        if fmt is None:
            self.reward = ReasoningGymReward(self.dataset, answer_format or "plain", partial_credit=partial_credit)
        else:
            if fmt.check is not None:
                raise ValueError(
                    f"{REASONING_GYM.env_id} grades answers with each task's own score_answer; instruct check= does "
                    "not apply (leave it None)"
                )
            self.reward = ReasoningGymReward(
                self.dataset, answer_format or "final", fmt.format_weight, fmt.style, partial_credit, fmt.answer_prefix
            )
        self.items: list[dict[str, Any]] = [self.dataset[i] for i in range(len(self.dataset))]

    def prompts(self) -> list[dict[str, Any]]:
        """One prompt dict per item: ``{"prompt": template(question), "question", "answer", "metadata"}``, and
        ``"level"`` with difficulty levels."""
        prompts = [
            {
                "prompt": self.template.format(question=item["question"]),
                "question": item["question"],
                "answer": item["answer"],
                "metadata": item["metadata"],
            }
            for item in self.items
        ]
        if isinstance(self.dataset, LeveledDataset):
            for prompt, level in zip(prompts, self.dataset.levels, strict=True):
                prompt[LEVEL_KEY] = level
        return prompts

    def spec_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The text env's keyword arguments: the user's, with this suite's prompts and (unless given) reward."""
        if kwargs.get("prompts") is not None:
            raise TypeError(
                f"{REASONING_GYM.env_id} makes its prompts from task=, task_kwargs=, size= and seed=; it takes no "
                "prompts= (for your own prompts and a reasoning-gym scorer, use TextGen-style envs with "
                "prompts=[...] and reward=ReasoningGymReward(dataset))"
            )
        if kwargs.get("reward") is not None and not self.reward.partial_credit:
            raise TypeError(
                f"{REASONING_GYM.env_id}: partial_credit=False sets how the task's own grader scores, and reward= "
                "replaces that grader; pass one of them (your reward decides its own partial credit)"
            )
        out = dict(kwargs, task=REASONING_GYM.env_id, prompts=self.prompts())
        if out.get("reward") is None:
            out["reward"] = self.reward
        return out

    def item_info(self, index: int) -> dict[str, Any]:
        """What an episode's final info adds about its item: ``answer`` and ``metadata`` (empty for ``-1``)."""
        if index < 0:
            return {}
        item = self.items[index]
        return {"answer": item["answer"], "metadata": item["metadata"]}


_SUITE_ARGS = ("task", "task_kwargs", "size", "seed", "template", "answer_format", "levels", "partial_credit")


def _split_suite_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the suite's own arguments out of ``kwargs`` (the rest are the text env's)."""
    return {k: kwargs.pop(k) for k in _SUITE_ARGS if k in kwargs}


class ReasoningGymEnv(TextGenEnv):
    """Any reasoning-gym task: answer the item's question; the task's own verifier scores the answer.

    Needs the optional extra: ``pip install "textrl[reasoning]"`` (the ``reasoning-gym`` package; procedural,
    nothing is downloaded). Without it, ``gym.make`` raises an ``ImportError`` that says so.

    ## Description
    ``gym.make("ReasoningGym-v0", task="leg_counting")`` generates ``size`` items of the task with the
    generator seed ``seed`` (``reasoning_gym.create_dataset(task, size=size, seed=seed, **task_kwargs)``). Each
    episode is one item: the prompt is ``template.format(question=item["question"])`` and the agent writes the
    answer, token by token, then EOS. ``task`` may also be a list of task names or a dict ``{name: weight}``: a
    weighted mix (reasoning-gym's composite dataset; item ``i`` comes from one task, chosen by weight).
    ``textrl_envs.suites.reasoning.task_names()`` lists the tasks (about 100; an unknown name gets the close
    matches). Some generators are slow (``sudoku`` about 45 ms an item, ``countdown`` 30 ms): keep ``size``
    small for those.

    ``levels=[0, 1, 2]`` (or ``"all"``) uses reasoning-gym's own difficulty knobs: for each level ``l``, the task's
    curriculum at global level ``l`` (``curriculum.set_global_level(l)``, ``generate_configuration``) gives the
    config of ``size`` items, generated with seed ``seed + l``; the prompt list holds every level's items, in order
    of level, each with a ``level`` prompt column (and ``metadata["level"]``). A curriculum callback then chooses
    which levels are drawn (:class:`sb3_grpo.callbacks.LevelCurriculum`). ``task_kwargs`` may set the fields the
    curriculum leaves alone; tasks without a curriculum refuse ``levels``.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``96 + 16 = 112``, within the bundled LM's 128
    positions), right-aligned, pad on the left with mask 0. Questions longer than ``max_prompt_tokens`` keep
    their end (``prompt_truncation="left"``), where reasoning-gym puts the problem itself.

    ## Rewards
    0 on every step but the last; then ``dataset.score_answer(answer, item)``, the task's own score in
    ``[0, 1]`` (1.0 for the exact answer; partial credit where the task defines it), of the answer read from the
    completion by ``answer_format``: ``"plain"`` (default) the completion stripped, ``"tag"`` the last
    ``<answer>...</answer>``, ``"prefix"`` the line after the last ``answer:``, or a callable. Another
    ``reward=`` replaces it and gets ``question``, ``answer`` and ``metadata`` lists (TRL's convention).
    ``partial_credit=False`` keeps only full scores (1.0, else 0.0): reasoning-gym's default scorer gives an answer
    that contains the right one part of the credit (``"10"`` earns 0.5 where the answer is ``"1"``), which a policy
    learns to game on tasks whose answers are small numbers.

    ## Starting State
    An item drawn uniformly with the env's ``np_random``; ``reset(options={"prompt_index": i})`` starts on
    item ``i`` (the same item for every seed of the generator). ``env.unwrapped.suite.items`` holds the items.

    ## Episode End
    Terminated when the agent emits EOS; truncated after ``max_new_tokens`` tokens. The final ``info`` holds
    ``prompt``, ``completion``, ``completion_ids``, ``prompt_index``, ``reward`` and the item's ``answer`` and
    ``metadata`` (reasoning-gym's dict).

    ## Arguments
    ``gym.make("ReasoningGym-v0", task="leg_counting", task_kwargs=None, size=500, seed=0,
    template="{question}", answer_format="plain", levels=None, partial_credit=True, reward=None, tokenizer=None,
    max_new_tokens=16, max_prompt_tokens=96, prompt_truncation="left", ...)``. ``task_kwargs`` is the task's
    reasoning-gym config (``{"min_animals": 2, "max_animals": 3}``), or ``{name: config}`` for several tasks; ``size``
    and ``seed`` are the env's own arguments. ``prompts=`` is not accepted (the items are the prompts).

    ``instruct=True`` (an instruct model, e.g. ``tokenizer="smollm2-135m-instruct"``; :mod:`textrl_envs.instruct`)
    asks the question in a chat with an instruction that states the answer format, reads the final answer from
    free text (``answer_format="final"``) for the task's own ``score_answer``, and uses ``max_new_tokens=128``,
    ``max_prompt_tokens=256``; ``instruct={"format_weight": 0.1}`` adds a format bonus.

    ## Vectorized environment
    ``gym.make_vec("ReasoningGym-v0", num_envs=N, device=..., group_size=G, task=...)`` returns
    :class:`ReasoningGymVectorEnv` (the batched env over the same items); with ``group_size=G`` every member
    of a group answers the same item, so group-relative advantages compare answers to one question.

    ## Version History
    * v0: Initial version (reasoning-gym 0.1.x).
    """

    default_task = REASONING_GYM.env_id

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        self.suite = ReasoningGymSuite(**_split_suite_kwargs(kwargs), instruct=kwargs.get("instruct"))
        super().__init__(render_mode=render_mode, **self.suite.spec_kwargs(kwargs))

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if terminated or truncated:
            info.update(self.suite.item_info(info["prompt_index"]))
        return obs, reward, terminated, truncated, info


class ReasoningGymVectorEnv(TextGenVectorEnv):
    """The batched :class:`ReasoningGymEnv`: :class:`~textrl_envs.vector.TextGenVectorEnv` over the same items.

    Takes the vector env's arguments (``num_envs``, ``device``, ``group_size``, ``obs_backend``) and the single
    env's. ``final_info`` also holds ``answer`` and ``metadata`` (object arrays) of the finished episodes' items.
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
        self.suite = ReasoningGymSuite(**_split_suite_kwargs(kwargs), instruct=kwargs.get("instruct"))
        super().__init__(
            num_envs=num_envs,
            device=device,
            group_size=group_size,
            obs_backend=obs_backend,
            render_mode=render_mode,
            **self.suite.spec_kwargs(kwargs),
        )

    def step(self, actions):
        obs, rewards, terminated, truncated, infos = super().step(actions)
        final = infos.get("final_info")
        if final is not None:
            done = np.flatnonzero(final["_prompt_index"])
            items = [self.suite.item_info(int(final["prompt_index"][j])) for j in done]
            for key in ("answer", "metadata"):
                column = np.full(self.num_envs, None, dtype=object)
                for j, item in zip(done, items):
                    column[j] = item.get(key)
                final[key], final[f"_{key}"] = column, final["_prompt_index"].copy()
        return obs, rewards, terminated, truncated, infos
