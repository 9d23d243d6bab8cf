"""The human-evaluation folder's protocol: the dimensions and their anchors, the file names, and the ratings file
(``ratings.jsonl``: one JSON line per entry, read back by the ``load_*`` functions)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = [
    "ALPHA_MIN",
    "ANCHORS",
    "CALIBRATION",
    "DIMENSIONS",
    "PREFERENCES",
    "SIDES",
    "SIDE_BY_SIDE",
    "checked_preferences",
    "checked_scores",
    "load_preferences",
    "load_ratings",
    "load_sample_scores",
    "repair_ratings",
]

#: The dimensions each item is rated on (1 to 5).
DIMENSIONS = ("instruction_following", "accuracy", "coherence", "creativity")
#: What 1, 3 and 5 mean on each dimension (shown on the page).
ANCHORS = {
    "instruction_following": {1: "ignores the prompt", 3: "follows part of it", 5: "does exactly what it asks"},
    "accuracy": {1: "mostly wrong", 3: "some errors", 5: "no errors"},
    "coherence": {1: "does not hold together", 3: "understandable, with jumps", 5: "clear and well connected"},
    "creativity": {1: "generic or copied", 3: "some fresh turns", 5: "original and apt"},
}
#: Krippendorff's alpha below this flags a dimension as unreliable.
ALPHA_MIN = 0.7
ITEMS_FILE, KEY_FILE, RATINGS_FILE = "items.json", "key.json", "ratings.jsonl"
#: A rater's choices in a side-by-side folder.
PREFERENCES = ("A", "B", "tie")
#: The two sides of a side-by-side item.
SIDES = ("A", "B")
SIDE_BY_SIDE = "side_by_side"
CALIBRATION = "calibration"


def _entry(text: str) -> dict[str, Any] | None:
    """A ratings line's entry, or ``None`` when it is not a complete one (``{"rater": str, "item": str, ...}``)."""
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError):
        return None
    ok = isinstance(entry, dict) and isinstance(entry.get("rater"), str) and isinstance(entry.get("item"), str)
    return entry if ok else None


def _salvage(text: str) -> tuple[str | None, str]:
    """``(the last complete entry of a damaged line, or None; the rest)``: a rating glued onto a torn fragment
    (``{"rater": "a", "it{"rater": "b", ...}``) is recovered whole."""
    start = text.rfind("{")
    while start > 0:
        if _entry(text[start:]) is not None:
            return text[start:], text[:start]
        start = text.rfind("{", 0, start)
    return None, text


def repair_ratings(folder: str | os.PathLike) -> str | None:
    """Repair ``ratings.jsonl`` after a torn append (a process killed mid-write, a full disk): every line that is not
    a complete entry is moved to ``ratings.jsonl.torn-<time>`` (a complete rating glued onto a fragment is kept), the
    file is rewritten atomically, and it ends with a newline, so the next rating starts a line of its own.

    :return: What was done, for the user (``None`` when the file was whole).
    """
    from sb3_grpo.file_io import write_text_atomic

    path = Path(folder) / RATINGS_FILE
    if not path.exists():
        return None
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    kept, torn, recovered = [], [], 0
    for line in lines:
        if not line.strip():
            continue
        if _entry(line) is not None:
            kept.append(line)
            continue
        whole, fragment = _salvage(line)
        if whole is not None:
            kept.append(whole)
            recovered += 1
        torn.append(fragment)
    if not torn and raw.endswith(b"\n") and "\ufffd" not in text:
        return None
    aside = None
    if torn:
        aside = path.with_name(f"{RATINGS_FILE}.torn-{time.strftime('%Y%m%d-%H%M%S')}")
        with open(aside, "a", encoding="utf-8") as f:
            f.write("".join(t + "\n" for t in torn))
    write_text_atomic(path, "".join(line + "\n" for line in kept))
    if aside is None:
        return f"{path}: the last rating had no line end (a write cut short); added it, {len(kept)} ratings kept"
    return (
        f"{path}: repaired {len(torn)} torn line(s) (a process killed mid-append, or a full disk): kept {len(kept)} "
        f"complete ratings ({recovered} recovered from lines a later rating was glued onto); the fragments are in "
        f"{aside.name}"
    )


def _ratings_lines(folder: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(folder) / RATINGS_FILE
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        entry = _entry(line)
        if entry is None:
            raise ValueError(
                f"{path} line {n} is not a complete rating (a torn write); `sb3-grpo human-eval serve` or `report` "
                "repairs the file (sb3_grpo.human_eval.protocol.repair_ratings)"
            )
        out.append(entry)
    return out


def load_ratings(folder: str | os.PathLike) -> dict[tuple[str, str], dict[str, int]]:
    """``(rater, item) -> {dimension: score}`` from ``ratings.jsonl``; a later entry for the same dimension wins."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for entry in _ratings_lines(folder):
        if "scores" in entry and "side" not in entry:
            out.setdefault((entry["rater"], entry["item"]), {}).update(entry["scores"])
    return out


def load_preferences(folder: str | os.PathLike) -> dict[tuple[str, str], dict[str, str]]:
    """``(rater, item) -> {dimension: "A" | "B" | "tie"}`` of a side-by-side folder (still blind: positions, not runs);
    a later entry for the same dimension wins."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for entry in _ratings_lines(folder):
        if "prefer" in entry:
            out.setdefault((entry["rater"], entry["item"]), {}).update(entry["prefer"])
    return out


def load_sample_scores(folder: str | os.PathLike) -> dict[tuple[str, str, str], dict[str, int]]:
    """``(rater, item, side) -> {dimension: 1..5}``: the scores of each of a side-by-side item's two completions
    (``side`` is ``"A"`` or ``"B"``, still blind); a later entry for the same dimension wins."""
    out: dict[tuple[str, str, str], dict[str, int]] = {}
    for entry in _ratings_lines(folder):
        if "scores" in entry and "side" in entry:
            out.setdefault((entry["rater"], entry["item"], entry["side"]), {}).update(entry["scores"])
    return out


def checked_scores(scores: Any) -> dict[str, int]:
    if not isinstance(scores, dict) or not scores:
        raise ValueError("scores must map dimensions to 1..5")
    for dim, score in scores.items():
        if dim not in DIMENSIONS:
            raise ValueError(f"unknown dimension {dim!r}; dimensions: {', '.join(DIMENSIONS)}")
        if isinstance(score, bool) or score not in (1, 2, 3, 4, 5):
            raise ValueError(f"{dim}: a score is an integer from 1 to 5, got {score!r}")
    return scores


def checked_preferences(prefer: Any) -> dict[str, str]:
    if not isinstance(prefer, dict) or not prefer:
        raise ValueError("prefer must map dimensions to 'A', 'B' or 'tie' (a side-by-side folder)")
    for dim, choice in prefer.items():
        if dim not in DIMENSIONS:
            raise ValueError(f"unknown dimension {dim!r}; dimensions: {', '.join(DIMENSIONS)}")
        if choice not in PREFERENCES:
            raise ValueError(f"{dim}: a preference is 'A', 'B' or 'tie', got {choice!r}")
    return prefer
