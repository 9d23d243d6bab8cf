"""GRPO against stock SB3 PPO and against hand-computed references (short seeded runs)."""

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import RolloutLog, params, quiet
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import IdentityEnv, SimpleMultiObsEnv
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_grpo import GRPO
from sb3_grpo.common.buffers import GRPODictRolloutBuffer, GRPORolloutBuffer
from sb3_grpo.grpo.extras import EXTRAS_OFF
from sb3_grpo.objectives import group_advantages, kl_k3, rloo_advantages

OFF = EXTRAS_OFF.switches()
SMALL = {"n_steps": 128, "batch_size": 32, "n_epochs": 2, "device": "cpu"}


def _same_params(a, b):
    return all(th.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("CartPole-v1", {}),
        ("Pendulum-v1", {}),
        # PPO's other branches: value clipping, a clip schedule, early stopping on approx_kl, 2 envs
        ("CartPole-v1", {"clip_range_vf": 0.2, "clip_range": lambda p: 0.1 + 0.1 * p, "target_kl": 0.002}),
    ],
    ids=["cartpole", "pendulum", "cartpole-vfclip-schedule-targetkl"],
)
def test_extras_off_equals_stock_ppo(env_id, kwargs):
    hp = {"n_steps": 256, "batch_size": 64, "n_epochs": 3, "seed": 7, "device": "cpu", **kwargs}
    ppo = quiet(PPO("MlpPolicy", env_id, **hp)).learn(512)
    grpo = quiet(GRPO("MlpPolicy", env_id, **hp, **OFF)).learn(512)
    assert _same_params(params(ppo), params(grpo))
    assert grpo._n_updates == ppo._n_updates


def test_extras_off_equals_stock_ppo_dict_observations():
    def make_env():
        np.random.seed(0)  # the env draws its observation table from numpy's global RNG at creation
        return SimpleMultiObsEnv(random_start=True)

    hp = {"n_steps": 64, "batch_size": 32, "n_epochs": 2, "seed": 5, "device": "cpu"}
    ppo = quiet(PPO("MultiInputPolicy", make_env(), **hp)).learn(128)
    grpo = quiet(GRPO("MultiInputPolicy", make_env(), **hp, **OFF)).learn(128)
    assert _same_params(params(ppo), params(grpo))


@pytest.mark.parametrize(
    "extra",
    [{"adaptive_clip": (1.0, 0.01)}, {"grad_var_coef": 1.0}, {"explore_alpha": 0.5}, {"kl_coef": 1.0}],
    ids=["adaptive_clip", "grad_var", "explore", "kl"],
)
def test_each_extra_changes_the_update(extra):
    """The equivalence test can fail: switching any one mechanism on moves the parameters elsewhere."""
    hp = {**SMALL, "seed": 3}
    ppo = quiet(PPO("MlpPolicy", "CartPole-v1", **hp)).learn(256)
    grpo = quiet(GRPO("MlpPolicy", "CartPole-v1", **hp, **{**OFF, **extra})).learn(256)
    assert not _same_params(params(ppo), params(grpo))


# ------------------------------------------------------------------------------------------ logging
def test_defaults_log_every_quantity():
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", seed=0, kl_coef=0.1, clip_range=lambda p: 0.1 + 0.2 * p, **SMALL))
    model.learn(256)
    logged = model.logger.name_to_value
    ppo_keys = [
        "train/entropy_loss", "train/policy_gradient_loss", "train/value_loss", "train/approx_kl",
        "train/clip_fraction", "train/loss", "train/explained_variance", "train/n_updates", "train/clip_range",
    ]  # fmt: skip
    for key in ppo_keys:
        assert key in logged, key
    # last update at progress_remaining 0: eps = 0.1, scaled by the default (1.1, 0.9)
    assert logged["train/clip_range"] == pytest.approx(0.1)
    assert logged["train/clip_range_pos"] == pytest.approx(0.11)
    assert logged["train/clip_range_neg"] == pytest.approx(0.09)
    # alpha decays from 0.05 to 0 over the first half: the 2nd rollout starts at progress 0.5
    assert logged["train/explore_alpha"] == 0.0
    assert logged["train/grad_var"] > 0
    assert logged["train/kl_ref"] >= 0 and logged["train/kl_coef"] == pytest.approx(0.1)
    assert logged["train/grad_norm"] > 0
    assert -1 <= logged["train/value_return_corr"] <= 1
    for key in ("train/clip_fraction_pos", "train/clip_fraction_neg"):
        assert 0 <= logged[key] <= 1


