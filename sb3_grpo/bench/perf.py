"""``sb3-grpo perf``: the project's throughput figures in one run, written to ``perf.json`` and ``perf.md``.

Each measurement is a plain function returning a row (``name``, ``ours``, ``baseline``, ``ratio``, ``unit``,
``notes``) that the README's performance section quotes:

1. :func:`vector_env_vs_sync`: env steps/s of the batched ``TextGenVectorEnv`` against Gymnasium's
   ``SyncVectorEnv`` of single ``TextGenEnv``\\ s (random actions, a cheap length reward so the env is what
   is timed).
2. :func:`rollout_vs_generate`: tokens/s of stock SB3 ``collect_rollouts`` with ``CausalLMPolicy`` (KV cache on)
   against ``model.generate`` on the same prompts and lengths, and against the same loop with the cache off
   (every step recomputes every prefix).
3. :func:`update_seq_vs_stock`: seconds per update of GRPO's sequence fast path (every extra off) against
   stock ``PPO.train`` on one and the same rollout, and on that rollout the cost of the gradient-variance
   penalty over all LM parameters and over the last block.
4. :func:`grad_var_cost`: the same penalty's cost on an MLP (CartPole-v1).
5. :func:`~sb3_grpo.bench.perf_interactive.interactive_rollout`: rollout tokens/s on an interactive env
   (``GuessNumber-v0``) with the KV cache extended by each reply in one forward, against the same cache that
   recomputes a row after every reply.

Paired measurements alternate their calls (A, B, A, B, ...) after one warm-up each and report medians, so a
load spike on a shared machine does not land on one side only (:mod:`sb3_grpo.bench.timing`). The measuring
functions live here (importable from an installed package); ``scripts/bench_*.py`` hold the longer, configurable
versions of the env and rollout measurements, and ``scripts/bench_update.py`` is a command-line front end to
:func:`update_seq_vs_stock`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from sb3_grpo.bench.perf_interactive import interactive_rollout
from sb3_grpo.bench.timing import interleaved as _interleaved
from sb3_grpo.bench.timing import row as _row


def _length_reward(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
    """Cheap reward (characters of the completion) so that env benchmarks time the env, not a reward model."""
    return [float(len(c)) for c in completions]


# ------------------------------------------------------------------------------------------------------------
# 1. vector env vs SyncVectorEnv
# ------------------------------------------------------------------------------------------------------------


def vector_env_vs_sync(
    num_envs: int = 256, steps: int = 320, repeats: int = 3, env_id: str = "TextGen-v0", max_new_tokens: int = 32
) -> dict:
    """Median env steps/s of the batched text env and of ``SyncVectorEnv`` over the same random actions.

    Actions are random non-special tokens (never EOS), so every episode runs the full ``max_new_tokens``.

    :param num_envs: Envs per vector env.
    :param steps: Vector steps per timed repeat.
    :param repeats: Timed repeats (median).
    :param env_id: A text env id.
    :param max_new_tokens: Tokens per episode.
    :return: A row.
    """
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    import textrl_envs  # noqa: F401

    kwargs = {"reward": _length_reward, "max_new_tokens": max_new_tokens}
    vec = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", device="cpu", **kwargs)
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    tokenizer = vec.unwrapped.text_spec.tokenizer
    special = set(tokenizer.all_special_ids)
    words = np.array([i for i in range(len(tokenizer)) if i not in special])
    rng = np.random.default_rng(0)

    def runner(env: Any, actions: np.ndarray) -> Any:
        def run() -> None:
            env.reset(seed=0)
            for a in actions:
                env.step(a)

        return run

    actions = words[rng.integers(0, len(words), (steps, num_envs))]
    t, c = _interleaved({"vec": runner(vec, actions), "sync": runner(sync, actions)}, repeats)
    vec.close()
    sync.close()
    n = actions.size
    return _row(
        "env: TextGenVectorEnv vs SyncVectorEnv",
        n / t["vec"],
        n / t["sync"],
        "env steps/s",
        f"{env_id}, {num_envs} envs, {max_new_tokens}-token episodes, {steps} random-token steps x {repeats} "
        "(median), length reward",
        True,
        cpu=(n / c["vec"], n / c["sync"]),
    )


# ------------------------------------------------------------------------------------------------------------
# 2. rollout vs generate vs full recompute
# ------------------------------------------------------------------------------------------------------------


def _no_eos_tokenizer() -> Any:
    """The bundled tokenizer without an EOS token: episodes then run their whole budget (the env's documented
    fallback), as ``generate(min_new_tokens=max_new_tokens)`` does, so both sides make the same tokens."""
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    tokenizer.eos_token = None
    return tokenizer


def _text_env(env_id: str, n_envs: int, tokens: int, full_length: bool) -> Any:
    import warnings

    from textrl_envs.sb3 import make_vec_env

    kwargs = {"tokenizer": _no_eos_tokenizer()} if full_length else {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="the tokenizer has no EOS token")
        return make_vec_env(env_id, n_envs=n_envs, device="cpu", seed=0, max_new_tokens=tokens, **kwargs)


def _collector(n_envs: int, tokens: int, use_cache: bool, env_id: str, full_length: bool = True) -> Any:
    """A callable that runs one ``PPO.collect_rollouts`` of ``tokens`` steps with ``CausalLMPolicy``, starting each
    time without cache, as a rollout after an update does."""
    from stable_baselines3 import PPO

    from sb3_grpo.policies import CausalLMPolicy

    env = _text_env(env_id, n_envs, tokens, full_length)
    model = PPO(
        CausalLMPolicy,
        env,
        n_steps=tokens,
        batch_size=n_envs * tokens,
        n_epochs=1,
        seed=0,
        device="cpu",
        policy_kwargs={"use_cache": use_cache},
    )
    _, callback = model._setup_learn(10**9, None, progress_bar=False)

    def collect() -> None:
        model.policy.reset_cache()  # as after an update: no cache and no prefill memo carried over from the last call
        model.collect_rollouts(env, callback, model.rollout_buffer, n_rollout_steps=tokens)

    return collect


def _generator(n_envs: int, tokens: int, env_id: str) -> Any:
    """A callable that runs ``generate(do_sample=True)`` of exactly ``tokens`` new tokens for the env's prompts."""
    import torch as th
    from transformers import AutoModelForCausalLM

    from textrl_envs.assets import lm_path

    env = _text_env(env_id, n_envs, tokens, full_length=False)
    obs = env.reset()
    env.close()
    ids, mask = th.as_tensor(obs["input_ids"]), th.as_tensor(obs["attention_mask"])
    width = int(mask.sum(1).max())
    ids, mask = ids[:, -width:], mask[:, -width:]
    lm = AutoModelForCausalLM.from_pretrained(lm_path(), local_files_only=True).eval()
    pad = lm.config.pad_token_id if lm.config.pad_token_id is not None else 0

    def generate() -> None:
        with th.no_grad():
            lm.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=pad,
            )

    return generate


