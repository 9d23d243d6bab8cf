"""Human evaluation: a blind export, three raters rating through the page's HTTP endpoints (saved as entered), and a
report whose alpha equals a hand computation of Krippendorff's alpha."""

from __future__ import annotations

import itertools
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from sb3_grpo.cli import main
from sb3_grpo.human_eval import DIMENSIONS, export_items, krippendorff_alpha, load_ratings, make_server, report

pytest.importorskip("krippendorff", reason="the human-eval extra is not installed")


def hand_alpha_interval(matrix: np.ndarray) -> float:
    """Krippendorff's interval alpha by its definition: 1 - D_o / D_e over the pairable values (items rated at least
    twice), D_o from the pairs within an item (each weighted 1 / (m_u - 1)), D_e from all pairs of values."""
    units = [col[~np.isnan(col)] for col in matrix.T]
    units = [u for u in units if len(u) >= 2]
    values = np.concatenate(units)
    n = len(values)
    d_o = sum(sum((a - b) ** 2 for a, b in itertools.permutations(u, 2)) / (len(u) - 1) for u in units) / n
    d_e = sum((a - b) ** 2 for a, b in itertools.permutations(values, 2)) / (n * (n - 1))
    return 1 - d_o / d_e


def test_alpha_equals_the_hand_computation():
    nan = np.nan
    m = np.array([[1, 2, 3, 3, 2, 1, 4, 1, 2, nan], [1, 2, 3, 3, 2, 2, 4, 1, 2, 5], [nan, 3, 3, 3, 2, 3, 4, 2, 2, 5]])
    assert krippendorff_alpha(m) == pytest.approx(hand_alpha_interval(m), abs=1e-9)
    assert np.isnan(krippendorff_alpha(np.array([[1.0, nan], [nan, 2.0]])))  # no item rated twice


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


#: The rating servers' token here (a server draws a random one when none is given).
TOKEN = "test-token-0123456789abcdef"


def _post(url, body):
    headers = {"Content-Type": "application/json", "X-Rating-Token": TOKEN}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


def _get(url):
    return urllib.request.urlopen(urllib.request.Request(url, headers={"X-Rating-Token": TOKEN}), timeout=10).read()


# each rater's scores of the six run items, the same on every dimension; one rater misses the calibration item
SCORES = {
    "ana": [5, 4, 4, 2, 1, 2],
    "bo": [5, 5, 4, 2, 2, 1],
    "cy": [4, 4, 5, 1, 2, 2],
}


