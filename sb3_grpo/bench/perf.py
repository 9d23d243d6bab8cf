"""``sb3-grpo perf``: the project's throughput figures in one run, written to ``perf.json`` and ``perf.md``.

Each measurement is a plain function returning a row (``name``, ``ours``, ``baseline``, ``ratio``, ``unit``,
``notes``) that the README's performance section quotes:

1. :func:`vector_env_vs_sync`: env steps/s of the batched ``TextGenVectorEnv`` against Gymnasium's
   ``SyncVectorEnv`` of single ``TextGenEnv``\\ s (random actions, a cheap length reward so the env is what
   is timed).
2. :func:`rollout_vs_generate`: tokens/s of stock SB3 ``collect_rollouts`` with ``CausalLMPolicy`` (KV cache on)
   against ``model.generate`` on the same prompts and lengths, and against the same loop with the cache off
   (every step recomputes every prefix).
3. :func:`update_seq_vs_stock`: seconds per update of GRPO's sequence fast path (``ppo-seq``, when
   ``sb3_grpo.buffers.SequenceRolloutBuffer`` exists) against stock ``PPO.train`` on the same rollout size.
4. :func:`grad_var_cost`: seconds per update of GRPO with and without the gradient-variance penalty (MLP on
   CartPole and the bundled LM on TextGen-v0).

Paired measurements alternate their calls (A, B, A, B, ...) after one warm-up each and report medians, so a
load spike on a shared machine does not land on one side only. The measuring functions live here (importable
from an installed package); ``scripts/bench_*.py`` hold the
longer, configurable versions of the same measurements.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

ROW_KEYS = ("name", "ours", "baseline", "ratio", "unit", "notes")


def _ratio(ours: float | None, baseline: float | None, higher_is_better: bool) -> float | None:
    if ours is None or baseline is None or ours <= 0 or baseline <= 0:
        return None
    return ours / baseline if higher_is_better else baseline / ours


def _row(
    name: str,
    ours: float | None,
    baseline: float | None,
    unit: str,
    notes: str,
    higher_is_better: bool,
    cpu: tuple[float | None, float | None] | None = None,
) -> dict:
    """One measurement: wall-clock figures, and the same ratio on process CPU time when ``cpu`` is given."""
    return {
        "name": name,
        "ours": ours,
        "baseline": baseline,
        "ratio": _ratio(ours, baseline, higher_is_better),
        "cpu_ratio": _ratio(*cpu, higher_is_better) if cpu is not None else None,
        "unit": unit,
        "notes": notes,
    }


def _length_reward(prompts, completions, **kwargs):
    """Cheap reward (characters of the completion) so that env benchmarks time the env, not a reward model."""
    return [float(len(c)) for c in completions]


# ------------------------------------------------------------------------------------------------------------
# 1. vector env vs SyncVectorEnv
# ------------------------------------------------------------------------------------------------------------


def vector_env_vs_sync(num_envs: int = 64, steps: int = 96, repeats: int = 3, env_id: str = "TextGen-v0") -> dict:
    """Median env steps/s of the batched text env and of ``SyncVectorEnv`` over the same random actions.

    :param num_envs: Envs per vector env.
    :param steps: Vector steps per timed repeat.
    :param repeats: Timed repeats (median).
    :param env_id: A text env id.
    :return: A row.
    """
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    import textrl_envs  # noqa: F401

    vec = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", device="cpu",
                       reward=_length_reward)
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, reward=_length_reward) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    vocab = int(vec.single_action_space.n)
    rng = np.random.default_rng(0)

    def rate(env: Any, actions: np.ndarray) -> float:
        env.reset(seed=0)
        start = time.perf_counter()
        for a in actions:
            env.step(a)
        return actions.size / (time.perf_counter() - start)

    # actions avoid EOS-like low ids only by chance; both envs see the same actions
    rate(vec, rng.integers(0, vocab, (3, num_envs)))
    vec_rates, sync_rates = [], []
    for _ in range(repeats):
        actions = rng.integers(0, vocab, (steps, num_envs))
        vec_rates.append(rate(vec, actions))
        sync_rates.append(rate(sync, actions))
    vec.close()
    sync.close()
    return _row(
        "env: TextGenVectorEnv vs SyncVectorEnv",
        statistics.median(vec_rates),
        statistics.median(sync_rates),
        "env steps/s",
        f"{env_id}, {num_envs} envs, {steps} random-action steps x {repeats} (median), length reward",
        True,
    )


# ------------------------------------------------------------------------------------------------------------
# 2. rollout vs generate vs full recompute
# ------------------------------------------------------------------------------------------------------------


def _interleaved(timers: dict[Any, Any], repeats: int) -> tuple[dict[Any, float], dict[Any, float]]:
    """Median wall-clock and process-CPU seconds of each zero-argument callable, calls alternating.

    Alternating (A, B, A, B, ...) after one warm-up call each, rather than timing A's repeats then B's, keeps a
    load spike on a shared machine from landing on one side of a comparison only. Process CPU time (all of this
    process's threads) hardly depends on what other processes do, so its ratios are the steadier figure on a
    shared machine; wall-clock is what a user waits.

    :param timers: ``{name: fn}``; each call does one unit of work.
    :param repeats: Timed calls per callable.
    :return: ``({name: median wall seconds}, {name: median CPU seconds})``.
    """
    for fn in timers.values():
        fn()
    wall: dict[Any, list[float]] = {name: [] for name in timers}
    cpu: dict[Any, list[float]] = {name: [] for name in timers}
    for _ in range(repeats):
        for name, fn in timers.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return (
        {name: statistics.median(v) for name, v in wall.items()},
        {name: statistics.median(v) for name, v in cpu.items()},
    )


def _collector(n_envs: int, tokens: int, use_cache: bool, env_id: str) -> Any:
    """A callable that runs one ``PPO.collect_rollouts`` of ``tokens`` steps with ``CausalLMPolicy``."""
    from stable_baselines3 import PPO

    from sb3_grpo.policies import CausalLMPolicy
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env(env_id, n_envs=n_envs, device="cpu", seed=0)
    model = PPO(CausalLMPolicy, env, n_steps=tokens, batch_size=n_envs * tokens, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"use_cache": use_cache})
    _, callback = model._setup_learn(10**9, None, progress_bar=False)
    return lambda: model.collect_rollouts(env, callback, model.rollout_buffer, n_rollout_steps=tokens)


def _generator(n_envs: int, tokens: int, env_id: str) -> Any:
    """A callable that runs ``generate(do_sample=True)`` of exactly ``tokens`` new tokens for the env's prompts."""
    import torch as th
    from transformers import AutoModelForCausalLM

    from textrl_envs.assets import lm_path
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env(env_id, n_envs=n_envs, device="cpu", seed=0)
    obs = env.reset()
    env.close()
    ids, mask = th.as_tensor(obs["input_ids"]), th.as_tensor(obs["attention_mask"])
    width = int(mask.sum(1).max())
    ids, mask = ids[:, -width:], mask[:, -width:]
    lm = AutoModelForCausalLM.from_pretrained(lm_path(), local_files_only=True).eval()
    pad = lm.config.pad_token_id if lm.config.pad_token_id is not None else 0

    def generate() -> None:
        with th.no_grad():
            lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                        max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=pad)

    return generate