def rollout_vs_generate(
    n_envs: int = 16, tokens: int = 32, long_tokens: int = 64, repeats: int = 3, env_id: str = "TextGen-v0"
) -> list[dict]:
    """Rollout tokens/s (cache on) against ``generate`` at ``tokens``, and against the cache-off loop at
    ``long_tokens`` (calls interleaved).

    The env is the real batched text env (SB3 adapter, reward and all) with the bundled LM. The first two rows
    use the bundled tokenizer without EOS, so that every episode runs the whole budget, as
    ``generate(min_new_tokens=tokens)`` does and as the cache comparison at ``long_tokens`` needs; the last row
    repeats the comparison with ``generate`` with EOS on, where episodes end early and auto-reset inside the
    loop (their new prompts are prefilled), as in training.

    :param n_envs: Envs (rows).
    :param tokens: Steps per rollout for the comparison with ``generate``.
    :param long_tokens: Steps per rollout for the comparison with the cache off.
    :param repeats: Timed repeats of each (median).
    :param env_id: A text env id.
    :return: Three rows.
    """
    notes = f"{env_id} vector env, bundled LM, {n_envs} envs, SB3 collect_rollouts with CausalLMPolicy"
    t, c = _interleaved(
        {
            "cached": _collector(n_envs, tokens, True, env_id),
            "generate": _generator(n_envs, tokens, env_id),
            "cached-eos": _collector(n_envs, tokens, True, env_id, full_length=False),
        },
        repeats,
    )
    n = n_envs * tokens
    rows = [
        _row(
            "rollout: collect_rollouts (KV cache) vs generate",
            n / t["cached"],
            n / t["generate"],
            "tokens/s",
            notes + f", {tokens}-token episodes (no EOS)",
            True,
            cpu=(n / c["cached"], n / c["generate"]),
        ),
        _row(
            "rollout with EOS: collect_rollouts (KV cache) vs generate",
            n / t["cached-eos"],
            n / t["generate"],
            "tokens/s",
            notes + f", {tokens}-token budget, EOS ends episodes (auto-resets inside the loop)",
            True,
            cpu=(n / c["cached-eos"], n / c["generate"]),
        ),
    ]
    t, c = _interleaved(
        {
            "cached": _collector(n_envs, long_tokens, True, env_id),
            "uncached": _collector(n_envs, long_tokens, False, env_id),
        },
        repeats,
    )
    n = n_envs * long_tokens
    rows.insert(
        1,
        _row(
            "rollout: KV cache vs full recompute",
            n / t["cached"],
            n / t["uncached"],
            "tokens/s",
            notes + f", {long_tokens}-token episodes (no EOS); baseline use_cache=False",
            True,
            cpu=(n / c["cached"], n / c["uncached"]),
        ),
    )
    return rows


