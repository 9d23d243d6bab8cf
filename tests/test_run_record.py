"""A checkpoint folder records the run that owns it: a different run refuses it unless told to resume or overwrite."""

from __future__ import annotations

import pytest
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO, DrGRPO
from sb3_grpo.callbacks import AtomicCheckpointCallback, ElasticCheckpointCallback, latest_checkpoint


def _model(cls=GRPO, **kwargs):
    hp = {"n_steps": 32, "batch_size": 32, "n_epochs": 1, "seed": 0, "device": "cpu", **kwargs}
    model = cls("MlpPolicy", "CartPole-v1", **hp)
    model.set_logger(configure(None, []))
    return model


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_restart_of_the_same_run_resumes_and_another_run_is_refused(tmp_path):
    from sb3_grpo.common.checkpoints.run_record import config_hash, read_run_record, run_identity

    folder = tmp_path / "ckpt"
    _model().learn(96, callback=ElasticCheckpointCallback(1, folder))
    before = _files(folder)
    record = read_run_record(folder / "rl_model_64_steps.zip")
    assert record["config_hash"] == config_hash(run_identity(_model()))
    assert GRPO.load(folder / "rl_model_64_steps.zip").num_timesteps == 64  # SB3's load ignores the record
    # the same script again: its own folder, it resumes
    again = ElasticCheckpointCallback(1, folder)
    _model().learn(128, callback=again)
    assert again.resumed_from is not None and again.resumed_from.name == "rl_model_64_steps.zip"
    before = _files(folder)
    # another learning rate: another run, refused before anything is read or written
    other = _model(learning_rate=1e-3)
    with pytest.raises(ValueError, match=r"belongs to another run.*learning_rate=0.001 \(the folder's: 0.0003\)"):
        other.learn(128, callback=ElasticCheckpointCallback(1, folder))
    assert other.num_timesteps == 0 and _files(folder) == before
    assert read_run_record(latest_checkpoint(folder))["config_hash"] == record["config_hash"]


def test_told_to_resume_it_continues_and_told_to_overwrite_it_moves_the_old_run_aside(tmp_path):
    from sb3_grpo.common.checkpoints.run_record import config_hash, read_run_record, run_identity

    folder = tmp_path / "ckpt"
    _model().learn(96, callback=ElasticCheckpointCallback(1, folder))
    resumed = ElasticCheckpointCallback(1, folder, other_run="resume")
    other = _model(learning_rate=1e-3)
    other.learn(128, callback=resumed)
    assert resumed.resumed_from.name == "rl_model_64_steps.zip" and other.num_timesteps == 128
    assert read_run_record(latest_checkpoint(folder))["config_hash"] == config_hash(run_identity(other))
    old = _files(folder)
    fresh = _model(learning_rate=5e-4)
    overwrite = ElasticCheckpointCallback(1, folder, other_run="overwrite")
    fresh.learn(64, callback=overwrite)
    assert overwrite.resumed_from is None
    (aside,) = [p for p in folder.iterdir() if p.is_dir()]
    assert aside.name.startswith("replaced-") and _files(aside) == old


def _text_model(cls=GRPO, max_new_tokens=3, **kwargs):
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=2, group_size=2, seed=0, device="cpu", max_new_tokens=max_new_tokens)
    model = cls("CausalLMPolicy", env, n_steps=4, batch_size=8, n_epochs=1, seed=0, device="cpu", **kwargs)
    model.set_logger(configure(None, []))
    return model


def test_resume_never_crosses_algorithms_or_windows(tmp_path):
    folder = tmp_path / "ckpt"
    _text_model(advantage="group").learn(16, callback=ElasticCheckpointCallback(1, folder))
    with pytest.raises(ValueError, match="another algorithm cannot be resumed"):
        _text_model(DrGRPO).learn(24, callback=ElasticCheckpointCallback(1, folder, other_run="resume"))
    with pytest.raises(ValueError, match=r"observation_space.*another env, window or tokenizer"):
        model = _text_model(max_new_tokens=4, advantage="group")
        model.learn(24, callback=ElasticCheckpointCallback(1, folder, other_run="resume"))


def test_a_second_run_does_not_prune_the_first_runs_checkpoints(tmp_path):
    folder = tmp_path / "ckpt"
    _model().learn(128, callback=AtomicCheckpointCallback(32, folder, keep_last=2))
    first = _files(folder)
    with pytest.raises(ValueError, match="belongs to another run"):
        _model(seed=1).learn(128, callback=AtomicCheckpointCallback(32, folder, keep_last=2))
    assert _files(folder) == first
    with pytest.raises(ValueError, match="other_run must be one of"):
        AtomicCheckpointCallback(32, folder, other_run="merge")
