"""Every path that sets an argument runs the validation layer: ``load`` (its keyword arguments and
``custom_objects``), reward constructors, callbacks when training starts, the distributed helpers; rewards beyond
float32's range and rewards that carry a graph; SB3's error classes kept where SB3 is stricter than we are."""

from __future__ import annotations

import math
import socket
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch as th

import textrl_envs  # noqa: F401  (registers the ids)
from sb3_grpo import GRPO, distributed
from sb3_grpo.callbacks import AtomicCheckpointCallback, EarlyStoppingCallback, RollbackCallback, latest_checkpoint
from textrl_envs.rewards.base import call_reward


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "grpo.zip"
    GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu").save(path)
    return path


# ------------------------------------------------------------------------------------------------------------
# load() checks what it sets
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"grad_var_coef": math.nan}, "grad_var_coef"),
        ({"kl_coef": math.nan}, "kl_coef"),
        ({"n_epochs": 0}, "n_epochs"),
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"advantage": "grup"}, "advantage"),
    ],
)
def test_load_refuses_bad_arguments_like_the_constructor(saved, kwargs, name):
    env = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match=rf"^{name} must be .*(pass|got)") as err:
        GRPO.load(saved, env=env, device="cpu", **kwargs)
    assert name in str(err.value)


def test_load_refuses_bad_custom_objects_and_keeps_rl_zoos_placeholders(saved):
    with pytest.raises(ValueError, match=r"kl_coef must be a finite number >= 0, got nan"):
        GRPO.load(saved, device="cpu", custom_objects={"kl_coef": math.nan})
    # rl-zoo's recipe for models saved elsewhere: callables stand in for schedules, and still load
    model = GRPO.load(saved, device="cpu", custom_objects={"learning_rate": 0.0, "clip_range": lambda _: 0.0})
    assert model.learning_rate == 0.0


def test_load_with_good_arguments_sets_them(saved):
    model = GRPO.load(saved, env=gym.make("CartPole-v1"), device="cpu", grad_var_coef=0.02, n_epochs=2)
    assert model.grad_var_coef == 0.02 and model.n_epochs == 2


def test_load_can_turn_the_kl_term_on_with_the_loaded_policy_as_reference(saved):
    model = GRPO.load(saved, env=gym.make("CartPole-v1"), device="cpu", kl_coef=0.1)
    assert model.kl_coef == 0.1 and model.ref_policy is not None
    for name, value in model.ref_policy.state_dict().items():
        th.testing.assert_close(value, model.policy.state_dict()[name])
    model.learn(32)


@pytest.mark.skipif(th.cuda.is_available(), reason="needs a machine without CUDA")
def test_load_on_cuda_without_cuda_falls_back_to_the_cpu_as_sb3_does(saved):
    with pytest.warns(UserWarning, match=r"CUDA is not available here, loading on the CPU"):
        model = GRPO.load(saved, device="cuda")
    assert model.device.type == "cpu"


def test_argument_value_errors_are_also_assertion_errors_as_in_sb3():
    try:  # code written against SB3 catches AssertionError for a negative clip_range_vf
        GRPO("MlpPolicy", "CartPole-v1", clip_range_vf=-0.2, device="cpu")
    except AssertionError as err:
        assert isinstance(err, ValueError) and "clip_range_vf" in str(err)
    else:
        pytest.fail("a negative clip_range_vf was accepted")


# ------------------------------------------------------------------------------------------------------------
# Reward constructors and reward values
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: textrl_envs.rewards.resolve_reward("length", min_words=math.nan), "min_words"),
        (lambda: textrl_envs.rewards.resolve_reward("length", per_word=math.inf), "per_word"),
        (lambda: textrl_envs.rewards.resolve_reward("arithmetic", partial_weight=math.nan), "partial_weight"),
        (lambda: textrl_envs.rewards.resolve_reward("classifier", max_length=0), "max_length"),
        (lambda: textrl_envs.rewards.resolve_reward("repetition", n=0), "n"),
    ],
)
def test_reward_constructors_check_their_numbers(make, name):
    with pytest.raises((TypeError, ValueError), match=rf"^{name} must be .*(pass|got)"):
        make()


