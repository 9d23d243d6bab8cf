"""``human-eval serve``: the local rating page and the store that appends every rating as it is entered."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sb3_grpo.human_eval.protocol import (
    ITEMS_FILE,
    RATINGS_FILE,
    SIDE_BY_SIDE,
    SIDES,
    checked_preferences,
    checked_scores,
    load_preferences,
    load_ratings,
    load_sample_scores,
)

__all__ = ["make_server"]


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
            return self._save({**saved, "scores": checked_scores(entry.get("scores"))})
        if "prefer" not in entry and "scores" not in entry:
            raise ValueError(f"expected {what}")
        if "prefer" in entry:
            saved["prefer"] = checked_preferences(entry["prefer"])
        if "scores" in entry:
            if entry.get("side") not in SIDES:
                raise ValueError(
                    f"side must be 'A' or 'B' (which completion the scores are of), got {entry.get('side')!r}"
                )
            saved["side"] = entry["side"]
            saved["scores"] = checked_scores(entry["scores"])
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
