"""SB3 constructors with string ids (SB3 makes them with ``render_mode="rgb_array"``), ``evaluate_policy`` on
them, and the ``rgb_array`` frames themselves (fixed size, the transcript drawn, Gymnasium's ``RecordVideo``)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import sys
import types
import warnings

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.rendering import FRAME_SHAPE, transcript_frame, wrap_segments
from textrl_envs.tasks import REASONING_GYM

SMALL = {"n_steps": 8, "batch_size": 8, "n_epochs": 1, "seed": 0}


def test_ppo_multi_input_policy_from_a_string_id():
    model = PPO("MultiInputPolicy", "TextGen-v0", **SMALL)
    env = model.get_env()
    assert env.render_mode == "rgb_array" and env.envs[0].unwrapped.render_mode == "rgb_array"
    model.learn(16)
    assert model.num_timesteps == 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "not wrapped with a Monitor"
        mean, std = evaluate_policy(model, env, n_eval_episodes=2)
    assert np.isfinite(mean) and np.isfinite(std)
    frame = env.render()
    assert frame.shape == (*FRAME_SHAPE, 3) and frame.dtype == np.uint8


@pytest.mark.parametrize("env_id", ["TextGen-v0", "GuessNumber-v0", REASONING_GYM.env_id])
def test_grpo_causal_lm_policy_from_a_string_id(env_id):
    from sb3_grpo import GRPO

    if env_id == REASONING_GYM.env_id:
        pytest.importorskip("reasoning_gym")
    model = GRPO("CausalLMPolicy", env_id, **SMALL)
    model.learn(16)
    assert model.num_timesteps == 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mean, _ = evaluate_policy(model, model.get_env(), n_eval_episodes=2)
    assert np.isfinite(mean)


def test_rgb_array_frames_show_the_transcript_at_a_fixed_size():
    env = gym.make("TextGen-v0", render_mode="rgb_array", max_new_tokens=24)
    env.reset(seed=0)
    first = env.render()
    assert first.shape == (*FRAME_SHAPE, 3) and first.dtype == np.uint8
    assert (first < 255).any()  # the prompt is drawn
    tok = env.unwrapped.tokenizer
    frames = [first]
    for t in tok(" great fun and a lovely film with a story", add_special_tokens=False)["input_ids"]:
        env.step(t)
        frames.append(env.render())
    assert all(f.shape == first.shape for f in frames)
    assert not np.array_equal(frames[0], frames[-1])  # the completion grows in the picture
    blue = (frames[-1][..., 2].astype(int) - frames[-1][..., 0]) > 60  # the agent's text is blue
    assert blue.any() and not ((first[..., 2].astype(int) - first[..., 0]) > 60).any()
    # the same transcript drawn directly gives the same picture
    u = env.unwrapped
    np.testing.assert_array_equal(
        frames[-1], transcript_frame([("prompt", u._prompt_text), ("agent", u.decode(u._generated))])
    )


def test_long_transcripts_wrap_and_keep_the_newest_lines():
    def measure(s):
        return 10.0 * len(s)  # 10 px per character

    lines = wrap_segments([("prompt", "ab cd"), ("agent", " efghijklmnop\nq")], 50, measure)
    assert ["".join(text for _, text in line) for line in lines] == ["ab cd", "efghi", "jklmn", "op", "q"]
    assert {role for role, _ in lines[0]} == {"prompt"} and lines[1] == [("agent", "efghi")]
    long = transcript_frame([("prompt", "word " * 2000)])
    assert long.shape == (*FRAME_SHAPE, 3)


def test_vector_env_and_sb3_adapter_render_frames():
    from textrl_envs.sb3 import make_vec_env

    vec = gym.make_vec("TextGen-v0", num_envs=3, device="cpu", render_mode="rgb_array")
    vec.reset(seed=0)
    frames = vec.render()
    assert len(frames) == 3 and all(f.shape == (*FRAME_SHAPE, 3) for f in frames)
    single = gym.make("TextGen-v0", render_mode="rgb_array")
    single.reset(seed=0)
    np.testing.assert_array_equal(frames[0], single.render())  # env 0 is seeded like the single env
    venv = make_vec_env("TextGen-v0", n_envs=4, device="cpu", render_mode="rgb_array", seed=0)
    venv.reset()
    tiled = venv.render()
    assert tiled.shape == (2 * FRAME_SHAPE[0], 2 * FRAME_SHAPE[1], 3)  # SB3 tiles 4 frames 2 x 2


def test_record_video_records_every_frame(tmp_path, monkeypatch):
    """Gymnasium's RecordVideo over the env: it hands the writer one same-size frame per step. The writer is
    MoviePy (not a dependency of ours); a stand-in module receives the frames instead of encoding an mp4."""
    written = []

    class ImageSequenceClip:
        def __init__(self, frames, fps):
            written.append((list(frames), fps))

        def write_videofile(self, path, logger=None):
            written[-1] += (path,)

    fake = types.ModuleType("moviepy")
    fake.__path__ = []
    clip_module = types.ModuleType("moviepy.video.io.ImageSequenceClip")
    clip_module.ImageSequenceClip = ImageSequenceClip
    for name, module in (
        ("moviepy", fake),
        ("moviepy.video", types.ModuleType("moviepy.video")),
        ("moviepy.video.io", types.ModuleType("moviepy.video.io")),
        ("moviepy.video.io.ImageSequenceClip", clip_module),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    env = gym.wrappers.RecordVideo(
        gym.make("TextGen-v0", render_mode="rgb_array", max_new_tokens=6),
        str(tmp_path / "videos"),
        episode_trigger=lambda e: True,
    )
    env.reset(seed=0)
    steps = 0
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(env.unwrapped.tokenizer.encode(" fun")[0])
        steps += 1
        done = terminated or truncated
    env.close()
    (frames, fps, path), *_ = written
    assert len(frames) == steps + 1 and fps == 30 and path.endswith(".mp4")
    assert all(f.shape == (*FRAME_SHAPE, 3) and f.dtype == np.uint8 for f in frames)