def _vector_env_rewards(reward):
    from textrl_envs.vector import TextGenVectorEnv

    env = TextGenVectorEnv(num_envs=2, prompts=["a", "b"], reward=reward, max_new_tokens=1, device="cpu")
    env.reset(seed=0)
    return env.step(np.zeros(2, dtype=np.int64))[1]


def test_a_reward_beyond_float32_is_refused_not_turned_into_inf():
    with pytest.raises(ValueError, match=r"returned 1e\+39 .*beyond float32's range.*scale the reward down"):
        call_reward(lambda p, c: [1e39] * len(c), ["a"], ["b"])
    with pytest.raises(ValueError, match="beyond float32's range"):
        _vector_env_rewards(lambda p, c: [1e39] * len(c))
    assert np.all(_vector_env_rewards(lambda p, c: [3e38] * len(c)) == 3e38)  # within float32's range: kept


def test_a_reward_tensor_that_requires_grad_is_detached_with_a_warning():
    weight = th.tensor(2.0, requires_grad=True)

    def graph_reward(prompts, completions):
        return th.stack([weight * len(c) for c in completions])

    with pytest.warns(UserWarning, match=r"requires grad: it is detached.*torch.no_grad"):
        values = call_reward(graph_reward, ["a", "b"], ["xy", "xyz"])
    assert values.tolist() == [4.0, 6.0]


# ------------------------------------------------------------------------------------------------------------
# Distributed helpers
# ------------------------------------------------------------------------------------------------------------


def test_distributed_helpers_refuse_bad_ranks_and_seeds():
    with pytest.raises(ValueError, match=r"shard: rank must be an int in \[0, 1\], got 5; ranks are 0 to 1"):
        distributed.shard(range(10), 5, 2)
    with pytest.raises(ValueError, match=r"shard: world_size must be an int >= 1, got 0"):
        distributed.shard(range(10), 0, 0)
    with pytest.raises(ValueError, match=r"rank_seed: seed must be an int in \[0, "):
        distributed.rank_seed(-1)
    with pytest.raises(ValueError, match=r"rank_seed: rank must be an int >= 0"):
        distributed.rank_seed(0, rank=-1)
    assert distributed.shard(range(10), 1, 2) == [1, 3, 5, 7, 9] and distributed.rank_seed(3, rank=2) == 2003


def test_start_up_without_peers_fails_fast_with_a_message(monkeypatch):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SB3_GRPO_RENDEZVOUS_TIMEOUT", "1")
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"found no peers at MASTER_ADDR=127.0.0.1.*within 1 s.*unset RANK"):
        distributed.setup("gloo")
    assert time.perf_counter() - start < 30
    monkeypatch.setenv("SB3_GRPO_RENDEZVOUS_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="SB3_GRPO_RENDEZVOUS_TIMEOUT must be a number of seconds"):
        distributed.rendezvous_timeout()


# ------------------------------------------------------------------------------------------------------------
# Checkpoints and callbacks, checked when training starts
# ------------------------------------------------------------------------------------------------------------


def test_latest_checkpoint_names_the_other_prefixes_instead_of_returning_none(tmp_path, saved):
    (tmp_path / "grpo_run_128_steps.zip").write_bytes(saved.read_bytes())
    with pytest.raises(ValueError, match=r"no rl_model_<steps>_steps.zip but .*'grpo_run'.*pass name_prefix="):
        latest_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path, name_prefix="grpo_run").name == "grpo_run_128_steps.zip"
    assert latest_checkpoint(tmp_path / "missing") is None


def _tiny():
    return GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")


def test_rollback_to_a_missing_checkpoint_dir_is_refused_when_training_starts(tmp_path):
    callback = RollbackCallback(gym.make("CartPole-v1"), eval_freq=32, checkpoint_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match=r"checkpoint_dir .*missing' does not exist.*AtomicCheckpointCallback"):
        _tiny().learn(32, callback=callback)


def test_early_stopping_checks_its_eval_env_and_path_when_training_starts(tmp_path):
    wrong = EarlyStoppingCallback(gym.make("MountainCar-v0"), patience=2, eval_freq=10_000)
    with pytest.raises(ValueError, match=r"eval_env's spaces .* are not the model's"):
        _tiny().learn(32, callback=wrong)
    folder = EarlyStoppingCallback(gym.make("CartPole-v1"), patience=2, eval_freq=10_000, best_model_path=tmp_path)
    with pytest.raises(ValueError, match=r"best_model_path .* is a folder; give a file path"):
        _tiny().learn(32, callback=folder)


