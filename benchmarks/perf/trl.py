"""The complete GRPO loop (rollout + update) against Hugging Face TRL's ``GRPOTrainer``: reward against wall time.

TRL is not a dependency: these functions import it when called (``pip install trl``, or TRL installed elsewhere and
put on ``PYTHONPATH``); :func:`trl_available` says whether it can be imported. ``textrl-bench trl``
(:mod:`benchmarks.trl_loops`) is the command-line front end, and ``textrl-bench perf`` takes four rows from here.

Both loops run until they have sampled (at least) the same number of completions, on the same task, LM, tokenizer,
prompts, reward and seed, one after the other in one process (or each in its own process at the same time, one loop
per call: ``compare_loops(sides=...)``, their runs merged afterwards). Each records, per update, the wall time since
its start and the mean reward of the completions the update trains on. The figure users care about is the wall time
to reach a reward: the threshold is TRL's final reward (the mean of its last ``window`` updates), and each loop's time
is the first moment the mean of its last ``window`` updates reaches it (TRL reaches it by its end, by construction;
ours may not, then its time is ``None``). With held-out items (``eval_items``) and ``eval_every``, the same is
measured on held-out accuracy: each loop's trainable weights are copied every ``eval_every`` completions and scored
after the timed run (:class:`HeldoutSnapshots`), and each loop's time is the first copy that scores at least TRL's
final held-out accuracy.

Settings in both (see :class:`LoopConfig`): group size ``G``, completions of at most ``T`` tokens, ``N`` completions
per update (ours: ``N`` envs x ``T`` steps per rollout; an env whose episode ends on EOS starts its group's next prompt
at once, so a rollout holds more than ``N`` completions and some cross into the next rollout), one optimizer step per
update over all of it, group-normalised advantages, KL coefficient ``beta`` to a frozen copy of the initial model
(k3), clip 0.2, AdamW (eps 1e-8, no weight decay), gradient-norm clip 1.0, constant learning rate, sampling at
temperature 1 without top-k / top-p, dropout off, fp32. Ours has every GRPO extra that TRL lacks off (no variance
penalty, no mixture, symmetric clip). Loss normalisation: TRL's default ``loss_type="dapo"`` averages the per-token
loss over the batch's completion tokens; ours averages it over the update's transitions, which include the steps of
episodes cut by the rollout's end and of incomplete groups (advantage 0).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from sb3_grpo.grpo.extras import EXTRAS_OFF

__all__ = [
    "HeldoutSnapshots",
    "LoopConfig",
    "compare_loops",
    "run_ours",
    "run_trl",
    "time_to_accuracy",
    "time_to_reward",
    "trl_available",
]

#: The two loops compared.
SIDES = ("ours", "TRL")
NOT_INSTALLED = "TRL not installed: pip install trl (or put it on PYTHONPATH) to run this comparison"
#: A tiny GPT-2 for the small-batch case: 2 layers, 64 wide (the bundled tokenizer's vocabulary).
TINY_GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 128}


@dataclass(frozen=True)
class LoopConfig:
    """One side-by-side comparison.

    :param n_envs: Completions per update ``N`` (ours: envs).
    :param group_size: Completions per prompt ``G``.
    :param tokens: Completion budget ``T``.
    :param completions: Completions each loop samples (at least; whole updates).
    :param lr: Learning rate of both.
    :param beta: KL coefficient of both.
    :param model: ``"bundled"`` (the bundled LM), ``"tiny"`` (:data:`TINY_GPT2`, seeded random weights), or a GGUF
        model's name or path (``"smollm2-135m-instruct"``: both load its converted folder, :mod:`textrl_envs.gguf`).
    :param task: ``"textgen"`` (TextGen-v0 and its sentiment reward) or a reasoning-gym task of the real-model study
        (:data:`benchmarks.real_model.TASKS`: ``ReasoningGym-v0``, in instruct mode for a GGUF model; both score a
        completion with the env's grader).
    :param eval_items: Held-out items of a reasoning-gym task on which each trained model's greedy accuracy is
        measured after training (the real-model study's held-out seed; 0: none). Not part of the timed loop.
    :param lora: LoRA on both sides (the real-model study's adapters, :data:`benchmarks.real_model.LORA`; TRL through
        peft), else a full fine-tune.
    :param device: Ours: ``"auto"`` or a device; TRL runs on the CPU unless this is CUDA.
    :param window: Updates averaged for the reward curve's smoothing.
    :param ours_envs: Envs of our loop (``None``: ``N``). ``N`` envs x ``T`` steps sample more than ``N`` completions
        when episodes end early (EOS), so fewer updates for the same completions; about ``N / 2`` envs make as many
        completions per update as TRL's ``N`` at TextGen-v0's mean length.
    :param ours_completions: Completions our loop may sample (``None``: ``completions``). The figure compared is the
        time to TRL's final reward; more completions let a loop whose rollouts are faster run on toward it within
        TRL's wall time instead of stopping at TRL's sample count.
    :param eval_every: Completions between held-out snapshots (0: the held-out accuracy after training only; needs
        ``eval_items``). Each loop copies its trainable weights at the end of the first update at or past every
        multiple; after the timed run each copy is scored on the held-out items, which gives each loop a held-out
        accuracy curve against wall time and the time to TRL's final held-out accuracy. A copy of a full fine-tune
        holds the whole model.
    """

    n_envs: int = 64
    group_size: int = 4
    tokens: int = 24
    completions: int = 1024
    lr: float = 1e-4
    beta: float = 0.04
    model: str = "bundled"
    device: str = "auto"
    window: int = 3
    ours_envs: int | None = None
    ours_completions: int | None = None
    task: str = "textgen"
    lora: bool = False
    eval_items: int = 0
    eval_every: int = 0


#: The two comparisons ``textrl-bench perf`` prints: the default one, and small batches on a tiny model with beta 0.
DEFAULT = LoopConfig()
SMALL = LoopConfig(n_envs=16, group_size=8, tokens=16, completions=512, beta=0.0, model="tiny")
#: SmolLM2-135M-Instruct with LoRA on basic_arithmetic, as the real-model study trains it (groups of 8, 48 tokens,
#: lr 2e-4, KL 0.04).
REAL = LoopConfig(n_envs=32, group_size=8, tokens=48, completions=768, lr=2e-4, beta=0.04,
                  model="smollm2-135m-instruct", task="basic_arithmetic", lora=True, eval_items=128)  # fmt: skip


def trl_available() -> bool:
    """Whether ``import trl`` can work here."""
    return importlib.util.find_spec("trl") is not None


def _model_path(cfg: LoopConfig) -> str:
    """A directory holding the LM both loops load (TRL builds its models from a path)."""
    from textrl_envs.assets import lm_path
    from textrl_envs.gguf import gguf_folder, is_gguf_name

    if cfg.model == "bundled":
        return str(lm_path())
    if is_gguf_name(cfg.model):
        return gguf_folder(cfg.model)
    if cfg.model != "tiny":
        raise ValueError(f"model must be 'bundled', 'tiny' or a GGUF model's name or path, got {cfg.model!r}")
    import torch as th
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from textrl_envs.assets import tokenizer_path

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path()))
    path = os.path.join(tempfile.gettempdir(), f"textrl_tiny_gpt2_{len(tokenizer)}")
    if not os.path.exists(os.path.join(path, "config.json")):
        th.manual_seed(0)
        config = GPT2Config(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **TINY_GPT2,
        )
        GPT2LMHeadModel(config).save_pretrained(path)
    return path


def _task(cfg: LoopConfig) -> tuple[str, dict[str, Any]]:
    """The env id and keyword arguments of ``cfg.task`` (with ``cfg.tokens`` as the completion budget)."""
    from textrl_envs.gguf import is_gguf_name

    if cfg.task == "textgen":
        return "TextGen-v0", {"max_new_tokens": cfg.tokens}
    from benchmarks.real_model import TASKS, env_kwargs

    if cfg.task not in TASKS:
        raise ValueError(f"task must be 'textgen' or one of {', '.join(TASKS)}, got {cfg.task!r}")
    kwargs = env_kwargs(cfg.task, 1000, cfg.tokens)
    if not is_gguf_name(cfg.model):  # the small LMs: plain prompts, the bundled tokenizer
        kwargs = {k: v for k, v in kwargs.items() if k not in ("tokenizer", "instruct", "max_prompt_tokens")}
    return "ReasoningGym-v0", kwargs


def _spec(cfg: LoopConfig) -> Any:
    """The env's text spec for ``cfg.task``: its prompts (rendered as the env renders them) and its scorer."""
    import gymnasium as gym

    import textrl_envs  # noqa: F401  (registers the envs)

    env_id, kwargs = _task(cfg)
    env = gym.make(env_id, **kwargs)
    try:
        return env.unwrapped.text_spec
    finally:
        env.close()


def has_heldout(cfg: LoopConfig) -> bool:
    """Whether trained models are scored on held-out items (a reasoning-gym task and ``eval_items > 0``)."""
    return cfg.task != "textgen" and cfg.eval_items > 0


def heldout_accuracy(lm: Any, cfg: LoopConfig) -> float | None:
    """Greedy accuracy of ``lm`` on ``cfg.eval_items`` held-out items of ``cfg.task`` (the real-model study's held-out
    generator seed, scored by the env's grader), or ``None`` without a held-out set."""
    if not has_heldout(cfg):
        return None
    import gymnasium as gym

    from benchmarks.real_model import HELDOUT_SEED, complete

    env_id, kwargs = _task(cfg)
    spec = gym.make(env_id, **{**kwargs, "size": cfg.eval_items}, seed=HELDOUT_SEED).unwrapped.text_spec
    items = list(range(len(spec.prompt_texts)))
    was_training = lm.training
    lm.eval()
    try:
        return float((spec.score(items, complete(lm, spec, items, None)) >= 1.0).mean())
    finally:
        lm.train(was_training)


class HeldoutSnapshots:
    """Copies of a model's trainable weights taken during a timed run (:meth:`take`), scored on the held-out items
    after it (:meth:`curve`): a loop's held-out accuracy against wall time, at no cost to the time measured but the
    copies.

    :param every: Completions between copies (0: none).
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.next = every
        self.taken: list[tuple[float, int, dict[str, Any]]] = []

    def take(self, module: Any, wall: float, completions: int) -> None:
        """Copy ``module``'s trainable weights if ``completions`` reached the next multiple of ``every``."""
        if self.every <= 0 or completions < self.next:
            return
        self.taken.append((wall, completions, _trainable(module)))
        while self.next <= completions:
            self.next += self.every

    def curve(self, module: Any, lm: Any, cfg: LoopConfig, final: tuple[float, int, float]) -> list[list[float]] | None:
        """``[(wall s, completions, held-out accuracy), ...]``: each copy taken before the run's end scored with
        :func:`heldout_accuracy` (loaded into ``module``, whose ``lm`` generates), then ``final``, the trained model's
        point; ``module`` is left with the weights it had. ``None`` when no copies were asked for (``every`` 0)."""
        if self.every <= 0:
            return None
        trained = _trainable(module)
        points = []
        try:
            for wall, completions, weights in self.taken:
                if completions >= final[1]:
                    continue
                _load_trainable(module, weights)
                points.append([wall, completions, heldout_accuracy(lm, cfg)])
        finally:
            _load_trainable(module, trained)
        return [*points, list(final)]


def _trainable(module: Any) -> dict[str, Any]:
    return {name: p.detach().clone() for name, p in module.named_parameters() if p.requires_grad}


def _load_trainable(module: Any, weights: dict[str, Any]) -> None:
    import torch as th

    params = dict(module.named_parameters())
    with th.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)


def time_to_accuracy(curve: list[list[float]], threshold: float) -> float | None:
    """The wall time of the first point of a held-out ``curve`` (:meth:`HeldoutSnapshots.curve`) whose accuracy
    reaches ``threshold``, or ``None``."""
    for wall, _, accuracy in curve:
        if accuracy >= threshold - 1e-12:
            return wall
    return None


def lora_spec(cfg: LoopConfig) -> dict[str, Any]:
    """The LoRA adapters both sides add: the real-model study's (:data:`benchmarks.real_model.LORA`) on a GGUF
    model, the same rank on a GPT-2's attention and projections otherwise."""
    from benchmarks.real_model import LORA
    from textrl_envs.gguf import is_gguf_name

    if is_gguf_name(cfg.model):
        return dict(LORA)
    return {**LORA, "target_modules": ["c_attn", "c_proj"]}


def _lora_kwargs(cfg: LoopConfig) -> dict[str, Any]:
    return {"lora": lora_spec(cfg)} if cfg.lora else {}


def run_ours(cfg: LoopConfig, seed: int, **grpo_kwargs: Any) -> dict:
    """Our GRPO: whole updates until ``cfg.ours_completions`` (else ``cfg.completions``) completions are sampled.

    :param cfg: The comparison.
    :param seed: The seed.
    :param grpo_kwargs: Overrides of GRPO's arguments.
    :return: Figures, the reward curve ``[(wall s, completions so far, mean reward), ...]`` and ``cpu_at``, the
        process's CPU seconds at each point of the curve.
    """
    from stable_baselines3.common.logger import configure

    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    n_envs = cfg.ours_envs or cfg.n_envs
    env_id, env_kwargs = _task(cfg)
    env = make_vec_env(env_id, n_envs=n_envs, group_size=cfg.group_size, seed=seed, device=cfg.device, **env_kwargs)
    kwargs = _grpo_kwargs(cfg, n_envs, seed, grpo_kwargs)
    with warnings.catch_warnings():  # a minibatch larger than the rollout is meant here (see _grpo_kwargs)
        warnings.filterwarnings("ignore", message="You have specified a mini-batch size")
        model = GRPO("CausalLMPolicy", env, **kwargs)
    model.set_logger(configure(None, []))
    snapshots = HeldoutSnapshots(cfg.eval_every if has_heldout(cfg) else 0)
    record, curve = _recorders(cfg.ours_completions or cfg.completions, snapshots)
    w0, c0 = time.perf_counter(), time.process_time()
    record.start, record.cpu_start = w0, c0
    model.learn(10**12, callback=[record, curve])
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if hasattr(record, "pending"):  # the last update
        record.curve.append((wall, record.count, record.pending))
        record.cpu_at.append(cpu)
    env.close()
    heldout = heldout_accuracy(model.policy.lm, cfg)
    return {
        "heldout": heldout,
        "heldout_curve": snapshots.curve(model.policy, model.policy.lm, cfg, (wall, record.count, heldout)),
        "impl": "ours",
        "wall_s": wall,
        "cpu_s": cpu,
        "completions": record.count,
        "updates": len(record.curve),
        "curve": record.curve,
        "cpu_at": record.cpu_at,
        "advantaged": record.advantaged,
    }


def _grpo_kwargs(cfg: LoopConfig, n_envs: int, seed: int, grpo_kwargs: dict[str, Any]) -> dict[str, Any]:
    """GRPO's arguments in :func:`run_ours`: set as TRL's trainer runs (AdamW at its defaults, one epoch, one
    optimizer step per update, no extras), then the caller's overrides. With ``carry_over`` (on unless
    ``carry_over=False``) an update also trains steps held from earlier rollouts, so its minibatch is made large
    enough for all of them (four rollouts' worth: one optimizer step per update, as TRL's)."""
    import torch as th

    rollout = grpo_kwargs.get("n_steps", cfg.tokens) * n_envs  # steps per rollout

    optimizer = {"optimizer_class": th.optim.AdamW, "optimizer_kwargs": {"eps": 1e-8, "weight_decay": 0.0}}
    kwargs = {
        "learning_rate": cfg.lr,
        "n_steps": cfg.tokens,
        "batch_size": rollout if grpo_kwargs.get("carry_over", "auto") is False else 4 * rollout,
        "n_epochs": 1,
        "clip_range": 0.2,
        "max_grad_norm": 1.0,
        **EXTRAS_OFF.switches(),
        "advantage": "group",
        "kl_coef": cfg.beta,
        "seed": seed,
        "device": cfg.device,
        "policy_kwargs": {"model": _model_path(cfg), **optimizer, **_lora_kwargs(cfg)},
        **grpo_kwargs,
    }
    return kwargs


def _recorders(completions: int, snapshots: HeldoutSnapshots | None = None) -> tuple[Any, Any]:
    """The callbacks of :func:`run_ours` (SB3 imported here, lazily): a ``Record`` of each rollout's rewards that stops
    learning once ``completions`` completions are sampled, and a ``Curve`` of ``(wall s, completions, mean reward)``
    after each update (where ``snapshots`` may copy the policy's weights)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Record(BaseCallback):
        """Per rollout: the rewards of the episodes that ended, and the share of the rollout's steps that its update
        trains with an advantage (its own steps with one, plus the steps ``carry_over`` brought from earlier
        rollouts); stops once enough completions are sampled."""

        def __init__(self) -> None:
            super().__init__()
            self.rewards: list[dict] = []
            self.curve: list[tuple[float, int, float]] = []
            self.cpu_at: list[float] = []
            self.cpu_start = time.process_time()
            self.advantaged: list[float] = []
            self.count = 0
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            if self.count >= completions:
                return False
            for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                if done and "episode" in info:  # read at the rollout's end: a reward scored in the background
                    self.rewards.append(info["episode"])  # lands in this record then
            return True

        def _on_rollout_end(self) -> None:
            logged = self.model.logger.name_to_value
            steps = self.model.n_steps * self.model.n_envs
            own = logged.get("rollout/frac_steps_nonzero_advantage", float("nan")) * steps
            self.advantaged.append((own + logged.get("rollout/carried_steps", 0.0)) / steps)
            self.count += len(self.rewards)
            rewards = [float(episode["r"]) for episode in self.rewards]
            self.pending = statistics.fmean(rewards) if rewards else float("nan")
            self.rewards = []

    class Curve(BaseCallback):
        """The time after each update (the rollout's rewards were recorded before it)."""

        def __init__(self, record: Record) -> None:
            super().__init__()
            self.record = record

        def _on_step(self) -> bool:
            return True

        def _on_rollout_start(self) -> None:  # the previous update has finished
            r = self.record
            if hasattr(r, "pending"):
                r.curve.append((time.perf_counter() - r.start, r.count, r.pending))
                r.cpu_at.append(time.process_time() - r.cpu_start)
                del r.pending
                if snapshots is not None:
                    snapshots.take(self.model.policy, r.curve[-1][0], r.count)

    record = Record()
    return record, Curve(record)


def _dataset(prompts: list[str], repeats: int = 1) -> Any:
    """The prompts, ``repeats`` times over, as TRL's training set, each with its ``index`` among the env's prompts
    (the reward reads it)."""
    from datasets import Dataset

    columns = {"prompt": prompts * repeats, "index": list(range(len(prompts))) * repeats}
    try:
        return Dataset.from_dict(columns)
    except Exception:  # noqa: BLE001  (a datasets / pyarrow mismatch): a generator-backed dataset serves as well
        from datasets import IterableDataset

        def rows(prompts: list[str]) -> Any:
            for _ in range(repeats):
                for i, p in enumerate(prompts):
                    yield {"prompt": p, "index": i}

        return IterableDataset.from_generator(rows, gen_kwargs={"prompts": prompts})


def run_trl(cfg: LoopConfig, seed: int) -> dict:
    """TRL's ``GRPOTrainer``: ``ceil(completions / N)`` steps of ``N`` completions each.

    :return: Figures and the reward curve, as :func:`run_ours`.
    """
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from textrl_envs.assets import tokenizer_path
    from textrl_envs.devices import resolve_device

    spec = _spec(cfg)
    curve: list[tuple[float, int, float]] = []
    start = [0.0, 0.0]  # wall and CPU clocks at the start
    count = [0]

    def record(rewards: list[float]) -> None:
        count[0] += len(rewards)
        curve.append((time.perf_counter() - start[0], count[0], statistics.fmean(rewards)))  # timed at its step's end

    env_reward = trl_reward(spec, "sentiment" if cfg.task == "textgen" else cfg.task, record)
    on_cuda = resolve_device(cfg.device).type == "cuda"
    steps = math.ceil(cfg.completions / cfg.n_envs)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_"),
        per_device_train_batch_size=cfg.n_envs,
        gradient_accumulation_steps=1,
        num_generations=cfg.group_size,
        max_completion_length=cfg.tokens,
        beta=cfg.beta,
        num_iterations=1,
        epsilon=0.2,
        max_steps=steps,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        disable_dropout=True,
        use_cpu=not on_cuda,
        bf16=False,
        fp16=False,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
    )
    model_path = _model_path(cfg)
    tokenizer = model_path if cfg.model not in ("bundled", "tiny") else str(tokenizer_path())
    prompts = list(spec.prompt_texts)
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=env_reward,
        args=config,
        processing_class=AutoTokenizer.from_pretrained(tokenizer),
        train_dataset=_dataset(prompts, max(1, cfg.n_envs // cfg.group_size)),
        peft_config=_peft_config(cfg) if cfg.lora else None,
    )
    step_ends: list[tuple[float, float]] = []
    snapshots = HeldoutSnapshots(cfg.eval_every if has_heldout(cfg) else 0)
    trainer.add_callback(_StepEnd(step_ends, start, snapshots, cfg.n_envs))
    w0, c0 = time.perf_counter(), time.process_time()
    start[0], start[1] = w0, c0
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints its end-of-training metrics
        trainer.train()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    # each point's time: when the optimizer step that trained on it ended
    ends = [step_ends[i] if i < len(step_ends) else (wall, cpu) for i in range(len(curve))]
    timed = [(end[0], n, r) for end, (_, n, r) in zip(ends, curve, strict=True)]
    heldout = heldout_accuracy(trainer.model, cfg)
    return {
        "heldout": heldout,
        "heldout_curve": snapshots.curve(trainer.model, trainer.model, cfg, (wall, count[0], heldout)),
        "impl": "TRL",
        "wall_s": wall,
        "cpu_s": cpu,
        "completions": count[0],
        "updates": len(curve),
        "curve": timed,
        "cpu_at": [end[1] for end in ends],
    }


def trl_reward(spec: Any, name: str, record: Any = None) -> Any:
    """The env's reward as a TRL reward function: each completion scored by ``spec`` on the item its prompt's
    ``index`` column names; ``record`` (if given) gets each batch's rewards."""

    def reward(prompts: list[str], completions: list[str], index: list[int], **kwargs: Any) -> list[float]:  # noqa: ARG001  (TRL's reward signature)
        rewards = [float(r) for r in spec.score([int(i) for i in index], list(completions))]
        if record is not None:
            record(rewards)
        return rewards

    reward.__name__ = name
    return reward


def _peft_config(cfg: LoopConfig) -> Any:
    """:func:`lora_spec` as a peft config for TRL."""
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **lora_spec(cfg))


def _StepEnd(times: list[tuple[float, float]], start: list[float], snapshots: HeldoutSnapshots, per_step: int) -> Any:  # noqa: N802  (builds a class: transformers is lazy)
    """A ``TrainerCallback`` appending the wall and CPU seconds since ``start`` at the end of every optimizer step
    (of ``per_step`` completions), where ``snapshots`` may copy the model's weights."""
    from transformers import TrainerCallback

    class StepEnd(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:  # noqa: ARG002  (TRL's callback signature)
            times.append((time.perf_counter() - start[0], time.process_time() - start[1]))
            snapshots.take(kwargs["model"], times[-1][0], state.global_step * per_step)

    return StepEnd()


def reached_at(curve: list[tuple[float, int, float]], threshold: float, window: int) -> int | None:
    """The first point of ``curve`` at which the mean reward of the last ``window`` updates reaches ``threshold``.

    :param curve: ``[(wall s, completions so far, mean reward of the update), ...]``.
    :param threshold: The reward to reach.
    :param window: Updates averaged.
    :return: The point's index, or ``None`` when the curve never reaches it.
    """
    rewards = [r for _, _, r in curve]
    for i in range(window - 1, len(curve)):
        if statistics.fmean(rewards[i - window + 1 : i + 1]) >= threshold:
            return i
    return None


def time_to_reward(curve: list[tuple[float, int, float]], threshold: float, window: int) -> float | None:
    """The first wall time at which the mean reward of the last ``window`` updates reaches ``threshold``
    (:func:`reached_at`), or ``None``."""
    i = reached_at(curve, threshold, window)
    return None if i is None else curve[i][0]


def cpu_time_to_reward(run: dict, threshold: float, window: int) -> float | None:
    """:func:`time_to_reward` in the process's CPU seconds (steadier than wall time on a shared machine), from a
    run's ``cpu_at``."""
    i = reached_at(run["curve"], threshold, window)
    return None if i is None else run["cpu_at"][i]


def final_reward(curve: list[tuple[float, int, float]], window: int) -> float:
    """The mean reward of the last ``window`` updates."""
    return statistics.fmean(r for _, _, r in curve[-window:])


def compare_loops(
    cfg: LoopConfig,
    seeds: list[int],
    log: Any = print,
    measured: dict[int, dict] | None = None,
    on_seed: Callable[[list[dict]], None] | None = None,
    sides: tuple[str, ...] = SIDES,
    **grpo_kwargs: Any,
) -> dict:
    """Both loops per seed (alternating which goes first), their time to TRL's final reward, and the medians.

    :param cfg: The comparison.
    :param seeds: Seeds (one pair of loops each).
    :param log: Where progress lines go.
    :param measured: Runs of some of ``seeds`` measured before, by seed (an earlier result's ``runs``, of the same
        ``cfg`` and ``grpo_kwargs``: the caller checks): the loops they hold are kept as they are, not run again.
    :param on_seed: Called with the runs so far after each seed this call runs (to save them).
    :param sides: The loops this call may run (``("ours",)`` or ``("TRL",)``: one side, so that two processes can
        measure the two loops side by side and their results be merged).
    :param grpo_kwargs: Overrides of our GRPO's arguments.
    :return: ``{"config", "runs": [{"seed", "ours", "TRL", "threshold", "ours_time", "trl_time", ...}], "summary"}``;
        a run missing a loop holds only the loop it has, and then ``summary`` is ``None``.
    """
    import torch as th

    from textrl_envs.devices import resolve_device

    if not trl_available():
        raise ImportError(NOT_INSTALLED)
    if resolve_device(cfg.device).type == "cuda":
        th.cuda.synchronize()
    runners = {"ours": lambda s: run_ours(cfg, s, **grpo_kwargs), "TRL": lambda s: run_trl(cfg, s)}
    runs = []
    for i, seed in enumerate(seeds):
        results = {name: loop for name, loop in (measured or {}).get(seed, {}).items() if name in SIDES}
        todo = [name for name in (SIDES if i % 2 == 0 else SIDES[::-1]) if name in sides and name not in results]
        if not todo:
            log(f"seed {seed}: measured before, kept")
        for name in todo:
            log(f"seed {seed}: {name} ...")
            results[name] = runners[name](seed)
        runs.append(seed_run(seed, results, cfg))
        if todo and on_seed is not None:
            on_seed(runs)
    complete = all(set(SIDES) <= set(run) for run in runs)
    result = {"config": asdict(cfg), "grpo_kwargs": grpo_kwargs, "runs": runs,
              "summary": summarize(runs) if complete else None}  # fmt: skip
    if complete and has_heldout(cfg):
        from transformers import AutoModelForCausalLM

        untrained = AutoModelForCausalLM.from_pretrained(_model_path(cfg))
        result["summary"]["heldout_before"] = heldout_accuracy(untrained, cfg)
    return result


def seed_run(seed: int, results: dict[str, dict], cfg: LoopConfig) -> dict:
    """One seed's record: the loops it has, and, when it has both, each one's time to TRL's final reward (wall and
    CPU) and, with held-out curves, to TRL's final held-out accuracy."""
    run: dict[str, Any] = {"seed": seed, **results}
    if not set(SIDES) <= set(results):
        return run
    threshold = final_reward(results["TRL"]["curve"], cfg.window)
    run.update(
        threshold=threshold,
        ours_time=time_to_reward(results["ours"]["curve"], threshold, cfg.window),
        trl_time=time_to_reward(results["TRL"]["curve"], threshold, cfg.window),
        ours_cpu_time=cpu_time_to_reward(results["ours"], threshold, cfg.window),
        trl_cpu_time=cpu_time_to_reward(results["TRL"], threshold, cfg.window),
    )
    if all(results[name].get("heldout_curve") for name in SIDES):
        target = results["TRL"]["heldout"]
        run.update(
            heldout_threshold=target,
            ours_heldout_time=time_to_accuracy(results["ours"]["heldout_curve"], target),
            trl_heldout_time=time_to_accuracy(results["TRL"]["heldout_curve"], target),
        )
    return run


def summarize(runs: list[dict]) -> dict:
    """Medians over seeds: wall time, completions/s, final reward, time to TRL's final reward (a loop that never
    reached it counts as infinitely slow), and TRL / ours of the times."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    out: dict[str, Any] = {}
    for name in SIDES:
        out[name] = {
            "wall_s": med([r[name]["wall_s"] for r in runs]),
            "completions_per_s": med([r[name]["completions"] / r[name]["wall_s"] for r in runs]),
            "completions_per_cpu_s": med([r[name]["completions"] / r[name]["cpu_s"] for r in runs]),
            "final_reward": med([final_reward(r[name]["curve"], 3) for r in runs]),
        }
        if all(r[name].get("heldout") is not None for r in runs):
            out[name]["heldout"] = med([r[name]["heldout"] for r in runs])
    # the share of sampled steps that ours trained with an advantage: per run the mean over its updates
    out["ours"]["advantaged"] = med([statistics.fmean(r["ours"]["advantaged"]) for r in runs])
    inf = float("inf")
    timed = [("time_to_trl_final", "time"), ("cpu_time_to_trl_final", "cpu_time")]
    if all("heldout_threshold" in r for r in runs):
        timed.append(("time_to_trl_heldout", "heldout_time"))
    for key, suffix in timed:
        ours_t = med([r[f"ours_{suffix}"] if r.get(f"ours_{suffix}") is not None else inf for r in runs])
        trl_t = med([r[f"trl_{suffix}"] if r.get(f"trl_{suffix}") is not None else inf for r in runs])
        out[key] = {"ours": ours_t, "TRL": trl_t, "ratio": trl_t / ours_t if ours_t > 0 else None}
    out["throughput_ratio"] = out["ours"]["completions_per_s"] / out["TRL"]["completions_per_s"]
    return out


def with_overrides(cfg: LoopConfig, **changes: Any) -> LoopConfig:
    """``cfg`` with some fields changed."""
    return replace(cfg, **changes)
