"""The screenshots of the guides, taken with headless Chromium from the real pages.

    python -m benchmarks.screenshots [--out docs/guides/img]

- ``completion_logs_tensorboard.png``: tensorboard's Text tab with a completion table (a short GRPO run on
  ``TextGen-v0`` with a composite reward and :class:`~sb3_grpo.callbacks.CompletionLogger`);
- ``human_eval_page.png``: the rating page of ``sb3-grpo human-eval serve`` (1-5 scores), a few scores entered;
- ``human_eval_side_by_side.png``: the side-by-side page (1-5 scores of A and B, A / tie / B), a few entered;
- ``evaluation_tensorboard.png``: tensorboard's scalars of :class:`~sb3_grpo.callbacks.LMEvalCallback` (``eval/``,
  held-out prompts) in a short GRPO run;
- ``sample_episode.gif``: ``sb3-grpo sample --video`` of a saved GRPO model (the bundled LM) on ``TextGen-v0``;
- ``prometheus_graph.png``, ``prometheus_rules.png``: Prometheus scraping a GRPO run on CartPole through
  :class:`~sb3_grpo.callbacks.PrometheusOutputFormat`, the reward's graph and the rules page (the alert rules of
  :func:`~sb3_grpo.callbacks.write_alert_rules` loaded, their state after the run);
- ``tracking_mlflow_completions.png``: MLflow's UI with the completion table of a short GRPO run logged through
  :class:`~sb3_grpo.callbacks.MLflowOutputFormat` to a local tracking server.

Needs ``chromium`` (Debian's package) on the PATH; tensorboard for the tensorboard ones; ``prometheus`` (Debian's
package) and prometheus_client for the Prometheus ones; the full ``mlflow`` package (its server and UI, not only the
``mlflow`` extra's mlflow-skinny) for the MLflow one; websockets (to drive Chromium) for those two and the
evaluation one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("chromium is not on the PATH; apt-get install chromium")
    return exe


def screenshot(url: str, path: Path, size: tuple[int, int] = (1100, 900), budget_ms: int = 8000) -> None:
    """``chromium --headless --screenshot`` of ``url`` once its scripts ran for ``budget_ms`` of virtual time."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
             f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
    print(f"wrote {path}")


def screenshot_with_storage(
    url: str,
    path: Path,
    storage: dict[str, str],
    size: tuple[int, int] = (1100, 900),
    ready: str | None = None,
    wait_s: float = 10.0,
    timeout_s: float = 120.0,
) -> None:
    """Like :func:`screenshot`, after setting the page's ``localStorage`` (settings a page keeps there, not in its
    URL) and reloading it; drives Chromium over the DevTools protocol (needs ``websockets``).

    :param ready: A JavaScript expression that is true once the page has drawn what is wanted (polled up to
        ``timeout_s``); the screenshot is taken ``wait_s`` seconds after it (or after the reload, without one).
    """
    import base64

    from websockets.sync.client import connect

    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not port_file.exists() or len(port_file.read_text().split()) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("Chromium did not open its DevTools port")
                time.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
            page = next(t for t in targets if t["type"] == "page")
            with connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
                calls = iter(range(1, 1_000_000))

                def call(method: str, **params: object) -> dict:
                    n = next(calls)
                    ws.send(json.dumps({"id": n, "method": method, "params": params}))
                    while True:
                        msg = json.loads(ws.recv(timeout=60))
                        if msg.get("id") == n:
                            return msg.get("result", {})

                time.sleep(2)
                setters = "".join(
                    f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});" for k, v in storage.items()
                )
                call("Runtime.evaluate", expression=setters + " true")
                call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                     mobile=False)  # fmt: skip
                call("Page.reload")
                deadline = time.monotonic() + timeout_s
                while ready is not None:
                    value = call("Runtime.evaluate", expression=ready, returnByValue=True).get("result", {})
                    if value.get("value"):
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{url}: not ready after {timeout_s:g} s ({ready})")
                    time.sleep(0.5)
                time.sleep(wait_s)
                shot = call("Page.captureScreenshot", format="png")
            path.write_bytes(base64.b64decode(shot["data"]))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(f"wrote {path}")


