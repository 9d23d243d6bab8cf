"""``sb3-grpo perf``: the project's speed and memory figures in one run, written to ``perf.json`` and ``perf.md``.

Every measurement is a plain function returning rows (``name``, ``ours``, ``baseline``, ``ratio``, ``cpu_ratio``,
``unit``, ``notes``, ``target``, ``met``) that the README's performance section quotes; the modules hold them by what
they measure:

- :mod:`.envs`: the vector env against ``SyncVectorEnv`` (cheap and default reward), ``device="auto"`` against
  ``"cpu"``, random actions with special tokens against word tokens;
- :mod:`.rollout`: GRPO's ``collect_rollouts`` against ``generate`` (no EOS, EOS on, a large batch, GPT-2-small
  size), against the cache-off loop, and the default reward's cost in a rollout;
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

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sb3_grpo.bench.perf.timing import make_row

__all__ = ["make_row", "markdown_table", "measurements", "run_perf"]


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


def measurements(quick: bool = False, device: str = "auto", trl_seeds: int = 3) -> list[tuple[str, Callable]]:
    """The measurements of ``sb3-grpo perf`` in order: ``[(name, fn returning rows), ...]``.

    :param quick: Small sizes and one repeat (a smoke run; its ratios are rough).
    :param device: The device of the env, rollout and update rows (``"auto"``: CUDA when there is one).
    :param trl_seeds: Seeds of the loops against TRL.
    """
    from sb3_grpo.bench.perf import envs, interactive, memory, rollout, trl, update

    r = 1 if quick else 3
    n_env, steps = (64, 64) if quick else (256, 320)
    small, tok = (8, 16) if quick else (16, 32)
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
    return [
        ("env", lambda: [envs.vector_env_vs_sync(n_env, steps, r, device=device),
                         envs.vector_env_vs_sync(n_env, steps // 4, r, default_reward=True, device=device),
                         envs.vector_env_auto_vs_cpu(n_env, steps, r + 2),
                         *envs.vector_env_special_tokens(n_env, steps, r + 2, device=device)]),
        ("rollout", lambda: rollout.rollout_vs_generate(small, tok, 2 * tok, r, device, 32 if quick else 128)),
        ("reward", lambda: [rollout.reward_cost(small, tok, 1 if quick else 2, 2 * r + 1, device)]),
        ("rollout-gpt2", lambda: [rollout.rollout_gpt2_small(4 if quick else 16, 8 if quick else 32, r, device)]),
        ("interactive", lambda: interactive.interactive_rollout(8 if quick else 16, 32 if quick else 96, r)),
        ("update", lambda: update.update_seq_vs_stock(small, tok, 16 if quick else 64, r, device)),
        ("update-long", lambda: update.update_seq_vs_stock(4 if quick else 16, 96, 8 if quick else 32, r, device,
                                                           last_block=False, env_id="LongReview-v0", penalty=False)),
        ("penalty-gpt2", lambda: update.update_seq_vs_stock(4 if quick else 8, 8 if quick else 16, 8 if quick else 16,
                                                            r, device, lm=rollout.gpt2_small(), stock=False,
                                                            last_block=False, label="GPT-2-small size")),
        ("grad-var-mlp", lambda: update.grad_var_cost(quick=quick)),
        ("cartpole", lambda: update.cartpole_vs_ppo(4096 if quick else 16384, r)),
        ("memory", lambda: [memory.memory_vs_trl("bundled" if quick else "gpt2-small", _device_name(device))]),
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
    from sb3_grpo.bench.perf import trl

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


def run_perf(
    out: Path, quick: bool = False, log: Any = print, device: str = "auto", only: list[str] | None = None
) -> dict:
    """Run the measurements, write ``out/perf.json`` (after each) and ``out/perf.md``, print the table.

    A measurement that fails is recorded with its error and the others still run.

    :param out: Output folder (exists).
    :param quick: Small sizes and fewer repeats.
    :param log: Where progress lines go.
    :param device: The device of the env, rollout and update rows.
    :param only: Names of the measurements to run (``None``: all; see :func:`measurements`).
    :return: The ``perf.json`` contents.
    """
    from sb3_grpo.bench.results import environment_info, write_json_atomic

    steps = measurements(quick=quick, device=device)
    names = [name for name, _ in steps]
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise ValueError(f"unknown measurement(s) {unknown}; known: {', '.join(names)}")
    result: dict[str, Any] = {
        "quick": quick,
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
    _write_markdown(out, result)
    write_json_atomic(out / "perf.json", result)
    log(markdown_table(result["rows"]))
    log(f"wrote {out}/perf.json and {out}/perf.md")
    return result


def _write_markdown(out: Path, result: dict) -> None:
    hw = result["environment"]["hardware"]
    text = (
        "# sb3-grpo perf\n\n" + markdown_table(result["rows"]) + "\n\n"
        f"Ratio: {result['ratio_meaning']}.\n\n"
        f"Device {result['device']}. Hardware: {hw.get('cpu')}, {hw.get('usable_cpus')} CPUs, torch threads "
        f"{hw.get('torch_threads')}, GPU {hw.get('gpu')}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in result["environment"]["versions"].items())
        + "\n"
    )
    if result["errors"]:
        text += "\nFailed: " + "; ".join(f"{e['measurement']}: {e['error']}" for e in result["errors"]) + "\n"
    (out / "perf.md").write_text(text)
