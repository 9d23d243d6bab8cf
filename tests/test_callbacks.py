"""sb3_grpo.callbacks: atomic checkpoints, early stopping, rollback, gamma schedule, max_new_tokens curriculum,
training monitor."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math
import re
import warnings
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import params, quiet
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

from sb3_grpo import GRPO
from sb3_grpo.callbacks import (
    AtomicCheckpointCallback,
    EarlyStoppingCallback,
    GammaSchedule,
    MaxNewTokensCurriculum,
    RollbackCallback,
    TrainingAlertWarning,
    TrainingMonitor,
    atomic_save,
    atomic_write,
    is_complete_checkpoint,
    latest_checkpoint,
    nonfinite_parameters,
)

SMALL = {"n_steps": 32, "batch_size": 32, "n_epochs": 1, "seed": 0, "device": "cpu"}


def _cartpole(**kw):
    return quiet(GRPO("MlpPolicy", "CartPole-v1", **{**SMALL, **kw}))


def _same(a, b):
    return a.keys() == b.keys() and all(th.equal(a[k], b[k]) for k in a)


class Probe(BaseCallback):
    """Records a function of the model at every rollout start."""

    def __init__(self, fn):
        super().__init__()
        self.fn, self.seen = fn, []

    def _on_rollout_start(self):
        self.seen.append(self.fn(self.model))

    def _on_step(self):
        return True


# ---------------------------------------------------------------------------------------------- atomic files
def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def broken(path):
        Path(path).write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, broken)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]  # no temp file left
    atomic_write(target, lambda path: Path(path).write_bytes(b"new"))
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_atomic_save_round_trips_and_refuses_nan_weights(tmp_path):
    model = _cartpole()
    path = atomic_save(model, tmp_path / "m")
    assert path == tmp_path / "m.zip" and is_complete_checkpoint(path)
    loaded = GRPO.load(path, device="cpu")
    assert _same(params(model), params(loaded))
    with th.no_grad():
        next(model.policy.parameters())[0] = math.nan
    assert nonfinite_parameters(model.policy)
    with pytest.raises(ValueError, match="non-finite values"):
        atomic_save(model, tmp_path / "bad.zip")
    assert not (tmp_path / "bad.zip").exists()


def test_checkpoints_are_complete_pruned_and_stale_temp_files_removed(tmp_path):
    stale = tmp_path / ".rl_model_64_steps.zip.999999999.tmp"  # a dead process's half-written file
    stale.write_bytes(b"PK\x03\x04 half")
    model = _cartpole()
    cb = AtomicCheckpointCallback(save_freq=32, save_path=tmp_path, keep_last=2)
    model.learn(160, callback=cb)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["rl_model_128_steps.zip", "rl_model_160_steps.zip"]
    assert latest_checkpoint(tmp_path) == tmp_path / "rl_model_160_steps.zip"
    assert cb.last_checkpoint == tmp_path / "rl_model_160_steps.zip"
    loaded = GRPO.load(cb.last_checkpoint, device="cpu")
    assert loaded.num_timesteps == 160


def test_latest_checkpoint_skips_truncated_and_foreign_files(tmp_path):
    model = _cartpole()
    good = atomic_save(model, tmp_path / "rl_model_100_steps.zip")
    data = good.read_bytes()
    (tmp_path / "rl_model_200_steps.zip").write_bytes(data[: len(data) // 2])  # a torn (non-atomic) write
    (tmp_path / "rl_model_300_steps.zip.tmp").write_bytes(data)
    (tmp_path / "other_400_steps.zip").write_bytes(data)
    assert not is_complete_checkpoint(tmp_path / "rl_model_200_steps.zip")
    assert latest_checkpoint(tmp_path) == good
    assert latest_checkpoint(tmp_path, max_steps=99) is None
    assert latest_checkpoint(tmp_path / "missing") is None


def test_checkpoint_saves_vecnormalize_stats_atomically(tmp_path):
    env = VecNormalize(sb3_make_vec_env("CartPole-v1", n_envs=1, seed=0))
    model = quiet(GRPO("MlpPolicy", env, **SMALL))
    model.learn(64, callback=AtomicCheckpointCallback(64, tmp_path, save_vecnormalize=True))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["rl_model_64_steps.zip", "rl_model_vecnormalize_64_steps.pkl"]
    stats = VecNormalize.load(str(tmp_path / names[1]), sb3_make_vec_env("CartPole-v1", n_envs=1))
    np.testing.assert_array_equal(stats.obs_rms.mean, env.obs_rms.mean)


def test_checkpoint_skips_nonfinite_weights_with_a_warning(tmp_path):
    model = _cartpole()
    cb = AtomicCheckpointCallback(save_freq=32, save_path=tmp_path)
    model.learn(32, callback=cb)
    assert cb.last_checkpoint is not None
    with th.no_grad():
        next(model.policy.parameters()).fill_(math.inf)
    with pytest.warns(TrainingAlertWarning, match="not saving a checkpoint"):
        assert cb.save_checkpoint() is None
    assert cb.n_skipped_nonfinite == 1
    assert [p.name for p in tmp_path.iterdir()] == ["rl_model_32_steps.zip"]


# ---------------------------------------------------------------------------------------------- early stopping
def test_early_stopping_after_patience_and_restores_best(tmp_path, monkeypatch):
    model = _cartpole()
    cb = EarlyStoppingCallback(gym.make("CartPole-v1"), patience=2, eval_freq=32, best_model_path=tmp_path / "best.zip")
    scores = iter([1.0, 3.0, 2.0, 3.0, 9.0, 9.0])
    best_params = {}

    def fake_eval():
        s = next(scores)
        cb.evaluations.append((cb.num_timesteps, s))
        if s == 3.0 and not best_params:
            best_params.update(params(cb.model))
        return s

    monkeypatch.setattr(cb, "_evaluate", fake_eval)
    model.learn(10_000, callback=cb)
    # evals at 32 (1), 64 (3: best), 96 (2), 128 (3: not better) -> stop after 2 without improvement
    assert cb.stopped_early and [s for _, s in cb.evaluations] == [1.0, 3.0, 2.0, 3.0]
    assert model.num_timesteps < 200
    assert cb.best_mean_reward == 3.0 and cb.best_timestep == 64
    assert _same(params(model), best_params)  # restored at training end
    assert _same(params(GRPO.load(tmp_path / "best.zip", device="cpu")), best_params)


def test_early_stopping_with_real_evaluations():
    model = _cartpole()
    eval_env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))  # the returns of every eval episode
    cb = EarlyStoppingCallback(eval_env, patience=1, eval_freq=32, n_eval_episodes=2, min_delta=1e9)
    model.learn(10_000, callback=cb)
    # nothing improves by 1e9 after the first evaluation: evals at 32 and 64, then stop
    assert cb.stopped_early and [t for t, _ in cb.evaluations] == [32, 64]
    returns = [float(r) for r in eval_env.return_queue]
    assert len(returns) == 4  # two episodes per evaluation, each scored by the callback as their mean
    assert [r for _, r in cb.evaluations] == [np.mean(returns[:2]), np.mean(returns[2:])]


# ---------------------------------------------------------------------------------------------- rollback
def test_rollback_on_reward_collapse(monkeypatch):
    model = _cartpole(learning_rate=1e-2)
    cb = RollbackCallback(gym.make("CartPole-v1"), eval_freq=32, threshold=2.0)
    scores = iter([5.0, 10.0, 1.0, 9.0, 9.5])
    snap = {}

    def fake_eval():
        s = next(scores)
        if s == 10.0:
            snap.update(params(cb.model))
        return s

    monkeypatch.setattr(cb, "_evaluate", fake_eval)
    after = Probe(params)
    with pytest.warns(TrainingAlertWarning, match="fell more than 2 below the best 10 .* rolled back"):
        model.learn(32 * 4, callback=[cb, after])  # rollout starts at 0, 32, 64, 96
    assert cb.n_rollbacks == 1 and cb.rollbacks[0][0] == 96 and "fell more than 2" in cb.rollbacks[0][1]
    assert _same(after.seen[-1], snap)  # the 4th rollout runs with the weights of the best evaluation


def test_rollback_on_nonfinite_weights_to_a_checkpoint(tmp_path):
    model = _cartpole()
    ckpt = AtomicCheckpointCallback(save_freq=32, save_path=tmp_path)
    poison = Probe(lambda m: None)
    rollback = RollbackCallback(checkpoint_dir=tmp_path, max_rollbacks=1)

    class Poison(BaseCallback):
        def _on_rollout_start(self):
            if self.num_timesteps == 64:  # as if the update after rollout 2 had landed non-finite weights
                with th.no_grad():
                    next(self.model.policy.parameters()).fill_(math.nan)

        def _on_step(self):
            return True

    class Check(BaseCallback):
        def _on_rollout_start(self):
            assert not nonfinite_parameters(self.model.policy)

        def _on_step(self):
            return True

    # the last state known good is the one checked at 32 timesteps: the newest checkpoint no later than that
    with pytest.warns(TrainingAlertWarning, match="rolled back to .*rl_model_32_steps.zip"):
        # the rollback runs before the checkpoint callback, so NaN weights are never saved either
        model.learn(32 * 4, callback=[Poison(), rollback, ckpt, Check(), poison])
    assert rollback.n_rollbacks == 1
    assert not nonfinite_parameters(model.policy)
    assert all(is_complete_checkpoint(p) for p in tmp_path.iterdir())


def test_rollback_stops_after_max_rollbacks():
    model = _cartpole()
    cb = RollbackCallback(max_rollbacks=1)

    class AlwaysNaN(BaseCallback):
        def _on_rollout_start(self):
            with th.no_grad():
                next(self.model.policy.parameters()).fill_(math.nan)

        def _on_step(self):
            return True

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(32 * 10, callback=[AlwaysNaN(), cb])
    assert cb.n_rollbacks == 1
    assert model.num_timesteps < 32 * 10  # stopped
    assert any("stopping training with the weights of" in str(w.message) for w in caught)
    assert not nonfinite_parameters(model.policy)


# ---------------------------------------------------------------------------------------------- gamma schedule
def test_gamma_schedule_follows_the_formula_and_reaches_the_buffer():
    model = _cartpole()
    probe = Probe(lambda m: (m.num_timesteps, m.gamma, m.rollout_buffer.gamma))
    model.learn(32 * 4, callback=[GammaSchedule(0.9, 0.99), probe])
    for t, gamma, buffer_gamma in probe.seen:
        assert gamma == pytest.approx(0.9 + 0.09 * t / 128) and buffer_gamma == gamma
    assert [t for t, _, _ in probe.seen] == [0, 32, 64, 96]


def test_gamma_schedule_changes_the_returns():
    """The buffer's returns use the scheduled gamma: gamma=0 makes returns the one-step reward + 0."""
    model = _cartpole(gae_lambda=1.0)
    model.learn(32, callback=GammaSchedule(0.0, 0.0))
    buffer = model.rollout_buffer
    np.testing.assert_allclose(buffer.returns, buffer.rewards, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------- curriculum
def test_max_new_tokens_curriculum_on_the_text_env():
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=6)
    width = env.observation_space["input_ids"].shape
    model = quiet(GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu"))
    lengths = []

    class Lengths(BaseCallback):
        def _on_step(self):
            for info in self.locals["infos"]:
                if "completion_ids" in info:
                    lengths.append((self.num_timesteps, len(info["completion_ids"])))
            return True

    cur = MaxNewTokensCurriculum([(0, 2), (32, 6)])
    model.learn(64, callback=[cur, Lengths()])
    assert env.observation_space["input_ids"].shape == width
    early = [n for t, n in lengths if t <= 32]
    assert early and max(early) <= 2
    assert max(n for t, n in lengths if t > 40) > 2
    assert env.get_attr("text_spec")[0].episode_budget is None  # full budget restored at the end
    assert cur.current is None


def test_curriculum_linear_schedule_and_bad_budgets():
    from textrl_envs.sb3 import make_vec_env

    f = MaxNewTokensCurriculum.linear(2, 10)
    assert [f(p) for p in (0.0, 0.5, 1.0)] == [2, 6, 10]
    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=4)
    with pytest.raises(ValueError, match=r"an int in \[1, 4\]"):
        env.env_method("set_max_new_tokens", 5)
    with pytest.raises(ValueError, match="timestep, max_new_tokens"):
        MaxNewTokensCurriculum("short")
    with pytest.raises(TypeError, match="set_max_new_tokens"):
        _cartpole().learn(32, callback=MaxNewTokensCurriculum([(0, 2)]))