# ------------------------------------------------------------------------------------------------------------
# 3. sequence update vs stock PPO.train, 4. gradient-variance cost
# ------------------------------------------------------------------------------------------------------------


def _trainer(model: Any) -> Any:
    """Collect one rollout into ``model``; return ``model.train`` (each call: one update on that rollout)."""
    _, callback = model._setup_learn(model.n_steps * model.n_envs * 4, None, progress_bar=False)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
    return model.train


def per_transition_copy(model: Any, buf: Any) -> Any:
    """A ``DictRolloutBuffer`` holding exactly the data of a ``SequenceRolloutBuffer`` (for stock ``PPO.train``)."""
    from stable_baselines3.common.buffers import DictRolloutBuffer

    out = DictRolloutBuffer(
        buf.buffer_size,
        model.observation_space,
        model.action_space,
        model.device,
        buf.gae_lambda,
        buf.gamma,
        buf.n_envs,
    )
    out.observations = {
        "input_ids": buf.token_ids.cpu().numpy().copy(),
        "attention_mask": buf.token_mask.cpu().numpy().copy(),
    }
    for name in ("actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages"):
        setattr(out, name, getattr(buf, name).copy())
    out.full, out.pos = True, buf.pos
    return out


def _update_on(model: Any, make_buffer: Any) -> Any:
    """A callable running ``model.train()`` on a fresh ``make_buffer()``, always from the same weights and optimizer
    state (so every repeat does the same work; SB3's ``get`` reorders a ``DictRolloutBuffer`` in place)."""
    import copy

    policy_state = copy.deepcopy(model.policy.state_dict())
    optim_state = copy.deepcopy(model.policy.optimizer.state_dict())

    def update() -> None:
        model.policy.load_state_dict(policy_state)
        model.policy.optimizer.load_state_dict(optim_state)
        model.rollout_buffer = make_buffer()
        model.train()

    return update


def _forward_positions(policy: Any, update: Any) -> int:
    """Positions (rows x columns) the LM body computes in one call of ``update`` (the update's forwards)."""
    shapes: list[tuple[int, ...]] = []
    hook = policy.lm.base_model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        update()
    finally:
        hook.remove()
    return sum(rows * cols for rows, cols in shapes)


LAST_BLOCK = ["lm.transformer.h.3.", "lm.transformer.ln_f."]


