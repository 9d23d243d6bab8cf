"""GRPO's rollout is the same MDP whichever way it is computed: the fast paths of collect_rollouts against the
step-by-step reference paths, on the same random streams (same transitions, log-probs and buffer contents)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import quiet
from stable_baselines3.common.callbacks import CallbackList

from sb3_grpo import GRPO
from textrl_envs.sb3 import make_vec_env

N_ENVS, N_STEPS = 4, 24
FIELDS_EXACT = ("actions", "episode_starts", "token_ids", "token_mask")
FIELDS_CLOSE = ("log_probs", "policy_log_probs", "values", "rewards", "advantages", "returns")


def _rollout(setup=None, **grpo_kwargs):
    """One rollout of GRPO on TextGen-v0 (bundled LM, EOS on, groups of 2); ``setup(model)`` runs before it."""
    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=2, seed=7, device="cpu", max_new_tokens=8)
    model = quiet(GRPO("CausalLMPolicy", env, n_steps=N_STEPS, batch_size=N_STEPS * N_ENVS, seed=3, device="cpu",
                       **grpo_kwargs))  # fmt: skip
    if setup is not None:
        setup(model)
    model._setup_learn(N_STEPS * N_ENVS, None)
    callback = CallbackList([])
    callback.init_callback(model)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, N_STEPS)
    return model.rollout_buffer


def _assert_same(fast, slow):
    for name in FIELDS_EXACT:
        a, b = getattr(fast, name), getattr(slow, name)
        a, b = (
            (a.cpu().numpy() if isinstance(a, th.Tensor) else a),
            (b.cpu().numpy() if isinstance(b, th.Tensor) else b),
        )
        np.testing.assert_array_equal(a, b, err_msg=name)
    for name in FIELDS_CLOSE:
        np.testing.assert_allclose(getattr(fast, name), getattr(slow, name), atol=2e-6, rtol=1e-5, err_msg=name)


def _two_calls(model):
    model.policy.accepts_action_filter = False  # the generic path: a second call per replaced action


@pytest.mark.parametrize(
    "extras",
    [{"explore_alpha": 0.3, "explore_fraction": 1.0}, {"explore_alpha": 0.3, "advantage": "self_critical"}],
    ids=["explore", "explore+greedy"],
)
def test_exploration_in_one_call_equals_the_two_call_path(extras):
    fast = _rollout(**extras)
    slow = _rollout(_two_calls, **extras)
    explored = fast.log_probs != fast.policy_log_probs
    assert explored.any(), "the mixture must have replaced some actions"
    _assert_same(fast, slow)


def _count_forwards(model):
    calls = []
    model.policy.lm.base_model.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    model.forward_calls = calls


def _count_values(model):
    """The batch size of every ``predict_values`` call the policy gets from now on (a list that fills)."""
    calls = []
    predict = model.policy.predict_values
    model.policy.predict_values = lambda obs: calls.append(len(obs["input_ids"])) or predict(obs)
    return calls


def _no_warm_prefills(model):
    _count_forwards(model)
    model.policy.warm_prefills = lambda _obs: 0


def test_cached_rollout_equals_full_recompute():
    """The reference MDP: every step recomputes every prefix (no cache, no look-ahead)."""
    fast = _rollout(explore_alpha=0.3, explore_fraction=1.0)
    slow = _rollout(explore_alpha=0.3, explore_fraction=1.0, policy_kwargs={"use_cache": False})
    assert (fast.episode_starts[1:] > 0).any(), "episodes must end and auto-reset inside the rollout"
    _assert_same(fast, slow)


def test_auto_resets_copied_from_the_memo_in_place_equal_full_recompute(monkeypatch):
    """An auto-reset's prompt, prefilled before the rollout, is written into the batch cache straight from the memo
    (no cache of those rows built first): the same buffer as a full recompute, and as the splice it replaces."""
    from sb3_grpo.policies.kv_cache import RolloutCache

    copy = RolloutCache._copy_from_memo
    served = []

    def counting(self, *args):
        done = copy(self, *args)
        served.append(done)
        return done

    monkeypatch.setattr(RolloutCache, "_copy_from_memo", counting)
    fast = _rollout()
    assert sum(served) > N_ENVS, "auto-resets must be served from the memo"
    slow = _rollout(policy_kwargs={"use_cache": False})
    _assert_same(fast, slow)
    monkeypatch.setattr(RolloutCache, "_copy_from_memo", lambda *_args: False)  # the splice of a built cache
    spliced = _rollout()
    for name in (*FIELDS_EXACT, *FIELDS_CLOSE):  # bit for bit: both copy the memo's tensors
        np.testing.assert_array_equal(getattr(fast, name), getattr(spliced, name), err_msg=name)


def test_prompts_prefilled_before_the_rollout_save_a_forward_per_reset():
    """The env's prompts prefilled in one batch before the rollout: the same buffer as prefills at each reset, with
    one forward per step (the look-ahead) plus that batch, the first observation and the final value."""
    models = {}

    def keep(name, setup):
        def run(model):
            setup(model)
            models[name] = model

        return run

    warm = _rollout(keep("warm", _count_forwards))
    cold = _rollout(keep("cold", _no_warm_prefills))
    _assert_same(warm, cold)
    n_warm, n_cold = len(models["warm"].forward_calls), len(models["cold"].forward_calls)
    resets = int((warm.episode_starts[1:] > 0).sum())
    assert resets > N_ENVS
    assert n_warm <= N_STEPS + 3 < n_cold  # look-aheads, the prompt batch, the first observation, the last value


def test_prompt_table_is_warmed_only_when_small_next_to_the_rollout():
    """The warm prefills the env's prompt table when its tokens are at most ``WARM_TOKEN_SHARE`` of the rollout's
    generated tokens, and skips it (0 prompts, no call) one step below that."""
    import math

    from sb3_grpo.common.rollout.rollout_extras import WARM_TOKEN_SHARE, warm_prefills

    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=2, seed=7, device="cpu", max_new_tokens=8)
    table = env.prompt_windows(10**6)
    calls = []

    class Policy:
        def warm_prefills(self, obs):
            calls.append(obs)
            return len(obs["input_ids"])

    steps = math.ceil(int(table[1].sum()) / (WARM_TOKEN_SHARE * N_ENVS))
    assert warm_prefills(Policy(), env, steps - 1) == 0 and not calls
    assert warm_prefills(Policy(), env, steps) == len(table[0])
    np.testing.assert_array_equal(calls[0]["input_ids"].numpy(), table[0])
    env.close()


def test_a_prompt_table_too_large_to_warm_queues_the_prompts_the_groups_draw_next():
    from sb3_grpo.common.rollout.rollout_extras import PREFETCH_ROUNDS, warm_prefills

    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=2, seed=7, device="cpu", max_new_tokens=8)
    env.reset()
    warmed, queued = [], []

    class Policy:
        def warm_prefills(self, obs):
            warmed.append(obs)
            return len(obs["input_ids"])

        def prefetch_prompts(self, obs):
            queued.append(obs)
            return len(obs["input_ids"])

    assert warm_prefills(Policy(), env, 1) == 0 and not warmed  # one step: the table is too large to prefill
    ids, mask = env.upcoming_prompt_windows(PREFETCH_ROUNDS)
    assert len(queued) == 1 and 0 < len(ids) <= N_ENVS // 2 * PREFETCH_ROUNDS
    np.testing.assert_array_equal(queued[0]["input_ids"].numpy(), ids)
    np.testing.assert_array_equal(queued[0]["attention_mask"].numpy(), mask)
    env.close()
    interactive = make_vec_env("GuessNumber-v0", n_envs=4, group_size=2, seed=0, device="cpu")
    interactive.reset()
    queued.clear()  # its episodes may open with the env's message after the prompt: nothing is guessed
    assert interactive.upcoming_prompt_windows(PREFETCH_ROUNDS) is None
    assert warm_prefills(Policy(), interactive, 1) == 0 and not queued
    interactive.close()


def test_truncated_episodes_valued_in_one_batch_equal_one_call_each(monkeypatch):
    """With an extra on, the step's truncated episodes get ``gamma * V(terminal obs)`` from one ``predict_values``
    call; the buffer is the one SB3's one call per episode gives (same rewards, returns and advantages)."""
    import sb3_grpo.common.on_policy as grpo_module
    from sb3_grpo.common.rollout.rollout_extras import bootstrap_truncated

    calls = {}

    def counting(name):
        def setup(model):
            calls[name] = _count_values(model)

        return setup

    extras = {"explore_alpha": 0.3, "explore_fraction": 1.0, "gamma": 0.9}  # gamma < 1: the bootstrap shows
    batched = _rollout(counting("batched"), **extras)
    monkeypatch.setattr(grpo_module, "bootstrap_truncated", lambda *a: bootstrap_truncated(*a[:5], batched=False))
    single = _rollout(counting("single"), **extras)
    _assert_same(batched, single)
    several = [n for n in calls["batched"] if 1 < n < N_ENVS]
    assert several, "some step must truncate several episodes at once (valued in one call)"
    assert len(calls["batched"]) < len(calls["single"])
    assert all(n in (1, N_ENVS) for n in calls["single"])  # the step's batch, the last obs, one per episode


