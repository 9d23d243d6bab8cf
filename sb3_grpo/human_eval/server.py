"""``human-eval serve``: the local rating page and the store that appends every rating as it is entered.

The server lets in only who holds its token and only the page it serves. Each start draws a new token (as Jupyter
does), printed in the page's URL (``http://127.0.0.1:8765/?token=...``); the page sends it with every API call
(header ``X-Rating-Token``), and a request without it is refused (403). API calls must come from the page's own origin
(``Origin`` / ``Sec-Fetch-Site``, and a ``Host`` of this server, against DNS rebinding) and ratings must be
``application/json`` (a form or ``text/plain`` post from another site is refused: 415). Every field is checked for type
and size (:data:`MAX_BODY_BYTES`, :data:`MAX_NAME_CHARS`); a connection idle for ``timeout`` seconds is closed, at most
``max_threads`` connections are served at once (more get 503), and an unexpected error answers 500 with one line,
never a traceback.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import sys
import threading
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlparse

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
    repair_ratings,
)

__all__ = ["MAX_BODY_BYTES", "MAX_NAME_CHARS", "TOKEN_HEADER", "RatingServer", "checked_rater", "make_server"]

#: The largest request body accepted (a rating is a few hundred bytes).
MAX_BODY_BYTES = 16 * 1024
#: The longest rater name accepted.
MAX_NAME_CHARS = 100
#: The header that carries the server's token on API calls.
TOKEN_HEADER = "X-Rating-Token"


def checked_rater(name: Any) -> str:
    """A rater's name, stripped: a non-empty string of at most :data:`MAX_NAME_CHARS` characters with no control
    characters (no newline, tab or escape: names go into ``report.md``).

    :raises ValueError: saying what is wrong.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("rater must be a non-empty name (a string)")
    name = name.strip()
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"rater: a name has at most {MAX_NAME_CHARS} characters, got {len(name)}")
    if any(unicodedata.category(c).startswith("C") for c in name):
        raise ValueError("rater: a name has no control characters (newlines, tabs, escapes)")
    return name


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
        unknown = sorted(set(entry) - {"rater", "item", "scores", "prefer", "side"})
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(map(repr, unknown[:5]))}; expected {what}")
        rater, item = checked_rater(entry.get("rater")), entry.get("item")
        if not isinstance(item, str) or item not in self.ids:
            raise ValueError(f"unknown item {str(item)[:40]!r}; give the id of an item of this folder")
        saved: dict[str, Any] = {"rater": rater, "item": item}
        if not self.side_by_side:
            return self._save({**saved, "scores": checked_scores(entry.get("scores"))})
        if "prefer" not in entry and "scores" not in entry:
            raise ValueError(f"expected {what}")
        if "prefer" in entry:
            saved["prefer"] = checked_preferences(entry["prefer"])
        if "scores" in entry:
            if entry.get("side") not in SIDES:
                raise ValueError(
                    f"side must be 'A' or 'B' (which completion the scores are of), got {str(entry.get('side'))[:20]!r}"
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
        line = (json.dumps(entry) + "\n").encode("utf-8")
        with self.lock, open(self.folder / RATINGS_FILE, "a+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size:  # a line cut short before (e.g. a full disk) is ended first: no rating is glued onto it
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = b"\n" + line
            try:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                f.truncate(size)  # the file as it was: no half line left behind
                raise
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
// the token the server printed in this page's URL goes with every API call (a page of another origin has none)
const TOKEN = new URLSearchParams(location.search).get("token") || "";
const post = body => fetch("/api/rate", {method: "POST", headers: {"Content-Type": "application/json",
                                         "X-Rating-Token": TOKEN}, body: JSON.stringify(body)});
const label = dim => dim.replace("_", " ");
async function start() {
  const rater = document.getElementById("rater").value.trim();
  if (!rater) { alert("Enter your name first."); return; }
  const answer = await fetch("/api/items?rater=" + encodeURIComponent(rater), {headers: {"X-Rating-Token": TOKEN}});
  if (!answer.ok) { alert("The server refused: " + (await answer.text())); return; }
  const data = await answer.json();
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
const named = new URLSearchParams(location.search).get("rater");  // a link per rater: &rater=NAME starts at once
if (named) { document.getElementById("rater").value = named; start(); }
</script></body></html>
"""


class _Refusal(Exception):
    """An HTTP refusal: status code and the reason sent back (JSON)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class RatingServer(ThreadingHTTPServer):
    """The rating page's HTTP server: a token per start, connections served by at most ``max_threads`` threads.

    :ivar token: This start's token (what the page's URL carries).
    :ivar repaired: What :func:`~sb3_grpo.human_eval.protocol.repair_ratings` did at the start (``None``: nothing).
    """

    store: _Store
    conn_timeout: float
    bind_addr: str
    repaired: str | None

    daemon_threads = True  # Ctrl-C stops the server at once; every rating is already on disk

    def __init__(self, address: tuple[str, int], handler: type, token: str, max_threads: int) -> None:
        super().__init__(address, handler)
        self.token = token
        self._slots = threading.BoundedSemaphore(max_threads)

    @property
    def url(self) -> str:
        """The page's address with the token, as printed for the raters."""
        host = self.server_address[0]
        host = "127.0.0.1" if host in ("", "0.0.0.0") else f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.server_port}/?token={quote(self.token, safe='')}"

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # every worker busy: refuse at once instead of queueing a thread
            body = b'{"error": "the server is busy (too many open connections); try again"}'
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))  # fmt: skip
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ARG002  (socketserver's signature)
        """One line on stderr for an error outside the handlers (never a traceback)."""
        err = sys.exc_info()[1]
        if not isinstance(err, (ConnectionError, socket.timeout)):
            print(f"human-eval serve: {type(err).__name__}: {err} (client {client_address[0]})", file=sys.stderr)


class _RatingHandler(BaseHTTPRequestHandler):
    """One request to the rating server (its store, token and limits are the server's)."""

    server: RatingServer

    def setup(self) -> None:
        self.timeout = (
            self.server.conn_timeout
        )  # StreamRequestHandler: the socket's timeout, so a silent client is dropped
        super().setup()

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Referrer-Policy", "no-referrer")  # the token never leaves in a Referer
        if kind == "text/html":
            self.send_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; "
                             "style-src 'unsafe-inline'; frame-ancestors 'none'")  # fmt: skip
        self.end_headers()
        self.wfile.write(data)

    def _check_host(self) -> None:
        allowed = _allowed_hosts(self.server.bind_addr, self.server.server_port)
        host = self.headers.get("Host", "")
        if allowed and host not in allowed:
            raise _Refusal(403, f"unexpected Host {host[:80]!r}; open the address the server printed")

    def _check_token(self, given: str | None) -> None:
        if not given or not hmac.compare_digest(given.encode(), self.server.token.encode()):
            raise _Refusal(403, "missing or wrong token; open the address (with its ?token=...) the server printed")

    def _check_api_call(self) -> None:
        """Token, and the page's own origin (a page of another site sends its Origin, or Sec-Fetch-Site)."""
        self._check_token(self.headers.get(TOKEN_HEADER))
        origin = self.headers.get("Origin")
        if origin is not None and origin != f"http://{self.headers.get('Host', '')}":
            raise _Refusal(403, f"cross-origin request from {origin[:80]!r} refused")
        if self.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            raise _Refusal(403, "cross-site request refused")

    def _guarded(self, work: Any) -> None:
        try:
            if len(self.path) > 2048:
                raise _Refusal(414, "the address is too long")
            self._check_host()
            work()
        except _Refusal as refusal:
            self._send(refusal.code, json.dumps({"error": str(refusal)}))
        except (TimeoutError, ConnectionError):
            pass  # the client went away: nothing to answer
        except Exception as err:  # noqa: BLE001  (answer 500 with one line, never a traceback)
            print(f"human-eval serve: {type(err).__name__}: {err}", file=sys.stderr)
            self._send(500, json.dumps({"error": "internal error (the server's terminal says which)"}))

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        self._guarded(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._guarded(self._post)

    def _get(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if url.path == "/":
            self._check_token((query.get("token") or [""])[0])
            self._send(200, _PAGE, "text/html")
        elif url.path == "/api/items":
            self._check_api_call()
            try:
                rater = checked_rater((query.get("rater") or [""])[0])
            except ValueError as err:
                raise _Refusal(400, str(err)) from None
            store = self.server.store
            self._send(200, json.dumps({**store.items, **store.given(rater)}))
        else:
            raise _Refusal(404, "not found")

    def _post(self) -> None:
        if self.path != "/api/rate":
            raise _Refusal(404, "not found")
        self._check_api_call()
        kind = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise _Refusal(415, f"a rating is sent as application/json, got {kind[:60]!r}")
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            raise _Refusal(411, "a rating needs a Content-Length")
        if int(length) > MAX_BODY_BYTES:
            raise _Refusal(413, f"a rating is at most {MAX_BODY_BYTES} bytes, this one is {int(length)}")
        try:
            entry = json.loads(self.rfile.read(int(length)) or b"null")
            saved = self.server.store.add(entry)
        except (ValueError, RecursionError) as err:  # JSON errors are ValueErrors
            raise _Refusal(400, str(err)[:300]) from None
        except OSError as err:  # e.g. a full disk: nothing half-written was left (see _Store._save)
            print(f"human-eval serve: could not save a rating: {err}", file=sys.stderr)
            raise _Refusal(507, f"the server could not save the rating ({err.strerror or err}); try again") from None
        self._send(200, json.dumps(saved))


def _allowed_hosts(addr: str, port: int) -> set[str]:
    names = {addr, "localhost", "127.0.0.1", "[::1]"} if addr in ("127.0.0.1", "localhost", "::1") else {addr}
    if addr in ("", "0.0.0.0", "::"):
        return set()  # bound to every interface: any Host (the token still guards every call)
    return {f"{n}:{port}" for n in names} | {f"[{addr}]:{port}"}


def make_server(
    folder: str | os.PathLike,
    port: int = 8765,
    addr: str = "127.0.0.1",
    token: str | None = None,
    timeout: float = 30.0,
    max_threads: int = 32,
) -> RatingServer:
    """The rating page's server over a folder written by :func:`export_items` or :func:`export_pairs`
    (``serve_forever()`` runs it; its ``url`` is the page's address with the token).

    ``GET /?token=T``: the page (``&rater=NAME`` opens it for that rater); ``GET /api/items?rater=NAME``: the items,
    the dimensions and their anchors, and that rater's scores so far; ``POST /api/rate`` ``{"rater", "item",
    "scores": {dimension: 1..5}}`` (side by side: ``"prefer": {dimension: "A" | "B" | "tie"}`` and/or ``"side": "A" |
    "B"`` with ``"scores"`` of that side's completion): saves them (400 with the reason when they are not valid). The
    API calls need the token in the ``X-Rating-Token`` header, the page's origin, and (``POST``) a JSON body of at most
    :data:`MAX_BODY_BYTES`. Nothing else of the folder is served (not ``key.json``). A torn last line of
    ``ratings.jsonl`` (a kill mid-append) is repaired first (:func:`~sb3_grpo.human_eval.protocol.repair_ratings`;
    the server's ``repaired`` attribute says what was done, ``None`` when nothing was).

    :param folder: The rating folder.
    :param port: The port (0: any free port).
    :param addr: The address to listen on (default ``127.0.0.1``: this machine only).
    :param token: The token (default: a new random one, ``secrets.token_urlsafe``).
    :param timeout: Seconds a connection may stay silent before it is closed.
    :param max_threads: Connections served at once; more are answered 503 at once.
    :raises ValueError: for a port outside 0..65535, a token shorter than 16 characters or a bad limit.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in 0..65535 (0: any free port), got {port!r}")
    if token is not None and (not isinstance(token, str) or len(token) < 16 or not token.isascii()):
        raise ValueError("token must be an ASCII string of at least 16 characters (or None: a random one)")
    if not (isinstance(timeout, (int, float)) and 0 < timeout < float("inf")):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(max_threads, bool) or not isinstance(max_threads, int) or max_threads < 1:
        raise ValueError(f"max_threads must be an integer >= 1, got {max_threads!r}")
    folder = Path(folder)
    repaired = repair_ratings(folder)
    store = _Store(folder)
    token = token or secrets.token_urlsafe(24)

    server = RatingServer((addr, port), _RatingHandler, token, max_threads)
    server.store, server.conn_timeout, server.bind_addr, server.repaired = store, float(timeout), addr, repaired
    return server
