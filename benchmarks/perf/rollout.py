"""The rollout's rows: GRPO's ``collect_rollouts`` against ``model.generate``, against itself without the KV cache,
and with the env's default reward against a reward that costs nothing.

Our side is what a user gets: ``GRPO("CausalLMPolicy", make_vec_env("TextGen-v0", n_envs=N))`` with GRPO's defaults
(mixed exploration included), the env's own reward and EOS, on ``device`` (``"auto"`` by default). Every call
starts without cache and prefill memo, as a rollout after an update does. ``generate(do_sample=True)`` makes exactly
``tokens`` new tokens per row (``min_new_tokens``), the same number of sampled positions as our rollout of ``tokens``
steps. Rows "without EOS" use the bundled tokenizer with its EOS token removed (the env's documented fallback), so our
episodes run their whole budget as ``generate``'s rows do; rows "with EOS" let episodes end and auto-reset inside the
loop, their new prompts prefilled, as in training. One more row with EOS compares them with ``generate`` as a user
runs it on these prompts: each row stops at EOS, and its tokens/s counts the tokens up to the EOS, not the padding
after it (as ``textrl-bench real-speed`` counts them).
"""

from __future__ import annotations

import statistics
import warnings
from typing import Any

from benchmarks.timing import interleaved, make_row, rate_row, synchronizer, zero_reward

__all__ = [
    "GPT2_SMALL",
    "GPT2_SMOKE",
    "generated_tokens",
    "gpt2_small",
    "reward_cost",
    "rollout_gpt2_small",
    "rollout_vs_generate",
]

#: A GPT-2-small-size model (124M parameters), built from its config with random weights.
GPT2_SMALL = {"vocab_size": 50257, "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024}
#: GPT-2-small's vocabulary on a 2 x 64 model: what ``perf --smoke`` runs the GPT-2 rows with (their code, in seconds).
GPT2_SMOKE = {**GPT2_SMALL, "n_layer": 2, "n_embd": 64, "n_head": 2}


def gpt2_small(config: dict[str, int] | None = None) -> Any:
    """A GPT-2-small-size LM from its config (seeded random weights; nothing is downloaded).

    :param config: Another GPT-2 config (default :data:`GPT2_SMALL`; ``perf --smoke`` uses :data:`GPT2_SMOKE`).
    """
    import torch as th
    from transformers import GPT2Config, GPT2LMHeadModel

    th.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**(config or GPT2_SMALL))).eval()


def _no_eos_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    tokenizer.eos_token = None
    return tokenizer


def text_env(n_envs: int, tokens: int, device: Any, eos: bool = True, env_id: str = "TextGen-v0", **kw: Any) -> Any:
    """The SB3 vector env of ``env_id`` (without EOS: the bundled tokenizer with its EOS token removed)."""
    from textrl_envs.sb3 import make_vec_env

    if not eos:
        kw["tokenizer"] = _no_eos_tokenizer()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="the tokenizer has no EOS token")
        return make_vec_env(env_id, n_envs=n_envs, device=device, seed=0, max_new_tokens=tokens, **kw)


def collector(env: Any, tokens: int, device: Any, lm: Any = None, **grpo_kwargs: Any) -> Any:
    """A callable running one ``GRPO.collect_rollouts`` of ``tokens`` steps (GRPO's defaults unless overridden),
    starting each time without cache, as a rollout after an update does, from new episodes (``env.reset()``, so
    collectors can share ``env``). Its ``model`` attribute is the GRPO model (its logger keeps the last rollout's
    records)."""
    import numpy as np
    from stable_baselines3.common.logger import configure

    from sb3_grpo import GRPO

    policy_kwargs = grpo_kwargs.pop("policy_kwargs", {})
    if lm is not None:
        policy_kwargs = {**policy_kwargs, "model": lm}
    model = GRPO(
        "CausalLMPolicy",
        env,
        n_steps=tokens,
        batch_size=env.num_envs * tokens,
        seed=0,
        device=device,
        policy_kwargs=policy_kwargs,
        **grpo_kwargs,
    )
    model.set_logger(configure(None, []))
    _, callback = model._setup_learn(10**9, None, progress_bar=False)

    def collect() -> None:
        model.policy.reset_cache()  # as after an update: no cache and no prefill memo carried over
        # Start from the env's fresh episodes, not from the observation this model saw last: a bench may share one env
        # between collectors, and a stale observation would make the first step's prefill miss the env's prompts.
        model._last_obs = env.reset()
        model._last_episode_starts = np.ones(env.num_envs, dtype=bool)
        model.collect_rollouts(env, callback, model.rollout_buffer, n_rollout_steps=tokens)

    collect.model = model
    return collect


