"""``sb3-grpo compare`` / ``report``: outputs, bad input, Ctrl-C and --resume (tiny settings, seconds each)."""

from __future__ import annotations

import json
import math
import os
import shlex

import pytest
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo.cli import main, parse_set
from sb3_grpo.compare import runner as compare_mod
from sb3_grpo.compare.algos import ALGOS, parse_algos
from sb3_grpo.compare.config import make_config
from sb3_grpo.compare.pages import git_commit
from sb3_grpo.compare.report import (
    curve_auc,
    render_report,
    steps_to_threshold,
    summarize,
    volatility,
)
from sb3_grpo.compare.results import prepare_out_dir
from sb3_grpo.compare.runner import run_compare

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CARTPOLE = [
    "compare",
    "--env",
    "CartPole-v1",
    "--algos",
    "ppo,grpo",
    "--seeds",
    "2",
    "--timesteps",
    "256",
    "--eval-episodes",
    "2",
    "--no-progress",
    "--set",
    "*.n_steps=64",
    "--set",
    "*.batch_size=32",
    "--set",
    "*.n_epochs=1",
]
TEXT = [
    "compare",
    "--env",
    "TextGen-v0",
    "--algos",
    "ppo,grpo-group",
    "--seeds",
    "1",
    "--timesteps",
    "96",
    "--n-envs",
    "4",
    "--group-size",
    "2",
    "--eval-episodes",
    "4",
    "--no-progress",
    "--set",
    "*.n_steps=24",
    "--set",
    "*.batch_size=48",
    "--set",
    "*.n_epochs=1",
]
RUN_KEYS = {
    "algo",
    "seed",
    "status",
    "curve",
    "final",
    "env_steps",
    "wall_time_s",
    "steps_per_s",
    "peak_rss_mb",
    "cuda_peak_mb",
    "kl_to_init",
    "kl_ref",
    "fingerprint",
}


def _check_outputs(out, algos, seeds):
    assert (out / "results.json").is_file() and (out / "curves.png").stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete"
    assert set(results["runs"]) == {f"{a}/seed{s}" for a in algos for s in seeds}
    for run in results["runs"].values():
        assert RUN_KEYS <= set(run)
        assert run["curve"]["steps"] and len(run["curve"]["steps"]) == len(run["curve"]["reward"])
        assert math.isfinite(run["final"]["reward_mean"]) and run["peak_rss_mb"] > 0
    assert results["untrained"] is not None and "versions" in results["environment"]
    report = (out / "report.md").read_text()
    for text in (
        "final reward",
        "vs PPO",
        "AUC",
        "seed std",
        "volatility",
        "peak RSS",
        "KL to init",
        "The claim",
        "sb3-grpo compare",
        "Versions:",
        "Hardware:",
        "separate evaluation",
    ):
        assert text in report, text
    for algo in algos:
        assert f"| {algo} |" in report
    return results


def test_compare_cartpole(tmp_path):
    out = tmp_path / "cp"
    assert main([*CARTPOLE, "--out", str(out)]) == 0
    results = _check_outputs(out, ["ppo", "grpo"], [0, 1])
    assert (out / "tensorboard" / "grpo" / "seed1").is_dir()
    assert results["config"]["hyperparameters"]["grpo"]["n_steps"] == 64
    report = (out / "report.md").read_text()  # the claim's section points at the study's page, not a README section
    assert "docs/results/claims.md" in report and '"The claims"' not in report
    # the report can be regenerated from results.json alone
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0 and (out / "report.md").is_file()