@pytest.mark.parametrize("advantage", ["group", "rloo"])
def test_group_advantages_compute_no_value_they_do_not_use(monkeypatch, advantage):
    """Group advantages replace GAE's and train no critic: the rollout skips the bootstrap values (of truncated
    episodes and of the rollout's end) and the last step's look-ahead. Same transitions, log-probs and advantages as
    the rollout that computes them, one forward fewer and no ``predict_values`` call."""
    from sb3_grpo.common.rollout.rollout_extras import RolloutExtras

    models = {}

    def keep(name):
        def setup(model):
            _count_forwards(model)
            model.values_calls = _count_values(model)
            models[name] = model

        return setup

    extras = {"advantage": advantage, "gamma": 0.9}  # gamma < 1: a bootstrap would show in the rewards
    lean = _rollout(keep("lean"), **extras)
    start = RolloutExtras.start

    def computing_values(*args, **kwargs):
        out = start(*args, **kwargs)
        out.needs_values = True  # as before: bootstrap values and the last look-ahead
        return out

    monkeypatch.setattr(RolloutExtras, "start", computing_values)
    full = _rollout(keep("full"), **extras)
    for name in FIELDS_EXACT:
        np.testing.assert_array_equal(getattr(lean, name), getattr(full, name), err_msg=name)
    for name in ("log_probs", "policy_log_probs", "values", "advantages"):
        np.testing.assert_array_equal(getattr(lean, name), getattr(full, name), err_msg=name)
    assert (lean.advantages != 0).any()
    truncated = lean.rewards != full.rewards  # gamma * V(terminal obs) added to truncated episodes' last rewards
    assert truncated.any() and (full.rewards[truncated] != 0).all()
    assert models["lean"].values_calls == [] and len(models["full"].values_calls) > 1
    assert len(models["lean"].forward_calls) == len(models["full"].forward_calls) - 1
    assert not hasattr(models["lean"].policy, "look_ahead")  # an argument of the draw, no flag left on the policy