def generator(n_envs: int, tokens: int, device: Any, lm: Any = None, eos: bool = False) -> Any:
    """A callable running ``generate(do_sample=True)`` of exactly ``tokens`` new tokens for the env's prompts, or (with
    ``eos``) of at most ``tokens``, each row stopping at the env's EOS token as a user's generation stops; its
    ``counted`` list then gets, per call, the tokens of each row up to and including its EOS
    (:func:`generated_tokens`), the padding after it not counted."""
    from transformers import AutoModelForCausalLM

    from textrl_envs.assets import lm_path
    from textrl_envs.devices import resolve_device

    dev = resolve_device(device)
    env = text_env(n_envs, tokens, "cpu")
    obs = env.reset()
    end = env.get_attr("text_spec")[0].eos_token_id
    env.close()
    ids, mask = (t.to(dev) for t in prompt_windows(obs))
    if lm is None:
        lm = AutoModelForCausalLM.from_pretrained(lm_path(), local_files_only=True)
    lm = lm.to(dev).eval()
    pad = lm.config.pad_token_id if lm.config.pad_token_id is not None else 0
    return sampling_generate(lm, ids, mask, tokens, end if eos else None, pad)


def prompt_windows(obs: dict) -> tuple[Any, Any]:
    """The token ids and attention mask of a batch of observations, cut to the longest prompt (the left padding
    that every row has dropped)."""
    import torch as th

    ids, mask = th.as_tensor(obs["input_ids"]), th.as_tensor(obs["attention_mask"])
    width = int(mask.sum(1).max())
    return ids[:, -width:], mask[:, -width:]


def sampling_generate(lm: Any, ids: Any, mask: Any, tokens: int, end: int | None, pad: int) -> Any:
    """A callable running ``lm.generate(do_sample=True)`` (no top-k or top-p) on the prompt windows ``ids`` /
    ``mask``: ``tokens`` new tokens each, or (``end`` given) at most ``tokens``, each row stopping at ``end``. Its
    ``counted`` list gets, per call, the tokens generated (:func:`generated_tokens`: with ``end``, each row's up to
    and including its first ``end``)."""
    import torch as th

    stop = {"eos_token_id": end} if end is not None else {"min_new_tokens": tokens}
    counted: list[int] = []

    def generate() -> None:
        with th.inference_mode():
            out = lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                              max_new_tokens=tokens, pad_token_id=pad, **stop)  # fmt: skip
        counted.append(generated_tokens(out[:, ids.shape[1] :], end))

    generate.counted = counted
    return generate


def generated_tokens(out: Any, end: int | None) -> int:
    """Tokens of ``generate``'s new columns ``out`` (``[B, T]``) that a rollout would have sampled: each row up to and
    including its first ``end`` token (all of them without one, or with ``end=None``)."""
    import torch as th

    if end is None:
        return int(out.numel())
    hit = out == end
    first = th.where(hit.any(1), hit.float().argmax(1) + 1, th.full_like(hit[:, 0], out.shape[1], dtype=th.long))
    return int(first.sum())


