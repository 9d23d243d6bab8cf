"""The ``sb3-grpo`` command: ``compare`` (PPO vs GRPO over seeds, with a report), ``report`` (rewrite a comparison's
report from its results.json) and ``warm-start`` (a supervised warm start of the LM, saved as a model folder).

Thin on purpose: the argument parsing lives here, the work in :mod:`sb3_grpo.compare` and :mod:`sb3_grpo.warmstart`.
The research lab (throughput, the claims study, the TRL comparisons) is a separate command, ``textrl-bench``.

::

    sb3-grpo compare                                   # the README's main job, about seven minutes on 2 CPU cores
    sb3-grpo compare --env CartPole-v1 --algos ppo,grpo --seeds 5 --timesteps 50000 --out runs/cartpole
    sb3-grpo compare --set grpo.learning_rate=1e-4 --set '*.n_epochs=2' --resume --out runs/compare-...
    sb3-grpo compare --gym-packages my_envs --env MyEnv-v0   # envs and rewards that my_envs registers on import
    sb3-grpo report runs/cartpole                      # rewrite report.md and curves.png from results.json
    sb3-grpo compare --env ReasoningGym-v0 --env-kwargs '{"task": "chain_sum"}'
    sb3-grpo warm-start --env ReasoningGym-v0 --env-kwargs '{"task": "chain_sum", "seed": 1}' --out runs/warm
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sb3_grpo.compare.algos import DEFAULT_GROUP_SIZE, algo_table
from sb3_grpo.compare.config import TEXT_DEFAULTS
from sb3_grpo.engines import ENGINES
from sb3_grpo.playback import ALGO_CLASSES

#: The no-argument comparison (the README's main job): about seven minutes on a 2-core CPU (5 seeds: the fewest
#: with which the report gives intervals, see sb3_grpo.compare.stats.MIN_RUNS).
DEFAULT_ENV = "TextGen-v0"
DEFAULT_ALGOS = "ppo,grpo,grpo-group"
DEFAULT_SEEDS = 5
DEFAULT_TIMESTEPS = 8192

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _value(text: str) -> Any:
    """A ``--set`` value: JSON (numbers, true/false/null, lists, dicts), ``None``, or else the plain string."""
    if text in ("None", "none"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_set(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Parse ``--set algo.key=value`` items (``*`` as algo: every algorithm).

    :param items: The raw strings.
    :return: ``{algo: {key: value}}``.
    :raises ValueError: for an item that is not ``algo.key=value``.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        algo, dot, key = name.partition(".")
        if not sep or not dot or not algo or not key:
            raise ValueError(f"--set {item!r}: expected ALGO.KEY=VALUE, e.g. grpo.learning_rate=1e-4 or '*.n_epochs=2'")
        out.setdefault(algo.strip(), {})[key.strip()] = _value(value.strip())
    return out


def load_config_file(path: str) -> dict[str, dict[str, Any]]:
    """Read ``--config``: a JSON object ``{"<algo>" or "*": {"<parameter>": value, ...}, ...}`` (and ``"lm_eval"``:
    the evaluation settings, see ``--eval-every``).

    :param path: The file.
    :return: The overrides.
    :raises ValueError: when it cannot be read or has another shape.
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as err:
        raise ValueError(f"--config {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--config {path}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(
            f'--config {path}: expected {{"<algo>" or "*": {{"<parameter>": value}}}}, e.g. '
            '{"*": {"n_epochs": 2}, "grpo": {"grad_var_coef": 0.02}}'
        )
    return data


def parse_env_kwargs(text: str | None) -> dict[str, Any]:
    """Parse ``--env-kwargs``: a JSON object of keyword arguments for ``gym.make`` (``None``: no arguments).

    :raises ValueError: for text that is not a JSON object.
    """
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f'--env-kwargs {text!r}: not valid JSON ({err}); e.g. \'{{"task": "chain_sum"}}\'') from None
    if not isinstance(data, dict):
        raise ValueError(f"--env-kwargs must be a JSON object of gym.make keyword arguments, got {text!r}")
    return data


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def port_number(text: str) -> int:
    """A TCP port: an integer in 0..65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535 (0: any free port), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``sb3-grpo`` argument parser (subcommands ``compare``, ``report``, ``warm-start``, ``sample``)."""
    parser = argparse.ArgumentParser(
        prog="sb3-grpo",
        description="Compare PPO and GRPO variants on Gymnasium / text envs over seeds, with interval estimates.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{compare,warm-start,report,sample,human-eval,estimate-memory}")
    _add_compare(sub)
    _add_warm_start(sub)
    _add_sample(sub)
    _add_estimate_memory(sub)
    _add_human_eval(sub)
    r = sub.add_parser("report", help="rewrite the report of an out dir of compare from its results.json")
    r.add_argument("dir", help="an out dir of `sb3-grpo compare`")
    r.add_argument(
        "--results-page",
        metavar="PATH.md",
        help="also write the report as a results page, stamped with the comparison's own command and commit",
    )
    r.set_defaults(subparser=r)
    return parser


