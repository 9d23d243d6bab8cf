"""A short supervised warm start: teach a causal LM a text env's answer format before RL.

The bundled LM learned its own synthetic corpus; on a reasoning-gym task it has never seen the question format,
so it almost never answers and RL has no reward to climb. A few hundred steps of teacher forcing on
``(prompt, answer)`` pairs (cross-entropy on the answer tokens and EOS only, the "cold start" SFT before RL of
DeepSeek-R1, arXiv 2501.12948) teach it the format; RL then starts from a policy that sometimes answers right.

The pairs come from any text env whose prompts carry an ``answer`` column (``ReasoningGym-v0``,
``Arithmetic-v0``, a data file with an ``answer`` column). Use other items for the warm start than for RL
and evaluation (for ``ReasoningGym-v0``, another generator ``seed``)::

    sb3-grpo warm-start --env ReasoningGym-v0 --env-kwargs '{"task": "chain_sum", "seed": 1}' --out runs/warm
    sb3-grpo compare --env ReasoningGym-v0 --env-kwargs '{"task": "chain_sum"}' \\
        --set '*.policy_kwargs={"model": "runs/warm"}'
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from sb3_grpo.file_io import atomic_folder, write_json_atomic

#: File of the warm start's record (command, settings, losses) in its out dir.
RECORD_FILE = "warm_start.json"


def answer_examples(text_spec: Any) -> list[tuple[list[int], list[int]]]:
    """``(prompt_ids, target_ids)`` per prompt of a text env: the prompt as the env shows it, and the answer's
    tokens then EOS (cut to the env's ``max_new_tokens``).

    :param text_spec: The env's :class:`~textrl_envs.core.EpisodeSpec` (``env.unwrapped.text_spec``).
    :raises ValueError: when the prompts have no ``answer`` column.
    """
    answers = text_spec.metadata.get("answer")
    if answers is None:
        raise ValueError(
            f"a warm start needs prompts with an 'answer' column; these prompts have {sorted(text_spec.metadata)} "
            "(ReasoningGym-v0 and Arithmetic-v0 have one, and so does a prompt file with an 'answer' column)"
        )
    tok, eos = text_spec.tokenizer, text_spec.eos_token_id
    examples = []
    for ids, answer in zip(text_spec.prompt_ids, answers):
        target = tok(str(answer), add_special_tokens=False)["input_ids"]
        target = target[: text_spec.max_new_tokens - (eos is not None)] + ([eos] if eos is not None else [])
        examples.append(([int(i) for i in ids], [int(i) for i in target]))
    return examples


def batch_tensors(examples: list[tuple[list[int], list[int]]], pad_id: int):
    """Left-padded ``input_ids``, ``attention_mask``, ``position_ids`` and ``labels`` (``-100`` but on the targets)
    of a batch, with the policy's position rule (:func:`~sb3_grpo.policies.windows.positions_from_mask`)."""
    import torch as th

    from sb3_grpo.policies.windows import positions_from_mask

    width = max(len(p) + len(t) for p, t in examples)
    ids = th.full((len(examples), width), pad_id, dtype=th.long)
    mask = th.zeros_like(ids)
    labels = th.full_like(ids, -100)
    for row, (prompt, target) in enumerate(examples):
        seq = prompt + target
        ids[row, width - len(seq) :] = th.tensor(seq)
        mask[row, width - len(seq) :] = 1
        labels[row, width - len(target) :] = th.tensor(target)
    return ids, mask, positions_from_mask(mask), labels


def supervised_warm_start(
    lm: Any,
    examples: list[tuple[list[int], list[int]]],
    pad_id: int,
    steps: int = 200,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Fine-tune ``lm`` in place on the targets of ``examples`` (Adam, batches drawn with replacement).

    :param lm: A Hugging Face causal LM.
    :param examples: ``(prompt_ids, target_ids)`` pairs (:func:`answer_examples`).
    :param pad_id: The padding id.
    :param steps: Optimizer steps.
    :param batch_size: Examples per step.
    :param learning_rate: Adam's learning rate.
    :param seed: Seed of the batch draws.
    :return: The loss of every step.
    """
    import torch as th

    if not examples:
        raise ValueError("no examples to warm-start on")
    rng = np.random.default_rng(seed)
    optimizer = th.optim.Adam(lm.parameters(), lr=learning_rate)
    device = next(lm.parameters()).device
    lm.train()
    losses = []
    for _ in range(steps):
        chosen = [examples[i] for i in rng.integers(len(examples), size=batch_size)]
        ids, mask, positions, labels = (t.to(device) for t in batch_tensors(chosen, pad_id))
        loss = lm(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels).loss
        if not th.isfinite(loss):
            raise FloatingPointError(f"the warm-start loss became {loss.item()} at step {len(losses)}; lower --lr")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    lm.eval()
    return losses


def run_warm_start(
    env_id: str,
    env_kwargs: dict[str, Any],
    out: Path,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    model: str | None = None,
    command: str = "",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Warm-start ``model`` (a folder or a Hub id; default: the bundled LM) on ``env_id``'s answers and save it, with
    its tokenizer and :data:`RECORD_FILE`, to ``out`` (a folder ``CausalLMPolicy(model=out)`` loads).

    The folder appears only once it is complete (:func:`~sb3_grpo.file_io.atomic_folder`): a failure (a full disk,
    Ctrl-C) leaves no folder with a config and no weights, and an existing ``out`` is kept until the new one is whole.

    :param overwrite: Replace an existing ``out`` (else it is refused before anything is trained).
    :return: The record (also written to ``out / RECORD_FILE``).
    :raises ValueError: ``out`` exists (without ``overwrite``) or is a file, or the env is not a text env.
    """
    import gymnasium as gym
    import torch as th
    from transformers import AutoModelForCausalLM

    import textrl_envs  # noqa: F401  (registers the ids)
    from textrl_envs.assets import lm_path

    check_warm_start_out(out, overwrite)
    env = gym.make(env_id, **env_kwargs)
    spec = getattr(env.unwrapped, "text_spec", None)
    if spec is None:
        raise ValueError(
            f"--env {env_id} is not a text env (it has no prompts and answers to learn from); give a text env id, "
            "e.g. ReasoningGym-v0 or Arithmetic-v0"
        )
    examples = answer_examples(spec)
    th.manual_seed(seed)
    source = os.fspath(model or lm_path())
    if os.path.isdir(source):
        lm = AutoModelForCausalLM.from_pretrained(source, local_files_only=True)
    else:  # a Hub id: from the Hugging Face cache (HF_HUB_OFFLINE=1), or downloaded when online
        from textrl_envs.hf_loading import load_from_hub

        lm = load_from_hub(AutoModelForCausalLM.from_pretrained, source, "warm-start model")
    start = time.perf_counter()
    losses = supervised_warm_start(lm, examples, spec.pad_token_id, steps, batch_size, learning_rate, seed)
    record = {
        "command": command,
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "model": os.fspath(source),
        "examples": len(examples),
        "steps": steps,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "seed": seed,
        "loss_first": losses[0],
        "loss_last": float(np.mean(losses[-10:])),
        "time_s": round(time.perf_counter() - start, 1),
        "losses": losses,
    }
    with atomic_folder(out, overwrite=overwrite) as tmp:
        lm.save_pretrained(tmp)
        spec.tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / RECORD_FILE, record)
    return record


def check_warm_start_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` that is a file, or an existing folder without ``--overwrite``.

    :raises ValueError: naming ``--out`` and what to do.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder path for the model (it is created)")
    if out.exists() and not overwrite:
        raise ValueError(f"--out {out} already exists; pass --overwrite to replace it, or choose another --out")
