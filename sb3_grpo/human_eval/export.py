"""``human-eval export``: the blind, shuffled rating folder of one run's completions (:func:`export_items`) or of two
runs' side by side (:func:`export_pairs`), calibration items mixed in."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sb3_grpo.file_io import write_text_atomic
from sb3_grpo.human_eval.protocol import (
    ANCHORS,
    CALIBRATION,
    DIMENSIONS,
    ITEMS_FILE,
    KEY_FILE,
    PREFERENCES,
    RATINGS_FILE,
    SIDE_BY_SIDE,
    SIDES,
)

__all__ = ["check_export_folder", "export_items", "export_pairs"]

#: What a rating folder's earlier set leaves there: moved aside together by an export with ``force``.
_SET_FILES = (ITEMS_FILE, KEY_FILE, RATINGS_FILE, "report.md", "report.json")


def _rated_lines(folder: Path) -> int:
    path = folder / RATINGS_FILE
    try:
        return sum(1 for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip())
    except OSError:
        return 0


def check_export_folder(out: str | os.PathLike, force: bool = False) -> Path | None:
    """Refuse to export into a folder that holds ratings (they would point at other completions), or, with ``force``,
    move its set (``items.json``, ``key.json``, ``ratings.jsonl``, reports) into ``<out>/replaced-<time>/`` first.

    :return: Where the old set went (``None``: nothing was moved).
    :raises ValueError: for a rated folder without ``force``, saying how many ratings and what to do.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {os.fspath(out)!r} is a file; give a folder for the rating set")
    rated = _rated_lines(out) if out.is_dir() else 0
    if rated and not force:
        raise ValueError(
            f"{os.fspath(out)!r} holds {rated} ratings of the items exported there; exporting again would make them "
            "point at other completions. Export to another folder, or pass --force (force=True) to keep the old "
            "items, key and ratings aside in a replaced-<time> subfolder and start a fresh set"
        )
    present = [name for name in _SET_FILES if (out / name).exists()] + [
        p.name for p in (out.glob(f"{RATINGS_FILE}.torn-*") if out.is_dir() else [])
    ]
    if not force or not present:
        return None
    import time

    aside = out / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    for name in present:
        (out / name).rename(aside / name)
    return aside