def rollout_vs_generate(
    n_envs: int = 16,
    tokens: int = 32,
    long_tokens: int = 64,
    repeats: int = 3,
    device: Any = "auto",
    large_envs: int = 128,
) -> list[dict]:
    """Rollout tokens/s (GRPO defaults, KV cache) against ``generate`` without and with EOS, with a large batch too,
    and against the cache-off loop at ``long_tokens``.

    :param n_envs: Envs (rows) of the small batch.
    :param tokens: Steps per rollout for the comparisons with ``generate``.
    :param long_tokens: Steps per rollout for the comparison with the cache off.
    :param repeats: Timed repeats of each (median).
    :param device: Where the env state and the model live.
    :param large_envs: Envs of the large batch (0: no large-batch row).
    :return: Rows.
    """
    sync = synchronizer(_resolved(device))
    notes = f"TextGen-v0, bundled LM, GRPO defaults, device {device}"
    rows = _vs_generate(n_envs, tokens, repeats, device, sync, notes)
    if large_envs:
        rows += _large_batch_vs_generate(large_envs, tokens, repeats, device, sync, notes)
    rows.append(_cache_vs_recompute(n_envs, long_tokens, repeats, device, sync, notes))
    return rows


def _vs_generate(n_envs: int, tokens: int, repeats: int, device: Any, sync: Any, notes: str) -> list[dict]:
    """The three rows of :func:`rollout_vs_generate` against ``generate`` on the small batch: no EOS, and EOS on
    (:func:`_eos_rows`)."""
    timers = {
        "ours": collector(text_env(n_envs, tokens, device, eos=False), tokens, device),
        "generate": generator(n_envs, tokens, device),
        "ours-eos": collector(text_env(n_envs, tokens, device), tokens, device),
        "generate-eos": generator(n_envs, tokens, device, eos=True),
    }
    times = interleaved(timers, repeats, sync)
    n = n_envs * tokens
    no_eos = rate_row(
        "rollout: collect_rollouts vs generate, no EOS",
        n,
        times,
        ("ours", "generate"),
        "tokens/s",
        f"{notes}, {n_envs} envs, {tokens}-token episodes (no EOS)",
        target=(">=", 1.0),
    )
    setup = f"{notes}, {n_envs} envs, {tokens}-token budget, EOS ends episodes (auto-resets in the loop)"
    return [no_eos, *_eos_rows("", n, times, timers, "ours-eos", setup)]


def _large_batch_vs_generate(
    large_envs: int, tokens: int, repeats: int, device: Any, sync: Any, notes: str
) -> list[dict]:
    """The rows of :func:`rollout_vs_generate` against ``generate`` on the large batch, EOS on (:func:`_eos_rows`)."""
    timers = {
        "ours": collector(text_env(large_envs, tokens, device), tokens, device),
        "generate": generator(large_envs, tokens, device),
        "generate-eos": generator(large_envs, tokens, device, eos=True),
    }
    times = interleaved(timers, repeats, sync)
    setup = f"{notes}, {large_envs} envs, {tokens}-token budget, EOS on"
    return _eos_rows(", large batch", large_envs * tokens, times, timers, "ours", setup)


def _eos_rows(suffix: str, n: int, times: Any, timers: dict[str, Any], ours: str, setup: str) -> list[dict]:
    """An EOS-on rollout (timer ``ours``, ``n`` tokens a call) against ``generate`` of as many tokens (``"generate"``)
    and against ``generate`` stopping each row at EOS (``"generate-eos"``, counted up to each row's EOS).

    :param suffix: Appended to both rows' names (``""``, ``", large batch"``).
    :param times: :func:`interleaved`'s ``(wall, cpu)`` of ``timers``.
    :param setup: The set-up both rows share.
    """
    counted = statistics.median(timers["generate-eos"].counted)
    return [
        rate_row(
            f"rollout: collect_rollouts vs generate, EOS on{suffix}",
            n,
            times,
            (ours, "generate"),
            "tokens/s",
            setup,
            target=(">=", 0.9),
        ),
        rate_row(
            f"rollout: collect_rollouts vs generate stopping at EOS{suffix}",
            (n, counted),
            times,
            (ours, "generate-eos"),
            "tokens/s",
            f"{setup}; generate stops each row at EOS and counts its tokens up to it (median {counted:.0f} of {n} a "
            "call)",
            target=(">=", 1.0),
        ),
    ]