def test_compare_textgen(tmp_path):
    out = tmp_path / "text"
    assert main([*TEXT, "--out", str(out)]) == 0
    results = _check_outputs(out, ["ppo", "grpo-group"], [0])
    assert results["config"]["group_sizes"] == {"ppo": 1, "grpo-group": 2}
    assert results["runs"]["ppo/seed0"]["step_unit"] == "tokens"
    assert "prompt groups of 2" in (out / "report.md").read_text()
    for algo in ("ppo", "grpo-group"):  # each run keeps a sample of what its trained policy writes
        rows = [json.loads(line) for line in (out / "tensorboard" / algo / "seed0" / "samples.jsonl").open()]
        assert len(rows) == 4 and all(set(r) == {"prompt", "completion", "reward"} for r in rows)
        assert all(isinstance(r["completion"], str) and isinstance(r["reward"], float) for r in rows)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algos", "ppo,nope"], "'nope'"),
        (["--env", "NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
        (["--seeds", "0"], "--seeds"),
        (["--timesteps", "-5"], "--timesteps"),
        (["--n-envs", "0"], "--n-envs"),
        (["--eval-episodes", "x"], "--eval-episodes"),
        (["--set", "grpo.learning_rate"], "ALGO.KEY=VALUE"),
        (["--set", "grpo.no_such_param=1"], "no_such_param"),
        (["--set", "sac.learning_rate=1"], "'sac'"),
        (["--env", "CartPole-v1", "--algos", "ppo,grpo-group"], "prompt groups"),
        (["--n-envs", "6", "--algos", "grpo-group"], "multiple of the group size"),
        (["--overwrite", "--resume"], "not allowed with"),
        (["--env-kwargs", "{task: 1}"], "--env-kwargs '{task: 1}': not valid JSON"),
        (["--env-kwargs", "[1, 2]"], "--env-kwargs must be a JSON object"),
        (["--env-kwargs", '{"max_new_tokens": 0}'], "TextGen-v0 cannot be made with them: ValueError: max_new_tokens"),
        (["--env", "CartPole-v1", "--env-kwargs", '{"colour": 1}'], "CartPole-v1 cannot be made with them"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["compare", *args, "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()


def test_unknown_algo_lists_known(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["compare", "--algos", "ppo,grpoo", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert all(name in err for name in ALGOS)


def test_existing_out_dir_refused(tmp_path, capsys):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as exc:
        main([*CARTPOLE, "--out", str(out)])
    assert exc.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    with pytest.raises(SystemExit):  # --resume without results.json
        main([*CARTPOLE, "--out", str(out), "--resume"])


def test_unwritable_out_dir(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        main([*CARTPOLE, "--out", str(blocker / "sub")])
    assert exc.value.code == 2 and "cannot write" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


class _Interrupt(BaseCallback):
    def _on_step(self) -> bool:
        raise KeyboardInterrupt


def _tiny_cartpole_config():
    return make_config(
        "CartPole-v1",
        ["ppo", "grpo"],
        seeds=1,
        timesteps=128,
        eval_episodes=2,
        device="cpu",
        overrides={"*": {"n_steps": 64, "batch_size": 32, "n_epochs": 1}},
    )


def test_ctrl_c_keeps_completed_runs_and_resume_skips_them(tmp_path, capsys):
    out = tmp_path / "cc"
    cfg = _tiny_cartpole_config()
    prepare_out_dir(out, overwrite=False, resume=False)
    calls = []

    def callbacks_for(algo, seed):
        calls.append(algo)
        return [_Interrupt()] if len(calls) == 2 else []

    with pytest.raises(KeyboardInterrupt):
        run_compare(cfg, out, "sb3-grpo compare ...", callbacks_for=callbacks_for, progress=False)
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "interrupted"
    assert list(results["runs"]) == ["ppo/seed0"]
    report = (out / "report.md").read_text()
    assert "Incomplete" in report and "grpo seed 0" in report
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    first_wall = results["runs"]["ppo/seed0"]["wall_time_s"]

    args = [
        "compare",
        "--env",
        "CartPole-v1",
        "--algos",
        "ppo,grpo",
        "--seeds",
        "1",
        "--timesteps",
        "128",
        "--eval-episodes",
        "2",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        str(out),
        "--resume",
        "--set",
        "*.n_steps=64",
        "--set",
        "*.batch_size=32",
        "--set",
        "*.n_epochs=1",
    ]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and set(results["runs"]) == {"ppo/seed0", "grpo/seed0"}
    assert results["runs"]["ppo/seed0"]["wall_time_s"] == first_wall  # kept, not rerun
    assert "keeping 1 completed run" in capsys.readouterr().out
    assert "Incomplete" not in (out / "report.md").read_text()


def test_cli_interrupt_exit_code(tmp_path, monkeypatch, capsys):
    calls = []
    real = compare_mod.run_one

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(compare_mod, "run_one", flaky)
    out = tmp_path / "ki"
    assert main([*CARTPOLE, "--seeds", "1", "--out", str(out)]) == 130
    assert "--resume" in capsys.readouterr().err
    assert list(json.loads((out / "results.json").read_text())["runs"]) == ["ppo/seed0"]


def test_parse_helpers():
    assert parse_algos("ppo, grpo,ppo") == ["ppo", "grpo"]
    assert parse_set(["grpo.learning_rate=1e-4", "*.adaptive_clip=null", 'ppo.policy_kwargs={"top_k": 5}']) == {
        "grpo": {"learning_rate": 1e-4},
        "*": {"adaptive_clip": None},
        "ppo": {"policy_kwargs": {"top_k": 5}},
    }


def test_metrics():
    steps, rewards = [100, 200, 300, 400], [0.0, 1.0, 1.0, 3.0]
    assert curve_auc(steps, rewards) == pytest.approx((0.5 + 1.0 + 2.0) * 100 / 300)
    assert steps_to_threshold(steps, rewards, 0.6) == 300  # smoothed: 0, .5, .667, 1.667
    assert steps_to_threshold(steps, rewards, 1.0) == 400
    assert steps_to_threshold(steps, rewards, 10.0) is None
    assert math.isnan(volatility([1.0, 2.0]))
    assert volatility([0, 0, 0, 1, 0, 1, 0, 1]) > 0


def test_report_from_handmade_results():
    def run(algo, seed, final):
        return {
            "algo": algo,
            "seed": seed,
            "status": "complete",
            "curve": {"steps": [1, 2, 3, 4], "reward": [0, 1, 2, final]},
            "final": {"reward_mean": final, "deterministic": True},
            "wall_time_s": 1.0,
            "steps_per_s": 4.0,
            "peak_rss_mb": 10.0,
            "cuda_peak_mb": None,
            "kl_to_init": 0.1,
            "kl_ref": None,
        }

    results = {
        "config": {
            "env_id": "TextGen-v0",
            "algos": ["ppo", "grpo"],
            "seeds": [0, 1, 2],
            "timesteps": 4,
            "n_envs": 1,
            "eval_episodes": 1,
            "text": True,
            "threshold": None,
            "hyperparameters": {},
            "group_sizes": {},
        },
        "untrained": {"reward_mean": 0.0},
        "runs": {
            f"{a}/seed{s}": run(a, s, f)
            for a, vals in (("ppo", (1.0, 1.2, 0.8)), ("grpo", (1.3, 1.1)))
            for s, f in enumerate(vals)
        },
        "status": "interrupted",
    }
    summary = summarize(results)
    assert summary["ppo"]["final_mean"] == pytest.approx(1.0)
    assert summary["grpo"]["vs_ppo_pct"] == pytest.approx(20.0)
    assert summary["grpo"]["seeds_missing"] == [2]
    text = render_report(results)
    assert "Incomplete (interrupted): 5 of 6 runs" in text and "grpo seed 2" in text
    assert summary["ppo"]["final_iqm"]["value"] == pytest.approx(1.0)
    assert summary["grpo"]["vs_ppo"]["value"] == pytest.approx(0.2)  # IQM of 2 = their mean
    assert "reward gain vs PPO" in text and "**inconclusive**" in text  # 2-3 seeds: the interval spans everything


def test_perf_helpers():
    from benchmarks import perf
    from benchmarks.timing import make_row

    rows = [
        make_row("env: a vs b", 200.0, 100.0, "env steps/s", "setup", True, target=(">=", 1.5)),
        make_row("update: x vs y", None, 2.0, "s/update", "not available", False),
        make_row("cost: z vs plain", 3.0, 1.0, "s/update", "setup", False, target=("<=", 2.0), slowdown=True),
        make_row("memory: ours vs theirs", 90.0, 100.0, "MB", "setup", False, cpu=(1.0, 2.0), target=(">=", 1.0)),
    ]
    assert rows[0]["ratio"] == pytest.approx(2.0) and rows[0]["met"] is True
    assert rows[1]["ratio"] is None and rows[1]["met"] is None
    assert rows[2]["ratio"] == pytest.approx(3.0) and rows[2]["met"] is False  # a slowdown above its cap
    assert rows[3]["ratio"] == pytest.approx(100 / 90) and rows[3]["cpu_ratio"] == pytest.approx(2.0)
    table = perf.markdown_table(rows)
    assert "| env: a vs b | 200 | 100 | env steps/s | 2.00x | – | >= 1.5x | yes |" in table
    assert "| update: x vs y | – |" in table and "| <= 2x | no |" in table


@pytest.mark.parametrize(("ours_time", "met"), [(float("inf"), False), (10.0, True), (20.0, False)])
def test_perf_trl_time_to_reward_row(monkeypatch, ours_time, met):
    """Ours never reaching TRL's final reward reads as a target not met, not as a missing figure."""
    from benchmarks import perf
    from benchmarks.perf import trl

    summary = {"ours": {"completions_per_s": 9.0, "final_reward": 0.3}, "TRL": {"completions_per_s": 7.0,
               "final_reward": 0.6}, "time_to_trl_final": {"ours": ours_time, "TRL": 14.0}}  # fmt: skip
    monkeypatch.setattr(trl, "trl_available", lambda: True)
    monkeypatch.setattr(trl, "compare_loops", lambda *a, **k: {"summary": summary})
    row = perf._trl_row(trl.DEFAULT, "complete loop vs TRL GRPOTrainer", True, "cpu", 1)
    assert row["met"] is met
    if ours_time == float("inf"):
        assert row["ours"] is None and "did not reach TRL's final reward" in row["notes"]
        assert "| – | 14 | s | – | – | >= 1x | no |" in perf.markdown_table([row])
    else:
        assert row["ratio"] == pytest.approx(14.0 / ours_time)


def test_perf_rejects_unknown_measurements(tmp_path):
    from benchmarks.perf import run_perf

    with pytest.raises(ValueError, match="unknown measurement.*'nope'.*known: env, rollout"):
        run_perf(tmp_path, only=["nope"])


def test_help_lists_algorithms(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ALGOS) and "seven minutes" in out


def test_compare_reasoning_gym_with_env_kwargs(tmp_path):
    pytest.importorskip("reasoning_gym")
    kwargs = {"task": "chain_sum", "task_kwargs": {"max_terms": 2, "max_digits": 1}, "size": 16}
    kwargs.update(max_prompt_tokens=24, max_new_tokens=4)
    out = tmp_path / "rg"
    args = [a if a != "TextGen-v0" else "ReasoningGym-v0" for a in TEXT]
    assert main([*args, "--env-kwargs", json.dumps(kwargs), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["env_kwargs"] == kwargs
    assert all(run["fingerprint"]["env_kwargs"] == kwargs for run in results["runs"].values())
    assert "# sb3-grpo compare: ReasoningGym-v0 `" in (out / "report.md").read_text()
    with pytest.raises(SystemExit):  # an unknown task is caught before the out dir is made
        main([*args, "--env-kwargs", '{"task": "chain_sun"}', "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()


def test_warm_start_learns_the_answers_and_saves_a_loadable_model(tmp_path, capsys):
    import gymnasium as gym
    import torch as th

    from sb3_grpo import GRPO
    from sb3_grpo.warmstart import RECORD_FILE, answer_examples, batch_tensors

    out = tmp_path / "warm"
    argv = ["warm-start", "--env", "Arithmetic-v0", "--steps", "40", "--batch-size", "16", "--out", str(out)]
    assert main(argv) == 0
    record = json.loads((out / RECORD_FILE).read_text())
    assert record["steps"] == len(record["losses"]) == 40 and record["command"].startswith("sb3-grpo warm-start")
    assert record["loss_last"] < record["loss_first"]
    # the saved model is what CausalLMPolicy trains from, and it gives the answers more probability than before
    env = gym.make("Arithmetic-v0")
    spec = env.unwrapped.text_spec
    examples = answer_examples(spec)[:64]
    ids, mask, positions, labels = batch_tensors(examples, spec.pad_token_id)

    def answer_nll(model):
        with th.no_grad():
            return float(
                model.policy.lm(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels).loss
            )

    warm = GRPO("CausalLMPolicy", env, policy_kwargs={"model": str(out)}, n_steps=8, batch_size=8, seed=0)
    cold = GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8, seed=0)
    assert answer_nll(warm) < answer_nll(cold)
    # bad input: prompts without answers
    with pytest.raises(SystemExit) as exc:
        main(["warm-start", "--env", "TextGen-v0", "--out", str(tmp_path / "w2")])
    assert exc.value.code == 2 and "needs prompts with an 'answer' column" in capsys.readouterr().err


def test_warm_start_batches_put_labels_on_the_targets_only():
    from sb3_grpo.warmstart import batch_tensors

    ids, mask, positions, labels = batch_tensors([([5, 6], [7, 0]), ([5], [8])], pad_id=1)
    assert ids.tolist() == [[5, 6, 7, 0], [1, 1, 5, 8]]
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert positions.tolist() == [[0, 1, 2, 3], [0, 0, 0, 1]]
    assert labels.tolist() == [[-100, -100, 7, 0], [-100, -100, -100, 8]]


USER_PACKAGE = """
import gymnasium as gym

from textrl_envs.rewards import register_reward

gym.register("UserCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=50)


@register_reward("user-constant-seven")
def make_constant():
    def constant(prompts, completions, **kwargs):
        return [7.0] * len(completions)

    return constant
"""


def test_gym_packages_register_the_users_envs_and_rewards(tmp_path, monkeypatch):
    """``--gym-packages`` imports a module before the envs are made: the env id and the reward it registers work."""
    (tmp_path / "user_envs_for_compare.py").write_text(USER_PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cartpole = [a if a != "CartPole-v1" else "UserCartPole-v0" for a in CARTPOLE]
    out = tmp_path / "env"
    assert main([*cartpole, "--gym-packages", "user_envs_for_compare", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["env_id"] == "UserCartPole-v0" and len(results["runs"]) == 4
    # the reward: every episode of the untrained policy scores the user's constant
    out = tmp_path / "reward"
    argv = [*TEXT, "--gym-packages", "user_envs_for_compare", "--env-kwargs", '{"reward": "user-constant-seven"}']
    assert main([*argv, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["untrained"]["reward_mean"] == pytest.approx(7.0)


def test_gym_packages_that_do_not_import_are_named(tmp_path, capsys):
    out = tmp_path / "x"
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--gym-packages", "json", "no_such_user_envs_xyz", "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "cannot import 'no_such_user_envs_xyz'" in err
    assert "PYTHONPATH" in err and "pip install" in err
    assert not out.exists()


def test_results_page_holds_the_report_with_a_stamp(tmp_path):
    out, page = tmp_path / "cp", tmp_path / "docs" / "results" / "cartpole.md"
    argv = [*CARTPOLE, "--out", str(out), "--results-page", str(page)]
    assert main(argv) == 0
    text = page.read_text()
    report = (out / "report.md").read_text()
    assert text.startswith("# sb3-grpo compare: CartPole-v1")
    assert f"- Command: `{shlex.join(['sb3-grpo', *argv])}`" in text
    assert "- Commit: `" in text and "- Hardware: " in text and "- Date: " in text
    # the report's tables after the stamp, its plot beside the page, named after it
    assert report.partition("\n")[2].strip().replace("](curves.png)", "](cartpole-curves.png)") in text
    assert (page.parent / "cartpole-curves.png").read_bytes() == (out / "curves.png").read_bytes()


def test_report_of_a_claims_dir_points_to_the_lab(tmp_path, capsys):
    """The claims study's report lives with the study (``textrl-bench report``); sb3-grpo says so."""
    out = tmp_path / "claims"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"kind": "claims", "budget": "smoke", "runs": {}}))
    with pytest.raises(SystemExit) as exc:
        main(["report", str(out)])
    assert exc.value.code == 2 and f"textrl-bench report {out}" in capsys.readouterr().err
    assert not (out / "claims.md").exists()


def test_compare_runs_the_field_algorithms(tmp_path):
    """Every algorithm of the field in the table runs through compare on a grouped text env and gets a report row."""
    algos = ["dr-grpo", "dapo", "gspo", "cispo"]
    argv = list(TEXT)
    argv[argv.index("ppo,grpo-group")] = ",".join(algos)
    out = tmp_path / "field"
    assert main([*argv, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete" and set(results["runs"]) == {f"{a}/seed0" for a in algos}
    report = (out / "report.md").read_text()
    for algo in algos:
        assert f"| {algo} |" in report
        assert math.isfinite(results["runs"][f"{algo}/seed0"]["final"]["reward_mean"])


def test_every_preset_is_a_compare_row_and_runs(tmp_path):
    """``preset-<name>`` rows build what ``make_preset(name, ...)`` builds; two of them run through compare."""
    from sb3_grpo.presets import PRESETS

    for name, preset in PRESETS.items():
        spec = ALGOS[f"preset-{name}"]
        assert spec.cls_name == preset.cls_name and spec.kwargs == preset.kwargs
    algos = ["preset-ppo-lm", "preset-dapo"]
    argv = list(TEXT)
    argv[argv.index("ppo,grpo-group")] = ",".join(algos)
    out = tmp_path / "presets"
    assert main([*argv, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == {f"{a}/seed0" for a in algos}
    assert results["config"]["hyperparameters"]["preset-ppo-lm"]["kl_coef"] == PRESETS["ppo-lm"].kwargs["kl_coef"]


def test_report_rewrites_the_results_page_with_the_runs_own_command_and_commit(tmp_path):
    """A results page written later from results.json (``sb3-grpo report --results-page``) stamps the commit recorded
    when the comparison started and the comparison's own command line, not those of the moment it is written."""
    out, page = tmp_path / "cp", tmp_path / "docs" / "cartpole.md"
    argv = [*CARTPOLE, "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    recorded = results["environment"]["commit"]
    assert recorded and recorded == git_commit()
    results["environment"]["commit"] = "0123abc"  # as if the checkout had moved on since the run
    (out / "results.json").write_text(json.dumps(results))
    assert main(["report", str(out), "--results-page", str(page)]) == 0
    text = page.read_text()
    assert "- Commit: `0123abc`\n" in text
    assert f"- Command: `{shlex.join(['sb3-grpo', *argv])}`" in text
    assert (page.parent / "cartpole-curves.png").is_file() and "](cartpole-curves.png)" in text