def add_run_options(c: argparse.ArgumentParser) -> None:
    """Options of the commands that train into an out dir (``compare``, and the benchmarks' ``claims``): out-dir
    mode, threads, progress."""
    mode = c.add_mutually_exclusive_group()
    mode.add_argument("--overwrite", action="store_true", help="replace the results in an existing --out")
    mode.add_argument("--resume", action="store_true", help="continue an existing --out, skipping completed runs")
    c.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch CPU threads (default 1: fastest for the small bundled models on a shared CPU; "
        "raise it for bigger models)",
    )
    c.add_argument("--no-progress", action="store_true", help="no progress display")


def _add_compare(sub: Any) -> None:
    c = sub.add_parser(
        "compare",
        help="train algorithms over seeds and write results.json, curves.png, report.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Train each algorithm on each seed, evaluate it separately, and write to --out: results.json "
            "(after every run), tensorboard/<algo>/seed<k>/, curves.png and report.md.\n\n"
            f"With no arguments: {DEFAULT_ENV}, {DEFAULT_ALGOS}, {DEFAULT_SEEDS} seeds x {DEFAULT_TIMESTEPS} tokens, "
            "into a fresh runs/compare-<timestamp>/ (about seven minutes on a 2-core CPU).\n\n"
            "Algorithms (--algos):\n" + algo_table() + "\n\n"
            f"Group-advantage algorithms get envs in prompt groups of {DEFAULT_GROUP_SIZE} (--group-size); the "
            "others get ungrouped envs. Text envs use CausalLMPolicy with the bundled LM and these defaults for "
            "every algorithm: " + ", ".join(f"{k}={v}" for k, v in TEXT_DEFAULTS.items()) + "; other ids use "
            "MlpPolicy / MultiInputPolicy with SB3's defaults (n_steps lowered when a rollout would exceed "
            "--timesteps). Override any of them with --set or --config.\n\n"
            "Ctrl-C keeps the runs that finished (the report marks the missing ones); --resume completes them."
        ),
    )
    c.add_argument("--env", default=DEFAULT_ENV, help=f"registered env id (default {DEFAULT_ENV})")
    c.add_argument(
        "--env-kwargs",
        default=None,
        metavar="JSON",
        help='keyword arguments of gym.make, as a JSON object, e.g. \'{"task": "chain_sum"}\' for ReasoningGym-v0 '
        "(checked by making the env once, before anything is written)",
    )
    c.add_argument("--algos", default=DEFAULT_ALGOS, help=f"comma-separated names (default {DEFAULT_ALGOS})")
    c.add_argument(
        "--seeds",
        type=positive_int,
        default=DEFAULT_SEEDS,
        help=f"number of seeds, 0..K-1 (default {DEFAULT_SEEDS}; the report's intervals need 5 or more)",
    )
    c.add_argument(
        "--timesteps",
        type=positive_int,
        default=None,
        help=f"env steps (tokens for text envs) per run (default {DEFAULT_TIMESTEPS} for text envs, else 50000)",
    )
    c.add_argument("--out", default=None, help="output folder (default: a fresh runs/compare-<timestamp>)")
    c.add_argument("--n-envs", type=positive_int, default=None, help="parallel envs (default 16 for text, else 1)")
    c.add_argument("--group-size", type=positive_int, default=None, help="prompt group size (default 4)")
    c.add_argument("--eval-episodes", type=positive_int, default=None, help="default 128 for text envs, else 10")
    c.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="training reward for the 'steps to threshold' column (default: halfway from where the "
        "training curves start to where the best algorithm's curves end)",
    )
    c.add_argument("--config", default=None, metavar="FILE.json", help='{"*": {...}, "<algo>": {"<param>": value}}')
    c.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="ALGO.KEY=VALUE",
        help="override one hyperparameter (JSON value; ALGO may be '*'); repeatable, wins over --config",
    )
    c.add_argument("--device", default="auto", help="torch device: auto, cpu, cuda (default auto)")
    c.add_argument(
        "--engine",
        default=None,
        metavar="ENGINE",
        help=f"rollout engine of every algorithm but stock ppo (SB3's own loop): {', '.join(ENGINES)} (default: "
        "each class's, 'step'); see the guide 'Rollout engines'. A --set ALGO.engine=... wins",
    )
    c.add_argument(
        "--gym-packages",
        nargs="+",
        default=[],
        metavar="PKG",
        help="modules to import before the envs are made, e.g. your own package that registers env ids "
        "(gymnasium.register) or rewards (textrl_envs.rewards.register_reward) when imported",
    )
    c.add_argument(
        "--results-page",
        default=None,
        metavar="PATH.md",
        help="also write the report as a results page (Markdown, stamped with the command, commit, hardware, date)",
    )
    c.add_argument(
        "--track",
        action="append",
        default=[],
        choices=("wandb", "mlflow"),
        help="also log every run (its scalars and config) to this tracker; repeatable. wandb follows WANDB_MODE "
        "(offline: runs in OUT/wandb); mlflow logs to MLFLOW_TRACKING_URI or else sqlite:///OUT/mlflow.db. Needs the "
        "extra: pip install 'textrl[wandb]' or 'textrl[mlflow]'",
    )
    ev = c.add_argument_group(
        "evaluation on held-out prompts (text envs)",
        "LMEvalCallback in every run: greedy and sampled reward, pass@k, length, distinct-n, repetition, perplexity; "
        'the report shows them per algorithm. In --config: {"lm_eval": {"every": N, "prompts": "heldout", "k": '
        '[1, 4], "success_threshold": 1.0, "reference_model": "bundled"}} (these options win over it)',
    )
    ev.add_argument("--eval-every", type=positive_int, default=None, metavar="N", help="env steps between evaluations")
    ev.add_argument(
        "--eval-prompts",
        default=None,
        metavar="FILE|heldout",
        help="'heldout' (default: 20%% of the env's prompts, at most 16, kept out of training; reasoning-gym: another "
        "generator seed) or a prompt file (.jsonl/.json/.csv/.txt)",
    )
    ev.add_argument("--eval-k", default=None, metavar="K,K", help="the k of pass@k, comma-separated (default 1,4)")
    ev.add_argument("--eval-success", type=float, default=None, metavar="R", help="reward of a correct sample (1.0)")
    ev.add_argument(
        "--eval-reference",
        default=None,
        metavar="DIR|bundled",
        help="causal LM for the perplexity of the samples (default: no perplexity)",
    )
    add_run_options(c)
    c.set_defaults(subparser=c)


