"""``textrl-bench claims``: the smoke budget end to end, and the study's bookkeeping (Ctrl-C, --resume, failed runs)
with the training replaced by a stand-in that returns made-up records at once."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from benchmarks.claims import runner, study
from benchmarks.claims.experiments import BUDGETS, phase_one
from benchmarks.cli import main

VERDICTS = ("**supported**", "**contradicted**", "**inconclusive**")


def test_claims_smoke_end_to_end(tmp_path):
    out = tmp_path / "smoke"
    assert main(["claims", "--budget", "smoke", "--out", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and results["kind"] == "claims"
    runs = results["runs"]
    assert all(r["status"] == "complete" for r in runs.values())
    experiments = {r["experiment"] for r in runs.values()}
    assert experiments == {"untrained", "tune", "long", "curriculum", "collapse", "baselines", "ablation"}
    assert results["tuning"]["grpo"]["best"] is not None and len(results["tuning"]["ppo"]["trials"]) == 2
    probed = [r for r in runs.values() if r["experiment"] == "baselines"]
    assert all(r["probe"]["probes"] > 0 and 0 <= r["probe"]["grad_var_relative"] <= 1 for r in probed)
    for r in probed:  # the series behind the mean, one value per probe
        series = r["probe"]["grad_var_relative_series"]
        assert len(series) == r["probe"]["probes"]
        assert np.mean(series) == pytest.approx(r["probe"]["grad_var_relative"], abs=1e-5)
    grpo = [r for r in runs.values() if r["experiment"] == "ablation" and r["arm"] == "grpo"]
    assert grpo[0]["updates"]["train/grad_var"] > 0 and grpo[0]["grad_norm_series"]
    text = (out / "claims.md").read_text()
    table = text[text.index("## Verdicts") : text.index("## How the verdicts")]
    assert sum(table.count(v) for v in VERDICTS) == 5
    # two seeds per arm: no interval, so no verdict but "inconclusive"
    assert table.count("**inconclusive**") == 5
    for section in ("## Tuning", "## Ablation", "P(arm > ppo-seq)", "Hardware:"):
        assert section in text
    assert (out / "curves.png").stat().st_size > 0 and (out / "profiles.png").stat().st_size > 0
    assert any(p.name.startswith("events") for p in (out / "long").rglob("*"))  # tensorboard logs
    # --resume with everything done runs nothing and keeps every run
    assert main(["claims", "--budget", "smoke", "--out", str(out), "--no-progress", "--resume"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert {k: r["wall_time_s"] for k, r in again["runs"].items() if "wall_time_s" in r} == {
        k: r["wall_time_s"] for k, r in runs.items() if "wall_time_s" in r
    }
    assert main(["report", str(out)]) == 0


def _fake_execute(job, out, report=None):
    """A made-up record in the shape of :func:`runner.execute`'s, without training."""
    base = {"key": job.key, "experiment": job.experiment, "arm": job.arm, "algo": job.algo, "seed": job.seed}
    final = {"reward_mean": 0.1 * (job.seed + 1) + (0.05 if "grpo" in job.arm else 0.0)}
    record = {**base, "status": "complete", "fingerprint": job.fingerprint(), "final": final}
    if not job.untrained:
        if report is not None:
            report(job.steps, 0.5)
        curve = {"steps": [1, 2, 3, 4, 5], "reward": [0.1, 0.3, 0.5, 0.4, 0.6], "episodes": [1] * 5}
        record.update(curve=curve, wall_time_s=0.0, steps_per_s=1.0, step_unit="tokens", updates={})
        if job.probe:
            record["probe"] = {"grad_var": 1.0, "grad_var_relative": 0.5, "probes": 1}
    return record


def test_ctrl_c_keeps_finished_runs_and_resume_completes(tmp_path, monkeypatch):
    out = tmp_path / "cc"
    calls = []

    def interrupting(job, out_dir, report=None):
        calls.append(job.key)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return _fake_execute(job, out_dir, report)

    monkeypatch.setattr(runner, "execute", interrupting)
    assert main(["claims", "--budget", "smoke", "--out", str(out), "--no-progress"]) == 130
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "interrupted" and len(results["runs"]) == 5
    assert "Status: interrupted" in (out / "claims.md").read_text()

    monkeypatch.setattr(runner, "execute", _fake_execute)
    calls.clear()
    assert main(["claims", "--budget", "smoke", "--out", str(out), "--no-progress", "--resume"]) == 0
    results = json.loads((out / "results.json").read_text())
    planned = len(phase_one(BUDGETS["smoke"])) + 3 * BUDGETS["smoke"].seeds
    assert results["status"] == "complete" and len(results["runs"]) == planned
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_run_is_recorded_and_the_study_goes_on(tmp_path, monkeypatch):
    def failing(job, out_dir, report=None):
        if job.experiment == "collapse" and job.seed == 0 and job.arm == "grpo":
            raise RuntimeError("boom")
        return _fake_execute(job, out_dir, report)

    monkeypatch.setattr(runner, "execute", failing)
    out = tmp_path / "failed"
    assert main(["claims", "--budget", "smoke", "--out", str(out), "--no-progress"]) == 1
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "failed"
    assert results["runs"]["collapse/grpo/seed0"]["error"] == "RuntimeError: boom"
    assert "collapse/grpo/seed0" in (out / "claims.md").read_text()


def test_claims_refuses_an_existing_out_dir(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "results.json").write_text("{}")
    with pytest.raises(SystemExit):
        main(["claims", "--budget", "smoke", "--out", str(tmp_path / "x")])
    assert "--resume" in capsys.readouterr().err
    assert study.CLAIMS_OUTPUTS[0] == "results.json"


def test_full_budget_has_the_seeds_that_resolve_a_30_percent_stability_gain():
    """Claim 2 is about a 30% lower spread: ``full`` runs the seeds per arm that resolve it with 80% power."""
    from sb3_grpo.compare.stats import seeds_to_resolve_std_ratio

    assert BUDGETS["full"].seeds >= seeds_to_resolve_std_ratio(0.7) == 63
    assert BUDGETS["default"].seeds < BUDGETS["full"].seeds


_ORPHAN_PARENT = """
import multiprocessing as mp, os, signal, sys, time
from concurrent.futures import ProcessPoolExecutor
from benchmarks.claims import runner

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=runner._init_worker, initargs=(ctx.Queue(), 1))
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 600)  # a long run in flight
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)  # killed, as a scheduler would: no cleanup runs here
"""


def test_workers_exit_when_the_claims_parent_is_killed(tmp_path):
    """A killed parent's workers end within seconds instead of finishing their run into the out dir."""
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_PARENT)
    log = tmp_path / "parent.log"
    with open(log, "w") as out:  # a file, not a pipe: an orphaned worker holding a pipe would block run()
        proc = subprocess.run([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT, timeout=120)
    assert proc.returncode == -9, log.read_text()
    worker = int(log.read_text().split()[0])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(worker, 9)
    pytest.fail(f"worker {worker} outlived its killed parent by 15 s")
