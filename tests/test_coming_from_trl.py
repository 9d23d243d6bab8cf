"""The "Coming from TRL" page and the README's snippets: the page's fields and defaults are TRL's own, the README's
quickstart trains without a warning, and its group snippet builds the preset it names."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ast
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGE = (ROOT / "docs" / "guides" / "coming_from_trl.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
ROW = re.compile(r"^\| `(\w+)` \(([^)]*)\) \|", flags=re.M)


def _literal(text: str):
    """A default as the page writes it (``1e-6``, ```None``: all 1``, ```"dapo"```), or ``...`` if it is prose."""
    text = text.split(":")[0].strip().strip("`")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return ...


def test_the_page_maps_the_fields_that_matter():
    fields = {name for name, _ in ROW.findall(PAGE)}
    wanted = {"learning_rate", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
              "num_iterations", "epsilon", "beta", "loss_type", "scale_rewards", "max_completion_length",
              "temperature", "max_grad_norm", "reward_weights", "importance_sampling_level"}  # fmt: skip
    assert wanted <= fields, wanted - fields
    assert 'make_preset("trl-grpo"' in PAGE and "tokens" in PAGE


def test_the_pages_fields_and_defaults_are_trls():
    trl = pytest.importorskip("trl", reason="trl is not installed: the test extra (pip install -e '.[test]') has it")
    config = trl.GRPOConfig(output_dir="unused", report_to=[], use_cpu=True)
    checked = 0
    for name, default in ROW.findall(PAGE):
        assert hasattr(config, name), f"GRPOConfig has no field {name!r}"
        value = _literal(default)
        if value is not ...:
            assert getattr(config, name) == value, (name, getattr(config, name), value)
            checked += 1
    assert checked >= 20


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_quickstart_trains_without_a_warning():
    quickstart = _python_blocks(README.split("## Quickstart", 1)[1])[0]
    assert "total_timesteps=960" in quickstart
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(quickstart, "README quickstart", "exec"), {})
    ours = [w for w in caught if issubclass(w.category, UserWarning)]
    assert not ours, [str(w.message) for w in ours]


def test_the_readme_group_snippet_is_the_real_preset():
    from sb3_grpo.presets import PRESETS

    snippet = _python_blocks(README.split("## Quickstart", 1)[1])[1]
    assert 'make_preset("deepseek-grpo"' in snippet and "DeepSeekMath-style" not in README
    namespace: dict = {}
    exec(compile(snippet.replace("model.learn(8_192)", ""), "README group snippet", "exec"), namespace)
    model = namespace["model"]
    for key, value in PRESETS["deepseek-grpo"].kwargs.items():
        if key != "learning_rate":
            assert getattr(model, key) == value, key
