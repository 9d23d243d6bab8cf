"""The rating server lets no one in without its token, takes JSON from its own page only, checks every field, bounds
connections and threads, never answers with a traceback; the ratings file survives a torn append, and an export
never silently replaces a rated set."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from sb3_grpo.cli import main
from sb3_grpo.human_eval import DIMENSIONS, export_items, load_ratings, make_server, report

TOKEN = "hostile-test-token-0123456789"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def folder(tmp_path):
    runs = [_write(tmp_path / f"{r}.jsonl", [{"prompt": f"p{r}{i}", "completion": f"{r} {i}"} for i in range(3)])
            for r in ("a", "b")]  # fmt: skip
    return export_items([("a", runs[0]), ("b", runs[1])], tmp_path / "rate", n=3, seed=0)


@pytest.fixture
def serve(folder):
    servers = []

    def start(**kwargs):
        server = make_server(folder, port=0, **{"token": TOKEN, **kwargs})
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _raw(port, request: bytes, timeout=5.0) -> tuple[int, str]:
    """Send raw bytes; ``(status, body)`` of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace")


def _request(port, method="POST", path="/api/rate", body=b"", headers=None) -> tuple[int, str]:
    headers = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json", "X-Rating-Token": TOKEN,
               "Content-Length": str(len(body)), **(headers or {})}  # fmt: skip
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items() if v is not None), "", ""]
    return _raw(port, "\r\n".join(lines).encode() + body)


def _rating(item="item0001", rater="ana", **extra):
    return json.dumps({"rater": rater, "item": item, "scores": {"coherence": 4}, **extra}).encode()


def test_no_token_no_entry(serve, folder):
    port = serve().server_port
    for headers in ({"X-Rating-Token": None}, {"X-Rating-Token": "wrong-token-0123456789abc"}):
        assert _request(port, body=_rating(), headers=headers)[0] == 403
        assert _request(port, "GET", "/api/items?rater=ana", headers=headers)[0] == 403
    code, body = _request(port, "GET", "/")
    assert code == 403 and "?token=" in body
    code, body = _request(port, "GET", f"/?token={TOKEN}")
    assert code == 200 and "X-Rating-Token" in body
    assert not (folder / "ratings.jsonl").exists()
    assert _request(port, body=_rating())[0] == 200  # with the token: saved


def test_other_origins_and_other_content_types_are_refused(serve, folder):
    port = serve().server_port
    refusals = [
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Host": "evil.example:80"}, 403),  # DNS rebinding
        ({"Content-Type": "text/plain"}, 415),  # a form post or a no-cors fetch from another page
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ]
    for headers, code in refusals:
        assert _request(port, body=_rating(), headers=headers)[0] == code, headers
    assert not (folder / "ratings.jsonl").exists()
    assert _request(port, body=_rating(), headers={"Origin": f"http://127.0.0.1:{port}"})[0] == 200


def test_wrong_types_and_sizes_are_refused_without_a_traceback(serve, folder):
    port = serve().server_port
    cases = [
        (json.dumps({"rater": "ana", "item": ["item0001"], "scores": {"coherence": 4}}).encode(), 400, "unknown item"),
        (json.dumps({"rater": ["ana"], "item": "item0001", "scores": {"coherence": 4}}).encode(), 400, "rater"),
        (json.dumps({"rater": "ana", "item": {"a": 1}, "scores": {"coherence": 4}}).encode(), 400, "unknown item"),
        (json.dumps({"rater": "ana", "item": "item0001", "scores": "five"}).encode(), 400, "scores must map"),
        (_rating(rater="x" * 101), 400, "at most 100 characters"),
        (_rating(rater="ana\n<script>alert(1)</script>"), 400, "control characters"),
        (_rating(extra="x"), 400, "unknown field"),
        (b"[" * 5000 + b"]" * 5000, 400, ""),
        (b"{not json", 400, ""),
        (_rating(rater="x" * 17_000), 413, "at most"),  # over the 16 KiB a rating may take
    ]
    for body, code, message in cases:
        got, text = _request(port, body=body)
        assert got == code and message in text and "Traceback" not in text, (body[:60], got, text)
    # a body that claims to be huge is refused before it is read; one that says nothing of its size too
    assert _request(port, body=b"", headers={"Content-Length": str(30 * 2**20)})[0] == 413
    assert _request(port, body=b"", headers={"Content-Length": None})[0] == 411
    assert _request(port, "GET", "/api/items?rater=" + "x" * 101)[0] == 400
    assert not (folder / "ratings.jsonl").exists()
    assert _request(port, body=_rating())[0] == 200


def test_an_unexpected_error_answers_500_in_one_line(serve, capfd):
    server = serve()

    def broken(rater):
        raise RuntimeError("disk on fire")

    server.store.given = broken
    code, body = _request(server.server_port, "GET", "/api/items?rater=ana")
    assert code == 500 and "Traceback" not in body and "internal error" in body
    err = capfd.readouterr().err
    assert "RuntimeError: disk on fire" in err and "Traceback" not in err
    assert _request(server.server_port, body=_rating())[0] == 200


def test_idle_connections_are_timed_out_and_the_threads_capped(serve, folder):
    server = serve(timeout=1.0, max_threads=4)
    port = server.server_port
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=6) for _ in range(12)]
    start, answers, peak = time.monotonic(), [], 0
    for s in idle:  # each is answered 503 at once (every worker busy) or closed once silent for the timeout
        peak = max(peak, threading.active_count() - before)
        answers.append(s.recv(100))
        s.close()
    assert time.monotonic() - start < 8
    assert peak <= 4  # at most max_threads workers, however many connect
    assert all(a == b"" or a.startswith(b"HTTP/1.0 503") for a in answers)
    assert sum(a.startswith(b"HTTP/1.0 503") for a in answers) >= 4 and answers[:4] == [b""] * 4
    assert _request(port, body=_rating())[0] == 200  # and it keeps serving
    assert len(load_ratings(folder)) == 1