def test_bootstrap_truncated_batched_matches_per_episode_and_skips_the_others():
    """The function itself on a Box env (MLP values) and a Dict-observation text env: only truncated episodes that
    carry a terminal observation change, by ``gamma * V``, batched or not."""
    from sb3_grpo.common.rollout.rollout_extras import bootstrap_truncated

    for env_id, policy in (("Pendulum-v1", "MlpPolicy"), ("TextGen-v0", "CausalLMPolicy")):
        if env_id == "TextGen-v0":
            env = make_vec_env(env_id, n_envs=4, seed=0, device="cpu", max_new_tokens=4)
        else:
            from stable_baselines3.common.env_util import make_vec_env as sb3_vec

            env = sb3_vec(env_id, n_envs=4, seed=0)
        model = quiet(GRPO(policy, env, n_steps=8, batch_size=32, seed=0, device="cpu"))
        obs = env.reset()
        is_dict = isinstance(obs, dict)
        assert is_dict == (env_id == "TextGen-v0")
        terminal = [({k: v[i] for k, v in obs.items()} if is_dict else obs[i]) for i in range(4)]
        dones = np.array([True, True, False, True])
        infos = [
            {"terminal_observation": terminal[0], "TimeLimit.truncated": True},
            {"terminal_observation": terminal[1], "TimeLimit.truncated": True},
            {},
            {"terminal_observation": terminal[3], "TimeLimit.truncated": False},  # terminated: no bootstrap
        ]
        out = {}
        for batched in (True, False):
            rewards = np.ones(4, dtype=np.float32)
            bootstrap_truncated(model.policy, 0.5, rewards, dones, infos, batched=batched)
            out[batched] = rewards
        with th.no_grad():
            for i in (0, 1):
                value = model.policy.predict_values(model.policy.obs_to_tensor(terminal[i])[0]).item()
                assert out[True][i] == pytest.approx(1 + 0.5 * value, rel=1e-6, abs=1e-6)
        np.testing.assert_allclose(out[True], out[False], rtol=1e-6, atol=1e-6, err_msg=env_id)
        assert out[True][2] == 1 and out[True][3] == 1
        assert out[True][0] != 1 and out[True][1] != 1
        env.close()


