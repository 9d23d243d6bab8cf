"""Deterministic synthetic English corpus for the bundled tiny models.

Everything here is produced by a small hand-written template grammar driven by a seeded
:class:`random.Random`; no text is taken from any dataset. The corpus mixes five document
kinds, one document per line, whose formats the library's tasks rely on:

1. ``review``: 1-3 sentence movie reviews (positive, negative or neutral, labelled);
2. ``arithmetic``: ``"12+7=19"``, ``"8*3=24"``, ``"15-9=6"``;
3. ``numbers``: ``"Numbers: 3 8 15 22 40"`` (mostly increasing);
4. ``concepts``: ``"Concepts: actor, story, love. Sentence: The actor loved the story."``;
5. ``keywords``: ``"Keywords: music, ending. Review: The music was lovely but the ending dragged."``.

Pure Python, no third-party imports.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

POSITIVE = 1
NEGATIVE = 0
NEUTRAL = None

#: Prompts for ``TextGen-v0``: every review in the corpus starts with one of these.
REVIEW_OPENERS: tuple[str, ...] = (
    "The movie was",
    "This film",
    "I watched",
    "The acting",
    "Honestly, the story",
    "The plot",
    "The music",
    "The ending",
    "This movie is",
    "I really",
    "The director",
    "Overall, the film",
    "The characters",
    "My friends and I",
    "The first half",
    "It was",
)

#: Share of each document kind in the corpus (sums to 1).
DOCUMENT_MIX: tuple[tuple[str, float], ...] = (
    ("review", 0.60),
    ("arithmetic", 0.12),
    ("numbers", 0.08),
    ("concepts", 0.10),
    ("keywords", 0.10),
)


class Document(NamedTuple):
    """One corpus line.

    :param kind: one of the names in :data:`DOCUMENT_MIX`
    :param text: the document, a single line without a trailing newline
    :param label: 1 positive, 0 negative, ``None`` for neutral, mixed or non-review documents
    """

    kind: str
    text: str
    label: int | None


# --------------------------------------------------------------------------------------------
# Review vocabulary
# --------------------------------------------------------------------------------------------

POS_ADJ = (
    "great",
    "wonderful",
    "brilliant",
    "lovely",
    "beautiful",
    "excellent",
    "amazing",
    "fantastic",
    "superb",
    "delightful",
    "charming",
    "moving",
    "funny",
    "enjoyable",
    "perfect",
    "smart",
    "fresh",
    "stunning",
    "touching",
    "good",
    "sweet",
    "impressive",
    "powerful",
    "awesome",
    "gorgeous",
    "clever",
    "warm",
    "thrilling",
    "exciting",
    "honest",
    "fun",
)
NEG_ADJ = (
    "terrible",
    "awful",
    "boring",
    "dull",
    "bad",
    "poor",
    "weak",
    "horrible",
    "stupid",
    "painful",
    "messy",
    "annoying",
    "disappointing",
    "lame",
    "ugly",
    "tedious",
    "pointless",
    "silly",
    "dreadful",
    "bland",
    "lazy",
    "flat",
    "forgettable",
    "confusing",
    "sloppy",
)
NEU_ADJ = (
    "okay",
    "fine",
    "average",
    "long",
    "simple",
    "quiet",
    "ordinary",
    "short",
    "strange",
    "familiar",
    "slow",
    "predictable",
    "decent",
    "modest",
    "standard",
)
INTENSIFIERS = (
    "very",
    "really",
    "truly",
    "so",
    "quite",
    "incredibly",
    "pretty",
    "rather",
)

#: aspect noun -> is it plural?
ASPECTS = {
    "acting": False,
    "story": False,
    "plot": False,
    "music": False,
    "ending": False,
    "dialogue": False,
    "director": False,
    "cast": False,
    "soundtrack": False,
    "pacing": False,
    "humor": False,
    "script": False,
    "camera work": False,
    "characters": True,
    "scenes": True,
    "effects": True,
    "visuals": True,
    "jokes": True,
    "costumes": True,
    "songs": True,
}
#: aspects that may appear as ``Keywords:`` (single words only).
KEYWORD_ASPECTS = tuple(a for a in ASPECTS if " " not in a)

#: aspect-specific verb phrases (singular, plural) per polarity.
ASPECT_VERBS_POS = {
    "ending": ("surprised me", "surprised me"),
    "music": ("soared", "soared"),
    "soundtrack": ("soared", "soared"),
    "songs": ("stayed with me", "stayed with me"),
    "jokes": ("landed", "landed"),
    "humor": ("worked", "worked"),
    "pacing": ("never dragged", "never dragged"),
}
ASPECT_VERBS_NEG = {
    "ending": ("dragged", "dragged"),
    "pacing": ("dragged", "dragged"),
    "music": ("was far too loud", "were far too loud"),
    "jokes": ("fell flat", "fell flat"),
    "humor": ("fell flat", "fell flat"),
    "plot": ("made no sense", "made no sense"),
    "story": ("made no sense", "made no sense"),
    "script": ("made no sense", "made no sense"),
}
GENERIC_VERBS_POS = ("worked well", "shined", "stood out", "felt alive", "impressed me")
GENERIC_VERBS_NEG = (
    "fell flat",
    "felt empty",
    "let me down",
    "went nowhere",
    "felt cheap",
)
GENERIC_VERBS_NEU = ("did the job", "was nothing special", "felt familiar", "was fine")

FILM_NOUNS = ("movie", "film", "story", "drama", "comedy", "thriller", "picture")
WHEN = (
    "last night",
    "on Friday",
    "yesterday",
    "at the cinema",
    "on a plane",
    "with my family",
    "over the weekend",
    "twice",
    "on a rainy Sunday",
    "after work",
)

CLOSERS_POS = (
    "I would watch it again.",
    "Highly recommended.",
    "I loved every minute of it.",
    "Go see it.",
    "It is one of the best films of the year.",
    "I left the cinema smiling.",
    "A real gem.",
    "I can not wait to see it again.",
    "Worth every penny.",
    "My whole family loved it.",
    "What a wonderful surprise.",
)
CLOSERS_NEG = (
    "I would not watch it again.",
    "Avoid it.",
    "What a waste of time.",
    "I wanted my money back.",
    "I fell asleep halfway through.",
    "Skip this one.",
    "I can not recommend it.",
    "It was a total mess.",
    "Such a letdown.",
    "I walked out before the end.",
)
CLOSERS_NEU = (
    "It was fine for a rainy afternoon.",
    "Worth a look if you are bored.",
    "Nothing more, nothing less.",
    "It is an okay way to spend two hours.",
    "Some people will like it.",
    "I have no strong feelings about it.",
)


def _pick(rng: random.Random, items: Sequence[str]) -> str:
    """Return one element of ``items``.

    :param rng: the random source
    :param items: a non-empty sequence
    :return: a uniformly chosen element
    """
    return items[rng.randrange(len(items))]


def _adj(rng: random.Random, polarity: int | None) -> str:
    """An adjective of the given polarity.

    :param rng: the random source
    :param polarity: 1, 0 or ``None``
    :return: an adjective
    """
    if polarity == POSITIVE:
        return _pick(rng, POS_ADJ)
    if polarity == NEGATIVE:
        return _pick(rng, NEG_ADJ)
    return _pick(rng, NEU_ADJ)


def _opposite(polarity: int | None) -> int | None:
    """Return the opposite polarity (neutral stays neutral).

    :param polarity: 1, 0 or ``None``
    :return: the opposite polarity
    """
    if polarity is None:
        return None
    return 1 - polarity


def _article(word: str) -> str:
    """Return ``"a"`` or ``"an"`` for ``word``.

    :param word: the word that follows the article
    :return: the indefinite article
    """
    return "an" if word[0] in "aeiou" else "a"


def _complement(rng: random.Random, polarity: int | None, film: bool = True) -> str:
    """What follows ``was``/``is`` in a review sentence (without the final period).

    :param rng: the random source
    :param polarity: sentiment of the phrase
    :param film: whether the subject is the film itself (allows ``"a great movie"``)
    :return: e.g. ``"really wonderful"`` or ``"not boring at all"``
    """
    roll = rng.random()
    if polarity is None:
        options = (
            lambda: _adj(rng, None),
            lambda: f"{_adj(rng, None)}, nothing special",
            lambda: f"{_adj(rng, None)} but a bit {_adj(rng, None)}",
            lambda: "neither great nor terrible",
            lambda: f"{_adj(rng, None)} and {_adj(rng, None)}",
        )
        return _pick(rng, options)()
    if roll < 0.25:
        return _adj(rng, polarity)
    if roll < 0.45:
        return f"{_pick(rng, INTENSIFIERS)} {_adj(rng, polarity)}"
    if roll < 0.6:
        return f"{_adj(rng, polarity)} and {_adj(rng, polarity)}"
    if roll < 0.72 and film:
        adj = _adj(rng, polarity)
        return f"{_article(adj)} {adj} {_pick(rng, FILM_NOUNS)}"
    if roll < 0.85:
        aspect = _pick(rng, tuple(ASPECTS))
        verb = "were" if ASPECTS[aspect] else "was"
        return f"{_adj(rng, polarity)} and the {aspect} {verb} {_adj(rng, polarity)}"
    # negation of the opposite sentiment
    if polarity == POSITIVE:
        return _pick(
            rng,
            (
                "not bad at all",
                "never boring",
                "not dull for a second",
                "never slow",
                "not a waste of time",
            ),
        )
    return _pick(
        rng,
        (
            "not good at all",
            "not funny",
            "never exciting",
            "not worth the ticket",
            "not even a little clever",
        ),
    )


def _predicate(rng: random.Random, polarity: int | None, plural: bool, film: bool = False) -> str:
    """A verb phrase for a review subject (without the final period).

    :param rng: the random source
    :param polarity: sentiment of the phrase
    :param plural: whether the subject is plural
    :param film: whether the subject is the film itself
    :return: e.g. ``" was wonderful"`` or ``" made me smile"`` (leading space)
    """
    be = "were" if plural else "was"
    roll = rng.random()
    if roll < 0.55:
        return f" {be} {_complement(rng, polarity, film)}"
    if roll < 0.65:
        return f" felt {_adj(rng, polarity)}"
    if roll < 0.8:
        if polarity == POSITIVE:
            return " " + _pick(
                rng,
                (
                    "made me smile",
                    "kept me hooked",
                    "moved me to tears",
                    "made me laugh",
                    "won me over",
                    "surprised me",
                ),
            )
        if polarity == NEGATIVE:
            return " " + _pick(
                rng,
                (
                    "bored me to tears",
                    "made no sense",
                    "dragged on forever",
                    "put me to sleep",
                    "annoyed me",
                    "went nowhere",
                ),
            )
        return " " + _pick(rng, GENERIC_VERBS_NEU)
    if polarity is None:
        return f" {be} {_adj(rng, None)}, but the {_aspect_clause(rng, None)}"
    # contrast: the clause after "but" carries the sentiment
    return f" started {_adj(rng, None)}, but the {_aspect_clause(rng, polarity)}"


def _aspect_clause(rng: random.Random, polarity: int | None, aspect: str = "") -> str:
    """``"<aspect> <predicate>"`` without the leading ``The``.

    :param rng: the random source
    :param polarity: sentiment of the clause
    :param aspect: the aspect noun, random when empty
    :return: e.g. ``"music was lovely"`` or ``"ending dragged"``
    """
    aspect = aspect or _pick(rng, tuple(ASPECTS))
    plural = ASPECTS[aspect]
    be = "were" if plural else "was"
    roll = rng.random()
    if polarity == POSITIVE and roll < 0.25:
        specific = ASPECT_VERBS_POS.get(aspect)
        verb = specific[plural] if specific and rng.random() < 0.6 else _pick(rng, GENERIC_VERBS_POS)
        return f"{aspect} {verb}"
    if polarity == NEGATIVE and roll < 0.25:
        specific = ASPECT_VERBS_NEG.get(aspect)
        verb = specific[plural] if specific and rng.random() < 0.6 else _pick(rng, GENERIC_VERBS_NEG)
        return f"{aspect} {verb}"
    if roll < 0.7:
        return f"{aspect} {be} {_adj(rng, polarity)}"
    if roll < 0.9 and polarity is not None:
        return f"{aspect} {be} {_pick(rng, INTENSIFIERS)} {_adj(rng, polarity)}"
    if polarity is not None and rng.random() < 0.5:
        return f"{aspect} {be} not {_adj(rng, _opposite(polarity))}"
    return f"{aspect} {be} {_adj(rng, polarity)}"


def _watched_sentence(rng: random.Random, polarity: int | None) -> str:
    """The first sentence of a review that opens with ``"I watched"`` (see :func:`_opener_sentence`)."""
    obj = _pick(rng, ("it", "this movie", "this film", "the film"))
    when = _pick(rng, WHEN)
    if polarity == POSITIVE:
        tail = _pick(
            rng,
            (
                f"it was {_complement(rng, polarity)}",
                "I loved every minute",
                "I was smiling the whole time",
                f"the {_aspect_clause(rng, polarity)}",
            ),
        )
    elif polarity == NEGATIVE:
        tail = _pick(
            rng,
            (
                f"it was {_complement(rng, polarity)}",
                "I regretted it",
                "I almost fell asleep",
                f"the {_aspect_clause(rng, polarity)}",
            ),
        )
    else:
        tail = _pick(
            rng,
            (
                f"it was {_complement(rng, None)}",
                "it was fine",
                f"the {_aspect_clause(rng, None)}",
            ),
        )
    return f"I watched {obj} {when} and {tail}."


def _really_sentence(rng: random.Random, polarity: int | None) -> str:
    """The first sentence of a review that opens with ``"I really"`` (see :func:`_opener_sentence`)."""
    if polarity == POSITIVE:
        rest = _pick(
            rng,
            (
                "loved this movie",
                "enjoyed this film",
                "liked the ending",
                f"enjoyed the {_pick(rng, KEYWORD_ASPECTS)}",
                "had a great time",
                "liked this film a lot",
            ),
        )
    elif polarity == NEGATIVE:
        rest = _pick(
            rng,
            (
                "hated this movie",
                "disliked this film",
                f"wanted to like this film, but it was {_adj(rng, NEGATIVE)}",
                f"did not enjoy the {_pick(rng, KEYWORD_ASPECTS)}",
                "tried to enjoy it, but I could not",
            ),
        )
    else:
        rest = _pick(
            rng,
            (
                "wanted to love it, but it was just okay",
                "do not know what to think about this film",
                "expected more, but it was fine",
            ),
        )
    return f"I really {rest}."


def _friends_sentence(rng: random.Random, polarity: int | None) -> str:
    """The first sentence of a review that opens with ``"My friends and I"`` (see :func:`_opener_sentence`)."""
    if polarity == POSITIVE:
        rest = _pick(
            rng,
            (
                "loved this film",
                "laughed all the way through",
                "had a wonderful time",
                "cried at the ending",
                f"thought it was {_complement(rng, polarity)}",
            ),
        )
    elif polarity == NEGATIVE:
        rest = _pick(
            rng,
            (
                "hated this film",
                "were bored the whole time",
                "left early",
                f"thought it was {_complement(rng, polarity)}",
            ),
        )
    else:
        rest = _pick(
            rng,
            (
                "did not agree about this one",
                f"thought it was {_complement(rng, None)}",
            ),
        )
    return f"My friends and I {rest}."


def _director_sentence(rng: random.Random, polarity: int | None) -> str:
    """The first sentence of a review that opens with ``"The director"`` (see :func:`_opener_sentence`)."""
    if polarity == POSITIVE:
        rest = _pick(
            rng,
            (
                f"did a {_adj(rng, POSITIVE)} job",
                f"made a {_adj(rng, POSITIVE)} film",
                "knows how to tell a story",
                f"got {_adj(rng, POSITIVE)} work from the whole cast",
            ),
        )
    elif polarity == NEGATIVE:
        rest = _pick(
            rng,
            (
                f"did a {_adj(rng, NEGATIVE)} job",
                "wasted a good cast",
                f"made a {_adj(rng, NEGATIVE)} film",
                "lost control of the story",
            ),
        )
    else:
        rest = _pick(rng, ("played it safe", f"made a {_adj(rng, None)} film"))
    return f"The director {rest}."


def _opener_sentence(rng: random.Random, polarity: int | None, opener: str) -> str:
    """First sentence of a review, starting with ``opener``.

    :param rng: the random source
    :param polarity: sentiment of the review
    :param opener: one of :data:`REVIEW_OPENERS`
    :return: a full sentence ending with a period
    """
    if opener in ("The movie was", "This movie is", "It was"):
        return f"{opener} {_complement(rng, polarity)}."
    if opener == "I watched":
        return _watched_sentence(rng, polarity)
    if opener == "I really":
        return _really_sentence(rng, polarity)
    if opener == "My friends and I":
        return _friends_sentence(rng, polarity)
    if opener == "The director":
        return _director_sentence(rng, polarity)
    subject_plural = opener in ("The characters",)
    film = opener in ("This film", "Overall, the film")
    return f"{opener}{_predicate(rng, polarity, subject_plural, film)}."


def _follow_sentence(rng: random.Random, polarity: int | None) -> str:
    """A later sentence of a review.

    :param rng: the random source
    :param polarity: sentiment of the review
    :return: a full sentence ending with a period
    """
    roll = rng.random()
    if roll < 0.45:
        clause = _aspect_clause(rng, polarity)
        return f"The {clause}."
    if roll < 0.6:
        a, b = rng.sample(KEYWORD_ASPECTS, 2)
        return f"The {_aspect_clause(rng, polarity, a)} and the {_aspect_clause(rng, polarity, b)}."
    if roll < 0.7 and polarity is not None:
        return f"Even the {_aspect_clause(rng, polarity)}."
    if polarity == POSITIVE:
        return _pick(rng, CLOSERS_POS)
    if polarity == NEGATIVE:
        return _pick(rng, CLOSERS_NEG)
    return _pick(rng, CLOSERS_NEU)


def make_review(rng: random.Random, polarity: int | None = None, opener: str = "") -> str:
    """Generate one movie review.

    :param rng: the random source
    :param polarity: 1 positive, 0 negative, ``None`` neutral
    :param opener: the first words; random from :data:`REVIEW_OPENERS` when empty
    :return: a 1-3 sentence review
    """
    opener = opener or _pick(rng, REVIEW_OPENERS)
    sentences = [_opener_sentence(rng, polarity, opener)]
    for _ in range(rng.choice((0, 1, 1, 2, 2))):
        sentences.append(_follow_sentence(rng, polarity))
    return " ".join(sentences)


# --------------------------------------------------------------------------------------------
# Arithmetic and numbers
# --------------------------------------------------------------------------------------------


def make_arithmetic(rng: random.Random) -> tuple[str, str]:
    """One arithmetic problem.

    Operands are 0-20 for ``+`` and ``-`` (differences may be negative) and 0-12 for ``*``.

    :param rng: the random source
    :return: ``(prompt, answer)``, e.g. ``("12+7=", "19")``
    """
    op = _pick(rng, "+-*")
    if op == "*":
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        return f"{a}*{b}=", str(a * b)
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    return f"{a}{op}{b}=", str(a + b if op == "+" else a - b)


def make_numbers(rng: random.Random, increasing_prob: float = 0.7) -> str:
    """A ``Numbers:`` list of 3-10 integers in 0-99.

    :param rng: the random source
    :param increasing_prob: chance that the list is strictly increasing
    :return: e.g. ``"Numbers: 3 8 15 22 40"``
    """
    k = rng.randint(3, 10)
    values = rng.sample(range(100), k)
    if rng.random() < increasing_prob:
        values.sort()
    return "Numbers: " + " ".join(str(v) for v in values)


# --------------------------------------------------------------------------------------------
# Concept-to-sentence
# --------------------------------------------------------------------------------------------

AGENTS = (
    "actor",
    "girl",
    "boy",
    "dog",
    "woman",
    "man",
    "child",
    "singer",
    "director",
    "teacher",
    "farmer",
    "student",
    "cat",
    "artist",
    "writer",
    "cook",
)


class Verb(NamedTuple):
    """Verb forms and the objects the verb takes."""

    base: str
    past: str
    third: str
    ing: str
    participle: str
    objects: tuple[str, ...]


VERBS = (
    Verb(
        "love",
        "loved",
        "loves",
        "loving",
        "loved",
        ("story", "song", "film", "book", "music", "cake", "garden", "picture"),
    ),
    Verb(
        "watch",
        "watched",
        "watches",
        "watching",
        "watched",
        ("film", "game", "sunset", "show", "scene", "river"),
    ),
    Verb(
        "read",
        "read",
        "reads",
        "reading",
        "read",
        ("book", "letter", "story", "script", "poem"),
    ),
    Verb(
        "write",
        "wrote",
        "writes",
        "writing",
        "written",
        ("letter", "song", "story", "script", "poem"),
    ),
    Verb("sing", "sang", "sings", "singing", "sung", ("song",)),
    Verb(
        "play",
        "played",
        "plays",
        "playing",
        "played",
        ("game", "song", "guitar", "piano", "ball"),
    ),
    Verb("throw", "threw", "throws", "throwing", "thrown", ("ball", "stone", "hat")),
    Verb(
        "find",
        "found",
        "finds",
        "finding",
        "found",
        ("key", "book", "letter", "ball", "hat", "box"),
    ),
    Verb(
        "open",
        "opened",
        "opens",
        "opening",
        "opened",
        ("door", "letter", "book", "box", "window"),
    ),
    Verb(
        "carry",
        "carried",
        "carries",
        "carrying",
        "carried",
        ("box", "bag", "ball", "book", "guitar"),
    ),
    Verb(
        "eat",
        "ate",
        "eats",
        "eating",
        "eaten",
        ("apple", "bread", "cake", "soup", "fish"),
    ),
    Verb(
        "cook",
        "cooked",
        "cooks",
        "cooking",
        "cooked",
        ("dinner", "soup", "fish", "bread"),
    ),
    Verb(
        "paint",
        "painted",
        "paints",
        "painting",
        "painted",
        ("picture", "door", "wall", "house"),
    ),
    Verb(
        "hear",
        "heard",
        "hears",
        "hearing",
        "heard",
        ("song", "music", "story", "noise"),
    ),
    Verb("tell", "told", "tells", "telling", "told", ("story", "joke", "secret")),
    Verb(
        "film",
        "filmed",
        "films",
        "filming",
        "filmed",
        ("scene", "sunset", "river", "game"),
    ),
)
VERBS_BY_BASE = {v.base: v for v in VERBS}

#: place -> preposition
PLACES = {
    "park": "in",
    "stage": "on",
    "kitchen": "in",
    "garden": "in",
    "street": "on",
    "beach": "on",
    "house": "in",
    "room": "in",
    "forest": "in",
    "studio": "in",
    "school": "at",
    "city": "in",
    "river": "by",
    "theater": "at",
}
TIME_PHRASES = ("every morning", "every day", "at night", "on Sunday", "after dinner")
OBJ_ADJ = (
    "old",
    "new",
    "small",
    "big",
    "red",
    "long",
    "little",
    "strange",
    "beautiful",
)

#: which frame slots a concept set names.
CONCEPT_SLOTS = (
    ("agent", "verb"),
    ("verb", "object"),
    ("agent", "object"),
    ("object", "place"),
    ("agent", "verb", "object"),
    ("agent", "verb", "object"),
    ("agent", "object", "place"),
    ("verb", "object", "place"),
    ("agent", "verb", "place"),
)


class Frame(NamedTuple):
    """The slots of a concept sentence."""

    agent: str
    verb: Verb
    object: str
    place: str


def _random_frame(rng: random.Random, fixed: Frame | None = None, keep: Sequence[str] = ()) -> Frame:
    """Fill a sentence frame, keeping the slots named in ``keep`` from ``fixed``.

    :param rng: the random source
    :param fixed: the frame whose kept slots must be reused
    :param keep: slot names to keep
    :return: a frame whose verb accepts its object
    """
    agent = fixed.agent if fixed and "agent" in keep else _pick(rng, AGENTS)
    place = fixed.place if fixed and "place" in keep else _pick(rng, tuple(PLACES))
    if fixed and "verb" in keep:
        verb = fixed.verb
        obj = fixed.object if "object" in keep else _pick(rng, verb.objects)
    elif fixed and "object" in keep:
        obj = fixed.object
        verb = _pick(rng, tuple(v for v in VERBS if obj in v.objects))
    else:
        verb = _pick(rng, VERBS)
        obj = _pick(rng, verb.objects)
    return Frame(agent, verb, obj, place)


def _concept_word(frame: Frame, slot: str) -> str:
    """The base form of a frame slot, as listed after ``Concepts:``.

    :param frame: the frame
    :param slot: ``"agent"``, ``"verb"``, ``"object"`` or ``"place"``
    :return: the concept word
    """
    if slot == "verb":
        return frame.verb.base
    return getattr(frame, slot)


def _realize(rng: random.Random, frame: Frame, need_place: bool, template: int) -> str:
    """Turn a frame into a sentence with one of the templates.

    :param rng: the random source
    :param frame: the filled frame
    :param need_place: whether the place must appear
    :param template: index of the template, 0-5
    :return: the sentence, e.g. ``"The actor loved the story."``
    """
    a, v, o = frame.agent, frame.verb, frame.object
    where = f" {PLACES[frame.place]} the {frame.place}"
    place = where if need_place or rng.random() < 0.3 else ""
    adj = _pick(rng, OBJ_ADJ)
    if template == 0:
        return f"The {a} {v.past} the {o}{place}."
    if template == 1:
        return f"{_article(a).capitalize()} {a} is {v.ing} {_article(o)} {o}{place}."
    if template == 2:
        return f"The {a} {v.third} the {o}{place} {_pick(rng, TIME_PHRASES)}."
    if template == 3:
        return f"{where.strip().capitalize()}, the {a} {v.past} {_article(adj)} {adj} {o}."
    if template == 4:
        return f"The {a} wanted to {v.base} the {o}{place}."
    return f"The {o} was {v.participle} by the {a}{place}."


def _concept_set(rng: random.Random) -> tuple[Frame, tuple[str, ...], list[str]]:
    """Draw a frame and the slots/words that form the ``Concepts:`` list.

    :param rng: the random source
    :return: ``(frame, slots, concept words in display order)``
    """
    frame = _random_frame(rng)
    slots = _pick(rng, CONCEPT_SLOTS)
    words = [_concept_word(frame, s) for s in slots]
    rng.shuffle(words)
    return frame, slots, words


def concept_prompt(words: Sequence[str]) -> str:
    """The prompt for a concept list.

    :param words: the concept words
    :return: e.g. ``"Concepts: actor, story, love. Sentence:"``
    """
    return f"Concepts: {', '.join(words)}. Sentence:"


def make_concepts(rng: random.Random) -> str:
    """One concept-to-sentence document.

    :param rng: the random source
    :return: e.g. ``"Concepts: actor, story, love. Sentence: The actor loved the story."``
    """
    frame, slots, words = _concept_set(rng)
    sentence = _realize(rng, frame, "place" in slots, rng.randrange(6))
    return f"{concept_prompt(words)} {sentence}"


# --------------------------------------------------------------------------------------------
# Keyword reviews
# --------------------------------------------------------------------------------------------


def keyword_prompt(keywords: Sequence[str]) -> str:
    """The prompt for a keyword review.

    :param keywords: aspect words
    :return: e.g. ``"Keywords: music, ending. Review:"``
    """
    return f"Keywords: {', '.join(keywords)}. Review:"


def make_keyword_review(rng: random.Random) -> tuple[str, int | None]:
    """One keyword-review document.

    :param rng: the random source
    :return: ``(document, label)``; the label is ``None`` when the review is mixed
    """
    keywords = rng.sample(KEYWORD_ASPECTS, rng.choice((1, 2, 2, 2, 3)))
    polarity = rng.choice((POSITIVE, NEGATIVE, POSITIVE, NEGATIVE, NEUTRAL))
    mixed = len(keywords) > 1 and polarity is not None and rng.random() < 0.35
    parts = []
    label = None if mixed else polarity
    for i, kw in enumerate(keywords):
        pol = _opposite(polarity) if mixed and i == len(keywords) - 1 else polarity
        clause = f"the {_aspect_clause(rng, pol, kw)}"
        if i == 0:
            parts.append(clause[0].upper() + clause[1:])
        elif mixed and i == len(keywords) - 1:
            parts.append(f" but {clause}")
        elif rng.random() < 0.5:
            parts.append(f" and {clause}")
        else:
            parts.append(f". {clause[0].upper() + clause[1:]}")
    text = "".join(parts) + "."
    if rng.random() < 0.3 and not mixed:
        text += " " + _follow_sentence(rng, polarity)
    return f"{keyword_prompt(keywords)} {text}", label


# --------------------------------------------------------------------------------------------
# The corpus
# --------------------------------------------------------------------------------------------


def make_document(rng: random.Random) -> Document:
    """Draw one document according to :data:`DOCUMENT_MIX`.

    :param rng: the random source
    :return: the document with its kind and label
    """
    roll, kind = rng.random(), DOCUMENT_MIX[-1][0]
    for name, share in DOCUMENT_MIX:
        if roll < share:
            kind = name
            break
        roll -= share
    if kind == "review":
        polarity = rng.choice((POSITIVE, NEGATIVE, POSITIVE, NEGATIVE, NEUTRAL))
        return Document(kind, make_review(rng, polarity), polarity)
    if kind == "arithmetic":
        prompt, answer = make_arithmetic(rng)
        return Document(kind, prompt + answer, None)
    if kind == "numbers":
        return Document(kind, make_numbers(rng), None)
    if kind == "concepts":
        return Document(kind, make_concepts(rng), None)
    text, label = make_keyword_review(rng)
    return Document(kind, text, label)


def generate_documents(n: int, seed: int = 0) -> list[Document]:
    """Generate ``n`` documents deterministically.

    :param n: number of documents
    :param seed: seed of the :class:`random.Random` that drives the grammar
    :return: the documents
    """
    rng = random.Random(seed)
    return [make_document(rng) for _ in range(n)]


def generate_corpus(n: int, seed: int = 0) -> list[str]:
    """Generate ``n`` document texts deterministically (one line each).

    :param n: number of documents
    :param seed: random seed
    :return: the texts
    """
    return [doc.text for doc in generate_documents(n, seed)]


def labelled_reviews(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """Positive/negative reviews for classifier training (neutral and mixed ones skipped).

    Keyword reviews contribute their review part only (after ``"Review: "``).

    :param n: number of documents to draw (fewer pairs come back)
    :param seed: random seed
    :return: ``(text, label)`` pairs, label 1 positive and 0 negative
    """
    pairs = []
    for doc in generate_documents(n, seed):
        if doc.label is None:
            continue
        text = doc.text.split("Review: ", 1)[1] if doc.kind == "keywords" else doc.text
        pairs.append((text, doc.label))
    return pairs


def review_openers() -> list[str]:
    """The review openers used as ``TextGen-v0`` prompts.

    :return: a copy of :data:`REVIEW_OPENERS`
    """
    return list(REVIEW_OPENERS)


def arithmetic_examples(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Arithmetic prompts and answers in the corpus format.

    :param n: number of examples
    :param seed: random seed
    :return: ``(prompt, answer)`` pairs such as ``("12+7=", "19")``
    """
    rng = random.Random(seed)
    return [make_arithmetic(rng) for _ in range(n)]