def test_checkpoint_callback_refuses_a_file_as_its_folder(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"save_path .*a_file' is a file, not a folder"):
        AtomicCheckpointCallback(64, a_file)


def test_no_warning_for_good_callbacks(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ckpt = AtomicCheckpointCallback(32, tmp_path / "ckpt")
        rollback = RollbackCallback(gym.make("CartPole-v1"), eval_freq=10_000, checkpoint_dir=tmp_path / "ckpt")
        from stable_baselines3.common.callbacks import CallbackList

        _tiny().learn(32, callback=CallbackList([ckpt, rollback]))


# ------------------------------------------------------------------------------------------------------------
# Constructor arguments SB3 leaves unchecked, and saved files that are not models
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rollout_buffer_class": int}, TypeError, r"rollout_buffer_class must be None .* subclass of SB3's Rollout"),
        ({"device": "meta"}, ValueError, r"device='meta' holds no data.*pass 'auto', 'cpu' or 'cuda'"),
        ({"policy_kwargs": {"net_arch": "big"}}, TypeError, r"policy_kwargs\['net_arch'\] must be a list of layer"),
        ({"policy_kwargs": {"optimizer_class": "adam"}}, TypeError, r"\['optimizer_class'\] must be a torch optim"),
        ({"env": None}, ValueError, r"env is None: pass an env to train on.*set_env"),
    ],
)
def test_constructor_refuses_what_sb3_would_fail_on_deep_inside(kwargs, error, message):
    kwargs = {"env": "CartPole-v1", **kwargs}
    with pytest.raises(error, match=message):
        GRPO("MlpPolicy", n_steps=32, batch_size=32, **kwargs)


def test_a_zip_whose_data_is_not_json_is_named(tmp_path, saved):
    import zipfile

    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.namelist():
            dst.writestr(item, b"{not json" if item == "data" else src.read(item))
    with pytest.raises(ValueError, match=r"bad.zip' is not a saved model: its 'data' entry is not JSON"):
        GRPO.load(bad, device="cpu")


def test_the_report_says_how_many_steps_each_run_took():
    from sb3_grpo.compare.report import render_report

    run = {
        "algo": "ppo",
        "seed": 0,
        "status": "complete",
        "curve": {"steps": [64, 128], "reward": [0.0, 1.0]},
        "final": {"reward_mean": 1.0, "deterministic": True},
        "env_steps": 128,
        "wall_time_s": 1.0,
        "steps_per_s": 128.0,
        "peak_rss_mb": 1.0,
        "cuda_peak_mb": None,
        "kl_to_init": None,
        "kl_ref": None,
    }
    config = {"env_id": "CartPole-v1", "algos": ["ppo"], "seeds": [0], "timesteps": 64, "n_envs": 1}
    config.update(eval_episodes=1, text=False, threshold=None, hyperparameters={}, group_sizes={})
    text = render_report({"config": config, "untrained": None, "runs": {"ppo/seed0": run}, "status": "complete"})
    assert "x 64 env steps (steps) (each run took 128 env steps: learn() runs whole rollouts" in text


def test_a_saved_text_model_loads_after_its_model_folder_moved(tmp_path):
    from transformers import AutoModelForCausalLM

    from textrl_envs.assets import lm_path

    folder = tmp_path / "my_lm"
    AutoModelForCausalLM.from_pretrained(lm_path(), local_files_only=True).save_pretrained(folder)
    env = gym.make("TextGen-v0")
    model = GRPO("CausalLMPolicy", env, policy_kwargs={"model": str(folder)}, n_steps=8, batch_size=8, seed=0)
    model.save(tmp_path / "text.zip")
    obs, _ = env.reset(seed=0)
    before = model.policy.get_distribution(model.policy.obs_to_tensor(obs)[0]).distribution.logits
    folder.rename(tmp_path / "moved")
    with pytest.warns(UserWarning, match=r"my_lm' this model was built from no longer exists; building the LM from"):
        loaded = GRPO.load(tmp_path / "text.zip", env=env, device="cpu")
    after = loaded.policy.get_distribution(loaded.policy.obs_to_tensor(obs)[0]).distribution.logits
    th.testing.assert_close(after, before)