def parse_lm_eval(args: argparse.Namespace, from_config: dict[str, Any] | None) -> dict[str, Any] | None:
    """The evaluation settings of ``compare``: the ``--config`` file's ``lm_eval`` object, then the ``--eval-*``
    options (``None``: no evaluation).

    :raises ValueError: for options without ``--eval-every`` or a bad ``--eval-k``.
    """
    spec = dict(from_config or {})
    if args.eval_every is not None:
        spec["every"] = args.eval_every
    if args.eval_prompts is not None:
        spec["prompts"] = args.eval_prompts
    if args.eval_k is not None:
        try:
            spec["k"] = [int(v) for v in args.eval_k.split(",")]
        except ValueError:
            raise ValueError(f"--eval-k {args.eval_k!r}: expected integers >= 1, comma-separated, e.g. 1,4") from None
    if args.eval_success is not None:
        spec["success_threshold"] = args.eval_success
    if args.eval_reference is not None:
        spec["reference_model"] = args.eval_reference
    if spec and "every" not in spec:
        raise ValueError("--eval-prompts, --eval-k, --eval-success and --eval-reference need --eval-every N")
    return spec or None


def check_trackers(names: Sequence[str]) -> None:
    """Fail before anything runs when a ``--track`` tracker's library is not installed, or it cannot log (wandb
    online without a login, an MLflow server that does not answer:
    :func:`~sb3_grpo.callbacks.trackers.check_tracker_ready`)."""
    import importlib

    from sb3_grpo.callbacks.trackers import check_tracker_ready

    for name in names:
        module = {"wandb": "wandb", "mlflow": "mlflow.tracking"}[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise ValueError(
                f"--track {name}: {name} is not installed; pip install 'textrl[{name}]' (or pip install {name})"
            ) from None
        try:
            check_tracker_ready(name)
        except ValueError as err:
            raise ValueError(f"--track {name}: {err}") from None


def _add_warm_start(sub: Any) -> None:
    w = sub.add_parser(
        "warm-start",
        help="supervised warm start of the LM on a text env's answers, saved as a model folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Fine-tune the bundled LM (or --model) on the (prompt, answer) pairs of a text env whose prompts have "
            "an 'answer' column (ReasoningGym-v0, Arithmetic-v0, a prompt file), and save it to --out; then train "
            'from it with: sb3-grpo compare ... --set \'*.policy_kwargs={"model": "OUT"}\'. Warm-start on other '
            "items than the comparison's (for ReasoningGym-v0, another generator seed in --env-kwargs)."
        ),
    )
    w.add_argument("--env", required=True, help="registered text env id")
    w.add_argument("--env-kwargs", default=None, metavar="JSON", help="keyword arguments of gym.make (JSON object)")
    w.add_argument("--out", required=True, help="folder for the model, its tokenizer and warm_start.json")
    w.add_argument("--overwrite", action="store_true", help="replace an existing --out (once the new model is saved)")
    w.add_argument(
        "--model", default=None, help="model folder or Hub id ('org/name') to start from (default: the bundled LM)"
    )
    w.add_argument("--steps", type=positive_int, default=200, help="optimizer steps (default %(default)s)")
    w.add_argument("--batch-size", type=positive_int, default=32, help="examples per step (default %(default)s)")
    w.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default %(default)s)")
    w.add_argument("--seed", type=int, default=0, help="seed of torch and the batch draws (default %(default)s)")
    w.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    w.set_defaults(subparser=w)