def rollout_vs_generate(n_envs: int = 16, tokens: int = 24, repeats: int = 3, env_id: str = "TextGen-v0") -> list[dict]:
    """Rollout tokens/s (cache on) against ``generate`` and against the cache-off loop (calls interleaved).

    :param n_envs: Envs (rows).
    :param tokens: Steps per rollout (the env's token budget: episodes auto-reset inside the loop).
    :param repeats: Timed repeats of each (median).
    :param env_id: A text env id.
    :return: Two rows.
    """
    n = n_envs * tokens
    t, c = _interleaved(
        {
            "cached": _collector(n_envs, tokens, True, env_id),
            "generate": _generator(n_envs, tokens, env_id),
            "uncached": _collector(n_envs, tokens, False, env_id),
        },
        repeats,
    )
    notes = f"{env_id}, bundled LM, {n_envs} envs x {tokens} steps, SB3 collect_rollouts with CausalLMPolicy"
    return [
        _row("rollout: collect_rollouts (KV cache) vs generate", n / t["cached"], n / t["generate"], "tokens/s", notes,
             True, cpu=(n / c["cached"], n / c["generate"])),
        _row("rollout: KV cache vs full recompute", n / t["cached"], n / t["uncached"], "tokens/s",
             notes + "; baseline use_cache=False", True, cpu=(n / c["cached"], n / c["uncached"])),
    ]


