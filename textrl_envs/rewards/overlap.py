"""Overlap with reference texts: ROUGE-L (``rouge-score``) and sentence BLEU (``sacrebleu``) against ``references``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textrl_envs.rewards.base import RewardModel
from textrl_envs.rewards.registry import register_reward


def _reference_list(name: str, refs: Any, i: int, prompt: str) -> list[str]:
    if refs is None:
        raise ValueError(
            f"reward {name!r} has no 'references' for example #{i} (prompt {prompt!r}); give prompts as dicts "
            "{'prompt': ..., 'references': [...]}, or pick a prompt from the env's list"
        )
    if isinstance(refs, str):
        refs = [refs]
    refs = [str(r) for r in refs]
    if not refs:
        raise ValueError(f"reward {name!r}: example #{i} (prompt {prompt!r}) has an empty 'references' list")
    return refs


@register_reward("rouge-l")
class RougeL(RewardModel):
    """ROUGE-L F1 of the completion against its references, the best over the references.

    Formula: ``r = max_j F1_LCS(completion, references[j])`` where ``F1_LCS`` is ROUGE-L's
    F-measure (precision and recall of the longest common subsequence of lower-cased word tokens),
    computed by ``rouge_score.rouge_scorer.RougeScorer(["rougeL"])``. Range ``[0, 1]``; an empty
    completion scores 0. The Porter stemmer (``use_stemmer=True``, default) needs no downloaded data.

    Needs the per-example metadata ``references`` (a list of strings, or one string).

    :param use_stemmer: Stem words before matching (``"cats"`` matches ``"cat"``).
    :param name: Name used in messages and logs.
    """

    required_kwargs = ("references",)

    def __init__(self, use_stemmer: bool = True, name: str | None = None) -> None:
        super().__init__(name or "rouge-l")
        from rouge_score import rouge_scorer

        self.use_stemmer = use_stemmer
        self._scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=use_stemmer)

    def score(
        self, prompts: list[str], completions: list[str], references: Sequence[Any] = (), **_metadata: Any
    ) -> list[float]:
        out = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            refs = _reference_list(self.name, references[i], i, p)
            out.append(max(float(self._scorer.score(r, c)["rougeL"].fmeasure) for r in refs))
        return out


@register_reward("bleu")
class Bleu(RewardModel):
    """Sentence BLEU of the completion against all its references (``sacrebleu``), divided by 100.

    Formula: ``r = sacrebleu.metrics.BLEU(smooth_method, effective_order=True)
    .sentence_score(completion, references).score / 100``: the geometric mean of the modified
    1..4-gram precisions (smoothed; with ``effective_order`` only the orders the hypothesis has)
    times the brevity penalty against the closest reference length; all references count at once.
    Range ``[0, 1]`` (clipped: sacrebleu may return 100.00000000000004); an empty completion scores 0.

    Needs the per-example metadata ``references`` (a list of strings, or one string).

    :param smooth_method: ``"exp"`` (default), ``"floor"``, ``"add-k"`` or ``"none"``.
    :param tokenize: sacrebleu tokenizer name (default ``"13a"``).
    :param lowercase: Compare case-insensitively.
    :param name: Name used in messages and logs.
    """

    required_kwargs = ("references",)

    def __init__(
        self, smooth_method: str = "exp", tokenize: str = "13a", lowercase: bool = False, name: str | None = None
    ) -> None:
        super().__init__(name or "bleu")
        from sacrebleu.metrics import BLEU

        self._bleu = BLEU(smooth_method=smooth_method, tokenize=tokenize, lowercase=lowercase, effective_order=True)

    def score(
        self, prompts: list[str], completions: list[str], references: Sequence[Any] = (), **_metadata: Any
    ) -> list[float]:
        out = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            refs = [r.strip() for r in _reference_list(self.name, references[i], i, p)]
            out.append(min(1.0, float(self._bleu.sentence_score(c.strip(), refs).score) / 100.0))
        return out