def test_gradient_checkpointing_with_the_penalty_is_refused_up_front():
    env = gym.make("TextGen-v0")
    kwargs = {"policy_kwargs": {"gradient_checkpointing": True}, "n_steps": 8, "batch_size": 8, "device": "cpu"}
    with pytest.raises(ValueError, match=r"grad_var_coef=0.01 with .*gradient_checkpointing.*pass grad_var_coef=0"):
        GRPO("CausalLMPolicy", env, **kwargs)
    GRPO("CausalLMPolicy", env, grad_var_coef=0.0, **kwargs).learn(16)  # without the penalty it trains


def test_predict_names_token_ids_outside_the_vocabulary_and_empty_masks():
    env = gym.make("TextGen-v0")
    model = GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8, device="cpu")
    obs, _ = env.reset(seed=0)
    bad = {k: v.copy() for k, v in obs.items()}
    bad["input_ids"][-1] = 10**7
    with pytest.raises(ValueError, match=r"token id 10000000, outside the model's vocabulary \[0, \d+\].*tokenizer"):
        model.predict(bad)
    empty = {k: np.zeros_like(v) for k, v in obs.items()}
    with pytest.raises(ValueError, match=r"attention_mask row 0 is all zeros") as err:
        model.predict(empty)
    assert "VecFrameStack" not in str(err.value)


def test_compare_groups_the_envs_of_an_algorithm_set_to_a_group_advantage():
    from sb3_grpo.compare.config import CompareError, make_config

    overrides = {"grpo": {"advantage": "group"}}
    cfg = make_config("TextGen-v0", ["ppo", "grpo"], seeds=1, timesteps=64, n_envs=4, group_size=2, overrides=overrides)
    assert cfg.group_sizes == {"ppo": 1, "grpo": 2}
    with pytest.raises(CompareError, match=r"--n-envs \(3\) must be a multiple of the group size \(2\) for grpo"):
        make_config("TextGen-v0", ["grpo"], seeds=1, timesteps=64, n_envs=3, group_size=2, overrides=overrides)


def test_perf_with_an_unknown_measurement_leaves_no_folder(tmp_path, capsys):
    from benchmarks.cli import main as bench_main

    out = tmp_path / "perf"
    with pytest.raises(SystemExit) as exc:
        bench_main(["perf", "--only", "bogus", "--out", str(out)])
    assert exc.value.code == 2 and "unknown measurement(s) ['bogus']" in capsys.readouterr().err
    assert not out.exists()


def test_a_truncated_weights_file_is_named(tmp_path):
    from transformers import AutoModelForCausalLM

    from textrl_envs.assets import lm_path

    folder = tmp_path / "lm"
    AutoModelForCausalLM.from_pretrained(lm_path(), local_files_only=True).save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(
        ValueError, match=r"could not load the model in .*lm'.*model.safetensors \(1,000 bytes\).*trunc"
    ):
        GRPO("CausalLMPolicy", gym.make("TextGen-v0"), policy_kwargs={"model": str(folder)}, device="cpu")


def test_prompt_sources_that_are_not_text_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"prompt #1 holds '\\ud83d' at character 2, a lone UTF-16 surrogate"):
        gym.make("TextGen-v0", prompts=["fine", "ok\ud83d"])
    folder = tmp_path / "prompts.jsonl"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"prompts.jsonl' is a folder, not a file"):
        gym.make("TextGen-v0", prompts=str(folder))


def test_textarena_games_that_cannot_start_are_named():
    pytest.importorskip("textarena")
    with pytest.raises(ValueError, match=r"'GuessTheNumber-v0' failed to start with game_kwargs .*check the values"):
        gym.make("TextArena-v0", game="GuessTheNumber-v0", game_kwargs={"min_number": 10, "max_number": 1})
    try:
        gym.make("TextArena-v0", game="Chess-v0")
    except ValueError as err:  # the installed textarena's Chess may not even import: then say so, naming the game
        assert "'Chess-v0'" in str(err)
