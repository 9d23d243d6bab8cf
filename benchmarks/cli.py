"""The ``textrl-bench`` command (also ``python -m benchmarks``): the lab's measurements and studies.

::

    textrl-bench perf --quick                          # every throughput / memory row, small sizes, rough ratios
    textrl-bench perf --smoke                          # every row at the smallest sizes: checks each gives a figure
    textrl-bench perf --only update rollout            # some rows (a results page only with --page PATH.md)
    textrl-bench claims --budget default --workers 2   # the claims study, about 20 minutes on 2 idle cores
    textrl-bench report runs/claims-default-...        # rewrite claims.md from a claims out dir's results.json
    textrl-bench trl --preset small                    # the complete loop against TRL's GRPOTrainer (trl extra)
    textrl-bench memory --models bundled               # peak memory of one update: full, LoRA, checkpointing, TRL
    textrl-bench gpu-check --out runs/gpu-check        # the perf rows a GPU changes, on CUDA

and the studies behind the README's figures, each also ``python -m benchmarks.<module>``: ``cartpole``,
``identity``, ``layout-check``, ``learn-interactive``, ``penalty-vs-surrogate``, ``selfplay``, ``micro-batch-memory``,
``memory-recipes``, ``sb3-suite``, ``tune-presets``, ``tools-code``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import RESULTS_DIR
from sb3_grpo.cli import EXIT_INTERRUPTED, EXIT_USAGE, add_run_options, positive_int, resume_argv

#: Commands that are a study module's own command line: ``textrl-bench NAME ARGS`` is ``python -m MODULE ARGS``.
MODULE_COMMANDS: dict[str, tuple[str, str]] = {
    "trl": ("benchmarks.trl_loops", "the complete GRPO loop against TRL's GRPOTrainer, reward against wall time"),
    "memory": ("benchmarks.memory_configs", "peak memory of one update: full, LoRA, checkpointing, against TRL"),
    "gpu-check": ("benchmarks.gpu_check", "the perf rows a GPU changes, on CUDA, with its sync-debug mode"),
    "cartpole": ("benchmarks.cartpole", "stock PPO against GRPO on CartPole-v1 (or another id) over seeds"),
    "identity": ("benchmarks.identity", "GRPO's defaults against stock PPO on SB3's identity checks"),
    "sb3-suite": ("benchmarks.sb3_suite", "SB3's own PPO tests, as is and with GRPO under PPO's name"),
    "layout-check": ("benchmarks.layout_check", "what CausalLMPolicy's observation-layout check costs a rollout"),
    "learn-interactive": ("benchmarks.learn_interactive", "learning on GuessNumber-v0: GRPO and stock PPO"),
    "micro-batch-memory": ("benchmarks.micro_batch_memory", "peak memory of one update with micro-batches"),
    "memory-recipes": ("benchmarks.memory_recipes", "peak memory of one update per option, beside the estimate"),
    "real-model": (
        "benchmarks.real_model",
        "learning on SmolLM2-135M-Instruct (GGUF, LoRA): GRPO, PPO, Dr. GRPO, a full fine-tune; held-out accuracy",
    ),
    "real-speed": (
        "benchmarks.real_speed",
        "speed on SmolLM2-135M-Instruct: rollouts and updates against generate, plain backward and the roofline",
    ),
    "selfplay": ("benchmarks.selfplay", "self-play on the two-player games: win rates against held-out opponents"),
    "tune-presets": ("benchmarks.preset_tuning", "the presets' own numbers checked by an Optuna search (tune extra)"),
    "moe": ("benchmarks.moe", "a mixture of K LoRA experts against plain LoRA: cost per step and learning"),
    "tools-code": ("benchmarks.tools_code", "a short run of the tool task and the code task (sandbox), one page"),
    "turn-credit": (
        "benchmarks.turn_credit",
        "turn-level group credit vs episode-level group advantages; reward redistribution on LongReview-v0",
    ),
    "penalty-vs-surrogate": (
        "benchmarks.penalty_vs_surrogate",
        "the variance penalty's gradient against the loss's, during training",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``textrl-bench`` argument parser (the module commands are listed; their options are their own)."""
    parser = argparse.ArgumentParser(
        prog="textrl-bench",
        description="The lab of textrl: throughput against baselines, the claims study, the comparisons with TRL.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", metavar="{" + ",".join(["perf", "claims", "report", *MODULE_COMMANDS]) + "}"
    )
    _add_perf(sub)
    _add_claims(sub)
    r = sub.add_parser("report", help="rewrite the report of a claims (or compare) out dir from its results.json")
    r.add_argument("dir", help="an out dir of `textrl-bench claims` or `sb3-grpo compare`")
    r.set_defaults(subparser=r)
    for name, (module, text) in MODULE_COMMANDS.items():
        sub.add_parser(name, help=f"{text} (python -m {module}; options: textrl-bench {name} --help)", add_help=False)
    return parser