#: The screenshots' rating servers' token (a served page carries it in its address).
_TOKEN = "screenshots-token-0123456789"


def _post(url: str, body: dict) -> None:
    headers = {"Content-Type": "application/json", "X-Rating-Token": _TOKEN}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    urllib.request.urlopen(req, timeout=10).read()


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _serve(folder: Path):
    from sb3_grpo.human_eval import make_server

    server = make_server(folder, port=0, token=_TOKEN)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def _samples(work: Path) -> tuple[Path, Path]:
    """Greedy and sampled completions of the bundled LM on the same prompts (two "runs")."""
    from sb3_grpo import GRPO
    from sb3_grpo.playback import sample_episodes
    from textrl_envs.sb3 import make_vec_env

    prompts = ["The film", "My friend said the movie", "Honestly, the ending", "The actors"]
    files = []
    for name, deterministic in (("greedy", True), ("sampled", False)):
        env = make_vec_env("TextGen-v0", n_envs=1, seed=0, device="cpu", max_new_tokens=16, prompts=prompts)
        model = GRPO("CausalLMPolicy", env, seed=0, device="cpu")
        rows = list(sample_episodes(model, env, len(prompts) * 2, deterministic=deterministic))
        env.close()
        files.append(_write_jsonl(work / f"{name}.jsonl", rows))
    return files[0], files[1]


