"""Same seed on CPU, same results: two runs give identical episode rewards, completions and parameters."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO
from textrl_envs.sb3 import make_vec_env


class Episodes(BaseCallback):
    """Every finished episode's (timestep, env, return, completion)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def _on_step(self):
        for i, info in enumerate(self.locals["infos"]):
            if "episode" in info:
                # the record itself: GRPO lands a reward scored in the background in it when the rollout ends
                self.seen.append((self.num_timesteps, i, info["episode"], info.get("completion")))
        return True


def _params(model):
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


def _run(make):
    model, steps = make()
    model.set_logger(configure(None, []))
    episodes = Episodes()
    initial = _params(model)
    model.learn(steps, callback=episodes)
    seen = [(t, i, float(episode["r"]), completion) for t, i, episode, completion in episodes.seen]
    params = _params(model)
    # training moved the parameters: two runs that both do nothing would be "identical" too
    assert any(not th.equal(initial[k], params[k]) for k in params)
    return seen, params, model.rollout_buffer.rewards.copy()


def _assert_identical(first, second):
    (ep1, p1, r1), (ep2, p2, r2) = first, second
    assert ep1 and ep1 == ep2
    assert (r1 == r2).all()
    assert p1.keys() == p2.keys()
    for k in p1:
        assert th.equal(p1[k], p2[k]), k


def _mlp_grpo():
    env = sb3_make_vec_env("CartPole-v1", n_envs=2, seed=1)
    return GRPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=2, explore_alpha=0.2, seed=1, device="cpu"), 384


def _mlp_ppo():
    env = sb3_make_vec_env("CartPole-v1", n_envs=2, seed=1)
    return PPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=2, seed=1, device="cpu"), 256


def _text(advantage):
    def make():
        group = 1 if advantage == "gae" else 2
        env = make_vec_env("TextGen-v0", n_envs=4, group_size=group, seed=3, device="cpu", max_new_tokens=6)
        model = GRPO(
            "CausalLMPolicy",
            env,
            n_steps=8,
            batch_size=16,
            n_epochs=2,
            advantage=advantage,
            kl_coef=0.05,
            explore_alpha=0.1,
            learning_rate=1e-3,
            seed=3,
            device="cpu",
        )
        return model, 64

    return make


@pytest.mark.parametrize("make", [_mlp_grpo, _mlp_ppo], ids=["grpo_mlp", "ppo_mlp"])
def test_mlp_runs_are_identical(make):
    _assert_identical(_run(make), _run(make))


@pytest.mark.parametrize("advantage", ["gae", "group"])
def test_text_runs_with_causal_lm_policy_are_identical(advantage):
    first, second = _run(_text(advantage)), _run(_text(advantage))
    _assert_identical(first, second)
    assert all(c is not None for *_, c in first[0])  # completions were compared too


def test_different_seeds_differ():
    def seeded(seed):
        def make():
            env = sb3_make_vec_env("CartPole-v1", n_envs=2, seed=seed)
            return GRPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, seed=seed, device="cpu"), 128

        return make

    (_, p1, _), (_, p2, _) = _run(seeded(1)), _run(seeded(2))
    assert any(not th.equal(p1[k], p2[k]) for k in p1)


def test_the_cpu_thread_default_computes_what_one_thread_computes(monkeypatch):
    """With no thread setting, the policy runs a small LM on one thread, so a run gives the results of a run at
    ``torch.set_num_threads(1)`` (the command line's default) bit for bit; at two threads the episodes are the same
    and the parameters differ only by float rounding (the backward sums in another order)."""
    from sb3_grpo.policies import threads

    before = th.get_num_threads()
    for name in (*threads.USER_THREAD_VARIABLES, threads.THREADS_ENV):
        monkeypatch.delenv(name, raising=False)
    runs = {}
    try:
        th.set_num_threads(2)
        monkeypatch.setattr(threads, "_THREADS_AT_IMPORT", 2)  # as if imported at torch's default of 2
        monkeypatch.setattr(threads, "_auto_applied", False)
        runs["default"] = _run(_text("group"))
        assert th.get_num_threads() == 1
        for count in (1, 2):
            th.set_num_threads(count)  # the user's choice, kept
            runs[count] = _run(_text("group"))
            assert th.get_num_threads() == count
    finally:
        th.set_num_threads(before)
    _assert_identical(runs["default"], runs[1])
    (ep1, p1, r1), (ep2, p2, r2) = runs[1], runs[2]
    assert ep1 == ep2 and (r1 == r2).all()
    for k in p1:
        th.testing.assert_close(p1[k], p2[k], rtol=1e-4, atol=1e-5)