def _cache_vs_recompute(n_envs: int, long_tokens: int, repeats: int, device: Any, sync: Any, notes: str) -> dict:
    """The row of :func:`rollout_vs_generate` for the KV cache against the cache-off loop (``use_cache=False``)."""
    env = text_env(n_envs, long_tokens, device, eos=False)
    t, c = interleaved(
        {
            "cached": collector(env, long_tokens, device),
            "uncached": collector(env, long_tokens, device, policy_kwargs={"use_cache": False}),
        },
        repeats,
        sync,
    )
    n = n_envs * long_tokens
    return rate_row(
        "rollout: KV cache vs full recompute",
        n,
        (t, c),
        ("cached", "uncached"),
        "tokens/s",
        f"{notes}, {n_envs} envs, {long_tokens}-token episodes (no EOS); baseline use_cache=False",
    )


def rollout_gpt2_small(
    n_envs: int = 16, tokens: int = 32, repeats: int = 3, device: Any = "auto", config: dict[str, int] | None = None
) -> dict:
    """Rollout tokens/s of a GPT-2-small-size model against its ``generate``, no EOS (every row makes ``tokens``).

    :param config: Another GPT-2 config (default :data:`GPT2_SMALL`).
    :return: A row (target: at least 1.0x).
    """
    config = config or GPT2_SMALL
    lm = gpt2_small(config)
    t, c = interleaved(
        {
            "ours": collector(text_env(n_envs, tokens, device, eos=False), tokens, device, lm=lm),
            "generate": generator(n_envs, tokens, device, lm=lm),
        },
        repeats,
        synchronizer(_resolved(device)),
    )
    n = n_envs * tokens
    return rate_row(
        "rollout: collect_rollouts vs generate, GPT-2-small size, no EOS",
        n,
        (t, c),
        ("ours", "generate"),
        "tokens/s",
        f"TextGen-v0 with the bundled tokenizer (1,229 actions), a {config['n_layer']} x {config['n_embd']} GPT-2 "
        f"({config['vocab_size']:,}-token vocabulary, random "
        f"weights), GRPO defaults, {n_envs} envs, {tokens}-token episodes (no EOS), device {device}",
        target=(">=", 1.0),
    )


def reward_cost(n_envs: int = 16, tokens: int = 32, rollouts: int = 1, repeats: int = 3, device: Any = "auto") -> dict:
    """Seconds of a rollout with the env's default reward (TextGen-v0: VADER) against a reward that costs nothing,
    EOS on, GRPO defaults: what the reward adds to the rollout's wall time.

    :return: A row: ``ratio`` = default / zero-cost time (target: at most 1.1x).
    """
    timers = {}
    for name, kw in (("default", {}), ("zero", {"reward": zero_reward})):
        collect = collector(text_env(n_envs, tokens, device, **kw), tokens, device)
        timers[name] = lambda f=collect: [f() for _ in range(rollouts)]
    t, c = interleaved(timers, repeats, synchronizer(_resolved(device)))
    return make_row(
        "rollout: default reward (VADER) vs zero-cost reward",
        t["default"],
        t["zero"],
        "s/rollout",
        f"TextGen-v0, bundled LM, GRPO defaults, {n_envs} envs x {tokens} steps x {rollouts} rollout(s), EOS on, "
        f"device {device}; ratio = slowdown",
        False,
        cpu=(c["default"], c["zero"]),
        target=("<=", 1.1),
        slowdown=True,
    )


def _resolved(device: Any) -> Any:
    from textrl_envs.devices import resolve_device

    return resolve_device(device)