def test_last_values_only_where_an_episode_goes_on():
    """GAE's last bootstrap: no call without a critic or when every episode ended (zeros, which GAE multiplies by 0:
    SB3's advantages to the bit); with ``by_rows`` only the running envs' rows are valued, else one call of all."""
    from gymnasium import spaces as gym_spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    from sb3_grpo.common.rollout.rollout_extras import last_values

    calls = []

    class Critic:
        def predict_values(self, obs):
            calls.append(obs["x"].clone())
            return obs["x"][:, :1].float() * 10

    obs = {"x": np.arange(8).reshape(4, 2)}
    done = np.array([True, False, True, False])
    cpu = th.device("cpu")
    assert not last_values(Critic(), obs, done, False, True, cpu).any() and not calls
    assert not last_values(Critic(), obs, np.ones(4, dtype=bool), True, True, cpu).any() and not calls
    values = last_values(Critic(), obs, done, True, True, cpu)
    np.testing.assert_array_equal(values.numpy().ravel(), [0, 20, 0, 60])
    np.testing.assert_array_equal(calls.pop().numpy(), obs["x"][~done])
    values = last_values(Critic(), obs, done, True, False, cpu)
    np.testing.assert_array_equal(values.numpy().ravel(), [0, 20, 40, 60])
    assert len(calls.pop()) == 4

    def advantages(last):  # GAE over a random buffer whose last step ended every episode
        buffer = RolloutBuffer(5, gym_spaces.Box(-1, 1, (1,)), gym_spaces.Discrete(2), n_envs=4, gamma=0.9)
        rng = np.random.default_rng(0)
        for _ in range(5):
            value, log_prob = th.as_tensor(rng.normal(size=4)), th.as_tensor(rng.normal(size=4))
            buffer.add(rng.normal(size=(4, 1)), rng.integers(2, size=(4, 1)), rng.normal(size=4),
                       rng.random(4) < 0.3, value, log_prob)  # fmt: skip
        buffer.compute_returns_and_advantage(last_values=last, dones=np.ones(4, dtype=bool))
        return buffer.advantages, buffer.returns

    for ours, sb3 in zip(advantages(th.zeros(4, 1)), advantages(th.randn(4, 1))):
        np.testing.assert_array_equal(ours, sb3)
