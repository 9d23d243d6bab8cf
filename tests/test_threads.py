"""The policy's CPU thread default: one torch intra-op thread for a small LM on the CPU, unless the user chose a
count (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``, ``torch.set_num_threads`` after import, ``SB3_GRPO_CPU_THREADS``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from transformers import GPT2Config, GPT2LMHeadModel

from sb3_grpo.policies import CausalLMPolicy, threads

V, W = 40, 8


@pytest.fixture(autouse=True)
def default_threads(monkeypatch):
    """Torch at 2 threads, as imported with no thread variable set; the count is restored afterwards."""
    before = th.get_num_threads()
    for name in (*threads.USER_THREAD_VARIABLES, threads.THREADS_ENV):
        monkeypatch.delenv(name, raising=False)
    th.set_num_threads(2)
    monkeypatch.setattr(threads, "_THREADS_AT_IMPORT", 2)
    monkeypatch.setattr(threads, "_auto_applied", False)
    yield
    th.set_num_threads(before)


def _policy() -> CausalLMPolicy:
    th.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_layer=1, n_embd=16, n_head=2, n_positions=16))
    ids, mask = spaces.Box(0, V - 1, (W,), np.int64), spaces.Box(0, 1, (W,), np.int64)
    obs = spaces.Dict({"input_ids": ids, "attention_mask": mask})
    return CausalLMPolicy(obs, spaces.Discrete(V), lambda _: 1e-3, model=lm)


def _forward(policy: CausalLMPolicy) -> None:
    obs = {"input_ids": np.ones((2, W), np.int64), "attention_mask": np.ones((2, W), np.int64)}
    policy.predict(obs)


def test_a_small_lm_on_the_cpu_runs_on_one_thread():
    policy = _policy()
    assert th.get_num_threads() == 2  # building the policy changes nothing: the first forward decides
    _forward(policy)
    assert th.get_num_threads() == 1
    th.set_num_threads(2)  # the user's, although it is the count at import: the rule applies once per process
    _forward(_policy())
    assert th.get_num_threads() == 2


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
def test_a_thread_variable_the_user_set_is_respected(monkeypatch, variable):
    monkeypatch.setenv(variable, "2")
    _forward(_policy())
    assert th.get_num_threads() == 2


def test_a_set_num_threads_call_after_import_is_respected():
    th.set_num_threads(3)
    _forward(_policy())
    assert th.get_num_threads() == 3


def test_keep_leaves_the_count_and_a_number_sets_it(monkeypatch):
    monkeypatch.setenv(threads.THREADS_ENV, "keep")
    _forward(_policy())
    assert th.get_num_threads() == 2
    monkeypatch.setenv(threads.THREADS_ENV, "3")
    _forward(_policy())
    assert th.get_num_threads() == 3


def test_a_large_lm_uses_every_usable_core_and_says_so(monkeypatch, caplog):
    policy = _policy()
    monkeypatch.setattr(threads, "SMALL_LM_PARAMETERS", sum(p.numel() for p in policy.lm.parameters()) - 1)
    monkeypatch.setattr(threads, "usable_cores", lambda: 3)
    with caplog.at_level("INFO", logger="sb3_grpo.policies.threads"):
        _forward(policy)
    assert th.get_num_threads() == 3
    assert "torch intra-op threads: 3, for a large LM of" in caplog.text and "SB3_GRPO_CPU_THREADS" in caplog.text


def test_the_small_lm_choice_is_stated_in_the_log(caplog):
    with caplog.at_level("INFO", logger="sb3_grpo.policies.threads"):
        _forward(_policy())
    assert "torch intra-op threads: 1, for a small LM of" in caplog.text


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_setting_is_refused_when_the_policy_is_built(monkeypatch, value):
    monkeypatch.setenv(threads.THREADS_ENV, value)
    with pytest.raises(ValueError, match=r"SB3_GRPO_CPU_THREADS=.*'keep'.*positive integer"):
        _policy()