# ------------------------------------------------------------------------------------------------------------
# 3. sequence update vs stock PPO.train, 4. gradient-variance cost
# ------------------------------------------------------------------------------------------------------------


def _trainer(model: Any) -> Any:
    """Collect one rollout into ``model``; return ``model.train`` (each call: one update on that rollout)."""
    _, callback = model._setup_learn(model.n_steps * model.n_envs * 4, None, progress_bar=False)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
    return model.train


def _text_model(algo: str, n_envs: int, n_steps: int, batch_size: int, env_id: str, **kwargs: Any) -> Any:
    from sb3_grpo.bench.algos import ALGOS
    from sb3_grpo.policies import CausalLMPolicy
    from textrl_envs.sb3 import make_vec_env

    spec = ALGOS[algo]
    group = 4 if spec.grouped else 1
    env = make_vec_env(env_id, n_envs=n_envs, group_size=group, device="cpu", seed=0)
    policy = CausalLMPolicy if spec.cls_name == "PPO" else "CausalLMPolicy"
    return spec.make(policy, env, n_steps=n_steps, batch_size=batch_size, n_epochs=1, seed=0, device="cpu",
                     learning_rate=1e-5, gamma=1.0, **kwargs)


def sequence_fast_path_available() -> bool:
    """Whether ``sb3_grpo.buffers.SequenceRolloutBuffer`` exists (the sequence update of the text fast path)."""
    try:
        from sb3_grpo import buffers
    except ImportError:
        return False
    return hasattr(buffers, "SequenceRolloutBuffer")


def update_seq_vs_stock(n_envs: int = 16, n_steps: int = 48, repeats: int = 2, env_id: str = "TextGen-v0") -> dict:
    """Seconds per update (one epoch over ``n_envs * n_steps`` tokens): ``ppo-seq`` vs stock ``PPO.train``.

    :param n_envs: Envs.
    :param n_steps: Steps per env per rollout.
    :param repeats: Timed ``train()`` calls (median).
    :param env_id: A text env id.
    :return: A row (``ours`` is ``None`` and the notes say "not available" without the fast path).
    """
    batch = n_envs * n_steps // 4
    stock_model = _text_model("ppo", n_envs, n_steps, batch, env_id)
    notes = f"{env_id}, bundled LM, {n_envs * n_steps} tokens per update, 1 epoch, minibatch {batch}"
    if not sequence_fast_path_available():
        stock = _interleaved({"stock": _trainer(stock_model)}, repeats)[0]["stock"]
        return _row("update: sequence fast path vs stock PPO.train", None, stock, "s/update",
                    notes + "; sequence fast path not available (no sb3_grpo.buffers.SequenceRolloutBuffer)", False)
    model = _text_model("ppo-seq", n_envs, n_steps, batch, env_id)
    t, c = _interleaved({"ours": _trainer(model), "stock": _trainer(stock_model)}, repeats)
    ours, stock = t["ours"], t["stock"]
    used = type(model.rollout_buffer).__name__
    return _row("update: sequence fast path vs stock PPO.train", ours, stock, "s/update",
                notes + f"; ppo-seq buffer: {used}", False, cpu=(c["ours"], c["stock"]))


