"""Evaluation metrics to report beside the reward, as pure functions over lists of texts.

Words are whitespace-separated tokens (``text.split()``), case kept. Empty inputs give 0.0 rather
than an error, so the metrics can be logged for any batch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from textrl_envs.hf_loading import no_progress_bars


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The ``n``-grams of a word list, in order (empty when there are fewer than ``n`` words)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_ratio(text: str, n: int) -> float:
    """Unique ``n``-grams / ``n``-grams within one text (1.0 when it has no ``n``-gram)."""
    grams = ngrams(text.split(), n)
    return len(set(grams)) / len(grams) if grams else 1.0


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct-n (Li et al., 2016): unique ``n``-grams over all texts / total ``n``-grams.

    Corpus-level: an ``n``-gram repeated across texts counts once in the numerator. Range ``[0, 1]``
    (0.0 when there is no ``n``-gram at all).
    """
    grams = [g for t in texts for g in ngrams(t.split(), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(texts: Sequence[str], n: int = 2) -> float:
    """Mean within-text repetition: ``1 - unique n-grams / n-grams`` of each text, averaged.

    Texts with fewer than ``n`` words are left out of the mean (0.0 when none is left). Range
    ``[0, 1)``; 0 means no ``n``-gram repeats inside any text (the "rep-n" of Welleck et al., 2020).
    """
    rates = [1.0 - distinct_ratio(t, n) for t in texts if len(t.split()) >= n]
    return sum(rates) / len(rates) if rates else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of Chen et al. (2021, arXiv 2107.03374): ``1 - C(n - c, k) / C(n, k)``.

    The probability that at least one of ``k`` samples drawn without replacement from ``n`` samples, ``c`` of which
    are correct, is correct. Computed as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``, which needs no large
    binomials; 1.0 when ``n - c < k`` (every draw of ``k`` holds a correct sample).

    :param n: Samples drawn for the problem (>= 1).
    :param c: Correct samples among them (0 <= c <= n).
    :param k: The ``k`` of pass@k (1 <= k <= n).
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_length(texts: Sequence[str], tokenizer: Any = None) -> float:
    """Mean length of the texts: in words, or in tokens of ``tokenizer`` (no special tokens added).

    0.0 for an empty list.
    """
    if not texts:
        return 0.0
    if tokenizer is None:
        lengths = [len(t.split()) for t in texts]
    else:
        lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return sum(lengths) / len(lengths)


def perplexity(
    texts: Sequence[str],
    model: Any,
    tokenizer: Any = None,
    prompts: Sequence[str] | None = None,
    batch_size: int = 16,
    device: Any = None,
) -> float:
    """Perplexity of the texts under a reference causal LM: ``exp(total NLL / total scored tokens)``.

    Token-weighted over the whole list. With ``prompts`` the text of example ``i`` is
    ``prompts[i]`` followed by ``texts[i]`` (tokenized separately and joined, as the environment
    builds them) and only the completion's tokens are scored, each given everything before it.
    Without ``prompts`` each text is scored from its start: the tokenizer's BOS token (or EOS, as
    GPT-2 uses it) is put in front when it has one, otherwise the first token is not scored.
    Sequences longer than the model's position limit keep their last tokens.

    :param texts: Completions (or whole texts).
    :param model: A causal LM (``transformers`` model) or a local directory to load one from.
    :param tokenizer: Its tokenizer (object or local directory); default: loaded from ``model``'s path.
    :param prompts: Prompts aligned with ``texts`` (optional).
    :param batch_size: Sequences per forward pass.
    :param device: Where to run (default: where the model is; ``"auto"`` picks CUDA when available).
    :raises ValueError: if no token is scored at all (e.g. all completions empty).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if prompts is not None and len(prompts) != len(texts):
        raise ValueError(f"prompts has {len(prompts)} items but texts has {len(texts)}; they must align")
    if isinstance(model, (str, os.PathLike)):
        if tokenizer is None:
            tokenizer = model
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(os.fspath(model))
    if tokenizer is None:
        raise ValueError("perplexity needs the model's tokenizer when the model is an object")
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer))
    if device is not None:
        from textrl_envs.devices import resolve_device

        model.to(resolve_device(device))
    limit = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    rows = scored_rows(texts, tokenizer, prompts, limit)
    if not rows:
        raise ValueError("perplexity: no completion token to score (are all completions empty?)")
    was_training = model.training
    model.eval()
    total_nll, total_n = _sum_nll(model, rows, batch_size)
    if was_training:
        model.train()
    return math.exp(total_nll / total_n)


def scored_rows(
    texts: Sequence[str], tokenizer: Any, prompts: Sequence[str] | None, limit: int | None
) -> list[tuple[list[int], int]]:
    """Each example's token ids and the index of its first scored token, as :func:`perplexity` scores them
    (examples left with no token to score are dropped).

    :param texts: Completions (or whole texts).
    :param tokenizer: The model's tokenizer.
    :param prompts: Prompts aligned with ``texts``, or ``None`` (then BOS, or EOS, goes in front when there is one).
    :param limit: The model's position limit (longer sequences keep their last tokens), or ``None``.
    """
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id

    def enc(s: str) -> list[int]:
        return list(tokenizer(s, add_special_tokens=False)["input_ids"])

    rows: list[tuple[list[int], int]] = []  # (ids, index of the first scored token)
    for i, t in enumerate(texts):
        if prompts is not None:
            ctx = enc(prompts[i])
        else:
            ctx = [start_id] if start_id is not None else []
        comp = enc(t)
        ids = ctx + comp
        first = max(len(ctx), 1)
        if limit and len(ids) > limit:
            cut = len(ids) - limit
            ids, first = ids[cut:], max(first - cut, 1)
        if len(ids) > first:
            rows.append((ids, first))
    return rows


def _sum_nll(model: Any, rows: Sequence[tuple[list[int], int]], batch_size: int) -> tuple[float, int]:
    """Total negative log-likelihood of the scored tokens of ``rows`` under ``model`` and their number.

    :param model: The causal LM (in eval mode), on the device it runs on.
    :param rows: ``(ids, first)`` pairs from :func:`scored_rows`: tokens ``first..`` are scored.
    :param batch_size: Sequences per forward pass.
    """
    nll, n = row_nll(model, rows, batch_size)
    return float(nll.sum()), int(n.sum())


def row_nll(model: Any, rows: Sequence[tuple[list[int], int]], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the negative log-likelihood of its scored tokens under ``model``, and their number.

    :param model: The causal LM (in eval mode), on the device it runs on.
    :param rows: ``(ids, first)`` pairs: tokens ``first..`` of ``ids`` are scored, each given those before it.
    :param batch_size: Sequences per forward pass.
    :return: ``(nll, n)``, float64 and int64 arrays of ``len(rows)``.
    """
    import torch

    dev = next(model.parameters()).device
    nll_rows = np.zeros(len(rows), dtype=np.float64)
    n_rows = np.zeros(len(rows), dtype=np.int64)
    with torch.no_grad():
        for s in range(0, len(rows), batch_size):
            batch = rows[s : s + batch_size]
            width = max(len(r) for r, _ in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            score = torch.zeros((len(batch), width), dtype=torch.bool)
            for j, (r, first) in enumerate(batch):
                ids[j, : len(r)] = torch.tensor(r)
                mask[j, : len(r)] = 1
                score[j, first : len(r)] = True
            ids, mask, score = ids.to(dev), mask.to(dev), score.to(dev)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
            m = score[:, 1:]
            nll_rows[s : s + len(batch)] = (nll * m).sum(dim=1).double().cpu().numpy()
            n_rows[s : s + len(batch)] = m.sum(dim=1).cpu().numpy()
    return nll_rows, n_rows