def rating_pages(out: Path, work: Path) -> None:
    from sb3_grpo.human_eval import DIMENSIONS, export_items, export_pairs

    greedy, sampled = _samples(work)
    folder = export_items([("greedy", greedy), ("sampled", sampled)], work / "rate", n=3, seed=0)
    server, base = _serve(folder)
    try:
        first = json.loads((folder / "items.json").read_text())["items"][0]["id"]
        _post(base + "/api/rate", {"rater": "ana", "item": first, "scores": dict(zip(DIMENSIONS, (4, 3, 4, 2)))})
        screenshot(f"{base}/?token={_TOKEN}&rater=ana", out / "human_eval_page.png", size=(1000, 1000))
    finally:
        server.shutdown()
        server.server_close()
    folder = export_pairs([("greedy", greedy), ("sampled", sampled)], work / "pairs", n=3, seed=0)
    server, base = _serve(folder)
    try:
        first = json.loads((folder / "items.json").read_text())["items"][0]["id"]
        _post(base + "/api/rate", {"rater": "ana", "item": first, "prefer": dict(zip(DIMENSIONS, "A A tie B".split()))})
        _post(base + "/api/rate", {"rater": "ana", "item": first, "prefer": {"creativity": "B"}})
        for side, scores in (("A", (4, 4, 5, 2)), ("B", (3, 3, 3, 4))):
            _post(base + "/api/rate", {"rater": "ana", "item": first, "side": side,
                                       "scores": dict(zip(DIMENSIONS, scores))})  # fmt: skip
        screenshot(f"{base}/?token={_TOKEN}&rater=ana", out / "human_eval_side_by_side.png", size=(1100, 1000))
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensorboard_page(out: Path, work: Path) -> None:
    from sb3_grpo import GRPO
    from sb3_grpo.callbacks import CompletionLogger, configure_logger
    from textrl_envs.rewards import CompositeReward
    from textrl_envs.sb3 import make_vec_env

    reward = CompositeReward({"sentiment": 1.0, "length": (0.5, {"min_words": 2, "max_words": 4})})
    env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=8, reward=reward)
    model = GRPO("CausalLMPolicy", env, advantage="group", n_steps=8, batch_size=32, n_epochs=1, seed=0, device="cpu")
    logs = work / "tb"
    model.set_logger(configure_logger(str(logs), ["tensorboard"]))
    model.learn(4 * 8 * 2, callback=CompletionLogger(every_n_rollouts=1, n_samples=4))
    model.logger.close()
    env.close()
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logs), "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/data/logdir", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        screenshot(f"http://127.0.0.1:{port}/#text", out / "completion_logs_tensorboard.png", size=(1400, 900),
                   budget_ms=15000)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _tensorboard_screenshot(
    logs: Path, fragment: str, path: Path, size: tuple[int, int], storage: dict[str, str] | None = None
) -> None:
    """Serve ``logs`` with tensorboard and screenshot ``/<fragment>`` once it has loaded (with ``storage`` in its
    ``localStorage``, if given)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logs), "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_http(f"http://127.0.0.1:{port}/data/logdir")
        if storage:
            screenshot_with_storage(f"http://127.0.0.1:{port}/{fragment}", path, storage, size=size)
        else:
            screenshot(f"http://127.0.0.1:{port}/{fragment}", path, size=size, budget_ms=15000)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def eval_page(out: Path, work: Path) -> None:
    """Tensorboard's scalars of :class:`~sb3_grpo.callbacks.LMEvalCallback` (``eval/``) in a short GRPO run on
    ``TextGen-v0``, evaluated on four held-out prompts every 64 timesteps."""
    from sb3_grpo import GRPO
    from sb3_grpo.callbacks import LMEvalCallback, configure_logger
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=8)
    held_out = ["The plot of the film", "I watched it twice and", "The music in this movie", "Overall the story"]
    eval_env = make_vec_env("TextGen-v0", n_envs=4, seed=1, device="cpu", max_new_tokens=8, prompts=held_out)
    model = GRPO("CausalLMPolicy", env, advantage="group", n_steps=8, batch_size=32, n_epochs=1, seed=0, device="cpu")
    logs = work / "tb_eval"
    model.set_logger(configure_logger(str(logs), ["tensorboard"]))
    evaluation = LMEvalCallback(eval_env, eval_freq=64, k=(1, 4), n_samples=4, success_threshold=0.6)
    model.learn(64 * 8, callback=evaluation)
    model.logger.close()
    env.close()
    eval_env.close()
    tags = urllib.parse.quote("eval/(pass|mean@|greedy_reward|sampled_reward)")
    fragment = f"#scalars&tagFilter={tags}&_smoothingWeight=0"
    _tensorboard_screenshot(logs, fragment, out / "evaluation_tensorboard.png", (1600, 740),
                            storage={"_ignoreYOutliers": "false"})  # fmt: skip


def mlflow_page(out: Path, work: Path) -> None:
    """A short GRPO run logged through an MLflow tracking server (sqlite store, artifacts proxied) with
    :class:`~sb3_grpo.callbacks.CompletionLogger`; the run's completion table in MLflow's UI. Needs the full ``mlflow``
    package (its server and UI; the ``mlflow`` extra installs only mlflow-skinny)."""
    import importlib.util

    from sb3_grpo import GRPO
    from sb3_grpo.callbacks import CompletionLogger, configure_logger
    from textrl_envs.rewards import CompositeReward
    from textrl_envs.sb3 import make_vec_env

    if importlib.util.find_spec("flask") is None or importlib.util.find_spec("mlflow.server") is None:
        raise SystemExit("the MLflow screenshot needs MLflow's server and UI: pip install mlflow (the full package)")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}",
         "--artifacts-destination", str(work / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(base + "/health", timeout=180)
        reward = CompositeReward({"sentiment": 1.0, "length": (0.5, {"min_words": 2, "max_words": 4})})
        env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=8, reward=reward)
        model = GRPO(
            "CausalLMPolicy", env, advantage="group", n_steps=8, batch_size=32, n_epochs=1, seed=0, device="cpu"
        )
        tracking = {"tracking_uri": base, "experiment_name": "textgen", "run_name": "grpo-seed0"}
        logger = configure_logger(str(work / "mlflow_run"), ["mlflow"], config=model, mlflow=tracking)
        model.set_logger(logger)
        model.learn(4 * 8 * 2, callback=CompletionLogger(every_n_rollouts=1, n_samples=4))
        tracker = logger.output_formats[0]
        run = tracker.client.get_run(tracker.run_id)
        logger.close()
        env.close()
        table = sorted(a.path for a in tracker.client.list_artifacts(run.info.run_id, "completions/table"))[-1]
        url = f"{base}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}/artifacts/{table}"
        closed = {"mlflow.assistant.panelOpen_v1": "false", "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true"}
        screenshot_with_storage(url, out / "tracking_mlflow_completions.png", closed, size=(1900, 480),
                                ready="document.body.innerText.includes('completion')", wait_s=3)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def sample_video(out: Path, work: Path) -> None:
    """``sb3-grpo sample --video``: three episodes of a saved GRPO model (the bundled LM) on ``TextGen-v0``, a GIF."""
    from sb3_grpo import GRPO
    from sb3_grpo.cli import main as cli
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=1, seed=0, device="cpu", max_new_tokens=12)
    GRPO("CausalLMPolicy", env, seed=0, device="cpu").save(work / "model.zip")
    env.close()
    args = ["sample", str(work / "model.zip"), "--env", "TextGen-v0", "--n", "3", "--seed", "0", "--quiet",
            "--env-kwargs", '{"max_new_tokens": 12, "prompts": ["The film was"]}', "--fps", "4",
            "--video", str(out / "sample_episode.gif")]  # fmt: skip
    if cli(args) != 0:
        raise SystemExit("sb3-grpo sample --video failed")
    print(f"wrote {out / 'sample_episode.gif'}")


def _wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def prometheus_pages(out: Path, work: Path) -> None:
    """A GRPO run on CartPole served by :class:`~sb3_grpo.callbacks.PrometheusOutputFormat`, scraped every second by
    Prometheus (Debian's ``prometheus``, its classic web UI) with the rules of
    :func:`~sb3_grpo.callbacks.write_alert_rules` loaded."""
    from sb3_grpo import GRPO
    from sb3_grpo.callbacks import configure_logger, write_alert_rules

    exe = shutil.which("prometheus")
    if exe is None:
        raise SystemExit("prometheus is not on the PATH; apt-get install prometheus")
    logger = configure_logger(str(work / "live"), ["prometheus"], prometheus={"port": 0})
    exporter = logger.output_formats[0]
    rules = write_alert_rules(work / "alerts.yml")
    port = _free_port()
    (work / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: [{json.dumps(str(rules))}]\n"
        f"scrape_configs:\n  - job_name: textrl\n    static_configs:\n      - targets: ['127.0.0.1:{exporter.port}']\n",
        encoding="utf-8",
    )
    proc = subprocess.Popen(
        [exe, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(base + "/-/ready")
        model = GRPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, seed=0, device="cpu")
        model.set_logger(logger)
        start = time.monotonic()
        model.learn(12_288)
        time.sleep(3)  # a last scrape and rule evaluation
        span = f"{int(time.monotonic() - start) + 5}s"
        query = urllib.parse.urlencode({"g0.expr": "sb3_rollout_ep_rew_mean", "g0.tab": "0", "g0.range_input": span})
        screenshot(f"{base}/classic/graph?{query}", out / "prometheus_graph.png", size=(1200, 820))
        screenshot(f"{base}/classic/rules", out / "prometheus_rules.png", size=(1200, 1000))
    finally:
        logger.close()
        proc.terminate()
        proc.wait(timeout=20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/guides/img", help="folder of the images (default %(default)s)")
    parser.add_argument(
        "--only",
        choices=("rating", "tensorboard", "eval", "video", "prometheus", "mlflow"),
        default=None,
        help="one kind of screenshot",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "rating"):
            rating_pages(out, Path(tmp))
        if args.only in (None, "tensorboard"):
            tensorboard_page(out, Path(tmp))
        if args.only in (None, "eval"):
            eval_page(out, Path(tmp))
        if args.only in (None, "video"):
            sample_video(out, Path(tmp))
        if args.only in (None, "prometheus"):
            prometheus_pages(out, Path(tmp))
        if args.only in (None, "mlflow"):
            mlflow_page(out, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