def _add_page_options(p: argparse.ArgumentParser, name: str) -> None:
    page = p.add_mutually_exclusive_group()
    page.add_argument(
        "--page",
        default=None,
        metavar="PATH.md",
        help=f"the results page to write (default {RESULTS_DIR / name}; smoke runs, and perf runs of some rows "
        "(--only), write none unless given)",
    )
    page.add_argument("--no-page", action="store_true", help="write no results page")


def _add_perf(sub: Any) -> None:
    p = sub.add_parser(
        "perf", help="speed and memory against the baselines (env, rollout, update, penalty, CartPole, memory, TRL)"
    )
    p.add_argument("--out", default=None, help="output folder for perf.json / perf.md (default runs/perf-<timestamp>)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run; rough ratios)")
    size.add_argument(
        "--smoke",
        action="store_true",
        help="every row at the smallest sizes, for CI: checks that each gives finite figures (not their speed); "
        "rows that need an absent extra (trl) are skipped with a message; exit status 1 on a problem",
    )
    p.add_argument("--device", default="auto", help="device of the env, rollout and update rows (default auto)")
    p.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="NAME",
        help="run only these measurements: env, rollout, reward, engine, engine-vllm (needs vLLM), rollout-gpt2, "
        "update, update-long, penalty-gpt2, grad-var-mlp, interactive, cartpole, memory, trl-bundled, "
        "trl-bundled-carry, trl-bundled-equal, trl-tiny (the TRL ones need TRL importable: the trl extra, or TRL on "
        "PYTHONPATH)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch CPU threads (default 1: small models on a shared CPU are fastest and steadiest so)",
    )
    _add_page_options(p, "perf.md")
    p.set_defaults(subparser=p)


def _add_claims(sub: Any) -> None:
    from benchmarks.claims.experiments import BUDGETS

    c = sub.add_parser(
        "claims",
        help="test the five claims with tuned baselines and interval estimates; write claims.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Run the claims study (benchmarks.claims: tuning, long generation, curriculum, collapse, baselines, "
            "ablation) on the CPU and write to --out: results.json (after every run), claims.md (a verdict per "
            "claim with its effect and 95% interval), curves.png, profiles.png, tensorboard logs; and, when the "
            "study completes, claims.md as the results page docs/results/claims.md (not for --budget smoke).\n\n"
            "Budgets: smoke (a couple of CPU-minutes, for tests), default (about 40 CPU-minutes: 20 minutes on 2 "
            "cores with --workers 2), full (the README's table; about 5.5 CPU-hours, 2.7 hours with --workers 2), "
            "real (claims 1, 2 and 4 on a real instruct model with LoRA, SmolLM2-135M-Instruct unless --model says "
            "otherwise; its page is claims_real.md). --scale, --n-envs and --device run a budget's plan with more "
            "tokens per run, more envs, or on a GPU.\n\n"
            "Ctrl-C keeps the runs that finished; --resume completes them."
        ),
    )
    c.add_argument("--budget", choices=list(BUDGETS), default="default", help="how much to run (default default)")
    c.add_argument(
        "--model",
        default=None,
        help=f"with --budget real: the instruct model trained with LoRA (a path, a Hub id or a packaged name; default "
        f"{BUDGETS['real'].model})",
    )
    c.add_argument(
        "--scale",
        type=positive_int,
        default=1,
        help="multiply every run's tokens (tuning and evaluation runs) by this factor: the same plan on a larger "
        "machine (default 1)",
    )
    c.add_argument("--n-envs", type=positive_int, default=None, help="envs per run (default: the budget's, 16)")
    c.add_argument(
        "--device",
        default=None,
        help="where every run trains: cpu, auto (CUDA when there is one), cuda, cuda:1 (default cpu)",
    )
    c.add_argument("--out", default=None, help="output folder (default: a fresh runs/claims-<budget>-<timestamp>)")
    c.add_argument(
        "--workers", type=positive_int, default=1, help="runs at a time, one process each (default 1; 2 on 2 cores)"
    )
    add_run_options(c)
    _add_page_options(c, "claims.md")
    c.set_defaults(subparser=c)


