"""``textrl-bench memory-recipes``: which rows run on this machine, and the page of rows that do not fit."""

import importlib.util

import pytest

from benchmarks import memory_recipes as recipes


@pytest.mark.parametrize(
    ("need", "available", "cap", "expected"),
    [
        (1000.0, 20_000.0, 14_336.0, None),
        (15_000.0, 40_000.0, 14_336.0, "--max-gb"),
        (10_000.0, 11_000.0, 14_336.0, "free here now"),  # 11 GB free less the 2 GB reserve
        (9_000.0, 11_100.0, 14_336.0, None),
    ],
)
def test_skip_reason_compares_the_need_with_the_cap_and_the_free_memory(need, available, cap, expected):
    reason = recipes.skip_reason(need, available, cap)
    if expected is None:
        assert reason is None
    else:
        assert expected in reason and f"{need / 1024:.1f} GB" in reason


def test_memory_needed_takes_the_larger_of_the_estimate_and_the_model_built_first():
    factor, process = recipes.NEED_FACTOR, recipes.PROCESS_MB
    assert recipes.memory_needed_mb(3000.0, 6000.0) == pytest.approx(factor * 6000.0 + process)
    assert recipes.memory_needed_mb(8000.0, 6000.0, processes=2) == pytest.approx(2 * (factor * 8000.0 + process))


def test_rows_that_do_not_fit_are_listed_with_their_estimate_and_not_run(tmp_path):
    from sb3_grpo.policies.memory_estimate import estimate_memory, load_config, model_counts

    page = tmp_path / "recipes.md"
    assert recipes.main(["--shapes", "qwen2-1.5b", "--max-gb", "0.01", "--page", str(page)]) == 0
    text = page.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| qwen2-1.5b |")]
    quant = importlib.util.find_spec("bitsandbytes") is not None
    assert len(rows) == len(recipes.configurations("qwen2-1.5b", 8, quant))
    assert all("not run: needs about" in row and "--max-gb" in row for row in rows)
    # the full fine-tune's estimate, computed here from the shape's config
    env, n_actions = recipes.make_env(8, 16)
    seq_len = int(env.observation_space["input_ids"].shape[0])
    config = load_config("qwen2-1.5b")
    config.vocab_size = max(config.vocab_size, n_actions)
    est = estimate_memory(model_counts(config, ["q_proj", "v_proj"]), micro_batch_size=8, seq_len=seq_len,
                          n_actions=n_actions)  # fmt: skip
    assert rows[0].startswith("| qwen2-1.5b | full |")
    assert f"| {est.total / 2**20:.0f} |" in rows[0]
    assert est.total / 2**30 > 20, "a full fine-tune of the 1.5B shape needs more than 20 GB"