def update_seq_vs_stock(
    n_envs: int = 16, tokens: int = 32, n_steps: int = 64, repeats: int = 3, env_id: str = "TextGen-v0"
) -> list[dict]:
    """Seconds per update on ONE rollout: GRPO's sequence fast path (every extra off) against stock ``PPO.train``,
    and the cost of the gradient-variance penalty on the same rollout (all LM parameters, and the last block).

    :param n_envs: Envs.
    :param tokens: The env's completion budget.
    :param n_steps: Steps per env per rollout.
    :param repeats: Timed ``train()`` calls of each (median, interleaved).
    :param env_id: A text env id.
    :return: Rows.
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import configure

    from sb3_grpo.common.buffers import episode_segments
    from sb3_grpo.grpo import GRPO
    from sb3_grpo.policies import CausalLMPolicy
    from textrl_envs.sb3 import make_vec_env

    off = {"grad_var_coef": 0.0, "adaptive_clip": None, "explore_alpha": 0.0, "advantage": "gae", "kl_coef": 0.0}
    env = make_vec_env(env_id, n_envs=n_envs, seed=0, device="cpu", max_new_tokens=tokens)
    hp = {"n_steps": n_steps, "batch_size": n_steps * n_envs // 4, "n_epochs": 1, "seed": 0, "device": "cpu"}
    fast = GRPO("CausalLMPolicy", env, **hp, **off)
    fast.set_logger(configure(None, []))
    _trainer(fast)
    seq_buffer = fast.rollout_buffer
    stock = PPO(CausalLMPolicy, env, **hp)
    stock.set_logger(configure(None, []))
    stock.policy.load_state_dict(fast.policy.state_dict())
    timers = {
        "ours": _update_on(fast, lambda: seq_buffer),
        "stock": _update_on(stock, lambda: per_transition_copy(stock, seq_buffer)),
    }
    for label, params in (("all", None), ("last", LAST_BLOCK)):
        model = GRPO("CausalLMPolicy", env, **hp, **{**off, "grad_var_coef": 0.01, "grad_var_params": params})
        model.set_logger(configure(None, []))
        model.policy.load_state_dict(fast.policy.state_dict())
        timers[label] = _update_on(model, lambda: seq_buffer)
    t, c = _interleaved(timers, repeats)
    n_seq = len(episode_segments(seq_buffer.episode_starts))
    packed = _forward_positions(fast.policy, timers["ours"])
    fast.policy.pack_sequences = False
    padded = _forward_positions(fast.policy, timers["ours"])
    fast.policy.pack_sequences = True
    notes = (
        f"{env_id}, bundled LM, one rollout of {n_envs} envs x {n_steps} steps = {n_envs * n_steps} tokens "
        f"in {n_seq} sequences, {tokens}-token budget, 1 epoch, minibatch {hp['batch_size']}; packed forwards: "
        f"{packed} positions (padded: {padded})"
    )
    rows = [
        _row(
            "update: sequence fast path vs stock PPO.train",
            t["ours"],
            t["stock"],
            "s/update",
            notes,
            False,
            cpu=(c["ours"], c["stock"]),
        )
    ]
    for label, name in (("all", "all LM parameters"), ("last", "last block + final norm")):
        row = _row(
            f"grad-variance penalty cost (LM, {name})",
            t[label],
            t["ours"],
            "s/update",
            notes + "; fast path with grad_var_coef=0.01 vs 0",
            False,
            cpu=(c[label], c["ours"]),
        )
        row["ratio"], row["cpu_ratio"] = t[label] / t["ours"], c[label] / c["ours"]  # slowdown factor
        rows.append(row)
    return rows


def grad_var_cost(quick: bool = False) -> list[dict]:
    """Seconds per update of GRPO defaults with the gradient-variance penalty against ``grad_var_coef=0`` on an MLP
    (the LM rows come from :func:`update_seq_vs_stock`, on its shared rollout).

    :param quick: Smaller rollouts.
    :return: One row for an MLP on CartPole-v1; ``ratio`` is the slowdown factor.
    """
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_grpo.grpo import GRPO

    n_steps = 512 if quick else 2048
    times, cpu = _interleaved(
        {
            coef: _trainer(
                GRPO(
                    "MlpPolicy",
                    make_vec_env("CartPole-v1", n_envs=1, seed=0),
                    n_steps=n_steps,
                    batch_size=64,
                    n_epochs=1,
                    seed=0,
                    device="cpu",
                    grad_var_coef=coef,
                )
            )
            for coef in (0.01, 0.0)
        },
        1 if quick else 3,
    )
    notes = f"CartPole-v1, GRPO defaults vs grad_var_coef=0, {n_steps} steps, 1 epoch, minibatch 64"
    row = _row(
        "grad-variance penalty cost (MLP)", times[0.01], times[0.0], "s/update", notes, False, cpu=(cpu[0.01], cpu[0.0])
    )
    row["ratio"], row["cpu_ratio"] = times[0.01] / times[0.0], cpu[0.01] / cpu[0.0]  # slowdown factor
    return [row]


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
            f"| {r['name']} | {_fmt(r['ours'])} | {_fmt(r['baseline'])} | {r['unit']} | {ratio} | {cpu} "
            f"| {r['notes']} |"
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

    from sb3_grpo.bench.results import environment_info, write_json_atomic

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
        (
            "env",
            lambda: [vector_env_vs_sync(num_envs=64 if quick else 256, steps=64 if quick else 320, repeats=repeats)],
        ),
        (
            "rollout",
            lambda: rollout_vs_generate(
                n_envs=8 if quick else 16, tokens=16 if quick else 32, long_tokens=32 if quick else 64, repeats=repeats
            ),
        ),
        (
            "update",
            lambda: update_seq_vs_stock(
                n_envs=8 if quick else 16, tokens=16 if quick else 32, n_steps=16 if quick else 64, repeats=repeats
            ),
        ),
        ("grad-var", lambda: grad_var_cost(quick=quick)),
        (
            "interactive",
            lambda: interactive_rollout(n_envs=8 if quick else 16, steps=32 if quick else 96, repeats=repeats),
        ),
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
        text += (
            "\nFailed measurements: " + "; ".join(f"{e['measurement']}: {e['error']}" for e in result["errors"]) + "\n"
        )
    (out / "perf.md").write_text(text)
    write_json_atomic(out / "perf.json", result)
    log(table)
    log(f"wrote {out}/perf.json and {out}/perf.md")
    return result
