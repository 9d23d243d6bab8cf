"""Coherence under a reference causal LM: how predictable a completion is, given its prompt."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from textrl_envs.hf_loading import no_progress_bars
from textrl_envs.rewards.base import RewardModel
from textrl_envs.rewards.metrics import row_nll, scored_rows
from textrl_envs.rewards.registry import register_reward
from textrl_envs.validation import check_float, check_int


@register_reward("coherence")
class Coherence(RewardModel):
    """Fluency of the completion under a frozen reference LM, scaled to ``[0, 1]``.

    Formula: with ``nll`` the mean negative log-likelihood (nats per token) of the completion's tokens, each
    given the prompt and the tokens before it, under the reference LM, and ``V`` its vocabulary size,
    ``r = clip(1 - nll / log V, 0, 1)``: 1 for text the LM finds certain, 0 for text no more likely than a
    uniform guess among ``V`` tokens (``log V`` is the NLL of the uniform distribution). An empty completion
    scores ``empty_score`` (0). Sequences past the LM's position limit keep their last tokens (as
    :func:`~textrl_envs.rewards.metrics.perplexity` does).

    The reference is the bundled LM by default: the same model the policy starts from, frozen, so the reward
    asks the policy not to drift into text its starting point would not write (a reward-side counterpart of a
    KL penalty).

    :param path: Local causal-LM directory (default: the bundled LM, :func:`textrl_envs.assets.lm_path`), a ``.gguf``
        file or a packaged model's name such as ``"smollm2-135m-instruct"`` (:func:`textrl_envs.gguf.gguf_folder`:
        converted once into a plain folder in the cache); its tokenizer is loaded from the same directory unless
        ``tokenizer`` is given. Nothing is downloaded.
    :param tokenizer: A tokenizer object or directory (default: the bundled tokenizer with the bundled LM).
    :param device: ``"cpu"`` (default), ``"auto"`` (CUDA when available), ``"cuda:0"``, a ``torch.device``.
    :param batch_size: Texts per forward pass.
    :param empty_score: Reward of a completion with no token.
    :param name: Name used in messages and logs.
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        tokenizer: Any = None,
        device: Any = "cpu",
        batch_size: int = 32,
        empty_score: float = 0.0,
        name: str | None = None,
    ) -> None:
        super().__init__(name or "coherence")
        batch_size = check_int("batch_size", batch_size, low=1, example=32)
        empty_score = check_float("empty_score", empty_score, example=0.0)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from textrl_envs.assets import lm_path, tokenizer_path
        from textrl_envs.gguf import gguf_folder, is_gguf_name

        if path is None:
            path = lm_path()
            tokenizer = tokenizer_path() if tokenizer is None else tokenizer
        elif is_gguf_name(path):  # its plain folder, converted once into the cache
            path = gguf_folder(path)
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(
                f"reference LM path {path!r} is not a directory; pass a local Hugging Face causal-LM directory, a "
                ".gguf file or a packaged model's name (nothing is downloaded)"
            )
        self.path = path
        if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer or path))
        self.tokenizer = tokenizer
        with no_progress_bars():
            self.model = AutoModelForCausalLM.from_pretrained(path)
        self.model.eval()
        self.batch_size = batch_size
        self.empty_score = float(empty_score)
        self.log_vocab = math.log(int(self.model.config.vocab_size))
        self.limit = getattr(self.model.config, "n_positions", None) or getattr(
            self.model.config, "max_position_embeddings", None
        )
        self.to(device)

    def to(self, device: Any) -> Coherence:
        """Move the reference LM to ``device`` (``"auto"`` allowed)."""
        from textrl_envs.devices import resolve_device

        self.device = resolve_device(device)
        self.model.to(self.device)
        return self

    def mean_nll(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        """Mean NLL per completion token (nats), ``nan`` for a completion with no token."""
        out = np.full(len(completions), np.nan)
        keep = [i for i, c in enumerate(completions) if c]
        if not keep:
            return out
        rows = scored_rows([completions[i] for i in keep], self.tokenizer, [prompts[i] for i in keep], self.limit)
        if len(rows) != len(keep):  # a completion that tokenizes to nothing: score them one by one
            for i in keep:
                one = scored_rows([completions[i]], self.tokenizer, [prompts[i]], self.limit)
                if one:
                    nll, n = row_nll(self.model, one, 1)
                    out[i] = nll[0] / n[0]
            return out
        nll, n = row_nll(self.model, rows, self.batch_size)
        out[keep] = nll / np.maximum(n, 1)
        return out

    def score(self, prompts: list[str], completions: list[str], **_metadata: Any) -> np.ndarray:
        nll = self.mean_nll(list(prompts), list(completions))
        scores = np.clip(1.0 - nll / self.log_vocab, 0.0, 1.0)
        return np.where(np.isnan(nll), self.empty_score, scores)

    def __repr__(self) -> str:
        return f"Coherence(path={self.path!r}, device={str(self.device)!r})"
