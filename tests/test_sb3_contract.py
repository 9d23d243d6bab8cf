"""SB3's public contract for PPO, held by GRPO used under PPO's name (as a user porting code would write it):
learn / predict / save / load round trips, ``get_parameters`` / ``set_parameters``, ``load(env=None)`` then
``set_env``, ``reset_num_timesteps=False``, a callback that returns False, ``progress_bar``, ``tb_log_name``, SB3's
``AssertionError`` for a negative ``clip_range_vf``, and ``learn``'s arguments checked (which SB3 leaves unchecked)."""

from __future__ import annotations

import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.env_util import make_vec_env

from sb3_grpo import GRPO as PPO  # noqa: N814  (the point: a PPO script, GRPO under PPO's name)

SMALL = {"n_steps": 32, "batch_size": 32, "n_epochs": 1, "seed": 0, "device": "cpu"}


def _obs(env_id: str = "CartPole-v1", n: int = 5) -> np.ndarray:
    env = gym.make(env_id)
    return np.stack([env.reset(seed=i)[0] for i in range(n)])


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_save_load_round_trip_predicts_the_same(tmp_path, env_id):
    model = PPO("MlpPolicy", env_id, **SMALL).learn(64)
    obs = _obs(env_id)
    before, _ = model.predict(obs, deterministic=True)
    params = model.get_parameters()
    model.save(tmp_path / "model")  # SB3 appends .zip
    loaded = PPO.load(tmp_path / "model", device="cpu")
    after, _ = loaded.predict(obs, deterministic=True)
    np.testing.assert_array_equal(before, after)
    for name, state in loaded.get_parameters()["policy"].items():
        th.testing.assert_close(state, params["policy"][name])
    assert loaded.num_timesteps == model.num_timesteps == 64
    assert type(loaded) is PPO and loaded.n_steps == SMALL["n_steps"]


def test_set_parameters_from_a_dict_and_from_a_file(tmp_path):
    trained = PPO("MlpPolicy", "CartPole-v1", **SMALL).learn(64)
    fresh = PPO("MlpPolicy", "CartPole-v1", **{**SMALL, "seed": 1})
    obs = _obs()
    fresh.set_parameters(trained.get_parameters())
    np.testing.assert_array_equal(
        fresh.predict(obs, deterministic=True)[0], trained.predict(obs, deterministic=True)[0]
    )
    trained.save(tmp_path / "m.zip")
    other = PPO("MlpPolicy", "CartPole-v1", **{**SMALL, "seed": 2})
    other.set_parameters(str(tmp_path / "m.zip"))
    np.testing.assert_array_equal(
        other.predict(obs, deterministic=True)[0], trained.predict(obs, deterministic=True)[0]
    )


