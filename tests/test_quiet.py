"""Quiet by default: building envs and a policy and training a little, as the examples do, prints no warning and
no progress bar, and the loads the packages make leave transformers' progress bars as the user had them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from textrl_envs.hf_loading import no_progress_bars

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE_SIZED = textwrap.dedent(
    """
    import gymnasium as gym
    from transformers.utils import logging as hf_logging

    import textrl_envs
    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    env = gym.make("TextGen-v0")
    model = GRPO("CausalLMPolicy", env, n_steps=48, batch_size=24, n_epochs=1, learning_rate=1e-4, kl_coef=0.05,
                 gamma=1.0, seed=0, device="cpu")
    model.learn(total_timesteps=48)
    vec = make_vec_env("TextGen-v0", n_envs=8, group_size=4, seed=0, device="cpu")
    GRPO("CausalLMPolicy", vec, advantage="group", n_steps=48, batch_size=96, n_epochs=2, learning_rate=1e-4,
         kl_coef=0.05, gamma=1.0, seed=0, device="cpu")
    fresh = gym.make("TextGen-v0")
    obs, _ = fresh.reset(seed=0)
    model.predict(obs)
    print("bars enabled:", hf_logging.is_progress_bar_enabled())
    """
)


def test_an_example_sized_run_prints_no_warning_and_no_progress_bar(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("PYTHONWARNINGS", None)
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    proc = subprocess.run(
        [sys.executable, "-c", EXAMPLE_SIZED], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Loading weights" not in proc.stderr and "it/s]" not in proc.stderr, proc.stderr[-2000:]
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip() == "", proc.stderr[-2000:]
    assert "bars enabled: True" in proc.stdout  # the user's own from_pretrained calls still show theirs


@pytest.mark.parametrize("enabled", [True, False])
def test_no_progress_bars_restores_what_the_user_had(enabled):
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    before = (hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled())
    try:
        (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
        state = (hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled())
        with no_progress_bars():
            assert not hf_logging.is_progress_bar_enabled()
        assert (hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()) == state
    finally:
        (hf_logging.enable_progress_bar if before[0] else hf_logging.disable_progress_bar)()


def test_the_hub_bars_a_user_turned_off_stay_off():
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"):
        pytest.skip("the Hub's bars are off by the environment here")
    before = hf_logging.is_progress_bar_enabled()
    try:
        hf_logging.enable_progress_bar()
        disable_progress_bars()  # the Hub's only
        with no_progress_bars():
            pass
        assert hf_logging.is_progress_bar_enabled() and are_progress_bars_disabled()
    finally:
        enable_progress_bars()
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


EIGHT_BIT_LORA = textwrap.dedent(
    """
    import logging

    import textrl_envs
    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=3)
    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "fan_in_fan_out": True}
    model = GRPO("CausalLMPolicy", env, n_steps=4, batch_size=8, n_epochs=1, seed=0, device="cpu",
                 policy_kwargs={"quantization": "8bit", "lora": lora})
    model.learn(8)
    # outside our calls bitsandbytes' loggers are as they were: the user's own 8-bit model still says it
    logging.getLogger("bitsandbytes.autograd._functions").warning("MatMul8bitLt: inputs will be cast (the user's)")
    print("levels:", logging.getLogger("bitsandbytes").level, logging.getLogger("kernels").level)
    """
)


def test_an_8bit_lora_run_does_not_repeat_bitsandbytes_notices(tmp_path):
    pytest.importorskip("bitsandbytes", reason='bitsandbytes is not installed: pip install "textrl[quant]"')
    pytest.importorskip("peft", reason='peft is not installed: pip install "textrl[lora]"')
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", EIGHT_BIT_LORA], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "gemm_4bit_forward" not in proc.stderr and "publisher trust" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("MatMul8bitLt") == 1 and "(the user's)" in proc.stderr, proc.stderr[-2000:]
    assert "levels: 0 0" in proc.stdout