def grad_var_cost(quick: bool = False, env_id: str = "TextGen-v0") -> list[dict]:
    """Seconds per update of GRPO defaults with the gradient-variance penalty against ``grad_var_coef=0``.

    :param quick: Smaller rollouts.
    :param env_id: A text env id for the LM row.
    :return: Rows for an MLP on CartPole-v1 and for the bundled LM (all parameters, and the last block only).
    """
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_grpo.grpo import GRPO

    rows = []
    n_steps = 512 if quick else 2048
    times, cpu = _interleaved(
        {
            coef: _trainer(GRPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=0), n_steps=n_steps,
                                batch_size=64, n_epochs=1, seed=0, device="cpu", grad_var_coef=coef))
            for coef in (0.01, 0.0)
        },
        1 if quick else 3,
    )
    notes = f"CartPole-v1, GRPO defaults vs grad_var_coef=0, {n_steps} steps, 1 epoch, minibatch 64"
    rows.append(_row("grad-variance penalty cost (MLP)", times[0.01], times[0.0], "s/update", notes, False,
                     cpu=(cpu[0.01], cpu[0.0])))
    n_envs, steps = (8, 24) if quick else (16, 48)
    batch = n_envs * steps // 4
    last_block = ["lm.transformer.h.3.", "lm.transformer.ln_f."]
    for label, params in (("all LM parameters", None), ("last block + final norm", last_block)):
        t, c = _interleaved(
            {
                "on": _trainer(_text_model("grpo", n_envs, steps, batch, env_id, grad_var_params=params)),
                "off": _trainer(_text_model("grpo", n_envs, steps, batch, env_id, grad_var_coef=0.0)),
            },
            1 if quick else 3,
        )
        t_on, t_off = t["on"], t["off"]
        notes = f"{env_id}, bundled LM, {n_envs * steps} tokens, 1 epoch, minibatch {batch}"
        rows.append(_row(f"grad-variance penalty cost (LM, {label})", t_on, t_off, "s/update", notes, False,
                         cpu=(c["on"], c["off"])))
    # for costs, 'ratio' reads as the slowdown factor: ours / baseline
    for row in rows:
        for key in ("ratio", "cpu_ratio"):
            if row[key]:
                row[key] = 1.0 / row[key]
    return rows


# ------------------------------------------------------------------------------------------------------------
# All of them
# ------------------------------------------------------------------------------------------------------------


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
        "| measurement | ours | baseline | unit | ratio (wall) | ratio (CPU time) | setup |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        cpu = "–" if r.get("cpu_ratio") is None else f"{r['cpu_ratio']:.2f}x"
        lines.append(
            f"| {r['name']} | {_fmt(r['ours'])} | {_fmt(r['baseline'])} | {r['unit']} | {ratio} | {cpu} | {r['notes']} |"
        )
    return "\n".join(lines)


def run_perf(out: Path, quick: bool = False, log: Any = print) -> dict:
    """Run every measurement, write ``out/perf.json`` (after each) and ``out/perf.md``, print the table.

    A measurement that fails is recorded with its error and the others still run.

    :param out: Output folder (exists).
    :param quick: Small sizes and fewer repeats.
    :param log: Where progress lines go.
    :return: The ``perf.json`` contents.
    """
    import torch as th

    from sb3_grpo.bench.compare import environment_info, write_json_atomic

    result: dict[str, Any] = {
        "quick": quick,
        "environment": environment_info("cuda" if th.cuda.is_available() else "cpu"),
        "ratio_meaning": "throughput rows: ours / baseline (higher is better); s/update rows: baseline / ours "
        "speed-up, except grad-variance rows: ours / baseline = slowdown factor. 'CPU time' ratios use this "
        "process's CPU seconds (steadier on a shared machine); wall-clock figures are what a user waits",
        "rows": [],
        "errors": [],
    }
    repeats = 1 if quick else 3
    steps = [
        ("env", lambda: [vector_env_vs_sync(num_envs=32 if quick else 64, steps=48 if quick else 96, repeats=repeats)]),
        ("rollout", lambda: rollout_vs_generate(n_envs=8 if quick else 16, tokens=24, repeats=repeats)),
        ("update", lambda: [update_seq_vs_stock(n_envs=8 if quick else 16, n_steps=24 if quick else 48, repeats=1 if quick else 2)]),
        ("grad-var", lambda: grad_var_cost(quick=quick)),
    ]
    for name, fn in steps:
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
    table = markdown_table(result["rows"])
    hw = result["environment"]["hardware"]
    text = (
        "# sb3-grpo perf\n\n" + table + "\n\n"
        f"Ratio: {result['ratio_meaning']}.\n\n"
        f"Hardware: {hw.get('cpu')}, {hw.get('usable_cpus')} CPUs, torch threads {hw.get('torch_threads')}, "
        f"GPU {hw.get('gpu')}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in result["environment"]["versions"].items())
        + "\n"
    )
    if result["errors"]:
        text += "\nFailed measurements: " + "; ".join(f"{e['measurement']}: {e['error']}" for e in result["errors"]) + "\n"
    (out / "perf.md").write_text(text)
    write_json_atomic(out / "perf.json", result)
    log(table)
    log(f"wrote {out}/perf.json and {out}/perf.md")
    return result