def _page_path(args: argparse.Namespace, name: str, smoke: bool, partial: bool = False) -> Path | None:
    """The results page a command writes: ``--page``, else ``RESULTS_DIR / name`` (none for ``--no-page``, for a smoke
    run, whose figures check the code and are not measurements, or for a ``partial`` run of some of the page's rows,
    which would replace the page's other rows)."""
    if args.no_page:
        return None
    if args.page:
        return Path(args.page)
    return None if smoke or partial else RESULTS_DIR / name


def _perf(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    from benchmarks.perf import check_only, perf_page_body, run_perf
    from sb3_grpo.compare.pages import write_results_page

    out = Path(args.out) if args.out else Path("runs") / time.strftime("perf-%Y%m%d-%H%M%S")
    try:
        check_only(args.only)  # before the folder exists: a typo leaves nothing behind
    except ValueError as err:
        parser.error(str(err))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"cannot create --out {out}: {err.strerror or err}")
    if args.threads:
        import torch as th

        th.set_num_threads(args.threads)
    try:
        result = run_perf(out, quick=args.quick, device=args.device, only=args.only, smoke=args.smoke)
    except ValueError as err:
        parser.error(str(err))
    except KeyboardInterrupt:
        print(f"\ninterrupted; measurements so far are in {out}/perf.json", file=sys.stderr)
        return EXIT_INTERRUPTED
    page = _page_path(args, "perf.md", args.smoke, partial=args.only is not None)
    if page is None and args.only is not None and not args.no_page and not args.smoke:
        print(
            f"no results page written: a run of some rows (--only) would replace the other rows of "
            f"{RESULTS_DIR / 'perf.md'}; pass --page PATH.md to write one (the figures are in {out}/perf.md)"
        )
    if page is not None:
        command = shlex.join(["textrl-bench", *argv])
        write_results_page(page, "Throughput and memory", perf_page_body(result), command, info=result["environment"])
        print(f"results page: {page}")
    if args.smoke:
        check = result["smoke_check"]
        for line in check["skipped"]:
            print(f"smoke: skipped {line}")
        for line in check["problems"]:
            print(f"smoke: PROBLEM {line}", file=sys.stderr)
        print(
            f"smoke: {len(result['rows'])} rows, {len(check['problems'])} problem(s), {len(check['skipped'])} skipped"
        )
        return 1 if check["problems"] else 0
    return 0


