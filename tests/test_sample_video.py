"""`sb3-grpo sample --video`: the episodes' frames as a GIF, read back with Pillow."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image
from stable_baselines3 import PPO

from sb3_grpo import GRPO
from sb3_grpo.cli import main
from sb3_grpo.playback import gif_frame_ms
from textrl_envs.rendering import transcript_frame
from textrl_envs.sb3 import make_vec_env

WALK_ID, ANSI_ID = "SampleVideoWalk-v0", "SampleVideoAnsi-v0"
WALK_CELLS, WALK_LIMIT = 7, 9


class Walk(gym.Env):
    """A walker on a line of cells, one step left or right per action; it ends at either edge. Its ``rgb_array``
    frame lights its cell, so every step changes the frame."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0

    def _obs(self):
        return np.array([self.pos / (WALK_CELLS - 1)], dtype=np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(1, WALK_CELLS - 1))
        return self._obs(), {}

    def step(self, action):
        self.pos += 1 if int(action) == 1 else -1
        return self._obs(), 1.0, self.pos in (0, WALK_CELLS - 1), False, {}

    def render(self):
        frame = np.zeros((4, 4 * WALK_CELLS, 3), dtype=np.uint8)
        frame[:, 4 * self.pos : 4 * self.pos + 4] = (250, 200, 0)
        return frame


class AnsiOnly(Walk):
    metadata = {"render_modes": ["ansi"], "render_fps": 10}


if WALK_ID not in gym.registry:
    gym.register(WALK_ID, entry_point=Walk, max_episode_steps=WALK_LIMIT)
    gym.register(ANSI_ID, entry_point=AnsiOnly, max_episode_steps=WALK_LIMIT)


def gif_frames(path) -> tuple[list[np.ndarray], list[int]]:
    """Every frame of a GIF as RGB, and its duration in ms."""
    frames, durations = [], []
    with Image.open(path) as image:
        for k in range(image.n_frames):
            image.seek(k)
            frames.append(np.asarray(image.convert("RGB")))
            durations.append(image.info["duration"])
    return frames, durations