def test_load_without_env_then_set_env_and_continue(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", **SMALL).learn(64)
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", device="cpu")
    assert loaded.get_env() is None
    loaded.predict(_obs(), deterministic=True)  # predicting needs no env
    loaded.set_env(make_vec_env("CartPole-v1", n_envs=1, seed=0))
    loaded.learn(64, reset_num_timesteps=False)
    assert loaded.num_timesteps == 128


def test_reset_num_timesteps_false_continues_the_count():
    model = PPO("MlpPolicy", "CartPole-v1", **SMALL)
    model.learn(64)
    model.learn(64, reset_num_timesteps=False)
    assert model.num_timesteps == 128
    model.learn(32, reset_num_timesteps=True)
    assert model.num_timesteps == 32
    model.learn(1e2 - 68, reset_num_timesteps=True)  # an integral float, as SB3 users write 1e5
    assert model.num_timesteps == 32


class _StopAfter(BaseCallback):
    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps

    def _on_step(self) -> bool:
        return self.num_timesteps < self.steps


def test_a_callback_that_returns_false_stops_training():
    model = PPO("MlpPolicy", "CartPole-v1", **SMALL)
    model.learn(10_000, callback=CallbackList([_StopAfter(5)]))
    assert model.num_timesteps == 5
    calls = []

    def function_callback(local, _globals):  # SB3 also takes a plain function of (locals, globals)
        calls.append(local["self"].num_timesteps)
        return len(calls) < 3

    model.learn(10_000, callback=function_callback)
    assert calls == [1, 2, 3] and model.num_timesteps == 3


def test_progress_bar_and_tb_log_name(tmp_path):
    pytest.importorskip("tqdm")
    pytest.importorskip("rich")
    model = PPO("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path), **SMALL)
    model.learn(64, progress_bar=True, tb_log_name="my_run")
    model.learn(64, tb_log_name="my_run")
    assert sorted(os.listdir(tmp_path)) == ["my_run_1", "my_run_2"]
    model.learn(32)
    assert "GRPO_1" in os.listdir(tmp_path)  # the default name is the class's, as PPO's is "PPO"


def test_sb3s_assertion_for_a_negative_clip_range_vf_is_kept():
    with pytest.raises(AssertionError, match="clip_range_vf"):
        PPO("MlpPolicy", "CartPole-v1", clip_range_vf=-0.2, **SMALL)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"total_timesteps": math.nan}, ValueError, r"total_timesteps must be a finite number >= 0, got nan"),
        ({"total_timesteps": -5}, ValueError, r"total_timesteps must be an int >= 0, got -5"),
        ({"total_timesteps": 10.5}, ValueError, r"total_timesteps must be a whole number"),
        ({"total_timesteps": "100"}, TypeError, r"total_timesteps must be an int"),
        ({"total_timesteps": 64, "log_interval": 0}, ValueError, r"log_interval must be an int >= 1, got 0"),
        ({"total_timesteps": 64, "callback": "checkpoint"}, TypeError, r"callback must be None, an SB3 BaseCallback"),
        ({"total_timesteps": 64, "tb_log_name": 3}, TypeError, r"tb_log_name must be a str or None"),
    ],
)
def test_learn_checks_its_arguments(kwargs, error, message):
    model = PPO("MlpPolicy", "CartPole-v1", **SMALL)
    with pytest.raises(error, match=message):
        model.learn(**kwargs)
    assert model.num_timesteps == 0


def test_stock_ppo_loads_a_saved_grpo_text_model_and_trains(tmp_path):
    from stable_baselines3 import PPO as StockPPO

    env = gym.make("TextGen-v0")
    model = PPO("CausalLMPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.save(tmp_path / "text.zip")
    stock = StockPPO.load(tmp_path / "text.zip", env=env, device="cpu")
    stock.learn(32)
    assert stock.num_timesteps == 32
    again = PPO.load(tmp_path / "text.zip", env=env, device="cpu")
    assert again.rollout_buffer_class is model.rollout_buffer_class  # GRPO picks its sequence buffer again


@pytest.mark.skipif(th.cuda.is_available(), reason="this machine has CUDA, so device='cuda' does not fall back")
def test_device_cuda_without_cuda_falls_back_to_the_cpu_as_sb3_does():
    from stable_baselines3 import PPO as StockPPO

    stock = StockPPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, device="cuda")
    with pytest.warns(UserWarning, match=r"device='cuda': CUDA is not available here, running on the CPU"):
        ours = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, device="cuda")
    assert ours.device == stock.device == th.device("cpu")
    assert next(ours.policy.parameters()).device.type == "cpu"


@pytest.mark.parametrize("net_arch", [[{"vf": [8]}], [{"vf": [8], "pi": [4]}]])
def test_the_pre_1_8_net_arch_form_builds_as_in_sb3(net_arch):
    """SB3 still takes one dict in a list (the form from before shared layers were removed), with a warning."""
    from stable_baselines3 import PPO as StockPPO

    kwargs = {"policy_kwargs": {"net_arch": net_arch}, "n_steps": 64, "device": "cpu"}
    with pytest.warns(UserWarning, match="shared layers in the mlp_extractor are removed"):
        stock = StockPPO("MlpPolicy", "CartPole-v1", **kwargs)
    with pytest.warns(UserWarning, match="shared layers in the mlp_extractor are removed"):
        ours = PPO("MlpPolicy", "CartPole-v1", **kwargs).learn(128)
    shapes = [p.shape for p in stock.policy.parameters()]
    assert [p.shape for p in ours.policy.parameters()] == shapes


def test_a_net_arch_sb3_cannot_build_is_still_refused():
    with pytest.raises(TypeError, match=r"policy_kwargs\['net_arch'\] must be a list of layer sizes"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs={"net_arch": [{"vf": [8]}, {"pi": [4]}]})