def test_explore_alpha_schedule():
    model = GRPO("MlpPolicy", "CartPole-v1", explore_alpha=0.4, explore_fraction=0.5, **SMALL)
    for remaining, alpha in [(1.0, 0.4), (0.75, 0.2), (0.5, 0.0), (0.1, 0.0)]:
        model._current_progress_remaining = remaining
        assert model.current_explore_alpha() == pytest.approx(alpha)


def test_grad_norm_warning():
    model = quiet(GRPO("MlpPolicy", "Pendulum-v1", seed=0, grad_norm_warn=1e-3, **SMALL))
    with pytest.warns(UserWarning, match="grad_norm_warn"):
        model.learn(128)


# ------------------------------------------------------------------------------ mixed exploration
def _collect_one_rollout(model):
    _, callback = model._setup_learn(model.n_steps * model.n_envs, None)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model.rollout_buffer


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_stored_log_prob_is_the_mixture_density(env_id):
    alpha = 0.5
    model = quiet(GRPO("MlpPolicy", env_id, seed=1, explore_alpha=alpha, **SMALL))
    buf = _collect_one_rollout(model)
    obs = th.as_tensor(buf.observations.reshape(-1, *model.observation_space.shape))
    actions = th.as_tensor(buf.actions.reshape(len(obs), -1))
    space = model.action_space
    with th.no_grad():
        if isinstance(space, spaces.Discrete):
            _, log_pi, _ = model.policy.evaluate_actions(obs, actions.long().flatten())
            uniform = th.full_like(log_pi, 1.0 / space.n)
        else:
            _, log_pi, _ = model.policy.evaluate_actions(obs, actions)
            inside = ((actions >= th.as_tensor(space.low)) & (actions <= th.as_tensor(space.high))).all(1)
            uniform = inside.float() / float(np.prod(space.high - space.low))
    expected = th.log((1 - alpha) * log_pi.double().exp() + alpha * uniform.double())
    np.testing.assert_allclose(buf.log_probs.reshape(-1), expected.numpy(), rtol=1e-4, atol=1e-5)
    # beside it, the policy's own log-prob of every action, explored or not (the KL's importance weights)
    np.testing.assert_allclose(buf.policy_log_probs.reshape(-1), log_pi.numpy(), rtol=1e-4, atol=1e-5)
    if isinstance(space, spaces.Box):
        # about alpha of the actions come from the uniform: inside the box, never clipped by the env
        assert inside.float().mean() > 0.4


# ------------------------------------------------------------------- KL to the reference under exploration
def _bandit_with_known_kl(explore_alpha: float, n_actions: int = 20, n_envs: int = 8, n_steps: int = 256):
    """
    GRPO on SB3's ``IdentityEnv`` whose policy and reference ignore the observation: a peaked ``pi`` and a
    flatter ``ref`` (fixed logits in ``action_net``'s bias), so ``KL(pi || ref)`` is known exactly; with
    ``learning_rate=0`` the update leaves ``pi`` where it is. One rollout, one minibatch, one epoch.
    """
    gen = th.Generator().manual_seed(2)
    pi = th.softmax(4 * th.randn(n_actions, generator=gen, dtype=th.float64), 0)
    ref = th.softmax(th.randn(n_actions, generator=gen, dtype=th.float64), 0)
    env = DummyVecEnv([lambda: IdentityEnv(n_actions, ep_length=n_steps)] * n_envs)
    kl = (pi * (pi.log() - ref.log())).sum().item()
    model = quiet(
        GRPO(
            "MlpPolicy", env, n_steps=n_steps, batch_size=n_steps * n_envs, n_epochs=1, learning_rate=0.0, seed=0,
            device="cpu", **{**OFF, "explore_alpha": explore_alpha, "explore_fraction": 1.0, "kl_coef": 0.1},
            kl_target=kl,
        )
    )  # fmt: skip
    with th.no_grad():
        for policy, probs in ((model.policy, pi), (model.ref_policy, ref)):
            policy.action_net.weight.zero_()
            policy.action_net.bias.copy_(probs.log().float())
    return model, pi, ref, kl