def expanded(frames: list[np.ndarray], durations: list[int], ms: int) -> list[np.ndarray]:
    """The frame of each step: a GIF frame lasting ``m * ms`` stands for ``m`` equal frames (Pillow merges a frame
    equal to the one before into it)."""
    assert all(d % ms == 0 and d > 0 for d in durations)
    return [f for f, d in zip(frames, durations) for _ in range(d // ms)]


def test_text_video_one_frame_per_token(tmp_path, capsys):
    env = make_vec_env("TextGen-v0", n_envs=1, seed=0, device="cpu", max_new_tokens=3)
    GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, device="cpu").save(tmp_path / "t.zip")
    video, out = tmp_path / "t.gif", tmp_path / "t.jsonl"
    argv = ["sample", str(tmp_path / "t.zip"), "--env", "TextGen-v0", "--env-kwargs", '{"max_new_tokens": 3}']
    assert main([*argv, "--n", "3", "--out", str(out), "--video", str(video), "--seed", "0"]) == 0
    rows = [json.loads(line) for line in open(out)]
    n_frames = sum(r["steps"] + 1 for r in rows)  # the reset frame and one per step (token)
    assert f"{n_frames} frames at 30 fps" in capsys.readouterr().out
    ms = gif_frame_ms(30)
    frames, durations = gif_frames(video)
    assert sum(durations) == n_frames * ms
    steps = expanded(frames, durations, ms)
    assert len(steps) == n_frames
    single = gym.make("TextGen-v0", render_mode="rgb_array", max_new_tokens=3)
    single.reset(seed=0)
    assert np.array_equal(steps[0], single.render())  # the first frame is the env's after reset with that seed
    start = 0
    for row in rows:  # each episode opens on its prompt and ends on its whole completion
        assert np.array_equal(steps[start], transcript_frame([("prompt", row["prompt"]), ("agent", "")]))
        last = transcript_frame([("prompt", row["prompt"]), ("agent", row["completion"])])
        assert np.array_equal(steps[start + row["steps"]], last)
        start += row["steps"] + 1
    assert not any(f.name.endswith(".tmp") for f in tmp_path.iterdir())  # written atomically, nothing left over


def test_gym_env_video_frames_and_final_frame(tmp_path):
    PPO("MlpPolicy", WALK_ID, n_steps=16, batch_size=16, seed=0).save(tmp_path / "w.zip")
    video, out = tmp_path / "w.gif", tmp_path / "w.jsonl"
    argv = ["sample", str(tmp_path / "w.zip"), "--env", WALK_ID, "--n", "4", "--seed", "3", "--quiet"]
    assert main([*argv, "--out", str(out), "--video", str(video), "--fps", "20"]) == 0
    rows = [json.loads(line) for line in open(out)]
    frames, durations = gif_frames(video)
    assert len(frames) == sum(r["steps"] + 1 for r in rows)  # every step moves the walker: no frame is merged
    assert set(durations) == {gif_frame_ms(20)} == {50}
    single = gym.make(WALK_ID, render_mode="rgb_array")
    single.reset(seed=3)
    assert np.array_equal(frames[0], single.render())
    cells = [int(np.flatnonzero(f[0, ::4, 0])[0]) for f in frames]  # the walker's cell in each frame
    start = 0
    for row in rows:
        path = cells[start : start + row["steps"] + 1]
        assert all(abs(b - a) == 1 for a, b in zip(path, path[1:]))  # one cell per step
        assert path[-1] in (0, WALK_CELLS - 1) or row["steps"] == WALK_LIMIT  # the last frame is the final state
        start += row["steps"] + 1


def test_cartpole_video(tmp_path):
    pytest.importorskip("pygame", reason="CartPole's rgb_array needs pygame (pip install 'gymnasium[classic-control]')")
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16).save(tmp_path / "cp.zip")
    video, out = tmp_path / "cp.gif", tmp_path / "cp.jsonl"
    argv = ["sample", str(tmp_path / "cp.zip"), "--env", "CartPole-v1", "--n", "2", "--quiet"]
    assert main([*argv, "--out", str(out), "--video", str(video)]) == 0
    rows = [json.loads(line) for line in open(out)]
    frames, durations = gif_frames(video)
    assert sum(durations) == sum(r["steps"] + 1 for r in rows) * gif_frame_ms(50)


def test_video_bad_input(tmp_path, capsys):
    PPO("MlpPolicy", WALK_ID, n_steps=16, batch_size=16).save(tmp_path / "w.zip")
    base = ["sample", str(tmp_path / "w.zip"), "--n", "1"]
    with pytest.raises(SystemExit):
        main([*base, "--env", ANSI_ID, "--video", str(tmp_path / "a.gif")])
    err = capsys.readouterr().err
    assert "has no render_mode='rgb_array'" in err and "its render modes: ansi" in err
    with pytest.raises(SystemExit):
        main([*base, "--env", WALK_ID, "--video", str(tmp_path / "a.avi")])
    assert "give a file ending in .gif or .mp4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--env", WALK_ID, "--video", str(tmp_path / "a.gif"), "--fps", "0"])
    assert "--fps must be positive" in capsys.readouterr().err
    assert not (tmp_path / "a.gif").exists()
    try:
        import imageio_ffmpeg
    except ImportError:
        with pytest.raises(SystemExit):
            main([*base, "--env", WALK_ID, "--video", str(tmp_path / "a.mp4")])
        assert "pip install imageio-ffmpeg" in capsys.readouterr().err
    else:  # the mp4 read back with ffmpeg: one frame per step and reset, at the frames' size
        out = tmp_path / "a.jsonl"
        assert main([*base, "--env", WALK_ID, "--video", str(tmp_path / "a.mp4"), "--out", str(out), "--quiet"]) == 0
        (row,) = [json.loads(line) for line in open(out)]
        reader = imageio_ffmpeg.read_frames(str(tmp_path / "a.mp4"))
        meta = next(reader)
        assert meta["size"] == (4 * WALK_CELLS, 4) and sum(1 for _ in reader) == row["steps"] + 1
