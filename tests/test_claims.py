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


# -- the real-model budget: claims 1, 2 and 4 on an instruct model with LoRA -------------------------------------


def test_the_real_budget_runs_the_long_text_claims_only():
    from benchmarks.claims.experiments import REAL_MODEL, Budget

    real = BUDGETS["real"]
    assert real.model == REAL_MODEL and set(real.experiments) == {"tune", "long", "curriculum"}
    assert real.seeds >= 5  # the seeds per arm the claims need at least
    with pytest.raises(ValueError, match="long-text experiments only"):
        Budget("x", 2, 2, 1, 2, 1, 64, 64, 64, 64, 4, model="m", experiments=("tune", "long", "collapse"))
    with pytest.raises(ValueError, match="add 'tune'"):
        Budget("x", 2, 2, 1, 2, 1, 64, 64, 64, 64, 4, experiments=("long",))
    with pytest.raises(ValueError, match="add 'long'"):
        Budget("x", 2, 2, 1, 2, 1, 64, 64, 64, 64, 4, experiments=("tune", "curriculum"))
    with pytest.raises(ValueError, match="unknown experiment"):
        Budget("x", 2, 2, 1, 2, 1, 64, 64, 64, 64, 4, experiments=("tune", "longg"))


def test_model_needs_the_real_budget(capsys):
    with pytest.raises(SystemExit):
        main(["claims", "--budget", "smoke", "--model", "some/model", "--no-progress"])
    assert "--budget real" in capsys.readouterr().err


def test_scale_n_envs_and_device_reach_every_run_of_the_plan(tmp_path, monkeypatch):
    from benchmarks.claims.experiments import scaled_budget

    seen = []

    def recording(job, out_dir, report=None):
        seen.append(job)
        return _fake_execute(job, out_dir, report)

    monkeypatch.setattr(runner, "execute", recording)
    argv = ["claims", "--budget", "smoke", "--scale", "3", "--n-envs", "8", "--device", "auto", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "s")]) == 0
    smoke = BUDGETS["smoke"]
    steps = {"tune": smoke.tune_steps, "long": smoke.long_steps, "curriculum": smoke.long_steps,
             "collapse": smoke.reason_steps, "baselines": smoke.text_steps, "ablation": smoke.text_steps}  # fmt: skip
    trained = [job for job in seen if not job.untrained]
    assert {job.experiment for job in trained} == set(steps)
    for job in trained:
        assert job.cfg.timesteps == 3 * steps[job.experiment], job.key
    assert all(job.cfg.n_envs == 8 and job.cfg.device == "auto" for job in seen)
    real = phase_one(scaled_budget(BUDGETS["real"], device="auto"))  # the reward model of the reviews goes along
    assert all(job.cfg.env_kwargs["reward_kwargs"]["components"][1][2]["device"] == "auto" for job in real)
    plan = json.loads((tmp_path / "s" / "results.json").read_text())["plan"]["budget"]
    assert plan["long_steps"] == 3 * smoke.long_steps and plan["device"] == "auto" and plan["n_envs"] == 8
    assert scaled_budget(smoke) == smoke  # the defaults change nothing
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="scale must be an int >= 1"):
            scaled_budget(smoke, bad)


