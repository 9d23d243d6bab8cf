"""Constraint rewards: keyword coverage, length limits, repetition."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from textrl_envs.rewards.base import RewardModel
from textrl_envs.rewards.metrics import distinct_ratio
from textrl_envs.rewards.registry import register_reward
from textrl_envs.validation import check_float, check_int

_VOWELS = set("aeiou")


def inflections(word: str) -> list[str]:
    """Simple English inflections of ``word`` that count as containing it.

    The word itself; ``+s``, ``+es``, ``+ed``, ``+d``, ``+ing``; for a final ``y`` after a
    consonant, ``-y+ies`` and ``-y+ied``; for a final ``e``, ``-e+ing``. For example ``story`` ->
    ``stories``; ``love`` -> ``loves, loved, loving``; ``music`` -> ``musics``. Irregular forms
    and doubled consonants are not covered.
    """
    w = word.casefold()
    forms = [w, w + "s", w + "es", w + "ed", w + "d", w + "ing"]
    if len(w) > 1 and w.endswith("y") and w[-2] not in _VOWELS:
        forms += [w[:-1] + "ies", w[:-1] + "ied"]
    if len(w) > 1 and w.endswith("e"):
        forms.append(w[:-1] + "ing")
    return list(dict.fromkeys(forms))


def keyword_pattern(keyword: str) -> re.Pattern:
    """Case-insensitive, word-boundary regex matching ``keyword`` or one of its :func:`inflections`.

    In a multi-word keyword only the last word is inflected; words may be separated by any whitespace.
    """
    words = keyword.split()
    if not words:
        raise ValueError(f"keyword {keyword!r} is empty")
    head = r"\s+".join(re.escape(w) for w in words[:-1])
    last = "|".join(re.escape(f) for f in sorted(inflections(words[-1]), key=len, reverse=True))
    body = (head + r"\s+" if head else "") + f"(?:{last})"
    return re.compile(rf"(?<!\w){body}(?!\w)", re.IGNORECASE)


def keyword_coverage(text: str, keywords: Sequence[str]) -> float:
    """Fraction of ``keywords`` present in ``text`` (see :func:`keyword_pattern`); 1.0 for no keywords."""
    if not keywords:
        return 1.0
    return sum(bool(keyword_pattern(k).search(text)) for k in keywords) / len(keywords)


@register_reward("keywords")
class KeywordCoverage(RewardModel):
    """Fraction of the example's keywords that appear in the completion.

    Formula: ``r = |{k in keywords : k occurs in completion}| / |keywords|``, range ``[0, 1]``
    (1.0 for an empty keyword list). A keyword occurs when it, or a simple inflection of it
    (:func:`inflections`: ``+s/es/ed/d/ing``, ``y -> ies/ied``, ``e -> ing``), appears as a whole
    word, case-insensitively. Example: keywords ``["music", "ending"]``, completion ``"The Music
    was loud."`` gives 0.5.

    Needs the per-example metadata ``keywords`` (a list of strings, or one comma-separated string).

    :param include_prompt: Also search the prompt (off by default: the prompt lists the keywords).
    :param name: Name used in messages and logs.
    """

    required_kwargs = ("keywords",)

    def __init__(self, include_prompt: bool = False, name: str | None = None) -> None:
        super().__init__(name or "keywords")
        self.include_prompt = include_prompt

    def score(
        self, prompts: list[str], completions: list[str], keywords: Sequence[Any] = (), **_metadata: Any
    ) -> list[float]:
        out = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            kws = keywords[i]
            if kws is None:
                raise ValueError(
                    f"reward {self.name!r} has no 'keywords' for example #{i} (prompt {p!r}); give prompts as "
                    "dicts {'prompt': ..., 'keywords': [...]}, or pick a prompt from the env's list"
                )
            if isinstance(kws, str):
                kws = [k.strip() for k in kws.split(",") if k.strip()]
            out.append(keyword_coverage(p + " " + c if self.include_prompt else c, list(kws)))
        return out


@register_reward("length")
class LengthPenalty(RewardModel):
    """Penalty for a completion whose length falls outside ``[min_words, max_words]``.

    With ``n = len(completion.split())`` and ``d`` the distance to the allowed range
    (``min_words - n`` below it, ``n - max_words`` above it, 0 inside):

    ``r = -min(cap, per_word * d)``, range ``[-cap, 0]``.

    Example (``min_words=5, max_words=20``, defaults ``per_word=0.1, cap=1``): 3 words give -0.2,
    12 words give 0, 23 words give -0.3, no words give -0.5.

    :param min_words: Fewest words without penalty (>= 0).
    :param max_words: Most words without penalty (``None``: no upper limit).
    :param per_word: Penalty per word outside the range.
    :param cap: Largest penalty.
    :param name: Name used in messages and logs.
    """

    def __init__(
        self,
        min_words: int = 0,
        max_words: int | None = None,
        per_word: float = 0.1,
        cap: float = 1.0,
        name: str | None = None,
    ) -> None:
        super().__init__(name or "length")
        min_words = check_int("min_words", min_words, low=0, example=5)
        if max_words is not None:
            max_words = check_int("max_words", max_words, low=0, example=20)
        per_word = check_float("per_word", per_word, low=0, example=0.1)
        cap = check_float("cap", cap, low=0, example=1.0)
        if max_words is not None and max_words < min_words:
            raise ValueError(f"need 0 <= min_words <= max_words; got min_words={min_words}, max_words={max_words}")
        if per_word < 0 or cap < 0:
            raise ValueError(f"per_word and cap must be >= 0; got {per_word} and {cap}")
        self.min_words, self.max_words, self.per_word, self.cap = min_words, max_words, float(per_word), float(cap)

    def distance(self, n_words: int) -> int:
        """Words outside the allowed range."""
        if n_words < self.min_words:
            return self.min_words - n_words
        if self.max_words is not None and n_words > self.max_words:
            return n_words - self.max_words
        return 0

    def score(self, prompts: list[str], completions: list[str], **_metadata: Any) -> list[float]:  # noqa: ARG002  (RewardModel.score signature)
        return [0.0 - min(self.cap, self.per_word * self.distance(len(c.split()))) for c in completions]


@register_reward("repetition")
class RepetitionPenalty(RewardModel):
    """Penalty for repeated word ``n``-grams inside the completion.

    Formula: ``r = -(1 - unique n-grams / n-grams)`` over the completion's words (``text.split()``,
    case kept), i.e. minus one minus its distinct-n ratio; 0 when it has fewer than ``n`` words.
    Range ``(-1, 0]``. Example (``n=2``): ``"the cat the cat"`` has bigrams ``the cat, cat the,
    the cat``: ``r = -(1 - 2/3) = -1/3``.

    :param n: The ``n``-gram order (>= 1).
    :param name: Name used in messages and logs.
    """

    def __init__(self, n: int = 2, name: str | None = None) -> None:
        super().__init__(name or "repetition")
        self.n = check_int("n", n, low=1, example=2)

    def score(self, prompts: list[str], completions: list[str], **_metadata: Any) -> list[float]:  # noqa: ARG002  (RewardModel.score signature)
        return [0.0 - (1.0 - distinct_ratio(c, self.n)) for c in completions]