def _add_estimate_memory(sub: Any) -> None:
    p = sub.add_parser(
        "estimate-memory",
        help="estimate one update's memory (weights, gradients, Adam state, activations) for a model and settings",
        description=(
            "Estimate the memory one update of CausalLMPolicy holds per rank, from the model's config alone (built on "
            "the meta device: no weights are downloaded or allocated): weights, gradients, Adam state, a frozen KL "
            "reference, activations of one micro-batch, FSDP's gathered block. Allocator overhead, the rollout's KV "
            "cache and the process itself are not counted (sb3_grpo.policies.memory_estimate documents each term)."
        ),
    )
    p.add_argument("--model", required=True, help="a shape (gpt2-small, qwen2-0.5b, qwen2-1.5b), a config.json, "
                   "a model directory or a Hub id (its config.json only; HF_HUB_OFFLINE=1: the HF cache)")  # fmt: skip
    p.add_argument("--revision", default=None, help="Hub revision of --model")
    p.add_argument("--lora", type=positive_int, nargs="?", const=8, default=None, metavar="R",
                   help="LoRA adapters of rank R (8 without a value) instead of a full fine-tune")  # fmt: skip
    p.add_argument("--lora-targets", nargs="+", default=None, metavar="NAME",
                   help="module names LoRA adapts (default: peft's for the model type)")  # fmt: skip
    p.add_argument("--quant", choices=("8bit", "4bit"), default=None, help="a quantized base (needs --lora)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="weights' dtype")
    p.add_argument("--autocast", choices=("bfloat16", "float16"), default=None, help="activations' dtype")
    p.add_argument("--micro-batch-size", type=positive_int, nargs="+", default=[8], metavar="N",
                   help="sequences per forward and backward (several: one row each; default 8)")  # fmt: skip
    p.add_argument("--seq-len", type=positive_int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="keep only each block's input")
    p.add_argument("--fsdp", type=positive_int, default=1, metavar="RANKS", help="FSDP ranks (default 1: none)")
    p.add_argument("--kl", action="store_true", help="a KL term (kl_coef > 0): a frozen copy in a full fine-tune")
    p.add_argument("--actions", type=positive_int, default=None, help="len(tokenizer) of the env (default: vocab)")
    p.add_argument("--compare", action="store_true", help="rows for full, LoRA, LoRA + 8-bit and LoRA + 4-bit")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures (MiB) as JSON")
    p.set_defaults(subparser=p)


def _estimate_memory(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sb3_grpo.policies.memory_estimate import COMPARED, estimate_memory, format_estimates, load_config, model_counts

    if args.quant is not None and args.lora is None and not args.compare:
        parser.error("--quant needs --lora: a quantized base is trained through LoRA adapters")
    try:
        config = load_config(args.model, args.revision)
    except ValueError as err:
        parser.error(str(err))
    counts = model_counts(config, args.lora_targets)
    if (args.lora is not None or args.compare) and counts.lora_per_rank == 0:
        parser.error(f"LoRA would adapt no layer of this {config.model_type} model; name them with --lora-targets")
    configs = [(name, lora, quant) for name, lora, quant in COMPARED] if args.compare else None
    if configs is None:
        name = "full" if args.lora is None else f"LoRA r={args.lora}" + (f" + {args.quant}" if args.quant else "")
        configs = [(name, args.lora is not None, args.quant)]
    rank = args.lora or 8
    rows = []
    for label, lora, quant in configs:
        if quant is not None and args.fsdp > 1:
            continue  # not combined (estimate_memory says why)
        for micro in args.micro_batch_size:
            estimate = estimate_memory(
                counts,
                lora_rank=rank if lora else None,
                quantization=quant,
                dtype=args.dtype,
                autocast_dtype=args.autocast,
                micro_batch_size=micro,
                seq_len=args.seq_len,
                gradient_checkpointing=args.gradient_checkpointing,
                fsdp=args.fsdp,
                kl_reference=args.kl,
                n_actions=args.actions,
            )
            rows.append((f"{label}, micro {micro}", estimate))
    settings = f"{args.seq_len} tokens per sequence, weights in {args.dtype}"
    settings += f", autocast {args.autocast}" if args.autocast else ""
    settings += ", gradient checkpointing" if args.gradient_checkpointing else ""
    settings += f", FSDP over {args.fsdp} ranks (per rank)" if args.fsdp > 1 else ""
    settings += ", KL reference" if args.kl else ""
    print(f"{args.model}: {counts.total / 1e6:.1f}M parameters, {counts.layers} blocks; {settings}")
    print(format_estimates(rows))
    print("MiB per rank; not counted: allocator overhead, the rollout's KV cache, CUDA's context, the process")
    if args.json:
        Path(args.json).write_text(json.dumps({name: est.as_mb() for name, est in rows}, indent=2) + "\n")
    return 0


def _add_sample(sub: Any) -> None:
    p = sub.add_parser(
        "sample",
        help="load a checkpoint and play episodes with it on an env, printing or saving the transcripts",
        description=(
            "Load an SB3 checkpoint (.zip saved by model.save, a checkpoint callback or compare) and play --n "
            "episodes on --env; print each episode's prompt and completion (or transcript) and reward, with --out "
            "write them as JSON lines, and with --video record them (GIF or mp4)."
        ),
    )
    p.add_argument("checkpoint", help="the checkpoint (.zip or .safetensors)")
    p.add_argument("--env", required=True, help="registered env id")
    p.add_argument("--env-kwargs", default=None, metavar="JSON", help="keyword arguments of the env (JSON object)")
    p.add_argument("--n", type=positive_int, default=4, help="episodes (default %(default)s)")
    p.add_argument("--out", default=None, metavar="FILE.jsonl", help="also write one JSON object per episode here")
    p.add_argument("--algo", default="auto", choices=("auto", *ALGO_CLASSES), help="default: from the file")
    p.add_argument("--deterministic", action="store_true", help="greedy actions (default: sampled)")
    p.add_argument("--seed", type=int, default=0, help="seed of the env and the sampling (default %(default)s)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--gym-packages", nargs="+", default=[], metavar="PKG", help="modules that register env ids")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors (with --out)")
    p.add_argument(
        "--video",
        default=None,
        metavar="FILE.gif|FILE.mp4",
        help="also record the episodes (render_mode='rgb_array'; one frame per step, a text env's per token): "
        "a GIF (Pillow) or an mp4 (needs imageio-ffmpeg)",
    )
    p.add_argument("--fps", type=float, default=None, help="frames per second of --video (default: the env's)")
    add_trust_option(p)
    p.set_defaults(subparser=p)


def add_trust_option(p: argparse.ArgumentParser) -> None:
    """``--trust-checkpoint``: load a checkpoint's pickled entries without the allow-list."""
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="let the checkpoint's pickled entries name any class or function (this runs code from the file: only "
        "for files you wrote or trust); without it, entries outside the allow-list of spaces, arrays and SB3 "
        "classes are refused",
    )


def _sample(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import gymnasium as gym

    from sb3_grpo.file_io import check_writable_file
    from sb3_grpo.playback import (
        check_sample_env,
        check_video_path,
        checkpoint_algo,
        format_row,
        load_checkpoint,
        make_sample_env,
        sample_episodes,
        write_video,
    )

    try:
        import_gym_packages(args.gym_packages)
        if not os.path.isfile(args.checkpoint):
            raise ValueError(f"checkpoint {args.checkpoint!r} is not a file; give the .zip that model.save wrote")
        algo = checkpoint_algo(args.checkpoint) if args.algo == "auto" else args.algo
        _check_device(args.device)
        if args.out is not None:
            check_writable_file(args.out, "--out")
        if args.video is not None:
            check_video_path(args.video)
            check_writable_file(args.video, "--video")
            if args.fps is not None and not args.fps > 0:
                raise ValueError(f"--fps must be positive, got {args.fps}")
        render_mode = "rgb_array" if args.video is not None else None
        env = make_sample_env(args.env, parse_env_kwargs(args.env_kwargs), seed=args.seed, render_mode=render_mode)
    except ValueError as err:
        parser.error(str(err))
    import torch as th

    th.manual_seed(args.seed)
    try:
        model = load_checkpoint(args.checkpoint, algo=algo, device=args.device, trusted=args.trust_checkpoint)
        check_sample_env(model, env, args.env)
    except (ValueError, FileNotFoundError) as err:
        env.close()
        parser.error(str(err))
    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115  (closed below)
    frames: list | None = [] if args.video is not None else None
    try:
        for row in sample_episodes(model, env, args.n, deterministic=args.deterministic, frames=frames):
            if not args.quiet:
                print(format_row(row))
            if out is not None:
                out.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        fps = args.fps or env.metadata.get("render_fps") or 30
    except gym.error.DependencyNotInstalled as err:  # e.g. CartPole's rgb_array needs pygame
        parser.error(f"--video: {err}")
    finally:
        if out is not None:
            out.close()
        env.close()
    if args.out and not args.quiet:
        print(f"{args.n} episodes in {args.out}")
    if frames is not None:
        write_video(args.video, frames, fps=fps)
        if not args.quiet:
            print(f"{len(frames)} frames at {fps:g} fps in {args.video}")
    return 0


def _add_human_eval(sub: Any) -> None:
    h = sub.add_parser("human-eval", help="rate completions by hand: export a blind set, serve the page, report")
    hs = h.add_subparsers(dest="human_command", metavar="{export,serve,report}")
    e = hs.add_parser("export", help="draw completions of one run (or two, mixed blind) into a rating folder")
    e.add_argument(
        "completions",
        nargs="+",
        help="one or two JSONL files (CompletionLogger, `sb3-grpo sample --out`); with --env, two checkpoints (.zip)",
    )
    e.add_argument(
        "--side-by-side",
        action="store_true",
        help="two runs on the same prompts, shown as A and B (order drawn per item); raters score both 1-5 and "
        "choose A, B or tie",
    )
    e.add_argument(
        "--env",
        default=None,
        help="sample the two checkpoints given (side by side) on this env's prompts, --n episodes each, greedy",
    )
    e.add_argument("--env-kwargs", default=None, metavar="JSON", help="with --env: the env's arguments (JSON object)")
    e.add_argument("--out", required=True, help="the rating folder")
    e.add_argument("--n", type=positive_int, default=50, help="items from each file (default %(default)s)")
    e.add_argument("--labels", default=None, help="comma-separated names of the files' runs (default: file names)")
    e.add_argument(
        "--calibration",
        default=None,
        metavar="FILE.jsonl",
        help="items of known scores to mix in (side by side: pairs 'a', 'b' of known 'prefer' and/or 'scores')",
    )
    e.add_argument("--seed", type=int, default=0, help="seed of the draws and the order (default %(default)s)")
    e.add_argument(
        "--force",
        action="store_true",
        help="export into a folder that holds ratings: its old items, key and ratings are kept aside in a "
        "replaced-<time> subfolder (without it such a folder is refused)",
    )
    add_trust_option(e)
    v = hs.add_parser("serve", help="serve the rating page of a folder (ratings saved as they are entered)")
    v.add_argument("folder", help="a folder written by `human-eval export`")
    v.add_argument("--port", type=port_number, default=8765, help="port, 0..65535 (default %(default)s; 0: any free)")
    v.add_argument("--addr", default="127.0.0.1", help="address (default 127.0.0.1: this machine only)")
    r = hs.add_parser("report", help="Krippendorff's alpha per dimension, calibration, scores (and win rates) per run")
    r.add_argument("folder", help="a rated folder")
    r.add_argument("--level", default="interval", choices=("interval", "ordinal"), help="alpha's level of measurement")
    h.set_defaults(subparser=h)
    for p in (e, v, r):
        p.set_defaults(subparser=p)


def _sample_checkpoints(checkpoints: Sequence[str], labels: Sequence[str], args: argparse.Namespace) -> list[str]:
    """``human-eval export --env``: play ``--n`` greedy episodes of each checkpoint on the same env seed (so on the
    same prompts), written to ``<out>/samples_<label>.jsonl``; returns those files."""
    from sb3_grpo.playback import check_sample_env, checkpoint_algo, load_checkpoint, make_sample_env, sample_episodes

    if len(checkpoints) != 2:
        raise ValueError(f"--env samples two checkpoints for a side-by-side folder, got {len(checkpoints)}")
    for path in checkpoints:
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {path!r} is not a file; give the .zip that model.save wrote")
    import torch as th

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for path, label in zip(checkpoints, labels):
        env = make_sample_env(args.env, parse_env_kwargs(args.env_kwargs), seed=args.seed)
        th.manual_seed(args.seed)
        model = load_checkpoint(path, algo=checkpoint_algo(path), trusted=args.trust_checkpoint)
        check_sample_env(model, env, args.env)
        target = out / f"samples_{label}.jsonl"
        try:
            with open(target, "w", encoding="utf-8") as f:
                for row in sample_episodes(model, env, args.n, deterministic=True):
                    f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        finally:
            env.close()
        files.append(str(target))
    return files


def _human_eval(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sb3_grpo import human_eval
    from sb3_grpo.human_eval.protocol import KEY_FILE

    command = getattr(args, "human_command", None)
    try:
        if command == "export":
            files = args.completions
            labels = args.labels.split(",") if args.labels else [Path(f).stem for f in files]
            if len(labels) != len(files):
                raise ValueError(f"--labels has {len(labels)} names for {len(files)} files")
            if not args.force:
                human_eval.check_export_folder(args.out)  # before anything is sampled or written
            if args.env is not None:
                args.side_by_side = True
                files = _sample_checkpoints(files, labels, args)
            if args.side_by_side:
                export = human_eval.export_pairs
            else:
                export = human_eval.export_items
            out = export(list(zip(labels, files)), args.out, args.n, args.seed, args.calibration, force=args.force)
            print(f"rating folder {out}/: serve it with: sb3-grpo human-eval serve {out}")
            return 0
        if command in ("serve", "report") and not (Path(args.folder) / KEY_FILE).is_file():
            raise ValueError(f"{args.folder!r} is not a folder written by `sb3-grpo human-eval export`")
        if command == "serve":
            server = human_eval.make_server(args.folder, args.port, args.addr)
            if server.repaired:
                print(f"repaired: {server.repaired}")
            print(
                f"rating page: {server.url}\n  (give each rater this address; add &rater=NAME for a link per rater. "
                "The token changes at every start; Ctrl-C stops, ratings are already saved)",
                flush=True,
            )
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
            finally:
                server.server_close()
            return 0
        if command == "report":
            repaired = human_eval.repair_ratings(args.folder)
            if repaired:
                print(f"repaired: {repaired}")
            result = human_eval.report(args.folder, level=args.level)
            print((Path(args.folder) / "report.md").read_text(), end="")
            return 0 if not (result["unreliable"] or result.get("unreliable_scores")) else 1
    except (ValueError, OSError) as err:
        parser.error(str(err))
    parser.print_help()
    return EXIT_USAGE


def _check_device(device: str) -> None:
    """Reject a device torch cannot use here, before anything is trained or written
    (:func:`textrl_envs.devices.resolve_device`)."""
    from textrl_envs.devices import resolve_device

    try:
        resolve_device(device)
    except ValueError as err:
        raise ValueError(f"--device: {err}") from None


def _compare(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    from sb3_grpo.compare.algos import parse_algos
    from sb3_grpo.compare.config import CompareError, make_config
    from sb3_grpo.compare.results import load_results, prepare_out_dir
    from sb3_grpo.compare.runner import check_resume_keeps_runs
    from sb3_grpo.file_io import FolderLock

    try:
        import_gym_packages(args.gym_packages)
        algos = parse_algos(args.algos)
        overrides: dict[str, dict[str, Any]] = {}
        lm_eval_file = None
        if args.config:
            loaded = load_config_file(args.config)
            lm_eval_file = loaded.pop("lm_eval", None)
            for key, values in loaded.items():
                overrides.setdefault(key, {}).update(values)
        for key, values in parse_set(args.set).items():
            overrides.setdefault(key, {}).update(values)
        timesteps = args.timesteps
        if timesteps is None:
            import textrl_envs

            timesteps = DEFAULT_TIMESTEPS if args.env in textrl_envs.ENV_IDS else 50_000
        _check_device(args.device)
        check_trackers(args.track)
        cfg = make_config(
            env_id=args.env,
            env_kwargs=parse_env_kwargs(args.env_kwargs),
            algos=algos,
            seeds=args.seeds,
            timesteps=timesteps,
            n_envs=args.n_envs,
            group_size=args.group_size,
            eval_episodes=args.eval_episodes,
            device=args.device,
            overrides=overrides,
            threshold=args.threshold,
            lm_eval=parse_lm_eval(args, lm_eval_file),
            engine=args.engine,
        )
        out = Path(args.out) if args.out else Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S")
    except (CompareError, ValueError) as err:
        parser.error(str(err))  # exits 2
    lock = FolderLock(out, what="--out")  # held until the command ends: one compare per out dir at a time
    try:
        try:
            created = prepare_out_dir(out, overwrite=args.overwrite, resume=args.resume, lock=lock)
            if args.resume:  # never drop completed runs: refuse a plan that leaves some out
                check_resume_keeps_runs(load_results(out), cfg)
        except (CompareError, ValueError) as err:
            lock.release()
            parser.error(str(err))  # exits 2
        return _run_compare(args, argv, cfg, out, created)
    finally:
        lock.release()


def _run_compare(args: argparse.Namespace, argv: Sequence[str], cfg: Any, out: Path, created: list[Path]) -> int:
    """The comparison itself, once ``out`` is prepared and locked."""
    from sb3_grpo.compare.results import discard_failed_out_dir
    from sb3_grpo.compare.runner import run_compare

    if args.threads:
        import torch as th

        th.set_num_threads(args.threads)
    command = shlex.join(["sb3-grpo", *argv])
    runs = len(cfg.algos) * len(cfg.seeds)
    grouped = [a for a in cfg.algos if cfg.group_sizes[a] > 1]
    print(
        f"sb3-grpo compare: {cfg.env_id}, {', '.join(cfg.algos)} x {len(cfg.seeds)} seeds x {cfg.timesteps:,} "
        f"steps ({runs} runs) -> {out}/"
        + (f"\n  {', '.join(grouped)}: envs in prompt groups of {cfg.group_size}" if grouped else ""),
        flush=True,
    )
    start = time.perf_counter()
    try:
        run_compare(
            cfg,
            out,
            command,
            resume=args.resume,
            progress=False if args.no_progress else None,
            track=tuple(dict.fromkeys(args.track)),
        )
    except KeyboardInterrupt as err:
        if getattr(err, "report_written", False):
            report = "report.md marks the missing ones"
        else:
            report = f"report.md was not written (rewrite it with: sb3-grpo report {out})"
        print(
            f"\ninterrupted: completed runs are kept in {out}/results.json and {report}; "
            f"continue with: {shlex.join(['sb3-grpo', *resume_argv(argv, out)])}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except OSError as err:  # e.g. a full disk: results.json holds every run that completed (written atomically)
        if discard_failed_out_dir(created):
            print(f"sb3-grpo compare: error: {err}; no run had completed, removed {out}/", file=sys.stderr)
        else:
            print(
                f"sb3-grpo compare: error: {err}; the completed runs are kept in {out}/results.json: free some space "
                f"and continue with: {shlex.join(['sb3-grpo', *resume_argv(argv, out)])} (or rewrite the report "
                f"with: sb3-grpo report {out})",
                file=sys.stderr,
            )
        return 1
    except Exception:
        if discard_failed_out_dir(created):  # no run completed: leave nothing half-written behind
            print(f"sb3-grpo compare failed before any run completed; removed {out}/", file=sys.stderr)
        raise
    print(f"done in {time.perf_counter() - start:.0f} s: {out}/report.md, {out}/curves.png, {out}/results.json")
    print(f"tensorboard: tensorboard --logdir {out}/tensorboard")
    if args.results_page:
        _write_compare_page(out, Path(args.results_page), command)
    return 0


def import_gym_packages(names: Sequence[str]) -> None:
    """Import each module of ``--gym-packages`` (rl-zoo3's option), so the env ids and rewards it registers on import
    can be used.

    :raises ValueError: naming the module that cannot be imported, and what to check.
    """
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(
                f"--gym-packages: cannot import {name!r} ({type(err).__name__}: {err}); check that it is on "
                "PYTHONPATH or installed (pip install it) in this Python environment"
            ) from None


def _write_compare_page(out: Path, page: Path, command: str) -> None:
    """The report of ``out`` as a results page (:func:`sb3_grpo.compare.pages.write_results_page`)."""
    from sb3_grpo.compare.pages import git_commit, write_results_page
    from sb3_grpo.compare.report import render_report
    from sb3_grpo.compare.results import CURVES_FILE, load_results
    from sb3_grpo.file_io import atomic_write

    results = load_results(out)
    heading, _, body = render_report(results).partition("\n")
    curves = out / CURVES_FILE
    if curves.is_file():  # the page's plot sits beside it, named after it (a docs folder holds several pages)
        image = page.with_name(f"{page.stem}-{CURVES_FILE}")
        atomic_write(image, lambda tmp: shutil.copyfile(curves, tmp))
        body = body.replace(f"]({CURVES_FILE})", f"]({image.name})")
    info = results.get("environment") or {}
    recorded = info.get("commit")  # recorded when the comparison started: the code the figures come from
    commit = f"`{recorded}`" if recorded else f"`{git_commit()}` (the page's; the run did not record its own)"
    write_results_page(page, heading.removeprefix("# "), body, command, info=info or None, commit=commit)
    print(f"results page: {page}")


def resume_argv(argv: Sequence[str], out: Path) -> list[str]:
    """``argv`` of an interrupted run as the command that continues it (``--out`` given, ``--resume`` added)."""
    rest = [a for a in argv if a not in ("--overwrite", "--resume")]
    if "--out" not in rest and not any(a.startswith("--out=") for a in rest):
        rest += ["--out", str(out)]
    return [*rest, "--resume"]


def _report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sb3_grpo.compare.config import CompareError
    from sb3_grpo.compare.results import RESULTS_FILE, load_results

    out = Path(args.dir)
    if not (out / RESULTS_FILE).is_file():
        parser.error(f"{out / RESULTS_FILE} does not exist; give an out dir of `sb3-grpo compare`")
    try:
        results = load_results(out)
    except CompareError as err:
        parser.error(str(err))  # exits 2
    if results.get("kind") == "claims":
        parser.error(f"{out} is an out dir of the claims study; rewrite its claims.md with: textrl-bench report {out}")
    from sb3_grpo.compare.report import write_report

    try:
        write_report(results, out)
    except OSError as err:  # e.g. a full disk: the previous report.md and curves.png are kept
        print(f"sb3-grpo report: error: {err}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:  # a results.json edited by hand
        parser.error(
            f"{out / RESULTS_FILE} could not be reported on ({type(err).__name__}: {err}); it looks edited or from "
            "another version: restore it, or run the comparison again into a fresh --out"
        )
    print(f"wrote {out}/report.md and {out}/curves.png")
    if args.results_page:
        _write_compare_page(out, Path(args.results_page), results.get("command") or f"sb3-grpo report {out}")
    return 0


def _warm_start(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    from sb3_grpo.compare.config import CompareError, check_env_id, check_env_kwargs
    from sb3_grpo.warmstart import check_warm_start_out, run_warm_start

    try:
        check_warm_start_out(Path(args.out), args.overwrite)
        env_kwargs = parse_env_kwargs(args.env_kwargs)
        check_env_id(args.env)
        check_env_kwargs(args.env, env_kwargs)
        if not args.lr > 0:
            raise ValueError(f"--lr must be > 0, got {args.lr}")
        if args.model is not None and not os.path.isdir(args.model):
            from textrl_envs.hf_loading import looks_like_hub_id

            if not looks_like_hub_id(args.model):
                raise ValueError(
                    f"--model {args.model!r} is neither a local model folder nor a Hub id ('org/name', from the "
                    "Hugging Face cache, or downloaded when online)"
                )
    except (CompareError, ValueError) as err:
        parser.error(str(err))
    import torch as th

    th.set_num_threads(args.threads)
    try:
        record = run_warm_start(
            args.env,
            env_kwargs,
            Path(args.out),
            steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.lr,
            seed=args.seed,
            model=args.model,
            command=shlex.join(["sb3-grpo", *argv]),
            overwrite=args.overwrite,
        )
    except ValueError as err:  # e.g. prompts without an 'answer' column, an env that is not a text env
        parser.error(str(err))
    except OSError as err:  # e.g. a full disk: nothing was left at --out
        print(f"sb3-grpo warm-start: error: {err}; nothing was written to {args.out}", file=sys.stderr)
        return 1
    print(
        f"warm start: {record['examples']} examples, {record['steps']} steps, loss {record['loss_first']:.3f} -> "
        f"{record['loss_last']:.3f} in {record['time_s']} s; model in {args.out}/ "
        f'(use it with --set \'*.policy_kwargs={{"model": "{args.out}"}}\')'
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sb3-grpo`` console script.

    :param argv: Arguments without the program name (``sys.argv[1:]`` when ``None``).
    :return: The exit status (0 ok, 2 bad usage, 130 interrupted).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "compare":
        return _compare(args, args.subparser, argv)
    if args.command == "warm-start":
        return _warm_start(args, args.subparser, argv)
    if args.command == "report":
        return _report(args, args.subparser)
    if args.command == "sample":
        return _sample(args, args.subparser)
    if args.command == "human-eval":
        return _human_eval(args, args.subparser)
    if args.command == "estimate-memory":
        return _estimate_memory(args, args.subparser)
    parser.print_help()
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