def _claims(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    from benchmarks.claims.experiments import EXPERIMENTS
    from benchmarks.claims.study import CLAIMS_OUTPUTS, check_claims_extra
    from sb3_grpo.compare.config import CompareError
    from sb3_grpo.compare.results import prepare_out_dir
    from sb3_grpo.file_io import FolderLock

    try:
        check_claims_extra()
    except ImportError as err:
        parser.error(str(err))
    if args.model is not None and args.budget != "real":
        parser.error(f"--model trains a real instruct model: use it with --budget real, not {args.budget}")
    budget = _claims_budget(args, parser)
    out = Path(args.out) if args.out else Path("runs") / time.strftime(f"claims-{args.budget}-%Y%m%d-%H%M%S")
    lock = FolderLock(out, what="--out")  # held until the process ends: one study per out dir at a time
    try:
        prepare_out_dir(
            out, overwrite=args.overwrite, resume=args.resume, outputs=(*CLAIMS_OUTPUTS, *EXPERIMENTS), lock=lock
        )
    except CompareError as err:
        parser.error(str(err))
    try:
        return _run_claims(args, argv, out, budget)
    finally:
        lock.release()


def _claims_budget(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """The budget that ``--budget``, ``--scale``, ``--n-envs``, ``--device`` and ``--model`` ask for, its runs' configs
    checked (a bad combination is refused before the out dir exists)."""
    from benchmarks.claims.experiments import BUDGETS, phase_one, scaled_budget
    from sb3_grpo.compare.config import CompareError
    from textrl_envs.devices import resolve_device

    if args.device is not None:
        try:
            resolve_device(args.device)
        except ValueError as err:
            parser.error(f"--device: {err}")
    budget = scaled_budget(BUDGETS[args.budget], args.scale, n_envs=args.n_envs, device=args.device)
    if args.model is not None:
        budget = dataclasses.replace(budget, model=args.model)
    try:
        phase_one(budget)
    except (CompareError, ValueError) as err:
        parser.error(str(err))
    return budget


def _run_claims(args: argparse.Namespace, argv: Sequence[str], out: Path, budget: Any) -> int:
    """The claims study of ``budget`` itself, once ``out`` is prepared and locked."""
    import torch as th

    from benchmarks.claims.study import run_claims

    th.set_num_threads(args.threads)
    command = shlex.join(["textrl-bench", *argv])
    print(f"textrl-bench claims: budget {args.budget}, {args.workers} worker(s) -> {out}/", flush=True)
    start = time.perf_counter()
    try:
        results = run_claims(
            budget, out, command, resume=args.resume, workers=args.workers, progress=not args.no_progress
        )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: completed runs are kept in {out}/results.json and claims.md uses them; "
            f"continue with: {shlex.join(['textrl-bench', *resume_argv(argv, out)])}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    print(f"done in {time.perf_counter() - start:.0f} s: {out}/claims.md, {out}/results.json")
    print(f"tensorboard: tensorboard --logdir {out}")
    page = _page_path(args, "claims_real.md" if args.budget == "real" else "claims.md", args.budget == "smoke")
    if page is not None and results["status"] == "complete":
        _claims_page(out, page, command, results)
    return 0 if results["status"] == "complete" else 1


def _claims_page(out: Path, page: Path, command: str, results: dict[str, Any]) -> None:
    """``claims.md`` of ``out`` as the results page (its title line becomes the page's)."""
    from sb3_grpo.compare.pages import write_results_page

    heading, _, body = (out / "claims.md").read_text().partition("\n")
    write_results_page(page, heading.removeprefix("# "), body, command, info=results.get("environment"))
    print(f"results page: {page}")


def _report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sb3_grpo.compare.config import CompareError
    from sb3_grpo.compare.results import RESULTS_FILE, load_results

    out = Path(args.dir)
    if not (out / RESULTS_FILE).is_file():
        parser.error(
            f"{out / RESULTS_FILE} does not exist; give an out dir of `textrl-bench claims` or `sb3-grpo compare`"
        )
    try:
        results = load_results(out)
    except CompareError as err:
        parser.error(str(err))  # exits 2
    if results.get("kind") == "claims":
        from benchmarks.claims.report import write_claims_report

        write_claims_report(results, out)
        print(f"wrote {out}/claims.md, {out}/curves.png and {out}/profiles.png")
        return 0
    from sb3_grpo.compare.report import write_report

    write_report(results, out)
    print(f"wrote {out}/report.md and {out}/curves.png")
    return 0


def _run_module(name: str, argv: Sequence[str]) -> int:
    """``textrl-bench NAME ARGS``: the study module's ``main(ARGS)`` (its exit status when it returns an int)."""
    module = importlib.import_module(MODULE_COMMANDS[name][0])
    status = module.main(list(argv))
    return status if isinstance(status, int) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``textrl-bench`` console script and of ``python -m benchmarks``.

    :param argv: Arguments without the program name (``sys.argv[1:]`` when ``None``).
    :return: The exit status (0 ok, 1 a failed study or smoke check, 2 bad usage, 130 interrupted).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if argv and argv[0] in MODULE_COMMANDS:
        return _run_module(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "perf":
        return _perf(args, args.subparser, argv)
    if args.command == "claims":
        return _claims(args, args.subparser, argv)
    if args.command == "report":
        return _report(args, args.subparser)
    parser.print_help()
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