def test_a_device_this_machine_lacks_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import torch as th

    monkeypatch.setattr(th.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu"
    with pytest.raises(SystemExit):
        main(["claims", "--budget", "smoke", "--device", "cuda", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert "--device" in err and "CUDA is not available" in err
    assert not out.exists()
    with pytest.raises(SystemExit):  # the group-advantage arms need whole prompt groups of envs
        main(["claims", "--budget", "smoke", "--n-envs", "6", "--out", str(out), "--no-progress"])
    assert "must be a multiple of the group size" in capsys.readouterr().err
    assert not out.exists()


def _long_runs(finals_by_arm: dict[tuple[str, str], list[float]], untrained: float) -> dict[str, dict]:
    runs = {"untrained/LongReview-v0": {"experiment": "untrained", "arm": "LongReview-v0", "status": "complete",
                                        "final": {"reward_mean": untrained}}}  # fmt: skip
    for (experiment, arm), values in finals_by_arm.items():
        for seed, value in enumerate(values):
            runs[f"{experiment}/{arm}/seed{seed}"] = {
                "experiment": experiment, "arm": arm, "seed": seed, "status": "complete",
                "final": {"reward_mean": value}, "curve": {"steps": [1, 2], "reward": [0.0, value]},
            }  # fmt: skip
    return runs


def test_a_long_text_verdict_is_read_only_where_every_arm_beats_the_untrained_policy():
    from benchmarks.claims import verdicts as V
    from benchmarks.claims.report import evaluate_claims

    learned = [1.50, 1.52, 1.55, 1.58, 1.60]
    flat = [1.00, 1.02, 0.98, 1.01, 0.99]  # around the untrained 1.0
    both = _long_runs({("long", "grpo"): learned, ("long", "ppo"): [x - 0.4 for x in learned],
                       ("curriculum", "grpo+curriculum"): learned}, untrained=1.0)  # fmt: skip
    claims = evaluate_claims(both, ("tune", "long", "curriculum"))
    assert set(claims) == {"reward", "stability", "curriculum"}
    # grpo ~1.55 against ppo ~1.15 (both above 1.0): +35%, beyond the claimed +15%, read as it is
    assert claims["reward"]["verdict"] == "supported" and "gate" not in claims["reward"]
    one_flat = _long_runs({("long", "grpo"): learned, ("long", "ppo"): flat,
                           ("curriculum", "grpo+curriculum"): learned}, untrained=1.0)  # fmt: skip
    gated = evaluate_claims(one_flat, ("tune", "long", "curriculum"))
    assert gated["reward"]["verdict_ungated"] == "supported"  # +55% over a PPO that learned nothing ...
    assert gated["reward"]["verdict"] == "inconclusive" and "`long/ppo`" in gated["reward"]["gate"]  # ... not read
    assert "gate" not in gated["curriculum"]  # it compares two arms that learned
    # by hand: the IQM interval of an arm against the untrained figure
    assert V.above_untrained({"value": 1.5, "low": 1.4, "high": 1.6}, 1.0) is True
    assert V.above_untrained({"value": 1.5, "low": 0.9, "high": 1.6}, 1.0) is False
    assert V.above_untrained({"value": 1.5, "low": float("nan"), "high": float("nan")}, 1.0) is None
    assert V.above_untrained({"value": 1.5, "low": 1.4, "high": 1.6}, None) is None


def test_a_real_model_study_trains_lora_on_chat_reviews_and_reports_three_claims(tmp_path, tiny_chat_model):
    pytest.importorskip("peft", reason='the real budget trains LoRA: pip install "textrl[lora]"')
    from dataclasses import replace

    from benchmarks.claims.experiments import REVIEW_COHERENCE_WEIGHT, REVIEW_REQUESTS

    budget = replace(BUDGETS["smoke"], name="real", model=tiny_chat_model, experiments=("tune", "long", "curriculum"))
    out = tmp_path / "real"
    out.mkdir()
    results = study.run_claims(budget, out, "textrl-bench claims --budget real", progress=False, log=lambda *_: None)
    runs = results["runs"]
    assert results["status"] == "complete" and all(r["status"] == "complete" for r in runs.values())
    assert {r["experiment"] for r in runs.values()} == {"untrained", "tune", "long", "curriculum"}
    assert [k for k in runs if k.startswith("untrained/")] == ["untrained/LongReview-v0"]
    for job in phase_one(budget):  # every run: the chat reviews, LoRA on the model, the model as its own reference
        kwargs = job.cfg.env_kwargs
        assert kwargs["chat_template"] is True and kwargs["prompts"] == list(REVIEW_REQUESTS)
        assert kwargs["reward_kwargs"]["components"][1] == [
            "coherence",
            REVIEW_COHERENCE_WEIGHT,
            {"path": tiny_chat_model, "device": "cpu"},
        ]
        policy = job.cfg.hyperparameters[job.algo]["policy_kwargs"]
        assert policy["model"] == tiny_chat_model and policy["lora"]["r"] == 8
    text = (out / "claims.md").read_text()
    table = text[text.index("## Verdicts") : text.index("## How the verdicts")]
    assert sum(table.count(v) for v in VERDICTS) == 3  # claims 1, 2 and 4
    assert "Not run in this study: claim 3 (collapse), claim 5 (baselines), the ablation." in text
    assert f"Policy: `{tiny_chat_model}` with LoRA" in text and "above untrained (" in text
    assert "## Claim 3" not in text and "## Ablation" not in text and "## Tuning" in text
    # two seeds per arm: no interval, so no arm is shown to beat the untrained policy and no verdict is read
    assert table.count("not read:") == 3
    # each trained run records the reward's three terms per rollout, and the page gives them per arm
    for run in (r for r in runs.values() if r["experiment"] == "long"):
        terms = run["reward_terms"]
        assert set(terms) == {"sentiment", "coherence", "repetition"}
        assert all(
            len(t["series"]) >= 1 and t["first"] == pytest.approx(t["series"][0], abs=1e-5) for t in terms.values()
        )
    assert "## Reward terms" in text and "| long | grpo | 2 |" in text


def test_reward_terms_average_each_term_over_a_rollouts_episodes():
    from benchmarks.claims.diagnostics import RewardTerms
    from benchmarks.claims.report import reward_terms_section
    from textrl_envs.rewards import CompositeReward

    reward = CompositeReward([["length", 1.0, {"min_words": 3, "max_words": 4}], ["repetition", 1.0, {"n": 1}]])
    reward([""], ["a b c d"])  # scored before the run: not counted
    terms = RewardTerms([reward])
    terms._init_callback()
    per_rollout = [["a b c d", "a a"], [], ["a b c d e f g h"]]  # the second rollout scores nothing
    expected: dict[str, list[float]] = {}
    for completions in per_rollout:
        if completions:
            _, parts = reward.score_components([""] * len(completions), completions)
            for label, scores in parts.items():
                expected.setdefault(label, []).append(float(np.mean(scores)))
        terms._on_rollout_end()
    assert set(terms.series) == {"length", "repetition"} and len(terms.series["length"]) == 2
    for label, values in expected.items():
        np.testing.assert_allclose(terms.series[label], values)
    summary = terms.summary()
    assert summary["length"]["last"] == pytest.approx(np.mean(expected["length"]))
    runs = {"long/grpo/seed0": {"experiment": "long", "arm": "grpo", "reward_terms": summary},
            "long/grpo/seed1": {"experiment": "long", "arm": "grpo", "reward_terms": summary},
            "untrained/x": {"experiment": "untrained", "arm": "x"}}  # fmt: skip
    first, last = summary["length"]["first"], summary["length"]["last"]
    assert f"| long | grpo | 2 | {first:.3f} -> {last:.3f} |" in "\n".join(reward_terms_section(runs))
    assert reward_terms_section({"untrained/x": runs["untrained/x"]}) == []
