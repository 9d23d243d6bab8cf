"""Human evaluation of sampled completions: export a blind, shuffled rating set, rate it on a local web page, report.

``sb3-grpo human-eval export`` takes completions (the JSONL files of :class:`~sb3_grpo.callbacks.CompletionLogger` or
``sb3-grpo sample --out``) from one run or two, draws ``n`` from each, mixes in calibration items of known score and
shuffles them into a folder: ``items.json`` (what raters see: no run names) and ``key.json`` (which run, or which known
scores, each item has). ``human-eval serve`` serves a page on which a rater scores each item from 1 to 5 on
:data:`DIMENSIONS`; every score is appended to ``ratings.jsonl`` (flushed and fsynced) the moment it is entered, so
nothing is lost when the page or the server closes, and a rater who comes back continues where they stopped.
``human-eval report`` computes Krippendorff's alpha per dimension (the ``krippendorff`` package, extra
``textrl[human-eval]``), flags a dimension whose alpha is below 0.7 and raters who miss the calibration items, and
writes the scores per run with 95% intervals.

Side by side (:func:`export_pairs`, ``human-eval export --side-by-side``): the completions of two runs on the same
prompts are paired, and which run is shown as A and which as B is drawn per item (``key.json`` holds it; the server
never serves that file). On the page a rater picks, per dimension, A, B or tie, and also scores each of the two
completions from 1 to 5 on the same dimensions; calibration pairs of known preference and/or known scores are mixed
in, shown like the others. ``human-eval report`` then un-blinds the choices and writes each run's win rate per
dimension with a Wilson interval, over items (the raters' choices on an item are averaged first), Krippendorff's
alpha of the un-blinded choices and of the 1-5 scores, each run's scores with 95% intervals, and flags raters who
miss the calibration pairs.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ALPHA_MIN",
    "ANCHORS",
    "DIMENSIONS",
    "PREFERENCES",
    "export_items",
    "export_pairs",
    "krippendorff_alpha",
    "load_preferences",
    "load_ratings",
    "load_sample_scores",
    "preference_outcomes",
    "make_server",
    "report",
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


def _read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if (
                not isinstance(row, dict)
                or "prompt" not in row
                or ("completion" not in row and "transcript" not in row)
            ):
                raise ValueError(
                    f"{os.fspath(path)} line {n}: expected an object with 'prompt' and 'completion' (or 'transcript'), "
                    "as CompletionLogger and `sb3-grpo sample --out` write"
                )
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
) -> Path:
    """Write a blind, shuffled rating set to ``out`` (``items.json``, ``key.json``); returns ``out``.

    :param sources: ``(label, completions.jsonl)`` for one run, or two for a comparison.
    :param n: Items drawn from each source (without replacement; all of them when it has fewer).
    :param seed: Seed of the draws and the order.
    :param calibration: A JSONL file of items of known score: ``prompt``, ``completion`` and ``scores`` (a dict
        dimension -> 1..5); all are mixed in.
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
    order = rng.permutation(len(entries))
    items, key = [], {}
    for pos, k in enumerate(order):
        item_id = f"item{pos + 1:04d}"
        items.append({"id": item_id, **entries[k][0]})
        key[item_id] = entries[k][1]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / ITEMS_FILE).write_text(
        json.dumps({"dimensions": list(DIMENSIONS), "anchors": ANCHORS, "items": items}, indent=1), encoding="utf-8"
    )
    (out / KEY_FILE).write_text(json.dumps(key, indent=1), encoding="utf-8")
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
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            where = f"{os.fspath(path)} line {n}"
            if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("prompt", "a", "b")):
                raise ValueError(f"{where}: a calibration pair is an object with 'prompt', 'a' and 'b' (texts)")
            prefer, scores = row.get("prefer") or {}, row.get("scores") or {}
            if not prefer and not scores:
                raise ValueError(
                    f"{where}: give the known 'prefer' (dimension -> 'A', 'B' or 'tie'), 'scores', or both"
                )
            if not isinstance(prefer, dict) or any(
                d not in DIMENSIONS or c not in PREFERENCES for d, c in prefer.items()
            ):
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
    order = rng.permutation(len(entries))
    items, key = [], {}
    for pos, k in enumerate(order):
        item_id = f"pair{pos + 1:04d}"
        items.append({"id": item_id, **entries[k][0]})
        key[item_id] = entries[k][1]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shown_items = {"mode": SIDE_BY_SIDE, "dimensions": list(DIMENSIONS), "anchors": ANCHORS, "items": items}
    (out / ITEMS_FILE).write_text(json.dumps(shown_items, indent=1), encoding="utf-8")
    (out / KEY_FILE).write_text(json.dumps({"models": [label_1, label_2], **key}, indent=1), encoding="utf-8")
    return out


