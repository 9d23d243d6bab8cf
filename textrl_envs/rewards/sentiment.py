"""Sentiment rewards: a lexicon scorer (VADER) and a Hugging Face sequence classifier.

Both score the completion alone by default (``include_prompt=False``): the reward then reflects
only what the agent wrote. Pass ``include_prompt=True`` to score ``prompt + completion`` instead, as
TRL's IMDB example does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from textrl_envs.hf_loading import no_progress_bars
from textrl_envs.rewards.base import RewardModel
from textrl_envs.rewards.registry import register_reward
from textrl_envs.validation import check_float, check_int

SENTIMENT_SCALES = ("compound", "prob")
CLASSIFIER_OUTPUTS = ("prob", "logit")


def _texts(prompts: Sequence[str], completions: Sequence[str], include_prompt: bool) -> list[str]:
    if include_prompt:
        return [p + c for p, c in zip(prompts, completions)]
    return list(completions)


@register_reward("sentiment")
class LexiconSentiment(RewardModel):
    """Lexicon sentiment with VADER (``vaderSentiment``): positive text scores high.

    Formula: ``c = VADER compound score`` of the text, in ``[-1, 1]`` (0 for an empty or neutral
    text). With ``scale="compound"`` (default) the reward is ``c``, range ``[-1, 1]``; with
    ``scale="prob"`` it is ``(c + 1) / 2``, range ``[0, 1]``.

    :param scale: ``"compound"`` or ``"prob"``.
    :param include_prompt: Score ``prompt + completion`` instead of the completion alone.
    :param name: Name used in messages and logs.
    """

    def __init__(self, scale: str = "compound", include_prompt: bool = False, name: str | None = None) -> None:
        super().__init__(name or "sentiment")
        if scale not in SENTIMENT_SCALES:
            raise ValueError(f"scale must be one of {SENTIMENT_SCALES}, got {scale!r}")
        self.scale = scale
        self.include_prompt = include_prompt
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        self._analyzer = SentimentIntensityAnalyzer()

    def compound(self, text: str) -> float:
        """VADER compound score of ``text`` in ``[-1, 1]``."""
        return float(self._analyzer.polarity_scores(text)["compound"])

    def score(self, prompts: list[str], completions: list[str], **_metadata: Any) -> list[float]:
        values = [self.compound(t) for t in _texts(prompts, completions, self.include_prompt)]
        if self.scale == "prob":
            values = [(v + 1.0) / 2.0 for v in values]
        return values


@register_reward("classifier")
class HFClassifierReward(RewardModel):
    """A Hugging Face sequence classifier, loaded from a local directory, as a reward model.

    Formula: with ``z = model(text).logits`` (one row per text), ``k`` the index of ``label``:
    ``output="prob"`` (default) gives ``softmax(z)[k]`` in ``[0, 1]`` (``sigmoid(z[0])`` for a
    single-logit model); ``output="logit"`` gives the raw ``z[k]`` (unbounded).

    Texts are scored in batches of ``batch_size`` under ``torch.no_grad()``, truncated to
    ``max_length`` tokens (default: the model's position limit, or the tokenizer's
    ``model_max_length``). A text that is empty or only whitespace gets ``empty_score`` (default 0.0,
    so that stopping at once earns nothing; a tiny classifier can score a lone EOS token as very
    positive); with ``empty_score=None`` it is scored as the single EOS token (or pad, or token 0).

    :param path: Local model directory (default: the bundled classifier,
        :func:`textrl_envs.assets.classifier_path`). Nothing is downloaded.
    :param label: Name of the label whose score is the reward (matched case-insensitively against
        ``model.config.id2label``), e.g. ``"POSITIVE"``.
    :param output: ``"prob"`` or ``"logit"``.
    :param device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda:0"``, a ``torch.device``.
    :param batch_size: Texts per forward pass.
    :param max_length: Truncation length in tokens.
    :param include_prompt: Score ``prompt + completion`` instead of the completion alone.
    :param empty_score: Reward of an empty (or whitespace-only) text; ``None`` runs the model on it.
    :param name: Name used in messages and logs.
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        label: str = "POSITIVE",
        output: str = "prob",
        device: Any = "auto",
        batch_size: int = 32,
        max_length: int | None = None,
        include_prompt: bool = False,
        empty_score: float | None = 0.0,
        name: str | None = None,
    ) -> None:
        super().__init__(name or "classifier")
        self.empty_score = None if empty_score is None else check_float("empty_score", empty_score, example=0.0)
        if output not in CLASSIFIER_OUTPUTS:
            raise ValueError(f"output must be one of {CLASSIFIER_OUTPUTS}, got {output!r}")
        batch_size = check_int("batch_size", batch_size, low=1, example=32)
        if max_length is not None:
            max_length = check_int(
                "max_length", max_length, low=1, hint="pass None (the model's limit) or a token count, e.g. 512"
            )
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if path is None:
            from textrl_envs.assets import classifier_path

            path = classifier_path()
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(
                f"classifier path {path!r} is not a directory; pass a local Hugging Face model directory "
                "(nothing is downloaded)"
            )
        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        with no_progress_bars():
            self.model = AutoModelForSequenceClassification.from_pretrained(path)
        self.model.eval()
        if self.tokenizer.pad_token_id is None:
            if self.tokenizer.eos_token is None:
                raise ValueError(f"the tokenizer in {path!r} has neither a pad nor an EOS token; set one")
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if getattr(self.model.config, "pad_token_id", None) is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.label = label
        self.label_index = self._label_index(label)
        self.output = output
        self.batch_size = batch_size
        self.include_prompt = include_prompt
        limits = [getattr(self.model.config, k, None) for k in ("max_position_embeddings", "n_positions")] + [
            getattr(self.tokenizer, "model_max_length", None)
        ]
        limits = [int(x) for x in limits if isinstance(x, int) and 0 < x < 1_000_000]
        self.max_length = int(max_length) if max_length is not None else (min(limits) if limits else 512)
        from textrl_envs.devices import resolve_device

        self.device = resolve_device(device)
        self.model.to(self.device)

    def _label_index(self, label: str) -> int:
        id2label = {int(k): str(v) for k, v in (self.model.config.id2label or {}).items()}
        for i, name in id2label.items():
            if name.casefold() == str(label).casefold():
                return i
        raise ValueError(
            f"label {label!r} is not one of the classifier's labels {sorted(id2label.values())}; "
            "pass label=<one of them>"
        )

    def to(self, device: Any) -> HFClassifierReward:
        """Move the classifier to ``device`` (``"auto"`` allowed)."""
        from textrl_envs.devices import resolve_device

        self.device = resolve_device(device)
        self.model.to(self.device)
        return self

    def _encode(self, texts: list[str]):
        import torch

        tok = self.tokenizer
        enc = tok(texts, truncation=True, max_length=self.max_length)
        fill = tok.eos_token_id if tok.eos_token_id is not None else (tok.pad_token_id or 0)
        rows = [ids if len(ids) else [fill] for ids in enc["input_ids"]]
        width = max(len(r) for r in rows)
        pad = tok.pad_token_id
        left = getattr(tok, "padding_side", "right") == "left"
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            sl = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, sl] = torch.tensor(r, dtype=torch.long)
            mask[i, sl] = 1
        return ids.to(self.device), mask.to(self.device)

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        """Raw classifier logits, shape ``(len(texts), num_labels)``."""
        import torch

        out = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                ids, mask = self._encode(list(texts[start : start + self.batch_size]))
                out.append(self.model(input_ids=ids, attention_mask=mask).logits.float().cpu())
        if not out:
            return np.zeros((0, int(self.model.config.num_labels)))
        return torch.cat(out).numpy()

    def score(self, prompts: list[str], completions: list[str], **_metadata: Any) -> np.ndarray:
        texts = _texts(prompts, completions, self.include_prompt)
        out = np.full(len(texts), np.nan if self.empty_score is None else self.empty_score, dtype=np.float64)
        run = [i for i, t in enumerate(texts) if self.empty_score is None or t.strip()]
        if run:
            out[run] = self._label_scores(self.logits([texts[i] for i in run]).astype(np.float64))
        return out

    def _label_scores(self, z: np.ndarray) -> np.ndarray:
        if self.output == "logit":
            return z[:, self.label_index]
        if z.shape[1] == 1:
            return 1.0 / (1.0 + np.exp(-z[:, 0]))
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        return p[:, self.label_index]

    def __repr__(self) -> str:
        return (
            f"HFClassifierReward(path={self.path!r}, label={self.label!r}, output={self.output!r}, "
            f"device={str(self.device)!r})"
        )
