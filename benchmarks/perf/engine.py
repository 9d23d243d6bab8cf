"""The rollout engine's rows: GRPO's ``collect_rollouts`` with ``engine="hf"`` (the policy's built-in decoder computes a
whole turn per row, the env is stepped from per-row queues) against ``model.generate`` and against ``engine="step"``.

Both sides as in :mod:`.rollout`: GRPO's defaults (mixed exploration included), the env's own reward, every rollout
starting without cache; ``generate(do_sample=True)`` makes exactly ``tokens`` new tokens per row. "EOS on" lets
episodes end and auto-reset inside the loop (each reset decodes a new turn); "no EOS" runs every episode to its budget
(the bundled tokenizer with its EOS token removed).
"""

from __future__ import annotations

from typing import Any

from benchmarks.perf.rollout import GPT2_SMALL, _resolved, collector, generator, gpt2_small, text_env
from benchmarks.timing import interleaved, rate_row, synchronizer

__all__ = ["engine_vs_generate"]


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