def test_three_raters_rate_over_http_and_the_report_matches(tmp_path):
    a = _write(tmp_path / "a.jsonl", [{"prompt": f"pa{i}", "completion": f"good answer {i}"} for i in range(5)])
    b = _write(tmp_path / "b.jsonl", [{"prompt": f"pb{i}", "completion": f"bad answer {i}", "transcript": None}
                                      for i in range(5)])  # fmt: skip
    cal = _write(
        tmp_path / "cal.jsonl", [{"prompt": "c", "completion": "known", "scores": dict.fromkeys(DIMENSIONS, 5)}]
    )
    folder = export_items([("A", a), ("B", b)], tmp_path / "rate", n=3, seed=1, calibration=cal)
    shown = json.loads((folder / "items.json").read_text())
    key = json.loads((folder / "key.json").read_text())
    assert len(shown["items"]) == 7 and "source" not in json.dumps(shown["items"])  # blind
    assert sorted(k["source"] for k in key.values()) == ["A"] * 3 + ["B"] * 3 + ["calibration"]
    run_items = sorted(i for i, k in key.items() if k["source"] != "calibration")
    cal_item = next(i for i, k in key.items() if k["source"] == "calibration")

    server = make_server(folder, port=0, token=TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        page = urllib.request.urlopen(base + f"/?token={TOKEN}", timeout=10).read().decode()
        assert "Rate the completions" in page and "/api/rate" in page
        for rater, scores in SCORES.items():
            for item, score in zip(run_items, scores):
                for dim in DIMENSIONS:  # one POST per click, as the page sends them
                    assert _post(base + "/api/rate", {"rater": rater, "item": item, "scores": {dim: score}})["saved"]
            _post(base + "/api/rate", {"rater": rater, "item": cal_item,
                                       "scores": dict.fromkeys(DIMENSIONS, 1 if rater == "cy" else 5)})  # fmt: skip
        # saved as entered: on disk before the server stops, and served back to the rater
        assert len(load_ratings(folder)) == 3 * 7
        back = json.loads(_get(base + "/api/items?rater=bo"))
        assert back["ratings"][run_items[0]] == dict.fromkeys(DIMENSIONS, 5)
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(base + "/api/rate", {"rater": "ana", "item": run_items[0], "scores": {"coherence": 6}})
        assert err.value.code == 400 and "integer from 1 to 5" in err.value.read().decode()
    finally:
        server.shutdown()
        server.server_close()

    result = report(folder)
    matrix = np.array([SCORES[r] for r in sorted(SCORES)], dtype=float)
    for dim in DIMENSIONS:
        assert result["alpha"][dim] == pytest.approx(hand_alpha_interval(matrix), abs=1e-9)
    assert result["unreliable"] == ([] if hand_alpha_interval(matrix) >= 0.7 else list(DIMENSIONS))
    assert result["calibration"]["cy"]["flagged"] and not result["calibration"]["ana"]["flagged"]
    means = {src: np.mean([np.mean([SCORES[r][run_items.index(i)] for r in SCORES])
                           for i in run_items if key[i]["source"] == src]) for src in ("A", "B")}  # fmt: skip
    for src in ("A", "B"):
        got = result["scores"][src]["coherence"]
        assert got["mean"] == pytest.approx(means[src]) and got["items"] == 3 and got["low"] < got["mean"] < got["high"]
    assert "Krippendorff's alpha" in (folder / "report.md").read_text()


def test_cli_export_and_report_and_bad_input(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", [{"prompt": "p", "completion": "x"}, {"prompt": "q", "completion": "y"}])
    assert main(["human-eval", "export", str(a), "--out", str(tmp_path / "r"), "--n", "2"]) == 0
    assert "serve it with" in capsys.readouterr().out
    assert main(["human-eval", "report", str(tmp_path / "r")]) == 1  # nobody rated: alpha undefined, unreliable
    assert "| coherence | n/a | no |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["human-eval", "report", str(tmp_path)])
    assert "is not a folder written by" in capsys.readouterr().err
    _write(tmp_path / "bad.jsonl", [{"text": "no prompt"}])
    with pytest.raises(SystemExit):
        main(["human-eval", "export", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o")])
    assert "expected an object with 'prompt'" in capsys.readouterr().err


class Browser:
    """Headless Chromium driven over the DevTools protocol (a page, JavaScript evaluation, screenshots)."""

    def __init__(self, tmp_path):
        import shutil
        import subprocess
        import time

        from websockets.sync.client import connect

        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        profile = tmp_path / "chromium-profile"
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "--window-size=1000,1400", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        port_file = profile / "DevToolsActivePort"
        while not port_file.exists() or len(port_file.read_text().split()) < 2:
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t["type"] == "page")
        self._connection = connect(page["webSocketDebuggerUrl"], max_size=None)
        self.ws = self._connection.__enter__()
        self._id = 0

    def call(self, method, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def js(self, expression):
        out = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"JavaScript error: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait_for(self, expression, timeout=20.0):
        import time

        deadline = time.monotonic() + timeout
        while not self.js(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(expression)
            time.sleep(0.05)

    def close(self):
        if hasattr(self, "_connection"):
            self._connection.__exit__(None, None, None)
        self.proc.terminate()
        self.proc.wait(timeout=10)


def test_three_raters_in_a_real_browser(tmp_path):
    import shutil

    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("Chromium is not installed (Debian package chromium)")
    pytest.importorskip("websockets", reason="websockets drives the browser over the DevTools protocol")
    a = _write(tmp_path / "a.jsonl", [{"prompt": f"pa{i}", "completion": f"good answer {i}"} for i in range(3)])
    b = _write(tmp_path / "b.jsonl", [{"prompt": f"pb{i}", "completion": f"bad answer {i}"} for i in range(3)])
    folder = export_items([("A", a), ("B", b)], tmp_path / "rate", n=3, seed=2)
    key = json.loads((folder / "key.json").read_text())
    run_items = sorted(key)
    server = make_server(folder, port=0, token=TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = Browser(tmp_path)
    try:
        for rater, scores in SCORES.items():
            browser.call("Page.navigate", url=f"http://127.0.0.1:{server.server_port}/?token={TOKEN}")
            browser.wait_for("document.readyState === 'complete' && !!document.getElementById('start')")
            browser.js(f"document.getElementById('rater').value = {json.dumps(rater)}; "
                       "document.getElementById('start').click(); true")  # fmt: skip
            browser.wait_for(f"document.querySelectorAll('.item').length === {len(run_items)}")
            for item, score in zip(run_items, scores):
                for dim in DIMENSIONS:
                    browser.js(f'document.querySelector(\'input[name="{item}/{dim}"][value="{score}"]\').click(); true')
            n_rows = len(run_items) * len(DIMENSIONS)
            browser.wait_for(
                f"[...document.querySelectorAll('.saved')].filter(s => s.textContent === 'saved').length === {n_rows}"
            )
    finally:
        browser.close()
        server.shutdown()
        server.server_close()
    ratings = load_ratings(folder)
    assert len(ratings) == 3 * len(run_items)
    assert all(len(s) == len(DIMENSIONS) for s in ratings.values())
    result = report(folder)
    matrix = np.array([SCORES[r] for r in sorted(SCORES)], dtype=float)
    for dim in DIMENSIONS:
        assert result["alpha"][dim] == pytest.approx(hand_alpha_interval(matrix), abs=1e-9)


# side by side: each rater's choice per item, in terms of the runs ("good" is better, "bad" is better, or a tie)
CHOICES = {
    "ana": ["good", "good", "tie", "bad", "good"],
    "bo": ["good", "good", "good", "bad", "tie"],
    "cy": ["good", "tie", "good", "good", "bad"],
}


def _wilson_by_hand(k, n, z=1.959963984540054):
    """Wilson's score interval from its formula: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    p = k / n
    centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def test_side_by_side_in_a_real_browser(tmp_path):
    import shutil

    from sb3_grpo.human_eval import export_pairs, load_preferences

    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("Chromium is not installed (Debian package chromium)")
    pytest.importorskip("websockets", reason="websockets drives the browser over the DevTools protocol")
    prompts = [f"prompt {i}" for i in range(6)]
    good = _write(tmp_path / "good.jsonl", [{"prompt": p, "completion": f"good answer to {p}"} for p in prompts])
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": p, "completion": f"bad answer to {p}"} for p in prompts[::-1]])
    folder = export_pairs([("good", good), ("bad", bad)], tmp_path / "pairs", n=5, seed=3)
    shown = json.loads((folder / "items.json").read_text())
    key = json.loads((folder / "key.json").read_text())
    items = sorted(i for i in key if i != "models")
    assert shown["mode"] == "side_by_side" and len(shown["items"]) == 5 and key["models"] == ["good", "bad"]
    assert "good" not in json.dumps([{k: v for k, v in it.items() if k in ("id", "prompt")} for it in shown["items"]])
    for item in shown["items"]:  # the same prompt on both sides, each side's text from the run the key names
        assert item["a"] == f"{key[item['id']]['A']} answer to {item['prompt']}"
        assert item["b"] == f"{key[item['id']]['B']} answer to {item['prompt']}"
    assert {key[i]["A"] for i in items} == {"good", "bad"}  # shuffled: each run shown as A somewhere

    server = make_server(folder, port=0, token=TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    browser = Browser(tmp_path)
    try:
        for path in ("/key.json", "/items.json", "/ratings.jsonl"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(base + path, timeout=10)
            assert err.value.code == 404
        for rater, choices in CHOICES.items():
            # the link opens the page for the rater
            browser.call("Page.navigate", url=f"{base}/?token={TOKEN}&rater={rater}")
            browser.wait_for(f"document.querySelectorAll('.item').length === {len(items)}")
            for item, choice in zip(items, choices):
                side = "tie" if choice == "tie" else ("A" if key[item]["A"] == choice else "B")
                assert browser.js(f"document.querySelector('#{item} pre.{side.lower()}') === null || "
                                  f"document.querySelector('#{item} pre.{side.lower()}').textContent"
                                  f".startsWith('{choice}')")  # fmt: skip
                for dim in DIMENSIONS:
                    browser.js(f'document.querySelector(\'input[name="{item}/{dim}"][value="{side}"]\').click(); true')
            n_rows = len(items) * len(DIMENSIONS)
            browser.wait_for(
                f"[...document.querySelectorAll('.saved')].filter(s => s.textContent === 'saved').length === {n_rows}"
            )
        # saved as entered, and served back: a rater who comes back sees their choices checked
        browser.call("Page.navigate", url=f"{base}/?token={TOKEN}&rater=bo")
        browser.wait_for(f"document.querySelectorAll('.item').length === {len(items)}")
        assert browser.js("document.querySelectorAll('input:checked').length") == len(items) * len(DIMENSIONS)
    finally:
        browser.close()
        server.shutdown()
        server.server_close()
    lines = (folder / "ratings.jsonl").read_text().splitlines()
    assert len(lines) == 3 * len(items) * len(DIMENSIONS)  # one line per click, as entered
    assert len(load_preferences(folder)) == 3 * len(items)

    result = report(folder)
    value = {"good": 1.0, "tie": 0.5, "bad": 0.0}  # the outcome for the first run, "good"
    per_item = [np.mean([value[CHOICES[r][j]] for r in CHOICES]) for j in range(len(items))]
    wins, losses = sum(u > 0.5 for u in per_item), sum(u < 0.5 for u in per_item)
    assert (wins, losses) == (3, 1)  # items 0, 1, 2 for good; item 3 for bad; item 4 tied (1, 0.5, 0)
    matrix = np.array([[value[c] for c in CHOICES[r]] for r in sorted(CHOICES)])
    for dim in DIMENSIONS:
        good_rate, bad_rate = result["win_rate"]["good"][dim], result["win_rate"]["bad"][dim]
        assert good_rate["rate"] == wins / (wins + losses) and bad_rate["rate"] == losses / (wins + losses)
        assert (good_rate["low"], good_rate["high"]) == pytest.approx(_wilson_by_hand(wins, wins + losses), abs=1e-9)
        assert (bad_rate["low"], bad_rate["high"]) == pytest.approx(_wilson_by_hand(losses, wins + losses), abs=1e-9)
        assert good_rate["ties"] == 1 and good_rate["items"] == len(items)
        assert result["alpha"][dim] == pytest.approx(hand_alpha_interval(matrix), abs=1e-9)
    text = (folder / "report.md").read_text()
    assert "| good | 0.750 [" in text and "(3-1, 1 tied)" in text


def test_side_by_side_export_checks_its_input(tmp_path):
    from sb3_grpo.human_eval import export_pairs

    a = _write(tmp_path / "a.jsonl", [{"prompt": "p", "completion": "x"}])
    b = _write(tmp_path / "b.jsonl", [{"prompt": "q", "completion": "y"}])
    with pytest.raises(ValueError, match="share no prompt"):
        export_pairs([("a", a), ("b", b)], tmp_path / "o", n=2)
    with pytest.raises(ValueError, match="exactly two runs"):
        export_pairs([("a", a)], tmp_path / "o", n=2)
    folder = export_pairs([("a", a), ("b", a)], tmp_path / "o2", n=2)
    server = make_server(folder, port=0, token=TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(f"http://127.0.0.1:{server.server_port}/api/rate", {"rater": "x", "item": "pair0001",
                                                                       "prefer": {"coherence": "C"}})  # fmt: skip
        assert err.value.code == 400 and "'A', 'B' or 'tie'" in err.value.read().decode()
    finally:
        server.shutdown()
        server.server_close()


def hand_alpha(matrix: np.ndarray, level: str) -> float:
    """Krippendorff's alpha by its definition, for the interval metric (c - k)^2 or the ordinal one
    (sum_{g=c}^{k} n_g - (n_c + n_k) / 2)^2, n_g the count of value g among the pairable values."""
    units = [col[~np.isnan(col)] for col in matrix.T]
    units = [u for u in units if len(u) >= 2]
    values = np.concatenate(units)
    counts = {v: int(np.sum(values == v)) for v in np.unique(values)}

    def delta(c, k):
        if level == "interval":
            return (c - k) ** 2
        lo, hi = min(c, k), max(c, k)
        return (sum(n for g, n in counts.items() if lo <= g <= hi) - (counts[c] + counts[k]) / 2) ** 2

    n = len(values)
    d_o = sum(sum(delta(a, b) for a, b in itertools.permutations(u, 2)) / (len(u) - 1) for u in units) / n
    d_e = sum(delta(a, b) for a, b in itertools.permutations(values, 2)) / (n * (n - 1))
    return 1 - d_o / d_e


def test_hand_alpha_ordinal_matches_the_interval_one_on_evenly_spread_values():
    # with every value equally frequent the ordinal metric is a multiple of the interval one, so alpha agrees
    m = np.array([[1.0, 2, 3, 1, 2, 3], [1, 3, 2, 1, 2, 3], [2, 1, 3, 2, 3, 1]])
    assert hand_alpha(m, "ordinal") == pytest.approx(hand_alpha(m, "interval"), abs=1e-12)
    assert hand_alpha(m, "interval") == pytest.approx(hand_alpha_interval(m), abs=1e-12)
    m = np.array([[1.0, 2, 5, 5, 4], [1, 3, 5, 4, 4], [2, 2, 5, 5, 1]])
    assert krippendorff_alpha(m, "ordinal") == pytest.approx(hand_alpha(m, "ordinal"), abs=1e-9)


# side by side with 1-5 scores: per rater and item, the scores of the "good" and the "bad" run's completions on
# instruction following, accuracy and coherence; creativity gets other scores (see _creativity)
PAIR_SCORES = {
    "ana": [(5, 2), (4, 2), (4, 3), (2, 4), (5, 1)],
    "bo": [(5, 1), (5, 2), (4, 3), (1, 4), (4, 1)],
    "cy": [(4, 2), (4, 2), (5, 3), (2, 5), (5, 2)],
}


def _creativity(rater: str, j: int, run: str) -> int:
    """Scores on which the raters agree little (so alpha is low there)."""
    return 1 + (3 * j + (run == "good") + 2 * sorted(PAIR_SCORES).index(rater)) % 5


def _pair_score(rater: str, j: int, run: str, dim: str) -> int:
    if dim == "creativity":
        return _creativity(rater, j, run)
    good, bad = PAIR_SCORES[rater][j]
    return good if run == "good" else bad


def _pair_answers(rater, item, key, by_id, j_of):
    """A rater's clicks on a side-by-side item: (input name, value), in shown positions."""
    k = key[item]
    clicks = []
    if k["source"] == "side_by_side":
        j = j_of[item]
        run = CHOICES[rater][j]
        for dim in DIMENSIONS:
            clicks.append((f"{item}/{dim}", "tie" if run == "tie" else ("A" if k["A"] == run else "B")))
            for side in "AB":
                clicks.append((f"{item}/{side}/{dim}", str(_pair_score(rater, j, k[side], dim))))
        return clicks
    clear = "A" if by_id[item]["a"].startswith("clear") else "B"
    other = "B" if clear == "A" else "A"
    for dim in DIMENSIONS:  # ana: right, with a 4 for the known 5 (within 1); bo: a tie on creativity; cy: wrong
        choice = {"ana": clear, "bo": "tie" if dim == "creativity" else clear, "cy": other}[rater]
        clicks.append((f"{item}/{dim}", choice))
        high, low = {"ana": (4, 1), "bo": (5, 2), "cy": (1, 5)}[rater]
        clicks += [(f"{item}/{clear}/{dim}", str(high)), (f"{item}/{other}/{dim}", str(low))]
    return clicks


def _pair_score_matrix(dim, items, j_of):
    """Raters x completions (the good and the bad run's completion of each item), from the tables above."""
    return np.array(
        [[_pair_score(r, j_of[i], run, dim) for i in items for run in ("good", "bad")] for r in sorted(PAIR_SCORES)],
        dtype=float,
    )


def test_side_by_side_with_scores_and_calibration_in_a_real_browser(tmp_path):
    import shutil

    from scipy import stats

    from sb3_grpo.human_eval import export_pairs, load_preferences, load_sample_scores

    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("Chromium is not installed (Debian package chromium)")
    pytest.importorskip("websockets", reason="websockets drives the browser over the DevTools protocol")
    prompts = [f"prompt {i}" for i in range(5)]
    good = _write(tmp_path / "good.jsonl", [{"prompt": p, "completion": f"good answer to {p}"} for p in prompts])
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": p, "completion": f"bad answer to {p}"} for p in prompts])
    calibration = _write(tmp_path / "cal.jsonl", [
        {"prompt": "What is 2 + 2?", "a": "clear: 4", "b": "muddled: fish",
         "prefer": dict.fromkeys(DIMENSIONS, "A"),
         "scores": {"A": dict.fromkeys(DIMENSIONS, 5), "B": dict.fromkeys(DIMENSIONS, 1)}},
        {"prompt": "Name a colour.", "a": "muddled: seven", "b": "clear: red", "prefer": {"accuracy": "B"}},
    ])  # fmt: skip
    folder = export_pairs([("good", good), ("bad", bad)], tmp_path / "pairs", n=5, seed=4, calibration=calibration)
    shown = json.loads((folder / "items.json").read_text())
    key = json.loads((folder / "key.json").read_text())
    assert len(shown["items"]) == 7 and all(set(it) == {"id", "prompt", "a", "b"} for it in shown["items"])
    assert "calibration" not in json.dumps(shown) and "prefer" not in json.dumps(shown)  # blind
    items = sorted(i for i, k in key.items() if i != "models" and k["source"] == "side_by_side")
    cal_items = sorted(i for i, k in key.items() if i != "models" and k["source"] == "calibration")
    assert len(items) == 5 and len(cal_items) == 2
    by_id = {it["id"]: it for it in shown["items"]}
    for item in cal_items:  # the known answers follow the side the clear text is shown on
        clear = "A" if by_id[item]["a"].startswith("clear") else "B"
        for choice in key[item]["prefer"].values():
            assert choice == clear
        if key[item]["scores"]:
            assert key[item]["scores"][clear] == dict.fromkeys(DIMENSIONS, 5)
    prompt_of = {i: by_id[i]["prompt"] for i in items}
    j_of = {i: prompts.index(prompt_of[i]) for i in items}  # the item's place in PAIR_SCORES and CHOICES

    def answers(rater, item):
        return _pair_answers(rater, item, key, by_id, j_of)

    server = make_server(folder, port=0, token=TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    browser = Browser(tmp_path)
    n_clicks = (len(items) + len(cal_items)) * len(DIMENSIONS) * 3
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/key.json", timeout=10)
        assert err.value.code == 404
        for rater in sorted(PAIR_SCORES):
            browser.call("Page.navigate", url=f"{base}/?token={TOKEN}&rater={rater}")
            browser.wait_for(f"document.querySelectorAll('.item').length === {len(shown['items'])}")
            assert browser.js("document.querySelectorAll('input[type=radio]').length") == 7 * 4 * (3 + 2 * 5)
            assert "does exactly what it asks" in browser.js("document.body.textContent")  # the anchors
            for item in items + cal_items:
                clicks = answers(rater, item)
                browser.js("".join(f'document.querySelector(\'input[name="{name}"][value="{value}"]\').click();'
                                   for name, value in clicks) + " true")  # fmt: skip
            browser.wait_for(
                f"[...document.querySelectorAll('.saved')].filter(s => s.textContent === 'saved').length === {n_clicks}"
            )
        browser.call("Page.navigate", url=f"{base}/?token={TOKEN}&rater=bo")  # come back: every click is checked again
        browser.wait_for(f"document.querySelectorAll('.item').length === {len(shown['items'])}")
        assert browser.js("document.querySelectorAll('input:checked').length") == n_clicks
        checked = browser.js("[...document.querySelectorAll('input:checked')].map(i => i.name + '=' + i.value)")
        assert sorted(checked) == sorted(f"{n}={v}" for i in items + cal_items for n, v in answers("bo", i))
    finally:
        browser.close()
        server.shutdown()
        server.server_close()

    # saved as entered: one line per click, each what was clicked
    assert len((folder / "ratings.jsonl").read_text().splitlines()) == 3 * n_clicks
    scores, prefs = load_sample_scores(folder), load_preferences(folder)
    saved = {f"{i}/{d}={c}" for (r, i), given in prefs.items() if r == "ana" for d, c in given.items()}
    saved |= {f"{i}/{side}/{d}={s}" for (r, i, side), given in scores.items() if r == "ana" for d, s in given.items()}
    assert saved == {f"{n}={v}" for i in items + cal_items for n, v in answers("ana", i)}
    assert len(prefs) == 3 * 7 and len(scores) == 3 * 7 * 2

    raters = sorted(PAIR_SCORES)
    value = {"good": 1.0, "tie": 0.5, "bad": 0.0}
    choice_matrix = np.array([[value[CHOICES[r][j_of[i]]] for i in items] for r in raters])
    for level in ("interval", "ordinal"):
        result = report(folder, level=level)
        for dim in DIMENSIONS:
            assert result["alpha"][dim] == pytest.approx(hand_alpha(choice_matrix, level), abs=1e-9)
            score_matrix = _pair_score_matrix(dim, items, j_of)  # one unit per completion
            assert result["score_alpha"][dim] == pytest.approx(hand_alpha(score_matrix, level), abs=1e-9)
    low_alpha = [d for d in DIMENSIONS if hand_alpha(_pair_score_matrix(d, items, j_of), "interval") < 0.7]
    assert "creativity" in low_alpha and "coherence" not in low_alpha  # both branches of the flag are exercised
    result = report(folder)
    assert result["unreliable_scores"] == low_alpha
    assert result["unreliable"] == [d for d in DIMENSIONS if hand_alpha(choice_matrix, "interval") < 0.7]

    # per-run scores: the mean over items of the raters' mean, with a 95% t-interval
    for run in ("good", "bad"):
        for dim in DIMENSIONS:
            per_item = np.array([np.mean([_pair_score(r, j_of[i], run, dim) for r in raters]) for i in items])
            half = stats.t.ppf(0.975, len(per_item) - 1) * per_item.std(ddof=1) / np.sqrt(len(per_item))
            got = result["scores"][run][dim]
            assert got["items"] == 5 and got["mean"] == pytest.approx(per_item.mean(), abs=1e-12)
            assert (got["low"], got["high"]) == pytest.approx((per_item.mean() - half, per_item.mean() + half))
    assert result["win_rate"]["good"]["coherence"]["wins"] == 3  # the run items only, calibration left out

    # calibration: 4 choices and 8 scores on the first pair, 1 choice on the second
    cal = result["calibration"]
    assert {r: (c["scored"], c["missed"], c["flagged"]) for r, c in cal.items()} == {
        "ana": (13, 0, False),  # a 4 for a known 5 is within the tolerance of 1
        "bo": (13, 1, False),  # one tie for a known choice: 1/13 < 20%
        "cy": (13, 13, True),  # every choice and score the wrong way round
    }
    assert cal["cy"]["by_kind"] == {"choice": [5, 5], "score": [8, 8]}
    text = (folder / "report.md").read_text()
    assert "## Scores (1-5)" in text and "| cy | 13 | 13 (5 of 5 choices, 8 of 8 scores) | yes |" in text
    assert main(["human-eval", "report", str(folder)]) == 1  # creativity's scores are unreliable


def test_side_by_side_calibration_file_is_checked(tmp_path, capsys):
    from sb3_grpo.human_eval import export_pairs

    a = _write(tmp_path / "a.jsonl", [{"prompt": "p", "completion": "x"}])
    b = _write(tmp_path / "b.jsonl", [{"prompt": "p", "completion": "y"}])
    cases = [
        ({"prompt": "q", "a": "x"}, "'prompt', 'a' and 'b'"),
        ({"prompt": "q", "a": "x", "b": "y"}, "give the known 'prefer'"),
        ({"prompt": "q", "a": "x", "b": "y", "prefer": {"coherence": "C"}}, "'prefer' must map"),
        ({"prompt": "q", "a": "x", "b": "y", "scores": {"A": {"coherence": 6}}}, "'scores' must map"),
        ({"prompt": "q", "a": "x", "b": "y", "scores": {"coherence": 5}}, "'scores' must map"),
    ]
    for row, message in cases:
        with pytest.raises(ValueError, match=message):
            export_pairs([("a", a), ("b", b)], tmp_path / "o", n=1, calibration=_write(tmp_path / "c.jsonl", [row]))
    cal = _write(tmp_path / "c.jsonl", [{"prompt": "q", "a": "x", "b": "y", "prefer": {"coherence": "tie"}}])
    out = tmp_path / "cli"
    args = ["human-eval", "export", str(a), str(b), "--side-by-side", "--calibration", str(cal), "--out", str(out)]
    assert main(args) == 0
    key = json.loads((out / "key.json").read_text())
    assert sorted(k["source"] for i, k in key.items() if i != "models") == ["calibration", "side_by_side"]
    server = make_server(out, port=0, token=TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/api/rate"
    try:
        for body, message in [
            ({"rater": "x", "item": "pair0001", "scores": {"coherence": 3}}, "side must be 'A' or 'B'"),
            ({"rater": "x", "item": "pair0001", "side": "A", "scores": {"coherence": 0}}, "integer from 1 to 5"),
            ({"rater": "x", "item": "pair0001"}, "expected {rater, item, prefer} or"),
        ]:
            with pytest.raises(urllib.error.HTTPError) as err:
                _post(url, body)
            assert err.value.code == 400 and message in err.value.read().decode()
        assert _post(url, {"rater": "x", "item": "pair0001", "side": "B", "scores": {"coherence": 3}})["saved"]
    finally:
        server.shutdown()
        server.server_close()