def _json_lines(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` of every non-empty line of a JSONL file.

    :raises ValueError: for a missing file or a line that is not JSON, naming the file and the line.
    """
    if not os.path.isfile(path):
        raise ValueError(
            f"{os.fspath(path)!r}: no such file; give a JSONL file (CompletionLogger, sb3-grpo sample --out)"
        )
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except ValueError as err:
                raise ValueError(
                    f"{os.fspath(path)} line {n} is not JSON ({err}); each line is one JSON object (fix or remove it)"
                ) from None


def _transcript_problem(transcript: Any) -> str | None:
    """What is wrong with a ``transcript`` value (``None``: it is a list of ``{"role": str, "text": str}``)."""
    if transcript is None:
        return None
    if not isinstance(transcript, list):
        return f"'transcript' must be a list of {{'role', 'text'}} messages, got {type(transcript).__name__}"
    for i, m in enumerate(transcript):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("text"), str):
            return f"transcript message {i} must be an object with 'role' and 'text' strings, got {str(m)[:60]}"
    return None


def _read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    rows = []
    for n, row in _json_lines(path):
        if not isinstance(row, dict) or "prompt" not in row or ("completion" not in row and not row.get("transcript")):
            raise ValueError(
                f"{os.fspath(path)} line {n}: expected an object with 'prompt' and 'completion' (or 'transcript'), "
                "as CompletionLogger and `sb3-grpo sample --out` write"
            )
        problem = _transcript_problem(row.get("transcript"))
        if problem:
            raise ValueError(f"{os.fspath(path)} line {n}: {problem}")
        rows.append(row)
    return rows


def _text(row: Mapping[str, Any]) -> str:
    if row.get("transcript"):
        return "\n".join(f"{m['role']}: {m['text']}" for m in row["transcript"])
    return str(row["completion"])


def export_items(
    sources: Sequence[tuple[str, str | os.PathLike]],
    out: str | os.PathLike,
    n: int,
    seed: int = 0,
    calibration: str | os.PathLike | None = None,
    force: bool = False,
) -> Path:
    """Write a blind, shuffled rating set to ``out`` (``items.json``, ``key.json``); returns ``out``.

    :param sources: ``(label, completions.jsonl)`` for one run, or two for a comparison.
    :param n: Items drawn from each source (without replacement; all of them when it has fewer).
    :param seed: Seed of the draws and the order.
    :param calibration: A JSONL file of items of known score: ``prompt``, ``completion`` and ``scores`` (a dict
        dimension -> 1..5); all are mixed in.
    :param force: Export into a folder that holds ratings, keeping its old set aside (:func:`check_export_folder`);
        without it such a folder is refused.
    """
    if not 1 <= len(sources) <= 2:
        raise ValueError(f"give the completions of one run or of two (a comparison), got {len(sources)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    labels = [label for label, _ in sources]
    if len(set(labels)) != len(labels):
        raise ValueError(f"the sources need different labels, got {labels}")
    rng = np.random.default_rng(seed)
    entries: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for label, path in sources:
        rows = _read_rows(path)
        if not rows:
            raise ValueError(f"{os.fspath(path)} has no completions")
        for i in rng.permutation(len(rows))[:n]:
            entries.append(({"prompt": rows[i]["prompt"], "completion": _text(rows[i])}, {"source": label}))
    if calibration is not None:
        for row in _read_rows(calibration):
            scores = row.get("scores")
            if not _is_score_map(scores):
                raise ValueError(
                    f"calibration item {row['prompt']!r}: 'scores' must map dimensions {DIMENSIONS} to 1..5"
                )
            entries.append(
                ({"prompt": row["prompt"], "completion": _text(row)}, {"source": CALIBRATION, "scores": scores})
            )
    check_export_folder(out, force)
    return _write_folder(out, entries, rng, "item", {}, {})


def _write_folder(
    out: str | os.PathLike,
    entries: list[tuple[dict[str, Any], dict[str, Any]]],
    rng: np.random.Generator,
    prefix: str,
    shown: dict[str, Any],
    key_head: dict[str, Any],
) -> Path:
    """Shuffle ``(what raters see, what the key holds)`` entries with ``rng``, number them ``<prefix>0001`` on, and
    write ``items.json`` (``shown``, the dimensions, their anchors and the items) and ``key.json`` (``key_head`` and
    each item's key)."""
    order = rng.permutation(len(entries))
    items, key = [], dict(key_head)
    for pos, k in enumerate(order):
        item_id = f"{prefix}{pos + 1:04d}"
        items.append({"id": item_id, **entries[k][0]})
        key[item_id] = entries[k][1]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shown_items = {**shown, "dimensions": list(DIMENSIONS), "anchors": ANCHORS, "items": items}
    write_text_atomic(out / KEY_FILE, json.dumps(key, indent=1))
    write_text_atomic(out / ITEMS_FILE, json.dumps(shown_items, indent=1))
    return out


def _is_score_map(scores: Any) -> bool:
    """Whether ``scores`` is a non-empty ``{dimension: 1..5}``."""
    return (
        isinstance(scores, dict)
        and bool(scores)
        and all(d in DIMENSIONS and s in (1, 2, 3, 4, 5) and not isinstance(s, bool) for d, s in scores.items())
    )


def _read_pair_calibration(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Calibration pairs: JSON lines ``{"prompt", "a", "b", "prefer": {dimension: "A" | "B" | "tie"}, "scores":
    {"A": {dimension: 1..5}, "B": {...}}}`` ("A" and "B" name the line's ``a`` and ``b``), with ``prefer`` or
    ``scores`` or both."""
    rows = []
    for n, row in _json_lines(path):
        where = f"{os.fspath(path)} line {n}"
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("prompt", "a", "b")):
            raise ValueError(f"{where}: a calibration pair is an object with 'prompt', 'a' and 'b' (texts)")
        prefer, scores = row.get("prefer") or {}, row.get("scores") or {}
        if not prefer and not scores:
            raise ValueError(f"{where}: give the known 'prefer' (dimension -> 'A', 'B' or 'tie'), 'scores', or both")
        if not isinstance(prefer, dict) or any(d not in DIMENSIONS or c not in PREFERENCES for d, c in prefer.items()):
            raise ValueError(f"{where}: 'prefer' must map dimensions {DIMENSIONS} to 'A', 'B' or 'tie'")
        if not isinstance(scores, dict) or any(k not in SIDES or not _is_score_map(v) for k, v in scores.items()):
            raise ValueError(f"{where}: 'scores' must map 'A' and/or 'B' to {{dimension: 1..5}}")
        rows.append({"prompt": row["prompt"], "a": row["a"], "b": row["b"], "prefer": prefer, "scores": scores})
    if not rows:
        raise ValueError(f"{os.fspath(path)} has no calibration pairs")
    return rows


def _swap_sides(row: Mapping[str, Any]) -> dict[str, Any]:
    """A calibration pair with its ``a`` and ``b`` exchanged, its known preferences and scores following them."""
    flip = {"A": "B", "B": "A", "tie": "tie"}
    return {
        "prompt": row["prompt"],
        "a": row["b"],
        "b": row["a"],
        "prefer": {d: flip[c] for d, c in row["prefer"].items()},
        "scores": {flip[side]: s for side, s in row["scores"].items()},
    }


def _first_by_prompt(rows: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        out.setdefault(str(row["prompt"]), row)
    return out


def export_pairs(
    sources: Sequence[tuple[str, str | os.PathLike]],
    out: str | os.PathLike,
    n: int,
    seed: int = 0,
    calibration: str | os.PathLike | None = None,
    force: bool = False,
) -> Path:
    """Write a blind side-by-side rating set to ``out``: ``n`` prompts that both runs answered (the first completion
    of each run on each prompt), each item showing the two completions as A and B in an order drawn per item.

    ``items.json`` holds ``{"mode": "side_by_side", "dimensions", "anchors", "items": [{"id", "prompt", "a",
    "b"}]}``; ``key.json`` holds, per item, which run is A and which is B, or the known answers of a calibration
    pair (never served).

    :param sources: ``(label, completions.jsonl)`` of the two runs (sampled on the same prompts, e.g. with
        ``sb3-grpo sample --env-kwargs '{"prompts": ...}'``).
    :param n: Prompts to draw (all shared ones when fewer).
    :param seed: Seed of the draw, of the A/B order and of the item order.
    :param calibration: A JSONL file of calibration pairs: ``prompt``, ``a``, ``b`` and the known ``prefer``
        (dimension -> ``"A"``, ``"B"`` or ``"tie"``) and/or ``scores`` (``{"A": {dimension: 1..5}, "B": ...}``), where
        A and B name the line's ``a`` and ``b``; all are mixed in, their sides drawn like the others'.
    :param force: As in :func:`export_items`.
    """
    if len(sources) != 2:
        raise ValueError(f"a side-by-side comparison takes the completions of exactly two runs, got {len(sources)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    (label_1, path_1), (label_2, path_2) = sources
    if label_1 == label_2:
        raise ValueError(f"the two runs need different labels, got {label_1!r} twice")
    if CALIBRATION in (label_1, label_2):
        raise ValueError(f"{CALIBRATION!r} names the calibration pairs; give the runs other labels")
    first, second = _first_by_prompt(_read_rows(path_1)), _first_by_prompt(_read_rows(path_2))
    shared = [p for p in first if p in second]
    if not shared:
        raise ValueError(
            f"{os.fspath(path_1)} and {os.fspath(path_2)} share no prompt; sample both runs on the same prompts "
            '(sb3-grpo sample --env-kwargs \'{"prompts": "prompts.jsonl"}\', or human-eval export --env with '
            "two checkpoints)"
        )
    known = _read_pair_calibration(calibration) if calibration is not None else []
    rng = np.random.default_rng(seed)
    chosen = [shared[i] for i in sorted(rng.permutation(len(shared))[:n])]
    swaps = rng.integers(0, 2, size=len(chosen)).astype(bool)  # True: the second run is shown as A
    entries: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for prompt, swap in zip(chosen, swaps):
        sides = [(label_1, first[prompt]), (label_2, second[prompt])]
        if swap:
            sides.reverse()
        (label_a, row_a), (label_b, row_b) = sides
        entries.append(
            (
                {"prompt": prompt, "a": _text(row_a), "b": _text(row_b)},
                {"source": SIDE_BY_SIDE, "A": label_a, "B": label_b},
            )
        )
    if known:
        for row, swap in zip(known, rng.integers(0, 2, size=len(known)).astype(bool)):
            shown = _swap_sides(row) if swap else row
            entries.append(
                (
                    {"prompt": shown["prompt"], "a": shown["a"], "b": shown["b"]},
                    {"source": CALIBRATION, "prefer": shown["prefer"], "scores": shown["scores"]},
                )
            )
    check_export_folder(out, force)
    return _write_folder(out, entries, rng, "pair", {"mode": SIDE_BY_SIDE}, {"models": [label_1, label_2]})