def test_a_torn_last_line_is_repaired_and_reported(folder, serve, capsys):
    ratings = folder / "ratings.jsonl"
    good = json.dumps({"rater": "ana", "item": "item0001", "scores": {"coherence": 4}})
    glued = '{"rater": "bo", "it' + json.dumps({"rater": "cy", "item": "item0002", "scores": {"coherence": 2}})
    ratings.write_text(good + "\n" + glued + "\n" + '{"rater": "bo", "item": "item00')  # killed mid-append twice
    server = serve()
    assert "repaired 2 torn line(s)" in server.repaired and "1 recovered" in server.repaired
    assert load_ratings(folder) == {("ana", "item0001"): {"coherence": 4}, ("cy", "item0002"): {"coherence": 2}}
    (aside,) = folder.glob("ratings.jsonl.torn-*")
    assert aside.read_text() == '{"rater": "bo", "it\n{"rater": "bo", "item": "item00\n'
    assert _request(server.server_port, body=_rating(item="item0003", rater="bo"))[0] == 200
    assert ("bo", "item0003") in load_ratings(folder)  # on a line of its own, not glued onto the fragment
    # a cut-short line left by a full disk while serving: the next rating still starts a line of its own
    with open(ratings, "a") as f:
        f.write('{"rater": "dee"')
    assert _request(server.server_port, body=_rating(item="item0004", rater="eve"))[0] == 200
    capsys.readouterr()
    assert main(["human-eval", "report", str(folder)]) in (0, 1)
    out = capsys.readouterr().out
    assert "repaired" in out and "Krippendorff" in out
    assert ("eve", "item0004") in load_ratings(folder)


def test_the_report_escapes_names(folder):
    name = "mallory | <script>alert(1)</script> " + "x" * 200
    entries = [{"rater": r, "item": "item0001", "scores": dict.fromkeys(DIMENSIONS, 3)} for r in (name, "ana")]
    _write(folder / "ratings.jsonl", entries)
    report(folder)
    text = (folder / "report.md").read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text and "x" * 150 not in text
    assert "mallory \\|" in text


def test_export_refuses_a_rated_folder_unless_forced(folder, tmp_path, capsys):
    runs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    _write(folder / "ratings.jsonl", [{"rater": "ana", "item": "item0001", "scores": {"coherence": 4}}])
    items, key = (folder / "items.json").read_text(), (folder / "key.json").read_text()
    with pytest.raises(ValueError, match=r"holds 1 ratings.*--force"):
        export_items([("a", runs[0]), ("b", runs[1])], folder, n=2, seed=5)
    assert (folder / "items.json").read_text() == items and (folder / "key.json").read_text() == key
    with pytest.raises(SystemExit) as exit_:
        main(["human-eval", "export", *map(str, runs), "--out", str(folder), "--seed", "5"])
    assert exit_.value.code == 2 and "--force" in capsys.readouterr().err
    assert main(["human-eval", "export", *map(str, runs), "--out", str(folder), "--seed", "5", "--force"]) == 0
    (aside,) = [p for p in folder.iterdir() if p.is_dir()]
    assert (aside / "items.json").read_text() == items and (aside / "key.json").read_text() == key
    assert load_ratings(aside) == {("ana", "item0001"): {"coherence": 4}}
    assert not (folder / "ratings.jsonl").exists() and (folder / "items.json").read_text() != items


def test_the_page_works_with_its_token_and_a_cross_origin_form_is_refused(folder, serve, tmp_path):
    import shutil

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Chromium is not installed (/usr/bin/chromium, Debian package chromium): no real-browser check")
    pytest.importorskip("websockets", reason="websockets (the test extra) drives Chromium over the DevTools protocol")
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from test_human_eval import Browser

    server = serve()
    target = f"http://127.0.0.1:{server.server_port}/api/rate"
    evil_page = f"""<!doctype html><html><body>
<form id="f" method="POST" action="{target}" enctype="text/plain">
<input name='{{"rater": "evil", "item": "item0001", "scores": {{"coherence": 1}}, "x": "' value='"}}'></form>
<script>
fetch("{target}", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
  body: JSON.stringify({{rater: "evil2", item: "item0001", scores: {{coherence: 1}}}})}});
fetch("{target}", {{method: "POST",
  headers: {{"Content-Type": "application/json", "X-Rating-Token": "guess-guess-guess"}},
  body: JSON.stringify({{rater: "evil3", item: "item0001", scores: {{coherence: 1}}}})}}).catch(() => {{}});
setTimeout(() => document.getElementById("f").submit(), 300);
</script></body></html>"""

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            data = evil_page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    browser = Browser(tmp_path)
    try:
        browser.call("Page.navigate", url=f"{server.url}&rater=ana")
        browser.wait_for("document.querySelectorAll('.item').length === 6")
        browser.js('document.querySelector(\'input[name="item0001/coherence"][value="4"]\').click(); true')
        browser.wait_for("[...document.querySelectorAll('.saved')].some(s => s.textContent === 'saved')")
        browser.call("Page.navigate", url=f"http://127.0.0.1:{other.server_port}/")  # another origin
        time.sleep(3)
    finally:
        browser.close()
        other.shutdown()
        other.server_close()
    assert load_ratings(folder) == {("ana", "item0001"): {"coherence": 4}}
