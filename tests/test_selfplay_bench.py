"""``textrl-bench selfplay``: the exploitability-gap figure by hand, and a tiny run on a chat model that resumes."""

from __future__ import annotations

import json

import pytest

from benchmarks import selfplay as sp


def _run(before: float, after: float) -> dict:
    return {"before": {"heuristic": {"payoff": before}}, "after": {"heuristic": {"payoff": after}}}


def test_the_gap_closed_by_hand():
    # from -1 to -0.5 against a best response worth +1: a quarter of the gap of 2
    assert sp.gap_fraction(_run(-1.0, -0.5), 1.0) == pytest.approx(0.25)
    assert sp.gap_fraction(_run(-1.0, -1.0), 1.0) == 0.0
    assert sp.gap_fraction(_run(0.0, -0.5), 0.5) == pytest.approx(-1.0)  # worse than before
    assert sp.gap_fraction(_run(0.5, 0.5), 0.5) is None  # no gap to close
    lines = sp.gap_section({"nim": [_run(-1.0, -0.5), _run(-1.0, 0.0)]}, {"nim": {"payoff": 1.0}})
    row = next(line for line in lines if line.startswith("| nim |"))
    assert "| 1.000 | -1.00 ± 0.00 | -0.25 ± " in row and "| 0.38 ± " in row  # fractions 0.25 and 0.5


def test_a_tiny_chat_model_run_resumes_and_writes_its_page(tmp_path, tiny_chat_model):
    pytest.importorskip("peft", reason='the real-model mode trains LoRA: pip install "textrl[lora]"')
    out, kept = tmp_path / "page.md", tmp_path / "runs.json"
    argv = ["--games", "nim", "--seeds", "1", "--timesteps", "64", "--n-envs", "4", "--group-size", "2",
            "--n-steps", "16", "--eval-episodes", "4", "--model", tiny_chat_model, "--dtype", "bfloat16",
            "--results", str(kept), "--out", str(out)]  # fmt: skip
    assert sp.main(argv) == 0
    run = json.loads(kept.read_text())["runs"]["nim/0"]
    assert set(run["after"]) == {"random", "heuristic", "untrained", "earlier"}
    assert all(0.0 <= run["after"][o]["illegal"] <= 1.0 for o in run["after"])
    text = out.read_text()
    assert "in instruct mode" in text and "## The exploitability gap closed against the heuristic" in text
    assert "frozen weights in bfloat16" in text
    assert "## Why games are lost by illegal moves" in text and "| nim | 16 |" in text
    stamp = kept.stat().st_mtime_ns
    assert sp.main(argv) == 0  # kept: nothing trains again
    assert kept.stat().st_mtime_ns == stamp
    settings = json.loads(kept.read_text())
    del settings["settings"]["dtype"]  # a file from before --dtype existed: made in float32
    kept.write_text(json.dumps(settings))
    with pytest.raises(SystemExit, match="--dtype 'float32' \\(not 'bfloat16'\\)"):
        sp.main(argv)
    with pytest.raises(SystemExit, match="--timesteps 64 \\(not 128\\)"):
        sp.main([*argv[:4], "--timesteps", "128", *argv[6:]])


def test_dtype_reaches_the_policy_kwargs():
    policy = sp.model_setup("some/model", "bfloat16")[1]
    assert policy["dtype"] == "bfloat16" and policy["lora"] == sp.LORA
    assert "dtype" not in sp.model_setup("some/model")[1]
    assert sp.model_setup(None, "bfloat16")[1] == {"dtype": "bfloat16"}


def _eval(payoff: float, illegal: float) -> dict:
    return {"payoff": payoff, "illegal": illegal, "win": float(payoff > 0)}


def _game_run(before: tuple[float, float], after: tuple[float, float]) -> dict:
    return {when: {o: _eval(*pair) for o in ("random", "heuristic", "untrained")}
            for when, pair in (("before", before), ("after", after))}  # fmt: skip


def test_the_goals_by_hand():
    # tic-tac-toe: payoff -1 -> 0.2 and 0.4 against every opponent, illegal moves 0.9 -> 0.02 and 0.04
    ttt = [_game_run((-1.0, 0.9), (0.2, 0.02)), _game_run((-1.0, 0.9), (0.4, 0.04))]
    # Kuhn poker: -0.5 -> -0.4 against every opponent: a tenth of a gap of 0.611 ... below 0: not beaten
    kuhn = [_game_run((-0.5, 0.5), (-0.4, 0.3)), _game_run((-0.5, 0.5), (-0.4, 0.3))]
    bounds = {"tictactoe": {"payoff": 0.5}, "kuhn": {"payoff": 0.111}}
    text = "\n".join(sp.goals_section({"tictactoe": ttt, "kuhn": kuhn}, bounds))
    # t-interval of (0.2, 0.4): 0.30 ± 12.706 * 0.1414 / sqrt(2) = 0.30 ± 1.27: holds 0, so not met
    assert "| beat untrained play at tictactoe (payoff interval above 0) | 0.30 ± 1.27 | no |" in text
    assert "| beat random play at kuhn (payoff interval above 0) | -0.40 ± 0.00 | no |" in text
    # illegal after: 0.03 ± 12.706 * 0.01414 / sqrt(2) = 0.03 ± 0.13, not under 5% with its interval
    assert "under 5% | 0.03 ± 0.13 (before training 0.90) | no |" in text
    # the gap closed: tic-tac-toe (0.2 + 1) / 1.5 = 0.8 and (0.4 + 1) / 1.5 = 0.933: 0.87 ± 0.85 (better than
    # Kuhn's 0.1 / 0.611 = 0.16)
    assert "(the best: tictactoe) | 0.87 ± 0.85 | no |" in text
    assert (
        "How far off: tic-tac-toe's illegal moves: 90% of the games before training, 3% after (interval up to "
        "16%; the goal: under 5%); the gap closed: 87% on tictactoe, the better game (interval down to 2%)" in text
    )
    sure = [_game_run((-1.0, 0.9), (0.3, 0.01))] * 2  # no spread: every interval is a point
    assert "Every goal is met." in "\n".join(sp.goals_section({"tictactoe": sure}, {"tictactoe": {"payoff": 0.5}}))


def test_the_replies_section_quotes_replies_on_one_line():
    replies = {"kuhn": {"episodes": 16, "turns": 20, "legal": 0.25,
                        "unreadable": ["The golden\nhour | `x`", "King"]}}  # fmt: skip
    text = "\n".join(sp.replies_section(replies))
    assert "| kuhn | 16 | 20 | 25% | `The golden hour / 'x'` / `King` |" in text