def numbers_examples(n: int, seed: int = 0) -> list[str]:
    """Prompts for the increasing-numbers task.

    :param n: number of examples
    :param seed: random seed
    :return: prompts ``"Numbers:"`` followed by 0-2 starting increasing numbers
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = sorted(rng.sample(range(50), rng.randint(0, 2)))
        out.append(" ".join(["Numbers:"] + [str(v) for v in start]))
    return out


def concept_examples(n: int, seed: int = 0, n_refs: int = 3) -> list[tuple[str, list[str]]]:
    """Concept-to-sentence prompts with reference sentences.

    :param n: number of examples
    :param seed: random seed
    :param n_refs: distinct references per prompt
    :return: ``(prompt, references)``; prompt like ``"Concepts: actor, story, love. Sentence:"``,
        each reference starts with a space, as the corpus continuation does
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        frame, slots, words = _concept_set(rng)
        refs: list[str] = []
        templates = list(range(6))
        rng.shuffle(templates)
        attempts = 0
        while len(refs) < n_refs and attempts < 100:
            filled = _random_frame(rng, frame, slots)
            sentence = " " + _realize(rng, filled, "place" in slots, templates[attempts % 6])
            attempts += 1
            if sentence not in refs:
                refs.append(sentence)
        out.append((concept_prompt(words), refs))
    return out


def keyword_examples(n: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """Keyword-review prompts.

    :param n: number of examples
    :param seed: random seed
    :return: ``(prompt, keywords)`` such as ``("Keywords: music, ending. Review:", ["music", "ending"])``
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        keywords = rng.sample(KEYWORD_ASPECTS, rng.choice((1, 2, 2, 2, 3)))
        out.append((keyword_prompt(keywords), keywords))
    return out