def test_kl_to_reference_under_exploration_is_the_policys_kl():
    """With alpha = 0.3 the rollout's actions come from the mixture; the logged KL, the KL in the loss and the
    controller's input are the importance-weighted k3 mean, close to the exact KL(pi || ref), while the plain
    k3 mean over the same actions is orders of magnitude off."""
    model, pi, ref, kl = _bandit_with_known_kl(explore_alpha=0.3)
    model.learn(model.n_steps * model.n_envs)
    logged = model.logger.name_to_value
    assert logged["train/explore_alpha"] == pytest.approx(0.3)
    # 2048 actions, about 2.3 standard deviation per weighted sample here: 0.1 * KL is about 4 standard errors
    assert logged["train/kl_ref"] == pytest.approx(kl, rel=0.1)
    actions = th.as_tensor(model.rollout_buffer.actions).long().flatten()
    unweighted = kl_k3(pi.log()[actions], ref.log()[actions]).mean().item()
    assert unweighted > 100 * kl, "the rollout should hold uniformly explored actions"
    # the loss holds kl_coef (0.1 during the update) times the logged estimate (one minibatch, ent_coef = 0)
    pg_and_vf = logged["train/policy_gradient_loss"] + model.vf_coef * logged["train/value_loss"]
    assert logged["train/loss"] == pytest.approx(pg_and_vf + 0.1 * logged["train/kl_ref"], rel=1e-5)
    # and the controller moved kl_coef by its (unclipped) error on the same estimate
    assert model.kl_coef == pytest.approx(0.1 * (1 + 0.1 * (logged["train/kl_ref"] / kl - 1)), rel=1e-9)


def test_kl_to_reference_without_exploration_is_unchanged():
    """alpha = 0: every weight is exactly 1, the estimate is the plain k3 mean of the policy's own samples."""
    model, pi, ref, _ = _bandit_with_known_kl(explore_alpha=0.0)
    model.learn(model.n_steps * model.n_envs)
    buf = model.rollout_buffer
    assert np.array_equal(buf.policy_log_probs, buf.log_probs)
    actions = th.as_tensor(buf.actions).long().flatten()
    plain = kl_k3(pi.log()[actions].float(), ref.log()[actions].float()).mean().item()
    assert model.logger.name_to_value["train/kl_ref"] == pytest.approx(plain, rel=1e-5)


def test_grpo_builds_its_buffers_in_place_of_sb3s():
    assert type(GRPO("MlpPolicy", "CartPole-v1", n_steps=64).rollout_buffer) is GRPORolloutBuffer
    stock = GRPO("MlpPolicy", "CartPole-v1", n_steps=64, rollout_buffer_class=RolloutBuffer)
    assert type(stock.rollout_buffer) is GRPORolloutBuffer
    multi = GRPO("MultiInputPolicy", SimpleMultiObsEnv(), n_steps=64, rollout_buffer_class=DictRolloutBuffer)
    assert type(multi.rollout_buffer) is GRPODictRolloutBuffer