# ---------------------------------------------------------------------------------------------- monitor
def test_training_monitor_warns_on_grad_norm_and_kl():
    model = _cartpole(kl_coef=0.1, learning_rate=1e-2)
    monitor = TrainingMonitor(max_grad_norm=1e-6, kl_target=1e-12, approx_kl_target=1e-12)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(32 * 3, callback=monitor)
    messages = [str(w.message) for w in caught if issubclass(w.category, TrainingAlertWarning)]
    assert any(re.search(r"train/grad_norm_max = .* exceeds 1e-06 at update 1", m) for m in messages)
    assert len(messages) == len(monitor.alerts)  # one warning per alert
    keys = {key for _, key, _, _ in monitor.alerts}
    assert keys == {"train/grad_norm_max", "train/kl_ref", "train/approx_kl"}
    assert {u for u, _, _, _ in monitor.alerts} == {1, 2, 3}  # once per update, the last at training end


def test_training_monitor_stop_on_alert_and_quiet_when_fine():
    model = _cartpole()
    monitor = TrainingMonitor(max_grad_norm=1e-6, stop_on_alert=True)
    with pytest.warns(TrainingAlertWarning):
        model.learn(32 * 10, callback=monitor)
    assert model.num_timesteps <= 32 * 2 + 1
    quiet = TrainingMonitor(max_grad_norm=1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingAlertWarning)
        PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0).learn(64, callback=quiet)
    assert quiet.alerts == []


def test_callbacks_validate_their_arguments(tmp_path):
    with pytest.raises(ValueError, match="save_freq must be an int >= 1"):
        AtomicCheckpointCallback(0, tmp_path)
    with pytest.raises(ValueError, match="patience must be an int >= 1"):
        EarlyStoppingCallback(gym.make("CartPole-v1"), patience=0, eval_freq=10)
    with pytest.raises(ValueError, match=r"gamma_max must be a discount factor in \[0, 1\]"):
        GammaSchedule(0.9, 1.5)
    with pytest.raises(ValueError, match="threshold must be a finite number > 0"):
        RollbackCallback(threshold=-1)
    with pytest.raises(ValueError, match="at least one of"):
        TrainingMonitor()
    assert not list(tmp_path.iterdir())


def test_checkpoint_zip_has_sb3_layout(tmp_path):
    path = atomic_save(_cartpole(), tmp_path / "m.zip")
    with zipfile.ZipFile(path) as z:
        assert {"data", "policy.pth", "policy.optimizer.pth"} <= set(z.namelist())
