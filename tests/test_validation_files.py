"""Files on disk: nothing is written by a command that then fails on its input.

Every override is checked before the out dir is touched; a comparison that fails once it runs, before any run
completes, removes the out dir it created; an existing out dir and a damaged results.json are left as they were,
and ``sb3-grpo report`` still reports on a complete results.json.
"""

import json
from pathlib import Path

import pytest
from helpers import GIVEN, assert_refused, case_ids, run_report

from sb3_grpo.cli import main as cli_main
from sb3_grpo.compare import runner as compare_module
from sb3_grpo.compare.results import discard_failed_out_dir, prepare_out_dir

QUICK = ["compare", "--env", "CartPole-v1", "--algos", "ppo", "--seeds", "1", "--timesteps", "64"]


def _existing_out_with_bad_set():
    Path(GIVEN).mkdir()
    Path(GIVEN, "notes.txt").write_text("mine")
    cli_main([*QUICK, "--set", "ppo.n_steps=0", "--out", GIVEN, "--overwrite"])


def _resume_damaged():
    Path(GIVEN).mkdir()
    Path(GIVEN, "results.json").write_text('{"config": {"env_id": "CartPole-v1"}, "runs": {}}')
    cli_main([*QUICK, "--out", GIVEN, "--resume"])


CASES = [
    (
        "cli-learning-rate-abc",  # refused before a results.json with the bad config and no runs is written
        lambda: cli_main([*QUICK, "--set", "ppo.learning_rate=abc", "--out", "out"]),
        SystemExit,
        r"ppo: learning_rate must be a finite number >= 0, got 'abc' \(str\); pass a number or a schedule",
    ),
    (
        "cli-bad-value-in-config-file",
        lambda: (
            (Path(GIVEN).mkdir(), Path(GIVEN, "c.json").write_text('{"*": {"batch_size": "64"}}'))
            and cli_main([*QUICK, "--config", "given/c.json", "--out", "out/nested"])
        ),
        SystemExit,
        r"ppo: batch_size must be an int >= 1, got '64' \(str\); pass e.g. batch_size=64 \(check --set / --config\)",
    ),
    (
        "cli-policy-kwargs-model-missing",
        lambda: cli_main(["compare", "--algos", "ppo", "--set", 'ppo.policy_kwargs={"model": "no/lm"}', "--out", "o"]),
        SystemExit,
        r"policy_kwargs\['model'\] = 'no/lm' is not a directory, and not in the Hugging Face cache at .* "
        r"\(HF_HUB_OFFLINE=1 forbids downloading it\); pass a local model directory, fetch it once online with "
        r"`hf download no/lm`",
    ),
    (
        "cli-policy-kwargs-unknown",
        lambda: cli_main(["compare", "--algos", "ppo", "--set", 'ppo.policy_kwargs={"topk": 5}', "--out", "o"]),
        SystemExit,
        r"policy_kwargs has unknown name\(s\) topk; CausalLMPolicy takes: .*top_k",
    ),
    ("cli-existing-out-bad-set", _existing_out_with_bad_set, SystemExit, r"ppo: n_steps must be an int >= 1, got 0"),
    ("cli-resume-damaged-results", _resume_damaged, SystemExit, r"its config lacks algos, seeds, timesteps"),
]


@pytest.mark.parametrize("case, action, error, match", CASES, ids=case_ids(CASES))
def test_refused_before_anything_is_written(workdir, capsys, case, action, error, match):
    assert_refused(workdir, capsys, case, action, error, match)
    if case == "cli-existing-out-bad-set":
        assert Path(GIVEN, "notes.txt").read_text() == "mine"
    if case == "cli-resume-damaged-results":
        assert json.loads(Path(GIVEN, "results.json").read_text())["config"] == {"env_id": "CartPole-v1"}


def test_a_compare_that_fails_once_running_removes_the_out_dir_it_made(workdir, monkeypatch, capsys):
    def broken_run(*_args, **_kwargs):
        raise RuntimeError("the first run failed")

    monkeypatch.setattr(compare_module, "run_one", broken_run)
    with pytest.raises(RuntimeError, match="the first run failed"):
        cli_main([*QUICK, "--out", "runs/a/b"])
    assert sorted(p.name for p in workdir.iterdir()) == []  # runs/a/b and the parents it made are gone
    assert "removed runs/a/b/" in capsys.readouterr().err


def test_a_failed_resume_keeps_the_existing_out_dir(workdir):
    out = workdir / "kept"
    out.mkdir()
    assert prepare_out_dir(out, overwrite=False, resume=False) == []  # it existed (empty): nothing is ours
    assert discard_failed_out_dir([]) is False and out.is_dir()


def test_completed_runs_are_never_discarded(workdir):
    created = prepare_out_dir(workdir / "new" / "out", overwrite=False, resume=False)
    assert created == [workdir / "new" / "out", workdir / "new"]
    (created[0] / "results.json").write_text(json.dumps({"runs": {"ppo/seed0": {"status": "complete"}}}))
    assert discard_failed_out_dir(created) is False and (created[0] / "results.json").is_file()
    (created[0] / "results.json").write_text(json.dumps({"runs": {"ppo/seed0": {"status": "running"}}}))
    assert discard_failed_out_dir(created) is True and not (workdir / "new").exists()


def test_report_leaves_a_damaged_results_file_as_it_was(workdir, capsys):
    """The refused report writes no report.md / curves.png and does not touch the file."""
    with pytest.raises(SystemExit):
        run_report("{}")
    assert sorted(p.name for p in Path(GIVEN).iterdir()) == ["results.json"]
    assert Path(GIVEN, "results.json").read_text() == "{}"
    assert "sb3-grpo compare" in capsys.readouterr().err


def test_report_runs_on_a_complete_results_file_after_the_checks(tmp_path, capsys):
    """The results check lets real results through: a minimal, complete results.json still makes a report."""
    results = {
        "config": {
            "env_id": "CartPole-v1",
            "algos": ["ppo"],
            "seeds": [0],
            "timesteps": 64,
            "n_envs": 1,
            "eval_episodes": 2,
            "hyperparameters": {"ppo": {}},
        },
        "runs": {},
        "status": "interrupted",
    }
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert cli_main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").is_file()