def test_weighted_kl_needs_a_buffer_with_the_policys_log_probs():
    class PlainBuffer(RolloutBuffer):
        pass

    with pytest.raises(ValueError, match="PlainBuffer does not.*rollout_buffer_class=None"):
        GRPO("MlpPolicy", "CartPole-v1", n_steps=64, rollout_buffer_class=PlainBuffer, explore_alpha=0.1, kl_coef=0.1)
    GRPO("MlpPolicy", "CartPole-v1", n_steps=64, rollout_buffer_class=PlainBuffer, explore_alpha=0.0, kl_coef=0.1)
    # a stock buffer put in by hand after an explored rollout: a clear error, not a silently biased KL
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", seed=0, explore_alpha=0.3, kl_coef=0.1, **SMALL))
    buf = _collect_one_rollout(model)
    stock = RolloutBuffer(buf.buffer_size, model.observation_space, model.action_space, "cpu", n_envs=buf.n_envs)
    stock.__dict__.update({k: v for k, v in buf.__dict__.items() if k != "policy_log_probs"})
    model.rollout_buffer = stock
    with pytest.raises(RuntimeError, match="does not store the policy's own log-probs"):
        model.train()


def test_save_load_with_exploration_and_kl(tmp_path):
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", seed=0, explore_alpha=0.3, kl_coef=0.1, **SMALL)).learn(128)
    model.rollout_buffer_class = RolloutBuffer  # as a model saved before GRPO had its own buffers
    model.save(tmp_path / "grpo")
    loaded = quiet(GRPO.load(tmp_path / "grpo", env=model.env, device="cpu"))
    assert type(loaded.rollout_buffer) is GRPORolloutBuffer
    loaded.learn(128, reset_num_timesteps=False)
    assert np.isfinite(loaded.logger.name_to_value["train/kl_ref"])


def test_pendulum_trains_with_exploration_on_a_box_action_space():
    """Mixed exploration on a bounded Box: the stored behaviour log-density is the mixture's (not the policy's), the
    update trains on it and moves the weights, and everything stays finite."""
    model = quiet(GRPO("MlpPolicy", "Pendulum-v1", seed=0, explore_alpha=0.2, explore_fraction=1.0, **SMALL))
    before = params(model)
    model.learn(512)
    assert model.logger.name_to_value["train/explore_alpha"] > 0
    buf = model.rollout_buffer
    mixture, own = buf.log_probs.reshape(-1), buf.policy_log_probs.reshape(-1)
    assert np.all(mixture >= own + np.log(1 - model._rollout_explore_alpha) - 1e-5)  # mu >= (1 - alpha) pi
    assert np.mean(np.abs(mixture - own) > 1e-4) > 0.5  # the mixture, not the policy alone, was stored
    assert not _same_params(before, params(model))
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


