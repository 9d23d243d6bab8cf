"""The named presets: each builds the class it names with its arguments and learns a little on a grouped text env."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from helpers import quiet

import sb3_grpo
from sb3_grpo.presets import PRESETS, make_preset
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, N_STEPS = 4, 2, 8


def _env():
    return make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=0, device="cpu", max_new_tokens=6)


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_builds_and_learns_a_little(name):
    preset = PRESETS[name]
    model = quiet(make_preset(name, "CausalLMPolicy", _env(), n_steps=N_STEPS, batch_size=16, seed=0, device="cpu"))
    assert type(model) is getattr(sb3_grpo, preset.cls_name)
    for key, value in preset.kwargs.items():
        assert getattr(model, key) == value or callable(getattr(model, key)), key  # schedules are wrapped by SB3
    assert preset.summary and preset.source
    model.learn(N_STEPS * N_ENVS)
    assert np.isfinite(model.logger.name_to_value["train/policy_gradient_loss"])


def test_overrides_go_on_top_of_the_preset():
    model = make_preset(
        "deepseek-grpo", "CausalLMPolicy", _env(), n_steps=N_STEPS, batch_size=16, kl_coef=0.1, device="cpu"
    )
    assert model.kl_coef == 0.1 and model.advantage == "group" and model.n_epochs == 1


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown preset 'deepseek'; known presets: deepseek-grpo, dr-grpo, dapo"):
        make_preset("deepseek", "CausalLMPolicy", _env())


def test_the_docs_page_lists_every_preset_with_its_source():
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "algorithms" / "presets.md").read_text()
    for preset in PRESETS.values():
        assert f"| `{preset.name}` |" in page and preset.source in page, preset.name