def _ratings_lines(folder: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(folder) / RATINGS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


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


def _checked_scores(scores: Any) -> dict[str, int]:
    if not isinstance(scores, dict) or not scores:
        raise ValueError("scores must map dimensions to 1..5")
    for dim, score in scores.items():
        if dim not in DIMENSIONS:
            raise ValueError(f"unknown dimension {dim!r}; dimensions: {', '.join(DIMENSIONS)}")
        if isinstance(score, bool) or score not in (1, 2, 3, 4, 5):
            raise ValueError(f"{dim}: a score is an integer from 1 to 5, got {score!r}")
    return scores


def _checked_preferences(prefer: Any) -> dict[str, str]:
    if not isinstance(prefer, dict) or not prefer:
        raise ValueError("prefer must map dimensions to 'A', 'B' or 'tie' (a side-by-side folder)")
    for dim, choice in prefer.items():
        if dim not in DIMENSIONS:
            raise ValueError(f"unknown dimension {dim!r}; dimensions: {', '.join(DIMENSIONS)}")
        if choice not in PREFERENCES:
            raise ValueError(f"{dim}: a preference is 'A', 'B' or 'tie', got {choice!r}")
    return prefer


class _Store:
    """Ratings appended as they arrive (one JSON line each, flushed and fsynced), behind a lock."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        data = json.loads((folder / ITEMS_FILE).read_text(encoding="utf-8"))
        self.items = data
        self.ids = {item["id"] for item in data["items"]}
        self.side_by_side = data.get("mode") == SIDE_BY_SIDE
        self.lock = threading.Lock()

    def add(self, entry: Any) -> dict[str, Any]:
        what = "{rater, item, prefer} or {rater, item, side, scores}" if self.side_by_side else "{rater, item, scores}"
        if not isinstance(entry, dict):
            raise ValueError(f"expected a JSON object {what}")
        rater, item = entry.get("rater"), entry.get("item")
        if not isinstance(rater, str) or not rater.strip():
            raise ValueError("rater must be a non-empty name")
        if item not in self.ids:
            raise ValueError(f"unknown item {item!r}")
        saved: dict[str, Any] = {"rater": rater.strip(), "item": item}
        if not self.side_by_side:
            return self._save({**saved, "scores": _checked_scores(entry.get("scores"))})
        if "prefer" not in entry and "scores" not in entry:
            raise ValueError(f"expected {what}")
        if "prefer" in entry:
            saved["prefer"] = _checked_preferences(entry["prefer"])
        if "scores" in entry:
            if entry.get("side") not in SIDES:
                raise ValueError(
                    f"side must be 'A' or 'B' (which completion the scores are of), got {entry.get('side')!r}"
                )
            saved["side"] = entry["side"]
            saved["scores"] = _checked_scores(entry["scores"])
        return self._save(saved)

    def given(self, rater: str) -> dict[str, Any]:
        """What ``rater`` entered so far: ``{"ratings": {item: ...}}``, side by side with ``"scores": {item: {side:
        {dimension: score}}}`` beside the choices."""
        if not self.side_by_side:
            return {"ratings": {item: s for (r, item), s in load_ratings(self.folder).items() if r == rater}}
        scores: dict[str, dict[str, dict[str, int]]] = {}
        for (r, item, side), s in load_sample_scores(self.folder).items():
            if r == rater:
                scores.setdefault(item, {})[side] = s
        chosen = {item: c for (r, item), c in load_preferences(self.folder).items() if r == rater}
        return {"ratings": chosen, "scores": scores}

    def _save(self, entry: dict[str, Any]) -> dict[str, Any]:
        line = json.dumps(entry) + "\n"
        with self.lock, open(self.folder / RATINGS_FILE, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return {"saved": True}


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Rate the completions</title>
<style>body{font-family:sans-serif;max-width:52em;margin:auto;padding:1em}
.item{border:1px solid #ccc;border-radius:6px;padding:1em;margin:1em 0}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em}.dim{margin:.4em 0}
.saved{color:#080;font-size:.9em}.anchors{color:#555;font-size:.85em}
.pair{display:flex;gap:1em}.pair>div{flex:1}.score{font-size:.9em;margin:.2em 0}
.which{margin-top:.8em;font-weight:bold}</style></head>
<body><h1>Rate the completions</h1>
<p id="how">Score each completion from 1 to 5 on every dimension. Every score is saved the moment you click it; you
can close the page and come back with the same name.</p>
<p><label>Your name: <input id="rater"></label> <button id="start">Start</button></p>
<div id="items"></div>
<script>
const el = (t, a = {}, kids = []) => { const e = document.createElement(t); Object.assign(e, a);
  kids.forEach(k => e.append(k)); return e; };
const anchorText = a => "1: " + a[1] + " / 3: " + a[3] + " / 5: " + a[5];
// one row of radio buttons: name is the group's name, send(value) posts the click; "saved" once the server has it
function choiceRow(label, name, values, texts, current, send, anchors, cls = "dim") {
  const row = el("div", {className: cls}, [el("span", {textContent: label + ": "})]);
  for (const v of values) {
    const input = el("input", {type: "radio", name, value: v, checked: current === v});
    input.addEventListener("change", async () => {
      const r = await send(v);
      row.querySelector(".saved").textContent = r.ok ? "saved" : "not saved: " + (await r.text());
    });
    row.append(el("label", {}, [input, " " + texts(v) + " "]));
  }
  row.append(el("span", {className: "saved"}));
  if (anchors) row.append(el("div", {className: "anchors", textContent: anchors}));
  return row;
}
const post = body => fetch("/api/rate", {method: "POST", headers: {"Content-Type": "application/json"},
                                         body: JSON.stringify(body)});
const label = dim => dim.replace("_", " ");
async function start() {
  const rater = document.getElementById("rater").value.trim();
  if (!rater) { alert("Enter your name first."); return; }
  const data = await (await fetch("/api/items?rater=" + encodeURIComponent(rater))).json();
  const box = document.getElementById("items"); box.innerHTML = "";
  if (data.mode === "side_by_side") { sideBySide(data, rater, box); return; }
  for (const item of data.items) {
    const done = data.ratings[item.id] || {};
    const card = el("div", {className: "item", id: item.id}, [el("b", {textContent: item.id}),
      el("div", {textContent: "Prompt:"}), el("pre", {textContent: item.prompt}),
      el("div", {textContent: "Completion:"}), el("pre", {textContent: item.completion})]);
    for (const dim of data.dimensions) {
      card.append(choiceRow(label(dim), item.id + "/" + dim, [1, 2, 3, 4, 5], String, done[dim],
        s => post({rater, item: item.id, scores: {[dim]: s}}), anchorText(data.anchors[dim])));
    }
    box.append(card);
  }
}
function sideBySide(data, rater, box) {
  document.getElementById("how").textContent = "For each prompt, two completions, A and B, in no particular order. " +
    "Score each of them from 1 to 5 on every dimension, and on every dimension choose the better one, or tie. " +
    "Every click is saved the moment you make it; you can close the page and come back with the same name.";
  const labels = {A: "A is better", tie: "tie", B: "B is better"};
  for (const item of data.items) {
    const done = data.ratings[item.id] || {};
    const scored = (data.scores || {})[item.id] || {};
    const side = s => {
      const col = el("div", {className: "side"}, [el("div", {textContent: s + ":"}),
        el("pre", {className: s.toLowerCase(), textContent: item[s.toLowerCase()]})]);
      for (const dim of data.dimensions) {
        col.append(choiceRow(label(dim), item.id + "/" + s + "/" + dim, [1, 2, 3, 4, 5], String,
          (scored[s] || {})[dim], v => post({rater, item: item.id, side: s, scores: {[dim]: v}}), null, "score"));
      }
      return col;
    };
    const card = el("div", {className: "item", id: item.id}, [el("b", {textContent: item.id}),
      el("div", {textContent: "Prompt:"}), el("pre", {textContent: item.prompt}),
      el("div", {className: "pair"}, [side("A"), side("B")]),
      el("div", {className: "which", textContent: "Which is better? (what 1, 3 and 5 mean is under each)"})]);
    for (const dim of data.dimensions) {
      card.append(choiceRow(label(dim), item.id + "/" + dim, ["A", "tie", "B"], v => labels[v], done[dim],
        v => post({rater, item: item.id, prefer: {[dim]: v}}), anchorText(data.anchors[dim])));
    }
    box.append(card);
  }
}
document.getElementById("start").addEventListener("click", start);
const named = new URLSearchParams(location.search).get("rater");  // a link per rater: /?rater=NAME starts at once
if (named) { document.getElementById("rater").value = named; start(); }
</script></body></html>
"""


def make_server(folder: str | os.PathLike, port: int = 8765, addr: str = "127.0.0.1") -> ThreadingHTTPServer:
    """The rating page's server over a folder written by :func:`export_items` or :func:`export_pairs`
    (``serve_forever()`` runs it).

    ``GET /``: the page (``/?rater=NAME`` opens it for that rater); ``GET /api/items?rater=NAME``: the items, the
    dimensions and their anchors, and that rater's scores so far; ``POST /api/rate`` ``{"rater", "item", "scores":
    {dimension: 1..5}}`` (side by side: ``"prefer": {dimension: "A" | "B" | "tie"}`` and/or ``"side": "A" | "B"`` with
    ``"scores"`` of that side's completion): saves them (400 with the reason when they are not valid). Nothing else of
    the folder is served (not ``key.json``).
    """
    store = _Store(Path(folder))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            from urllib.parse import parse_qs, urlparse

            url = urlparse(self.path)
            if url.path == "/":
                self._send(200, _PAGE, "text/html")
            elif url.path == "/api/items":
                rater = (parse_qs(url.query).get("rater") or [""])[0].strip()
                self._send(200, json.dumps({**store.items, **store.given(rater)}))
            else:
                self._send(404, json.dumps({"error": "not found"}))

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/api/rate":
                self._send(404, json.dumps({"error": "not found"}))
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                self._send(200, json.dumps(store.add(json.loads(self.rfile.read(length) or b"null"))))
            except (ValueError, json.JSONDecodeError) as err:
                self._send(400, json.dumps({"error": str(err)}))

    return ThreadingHTTPServer((addr, port), Handler)


def krippendorff_alpha(matrix: np.ndarray, level: str = "interval") -> float:
    """Krippendorff's alpha of a raters x items matrix (NaN: not rated), by the ``krippendorff`` package; NaN when
    fewer than two ratings of one item exist."""
    try:
        import krippendorff
    except ImportError:
        raise ImportError(
            "the human-eval report needs krippendorff; pip install 'textrl[human-eval]' (or pip install krippendorff)"
        ) from None
    pairable = np.sum(~np.isnan(matrix), axis=0) >= 2
    if not pairable.any() or len(np.unique(matrix[:, pairable][~np.isnan(matrix[:, pairable])])) < 2:
        return float("nan")  # no pair of ratings, or no variation at all: alpha is undefined
    return float(krippendorff.alpha(reliability_data=matrix, level_of_measurement=level))


def _interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and a 95% t-interval."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


def _summary(per_item: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "low", "high", "items"}`` of the per-item mean scores (a 95% t-interval)."""
    mean, low, high = _interval(per_item) if per_item else (float("nan"),) * 3
    return {"mean": mean, "low": low, "high": high, "items": len(per_item)}


def _calibration_summary(checks: Mapping[str, Sequence[tuple[str, bool]]], max_miss_rate: float) -> dict[str, Any]:
    """Per rater, from their ``(kind, missed)`` checks against the known answers: ``scored``, ``missed``, ``flagged``
    (none checked, or more than ``max_miss_rate`` of them missed) and, per kind, ``[checked, missed]``."""
    out = {}
    for rater, given in checks.items():
        missed = sum(m for _, m in given)
        kinds = {kind: [sum(k == kind for k, _ in given), sum(m for k, m in given if k == kind)]
                 for kind in sorted({k for k, _ in given})}  # fmt: skip
        flagged = not given or missed / len(given) > max_miss_rate
        out[rater] = {"scored": len(given), "missed": missed, "flagged": flagged, "by_kind": kinds}
    return out


def report(folder: str | os.PathLike, level: str = "interval", tolerance: int = 1, max_miss_rate: float = 0.2) -> dict:
    """Reliability and scores of a rated folder; also written to ``report.json`` and ``report.md`` there.

    A side-by-side folder (:func:`export_pairs`) gets, from :func:`preference_outcomes`: ``alpha`` of the un-blinded
    choices, ``unreliable``, and ``win_rate`` (per run and dimension: the share of items the run won among the items
    not tied, with a 95% Wilson interval; ``wins``, ``losses``, ``ties``, ``items``); from the 1-5 scores of the two
    completions (when any were given): ``score_alpha`` (per dimension, over the completions of the run items),
    ``unreliable_scores`` and ``scores`` (per run, as below); and ``calibration`` over the calibration pairs (a
    choice is missed when it is not the known one, a score as below).

    :param level: Krippendorff's level of measurement (``"interval"``, or ``"ordinal"`` for ranks only).
    :param tolerance: A calibration score is missed when it is more than this far from the known one.
    :param max_miss_rate: A rater who misses more than this fraction of their calibration answers is flagged.
    :return: ``alpha`` (per dimension), ``unreliable`` (dimensions with alpha < :data:`ALPHA_MIN`),
        ``calibration`` (per rater: scored, missed, flagged; empty without calibration items), ``scores`` (per
        source and dimension: mean over items of the raters' mean, with a 95% t-interval, and the number of items).
    """
    folder = Path(folder)
    key = json.loads((folder / KEY_FILE).read_text(encoding="utf-8"))
    if "models" in key:
        return _report_pairs(folder, key, level, tolerance, max_miss_rate)
    return _report_scores(folder, key, level, tolerance, max_miss_rate)


def _write_report(folder: Path, result: dict[str, Any]) -> dict[str, Any]:
    (folder / "report.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (folder / "report.md").write_text(_markdown(result), encoding="utf-8")
    return result


def _calibration_checks(
    key: Mapping[str, Any], ratings: Mapping[tuple[str, str], Mapping[str, int]], raters: Sequence[str], tolerance: int
) -> dict[str, list[tuple[str, bool]]]:
    """Per rater, ``("score", missed)`` for every score they gave that a calibration item knows (none without
    calibration items)."""
    known = {i: k["scores"] for i, k in key.items() if k["source"] == CALIBRATION}
    if not known:
        return {}
    checks: dict[str, list[tuple[str, bool]]] = {r: [] for r in raters}
    for rater in raters:
        for item, want in known.items():
            given = ratings.get((rater, item), {})
            checks[rater] += [("score", abs(given[d] - s) > tolerance) for d, s in want.items() if d in given]
    return checks


def _report_scores(folder: Path, key: dict[str, Any], level: str, tolerance: int, max_miss_rate: float) -> dict:
    """:func:`report` of a folder of 1-5 scores."""
    ratings = load_ratings(folder)
    raters = sorted({r for r, _ in ratings})
    items = sorted(i for i, k in key.items() if k["source"] != CALIBRATION)
    alpha = {}
    for dim in DIMENSIONS:
        matrix = np.array([[ratings.get((r, i), {}).get(dim, np.nan) for i in items] for r in raters], dtype=float)
        alpha[dim] = krippendorff_alpha(matrix.reshape(len(raters), len(items)), level) if raters else float("nan")
    checks = _calibration_checks(key, ratings, raters, tolerance)
    scores: dict[str, dict[str, Any]] = {}
    for source in sorted({k["source"] for k in key.values()} - {CALIBRATION}):
        scores[source] = {}
        for dim in DIMENSIONS:
            per_item = []
            for item, k in key.items():
                given = [ratings[(r, item)][dim] for r in raters if dim in ratings.get((r, item), {})]
                if k["source"] == source and given:
                    per_item.append(float(np.mean(given)))
            scores[source][dim] = _summary(per_item)
    unreliable = [d for d, a in alpha.items() if not (a >= ALPHA_MIN)]
    result = {"raters": raters, "alpha": alpha, "alpha_min": ALPHA_MIN, "unreliable": unreliable,
              "calibration": _calibration_summary(checks, max_miss_rate), "scores": scores}  # fmt: skip
    return _write_report(folder, result)


def preference_outcomes(
    key: Mapping[str, Any], preferences: Mapping[tuple[str, str], Mapping[str, str]], dim: str
) -> dict[str, dict[str, float]]:
    """Un-blind the choices on one dimension: ``item -> {rater: outcome}`` with the outcome for the first run of
    ``key["models"]``: 1 when the rater preferred it, 0 when they preferred the other, 0.5 for a tie (the items that
    pair the two runs only: calibration pairs are left out)."""
    first = key["models"][0]
    out: dict[str, dict[str, float]] = {}
    for (rater, item), given in preferences.items():
        choice = given.get(dim)
        if choice is None or item not in key or key[item].get("source") != SIDE_BY_SIDE:
            continue
        out.setdefault(item, {})[rater] = 0.5 if choice == "tie" else float(key[item][choice] == first)
    return out


def _win_rates(outcomes: Mapping[str, Mapping[str, float]], models: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each run's win rate on one dimension from :func:`preference_outcomes`, with a 95% Wilson interval."""
    from sb3_grpo.compare.stats import wilson_interval

    per_item = [float(np.mean(list(v.values()))) for v in outcomes.values() if v]
    wins = sum(u > 0.5 for u in per_item)
    losses = sum(u < 0.5 for u in per_item)
    out = {}
    for model, k in ((models[0], wins), (models[1], losses)):
        low, high = wilson_interval(k, wins + losses)
        out[model] = {"rate": k / (wins + losses) if wins + losses else float("nan"), "low": low, "high": high,
                      "wins": k, "losses": wins + losses - k, "ties": len(per_item) - wins - losses,
                      "items": len(per_item)}  # fmt: skip
    return out


def _pair_calibration_checks(
    key: Mapping[str, Any],
    preferences: Mapping[tuple[str, str], Mapping[str, str]],
    sample_scores: Mapping[tuple[str, str, str], Mapping[str, int]],
    raters: Sequence[str],
    tolerance: int,
) -> dict[str, list[tuple[str, bool]]]:
    """Per rater, ``("choice" | "score", missed)`` for every answer they gave that a calibration pair knows."""
    known = {i: k for i, k in key.items() if i != "models" and k["source"] == CALIBRATION}
    if not known:
        return {}
    checks: dict[str, list[tuple[str, bool]]] = {r: [] for r in raters}
    for rater in raters:
        for item, k in known.items():
            chosen = preferences.get((rater, item), {})
            checks[rater] += [("choice", chosen[d] != c) for d, c in k["prefer"].items() if d in chosen]
            for side, want in k["scores"].items():
                given = sample_scores.get((rater, item, side), {})
                checks[rater] += [("score", abs(given[d] - s) > tolerance) for d, s in want.items() if d in given]
    return checks


def _report_pairs(folder: Path, key: dict[str, Any], level: str, tolerance: int, max_miss_rate: float) -> dict:
    """:func:`report` of a side-by-side folder."""
    models = key["models"]
    preferences = load_preferences(folder)
    sample_scores = load_sample_scores(folder)
    raters = sorted({r for r, _ in preferences} | {r for r, _, _ in sample_scores})
    items = sorted(i for i, k in key.items() if i != "models" and k["source"] == SIDE_BY_SIDE)
    alpha, win_rate = {}, {m: {} for m in models}
    for dim in DIMENSIONS:
        outcomes = preference_outcomes(key, preferences, dim)
        matrix = np.array([[outcomes.get(i, {}).get(r, np.nan) for i in items] for r in raters], dtype=float)
        alpha[dim] = krippendorff_alpha(matrix.reshape(len(raters), len(items)), level) if raters else float("nan")
        for model, rate in _win_rates(outcomes, models).items():
            win_rate[model][dim] = rate
    score_alpha: dict[str, float] = {}
    scores: dict[str, dict[str, Any]] = {}
    if sample_scores:  # the 1-5 scores of the two completions: each completion of a run item is one unit
        units = [(i, side) for i in items for side in SIDES]
        for dim in DIMENSIONS:
            matrix = np.array(
                [[sample_scores.get((r, i, side), {}).get(dim, np.nan) for i, side in units] for r in raters],
                dtype=float,
            )
            score_alpha[dim] = krippendorff_alpha(matrix, level)
        for model in models:
            scores[model] = {}
            for dim in DIMENSIONS:
                per_item = []
                for item in items:
                    side = "A" if key[item]["A"] == model else "B"
                    given = [sample_scores[(r, item, side)][dim] for r in raters
                             if dim in sample_scores.get((r, item, side), {})]  # fmt: skip
                    if given:
                        per_item.append(float(np.mean(given)))
                scores[model][dim] = _summary(per_item)
    checks = _pair_calibration_checks(key, preferences, sample_scores, raters, tolerance)
    result = {"mode": SIDE_BY_SIDE, "models": models, "raters": raters, "alpha": alpha, "alpha_min": ALPHA_MIN,
              "unreliable": [d for d, a in alpha.items() if not (a >= ALPHA_MIN)], "win_rate": win_rate,
              "score_alpha": score_alpha,
              "unreliable_scores": [d for d, a in score_alpha.items() if not (a >= ALPHA_MIN)],
              "scores": scores, "calibration": _calibration_summary(checks, max_miss_rate)}  # fmt: skip
    return _write_report(folder, result)


def _num(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _alpha_lines(alpha: Mapping[str, float], unreliable: Sequence[str], what: str) -> list[str]:
    lines = [f"| dimension | Krippendorff's alpha{what} | reliable (>= {ALPHA_MIN}) |", "|---|---|---|"]
    return lines + [f"| {d} | {_num(a)} | {'no' if d in unreliable else 'yes'} |" for d, a in alpha.items()]


def _scores_lines(scores: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    lines = ["| run | " + " | ".join(DIMENSIONS) + " |", "|---|" + "---|" * len(DIMENSIONS)]
    for source, dims in scores.items():
        cells = [f"{_num(v['mean'])} [{_num(v['low'])}, {_num(v['high'])}] (n={v['items']})" for v in dims.values()]
        lines.append(f"| {source} | " + " | ".join(cells) + " |")
    return lines


def _calibration_lines(calibration: Mapping[str, Mapping[str, Any]]) -> list[str]:
    if not calibration:
        return ["No calibration items."]
    lines = ["| rater | calibration answers | missed | flagged |", "|---|---|---|---|"]
    for rater, c in calibration.items():
        kinds = ", ".join(f"{m} of {n} {k}s" for k, (n, m) in c["by_kind"].items())
        missed = f"{c['missed']} ({kinds})" if len(c["by_kind"]) > 1 else str(c["missed"])
        lines.append(f"| {rater} | {c['scored']} | {missed} | {'yes' if c['flagged'] else 'no'} |")
    return lines


def _markdown(result: Mapping[str, Any]) -> str:
    lines = ["# Human evaluation", "", f"Raters: {', '.join(result['raters']) or 'none'}", ""]
    if result.get("mode") != SIDE_BY_SIDE:
        lines += _alpha_lines(result["alpha"], result["unreliable"], "")
        lines += ["", *_calibration_lines(result["calibration"]), "", *_scores_lines(result["scores"])]
        return "\n".join(lines) + "\n"
    lines += ["## Choices", "", *_alpha_lines(result["alpha"], result["unreliable"], " of the choices"), "",
              "Win rate: the share of the items not tied on which the raters (on average) preferred the run, "
              "with a 95% Wilson interval; alpha is that of the un-blinded choices (1 / 0.5 / 0 for the first run: "
              "preferred / tie / the other).", "",
              "| run | " + " | ".join(DIMENSIONS) + " |", "|---|" + "---|" * len(DIMENSIONS)]  # fmt: skip
    for model, dims in result["win_rate"].items():
        cells = [f"{_num(v['rate'])} [{_num(v['low'])}, {_num(v['high'])}] ({v['wins']}-{v['losses']}, "
                 f"{v['ties']} tied)" for v in dims.values()]  # fmt: skip
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    lines += ["", "## Scores (1-5)", ""]
    if result["score_alpha"]:
        lines += _alpha_lines(result["score_alpha"], result["unreliable_scores"], " of the scores")
        lines += ["", "Per run: the mean over items of the raters' mean score, with a 95% t-interval.", ""]
        lines += _scores_lines(result["scores"])
    else:
        lines.append("No 1-5 scores were given.")
    lines += ["", "## Calibration", "", *_calibration_lines(result["calibration"])]
    return "\n".join(lines) + "\n"