# ------------------------------------------------------------------------------- grouped toy env
class ToyGroupEnv(gym.Env):
    """
    Episodes of ``LENGTH`` steps; the observation is the one-hot prompt (``N_PROMPTS`` of them), the reward,
    paid at the last step, is the number of actions equal to the prompt's target bit. The ``G`` consecutive
    envs of a group share the prompt of each round and report ``group_id = round * n_groups + index // G``
    (the textrl_envs convention).
    """

    LENGTH = 3
    N_PROMPTS = 4

    def __init__(self, index: int, n_envs: int, group_size: int):
        self.index, self.n_groups, self.group_size = index, n_envs // group_size, group_size
        self.observation_space = spaces.Box(0.0, 1.0, (self.N_PROMPTS,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.round = -1

    def _group_id(self):
        return self.round * self.n_groups + self.index // self.group_size

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.round += 1
        self.t, self.correct = 0, 0
        self.prompt = (self._group_id() * 7919) % self.N_PROMPTS
        obs = np.zeros(self.N_PROMPTS, np.float32)
        obs[self.prompt] = 1.0
        self.obs = obs
        return obs, {}

    def step(self, action):
        self.correct += int(action) == self.prompt % 2
        self.t += 1
        done = self.t == self.LENGTH
        info = {"group_id": self._group_id(), "episode_id": self.round * 1000 + self.index}
        return self.obs, float(self.correct) if done else 0.0, done, False, info


def make_group_env(n_envs=8, group_size=4):
    return DummyVecEnv([lambda i=i: ToyGroupEnv(i, n_envs, group_size) for i in range(n_envs)])


def _episodes(buf, infos_group):
    """(env, start, end, return, group_id) of the episodes that finished in the buffer, from its rewards."""
    n_steps, n_envs = buf.rewards.shape
    out = []
    for env in range(n_envs):
        start = 0
        for t in range(n_steps):
            if (t + 1) % ToyGroupEnv.LENGTH == 0:
                out.append((env, start, t, float(buf.rewards[start : t + 1, env].sum()), infos_group[t, env]))
                start = t + 1
    return out


@pytest.mark.parametrize("advantage, reference", [("group", group_advantages), ("rloo", rloo_advantages)])
def test_group_advantages_in_buffer_match_reference(advantage, reference):
    model = quiet(GRPO("MlpPolicy", make_group_env(), advantage=advantage, seed=0, **{**SMALL, "n_steps": 10}))
    buf = _collect_one_rollout(model)
    n_envs = 8
    group_of = np.array([[(t // 3) * 2 + env // 4 for env in range(n_envs)] for t in range(10)])
    episodes = _episodes(buf, group_of)
    returns = th.tensor([e[3] for e in episodes])
    groups = th.tensor([e[4] for e in episodes])
    expected, _ = reference(returns, groups)
    for (env, start, end, _, _), adv in zip(episodes, expected):
        np.testing.assert_allclose(buf.advantages[start : end + 1, env], adv.item(), rtol=1e-5)
    # step 9 starts a 4th episode that is not finished: advantage 0
    assert np.all(buf.advantages[9] == 0)
    # the straddling episode (steps 9..11) gets its advantage in the next rollout, steps 0..1
    buf = _collect_one_rollout(model)
    assert np.any(buf.advantages[0:2] != 0)


def test_self_critical_greedy_members_and_baseline():
    model = quiet(GRPO("MlpPolicy", make_group_env(), advantage="self_critical", seed=0, **{**SMALL, "n_steps": 9}))
    buf = _collect_one_rollout(model)
    obs = th.as_tensor(buf.observations[:, [0, 4]].reshape(-1, 4))
    greedy, _ = model.policy.predict(obs.numpy(), deterministic=True)
    np.testing.assert_array_equal(buf.actions[:, [0, 4]].reshape(-1), greedy)
    assert np.all(buf.advantages[:, [0, 4]] == 0)
    for start in (0, 3, 6):
        for env in (1, 2, 3, 5, 6, 7):
            baseline_env = 0 if env < 4 else 4
            end = start + 3
            expected = buf.rewards[start:end, env].sum() - buf.rewards[start:end, baseline_env].sum()
            np.testing.assert_allclose(buf.advantages[start:end, env], expected, rtol=1e-6)


def test_group_advantage_learns_toy_task():
    env = make_group_env()
    model = quiet(
        GRPO("MlpPolicy", env, advantage="group", seed=0, n_steps=24, batch_size=48, n_epochs=4,
             learning_rate=3e-3, grad_var_coef=0.0, device="cpu")
    )  # fmt: skip

    def mean_reward():
        obs = np.eye(4, dtype=np.float32)
        actions, _ = model.predict(obs, deterministic=False)
        return float(np.mean(actions == np.arange(4) % 2))

    before = np.mean([mean_reward() for _ in range(50)])
    log = RolloutLog()
    model.learn(24 * 8 * 12, callback=log)
    after = np.mean([mean_reward() for _ in range(50)])
    assert after > 0.9 > before + 0.2
    assert log.values and all(v["rollout/n_complete_groups"] > 0 for v in log.values)
    assert all(math.isfinite(v["rollout/group_reward_mean"]) for v in log.values)
    assert "train/value_loss" not in model.logger.name_to_value  # no critic


# ---------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"advantage": "grpo"},
            r"advantage must be one of \('gae', 'group', 'group_mean', 'rloo', 'self_critical', 'group_turn', "
            r"'role'\), got 'grpo'",
        ),
        ({"grad_var_coef": -0.1}, "grad_var_coef must be a finite number >= 0"),
        ({"kl_coef": -1.0}, "kl_coef must be a finite number >= 0"),
        ({"explore_alpha": -0.1}, r"explore_alpha must be a finite number in \[0, 1\]"),
        ({"explore_alpha": 1.5}, r"explore_alpha must be a finite number in \[0, 1\]"),
        ({"explore_fraction": 0.0}, "explore_fraction"),
        ({"adaptive_clip": (1.1, 0.0)}, "pair of positive scales"),
        ({"adaptive_clip": (1.1,)}, "pair of positive scales"),
        ({"grad_var_slices": 1}, "grad_var_slices must be an int >= 2"),
        ({"grad_var_params": ["nonexistent"]}, "matches no trainable parameter"),
        ({"kl_target": 0.01}, "starting kl_coef > 0"),
        ({"advantage": "group"}, r"needs an env with group_size > 1, e\.g\. textrl_envs\.sb3\.make_vec_env"),
        ({"advantage": "rloo"}, "group_size > 1"),
    ],
)
def test_bad_input_raises_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRPO("MlpPolicy", "CartPole-v1", n_steps=64, **kwargs)


class NanReward(gym.Wrapper):
    def step(self, action):
        obs, _reward, terminated, truncated, info = self.env.step(action)
        return obs, math.nan, terminated, truncated, info


def test_non_finite_advantages_raise_before_any_update():
    env = make_vec_env(lambda: NanReward(gym.make("CartPole-v1")), n_envs=1)
    model = quiet(GRPO("MlpPolicy", env, seed=0, **SMALL))
    before = params(model)
    with pytest.raises(RuntimeError, match="non-finite advantages"):
        model.learn(256)
    assert _same_params(before, params(model))


def test_non_finite_loss_raises_before_the_optimizer_step():
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", seed=0, kl_coef=0.1, **SMALL))
    model.batch_source.reference_log_prob = lambda batch: th.full((len(batch.actions),), math.nan)
    before = params(model)
    with pytest.raises(RuntimeError, match=r"non-finite loss at update 0 .*kl_ref=nan"):
        model.learn(256)
    assert _same_params(before, params(model))


# ------------------------------------------------------------------------------ drop-in behaviour
def test_dict_observations_with_grad_var():
    model = quiet(GRPO("MultiInputPolicy", SimpleMultiObsEnv(random_start=False), seed=0, **{**SMALL, "n_steps": 64}))
    model.learn(64)
    assert model.logger.name_to_value["train/grad_var"] > 0


def test_grad_var_on_named_parameter_subset():
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", seed=0, grad_var_params=["action_net"], **SMALL))
    assert len(model._grad_var.params) == 2  # weight and bias
    model.learn(128)
    assert model.logger.name_to_value["train/grad_var"] > 0


def test_save_load_keeps_reference_policy(tmp_path):
    model = quiet(GRPO("MlpPolicy", "CartPole-v1", seed=0, kl_coef=0.1, **SMALL)).learn(128)
    model.save(tmp_path / "grpo")
    loaded = GRPO.load(tmp_path / "grpo", device="cpu")
    for a, b in zip(model.ref_policy.parameters(), loaded.ref_policy.parameters()):
        assert th.equal(a, b)
    assert not _same_params(params(model), {k: v for k, v in model.ref_policy.state_dict().items()})
    obs = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    assert loaded.kl_coef == 0.1 and loaded.adaptive_clip == (1.1, 0.9)


def test_causal_lm_policy_alias_is_lazy():
    """An MLP GRPO never imports transformers (a fresh interpreter tells); the name "CausalLMPolicy" still resolves."""
    import subprocess
    import sys

    code = (
        "import sys; from sb3_grpo import GRPO; "
        "model = GRPO('MlpPolicy', 'CartPole-v1', n_steps=64, device='cpu'); "
        "assert model.policy_class is GRPO.policy_aliases['MlpPolicy']; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'peft', 'tokenizers')); "
        "assert not heavy, heavy; "
        "from sb3_grpo.policies import CausalLMPolicy; "
        "assert model._get_policy_from_name('CausalLMPolicy') is CausalLMPolicy; "
        "assert 'CausalLMPolicy' not in GRPO.policy_aliases; print('lazy')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "lazy", done.stderr[-2000:]


def test_exploration_that_would_clip_every_positive_advantage_warns():
    # eps_pos = 0.2 * 1.1 = 0.22: the first-epoch ratio 1 / (1 - alpha) passes 1.22 above alpha = 0.22 / 1.22 = 0.18
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPO("MlpPolicy", "CartPole-v1", explore_alpha=0.17, device="cpu")
        GRPO("MlpPolicy", "CartPole-v1", explore_alpha=0.3, clip_range=0.5, device="cpu")
    with pytest.warns(UserWarning, match=r"explore_alpha=0.19 .* 1 / \(1 - alpha\) = 1.23.*explore_alpha <= 0.18"):
        GRPO("MlpPolicy", "CartPole-v1", explore_alpha=0.19, device="cpu")
    with pytest.warns(UserWarning, match="positive advantage would get no gradient"):
        GRPO("MlpPolicy", "CartPole-v1", explore_alpha=0.19, adaptive_clip=None, clip_range=lambda _: 0.2, device="cpu")


def test_every_extra_off_is_defined_once_and_covers_every_own_argument():
    """``EXTRAS_OFF`` is the one definition of "every extra off"; every argument GRPO takes beyond PPO's is a field of
    ``GRPOExtras`` (so a new mechanism cannot be missed by ``computes_as_ppo``) or one that changes no number."""
    import inspect

    from stable_baselines3 import PPO

    from sb3_grpo.grpo.extras import GRPOExtras

    assert EXTRAS_OFF.switches() == {
        "grad_var_coef": 0.0,
        "adaptive_clip": None,
        "explore_alpha": 0.0,
        "advantage": "gae",
        "kl_coef": 0.0,
        "engine": "step",
        "reward_redistribution": None,
    }
    own = set(inspect.signature(GRPO.__init__).parameters) - set(inspect.signature(PPO.__init__).parameters)
    # a warning threshold, an error policy, and how the same update is laid out (micro-batches, sharding)
    assert own - set(GRPOExtras.names()) == {"grad_norm_warn", "nonfinite", "micro_batch_size", "data_parallel"}
    assert EXTRAS_OFF.computes_as_ppo and not GRPOExtras().computes_as_ppo
    # a field its switch leaves unused does not matter; any switch on does
    assert GRPOExtras(**{**EXTRAS_OFF.kwargs(), "grad_var_slices": 8, "explore_fraction": 0.1}).computes_as_ppo
    for name, value in [("grad_var_coef", 0.01), ("adaptive_clip", (1.1, 0.9)), ("explore_alpha", 0.05)]:
        assert not GRPOExtras(**{**EXTRAS_OFF.kwargs(), name: value}).computes_as_ppo, name
    assert not GRPOExtras(**{**EXTRAS_OFF.kwargs(), "advantage": "group", "carry_over": True}).computes_as_ppo
    assert not GRPOExtras(**{**EXTRAS_OFF.kwargs(), "engine": "hf"}).computes_as_ppo
    assert not GRPOExtras(**{**EXTRAS_OFF.kwargs(), "reward_redistribution": "uniform"}).computes_as_ppo
    model = GRPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, device="cpu", **EXTRAS_OFF.switches())
    assert model.extras == EXTRAS_OFF and model._computes_as_ppo()
    assert not GRPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, device="cpu")._computes_as_ppo()


def test_critic_free_runs_log_no_explained_variance():
    """A group advantage trains no value head: its explained variance (once -19.4 on a run) is not logged."""
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=2, group_size=2, seed=0, device="cpu", max_new_tokens=3)
    model = quiet(GRPO("CausalLMPolicy", env, advantage="group", n_steps=4, batch_size=8, n_epochs=1, seed=0))
    model.learn(8)
    assert "train/policy_gradient_loss" in model.logger.name_to_value
    assert "train/explained_variance" not in model.logger.name_to_value
