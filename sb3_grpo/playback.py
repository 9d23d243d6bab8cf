"""Look at a saved model: load a checkpoint and play episodes with it (``sb3-grpo sample``, rl-zoo3's ``enjoy``)."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "ALGO_CLASSES",
    "VIDEO_SUFFIXES",
    "check_render_mode",
    "check_video_path",
    "env_render_modes",
    "gif_frame_ms",
    "check_sample_env",
    "checkpoint_algo",
    "load_checkpoint",
    "make_sample_env",
    "sample_episodes",
    "write_video",
]

#: Video formats of ``sb3-grpo sample --video``, by file suffix.
VIDEO_SUFFIXES = (".gif", ".mp4")
_MP4_INSTALL = "pip install imageio-ffmpeg (the video extra)"

#: ``--algo`` name -> the algorithm class's import path.
ALGO_CLASSES = {
    "ppo": ("stable_baselines3", "PPO"),
    "grpo": ("sb3_grpo", "GRPO"),
    "dr-grpo": ("sb3_grpo", "DrGRPO"),
    "dapo": ("sb3_grpo", "DAPO"),
    "gspo": ("sb3_grpo", "GSPO"),
    "cispo": ("sb3_grpo", "CISPO"),
    "reinforce-pp": ("sb3_grpo", "ReinforcePP"),
}


def checkpoint_algo(path: str | os.PathLike) -> str:
    """The ``--algo`` name of an SB3 checkpoint: a ``.safetensors`` checkpoint's recorded class, else from the
    attributes a ``.zip`` saved (DAPO's ``overlong_penalty_factor``, Dr. GRPO's ``max_completion_tokens``, GRPO's
    ``grad_var_coef``, REINFORCE++'s ``kl_coef`` without it; otherwise stock PPO).

    :raises ValueError: for a file that is no checkpoint, or a ``.zip`` of GSPO or CISPO, which save the same
        attributes (``clip_range_low``, ``clip_range_high``): ``--algo`` must say which.
    """
    from sb3_grpo.common.checkpoints.safetensors_format import is_safetensors_path, safetensors_algorithm

    if is_safetensors_path(path):
        algorithm = safetensors_algorithm(path).rpartition(":")[2]
        names = {cls_name: name for name, (_, cls_name) in ALGO_CLASSES.items()}
        return names.get(algorithm, algorithm)
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
    except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as err:
        raise ValueError(
            f"{os.fspath(path)!r} is not an SB3 checkpoint (a .zip or .safetensors saved by model.save): {err}"
        ) from None
    if "overlong_penalty_factor" in data:
        return "dapo"
    if "max_completion_tokens" in data:
        return "dr-grpo"
    if "clip_range_low" in data:
        raise ValueError(
            f"{os.fspath(path)!r} is a GSPO or a CISPO checkpoint (they save the same attributes); say which with "
            "--algo gspo or --algo cispo"
        )
    if "grad_var_coef" in data:
        return "grpo"
    if "kl_coef" in data:  # a KL in the reward and none of GRPO's own arguments
        return "reinforce-pp"
    return "ppo"


def load_checkpoint(
    path: str | os.PathLike, algo: str = "auto", device: str = "cpu", env: Any = None, trusted: bool = False
) -> Any:
    """Load an SB3 checkpoint (``.zip`` or ``.safetensors``) with its algorithm class (``algo="auto"``:
    :func:`checkpoint_algo`), running no code from the file unless ``trusted``
    (:func:`~sb3_grpo.common.checkpoints.safe_loading.load_model`)."""
    import importlib

    from sb3_grpo.common.checkpoints.safe_loading import load_model

    name = checkpoint_algo(path) if algo == "auto" else algo
    if name not in ALGO_CLASSES:
        raise ValueError(
            f"{os.fspath(path)!r} holds a {name} model; sampling knows {', '.join(ALGO_CLASSES)} (pass --algo)"
            if algo == "auto"
            else f"unknown algo {algo!r}; known: auto, {', '.join(ALGO_CLASSES)}"
        )
    module, cls_name = ALGO_CLASSES[name]
    cls = getattr(importlib.import_module(module), cls_name)
    return load_model(cls, os.fspath(path), trusted=trusted, env=env, device=device)


def check_sample_env(model: Any, env: Any, env_id: str) -> None:
    """Refuse an env whose observations or actions are not those the model was trained on, saying what to change
    (SB3's ``predict`` would fail later with a shape error, or deep inside the policy).

    :raises ValueError: naming both spaces and, for a text model, the window or the env to use.
    """
    trained, given = model.observation_space, env.observation_space
    text_model = isinstance(trained, gym.spaces.Dict) and "input_ids" in trained.spaces
    if text_model and not (isinstance(given, gym.spaces.Dict) and "input_ids" in given.spaces):
        raise ValueError(
            f"the checkpoint is a text model (its observations are windows of token ids) but {env_id} gives "
            f"{given}; sample it on a text env, e.g. --env TextGen-v0, with the env arguments it was trained with"
        )
    if text_model and trained["input_ids"].shape != given["input_ids"].shape:
        width, env_width = trained["input_ids"].shape[-1], given["input_ids"].shape[-1]
        raise ValueError(
            f"the checkpoint was trained on windows of W = max_prompt_tokens + max_new_tokens = {width} tokens, but "
            f"this {env_id} has W = {env_width}; pass the training run's sizes, e.g. --env-kwargs "
            f'\'{{"max_prompt_tokens": ..., "max_new_tokens": ...}}\' adding up to {width}'
        )
    for what, want, got in (("observation", trained, given), ("action", model.action_space, env.action_space)):
        if want != got:
            raise ValueError(
                f"the checkpoint's {what} space is {want} but {env_id}'s is {got}; sample it on the env (and env "
                "arguments) it was trained on"
            )


def env_render_modes(env_id: str) -> list[str]:
    """The render modes a registered env declares (its class's ``metadata["render_modes"]``)."""
    from gymnasium.envs.registration import load_env_creator

    import textrl_envs  # noqa: F401  (registers the text env ids)

    try:
        spec = gym.spec(env_id)
    except gym.error.Error as err:
        raise ValueError(f"env {env_id!r} is not registered ({err}); give a registered id or --gym-packages") from None
    entry = spec.entry_point
    creator = load_env_creator(entry) if isinstance(entry, str) else entry
    return list(getattr(creator, "metadata", {}).get("render_modes", []))


def check_render_mode(env_id: str, render_mode: str) -> None:
    """Raise a ``ValueError`` naming the modes ``env_id`` has when it does not render ``render_mode``."""
    modes = env_render_modes(env_id)
    if render_mode not in modes:
        raise ValueError(
            f"env {env_id!r} has no render_mode={render_mode!r} (its render modes: {', '.join(modes) or 'none'}); "
            "a video needs an env that renders 'rgb_array' frames"
        )


class _FinalFrame(gym.Wrapper):
    """Put the frame of an episode's last state in the info of its last step, as ``info["frame"]``.

    SB3's ``DummyVecEnv`` resets a finished env within the same ``step``, so ``render()`` afterwards shows the next
    episode; this wrapper renders before that reset. The text envs do the same themselves (their ``final_info``'s
    ``frame`` with ``render_mode="rgb_array"``).
    """

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = dict(info, frame=self.env.render())
        return obs, reward, terminated, truncated, info


def make_sample_env(
    env_id: str, env_kwargs: dict[str, Any] | None = None, seed: int | None = None, render_mode: str | None = None
) -> Any:
    """One env to sample on, as an SB3 VecEnv: a text env through :func:`textrl_envs.sb3.make_vec_env`, any other
    registered id through SB3's ``make_vec_env``.

    :param render_mode: ``"rgb_array"`` to record a video with :func:`sample_episodes` (``frames=``); the env must
        declare it (:func:`check_render_mode`), and the last step of each episode then carries ``info["frame"]``.
    """
    import textrl_envs  # registers the text env ids

    env_kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        check_render_mode(env_id, render_mode)
        env_kwargs["render_mode"] = render_mode
    if env_id in textrl_envs.ENV_IDS:
        from textrl_envs.sb3 import make_vec_env

        env_kwargs.setdefault("device", "cpu")
        return make_vec_env(env_id, n_envs=1, seed=seed, **env_kwargs)
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

    wrapper = _FinalFrame if render_mode == "rgb_array" else None
    return sb3_make_vec_env(env_id, n_envs=1, seed=seed, env_kwargs=env_kwargs, wrapper_class=wrapper)


def sample_episodes(
    model: Any, env: Any, n: int, deterministic: bool = False, frames: list[np.ndarray] | None = None
) -> Iterator[dict[str, Any]]:
    """Play ``n`` episodes of ``model`` on ``env`` (an SB3 VecEnv) and yield one row per episode.

    A row holds the episode's return (``reward``) and length in steps (``steps``), plus, for text envs, what the env
    put in the final info: prompt, completion, length in tokens, turns and transcript (the columns of
    :func:`~sb3_grpo.callbacks.completions.completion_row`).

    :param frames: A list to append the episodes' frames to (``env`` from :func:`make_sample_env` with
        ``render_mode="rgb_array"``, one env): one frame after each reset and one after each step, so an episode of
        ``steps`` steps adds ``steps + 1`` frames (for a text env, one per token; the last shows the whole completion).
    """
    from sb3_grpo.callbacks.completions import completion_row

    if frames is not None and env.num_envs != 1:
        raise ValueError(f"frames= records one env; this VecEnv has {env.num_envs}")
    obs = env.reset()
    if frames is not None:
        frames.append(_current_frame(env))
    returns, steps = np.zeros(env.num_envs), np.zeros(env.num_envs, dtype=int)
    done_count = 0
    while done_count < n:
        actions, _ = model.predict(obs, deterministic=deterministic)
        obs, rewards, dones, infos = env.step(actions)
        returns += rewards
        steps += 1
        if frames is not None:
            frames.append(_current_frame(env) if not dones[0] else _final_frame(infos[0]))
            if dones[0] and done_count + 1 < n:
                frames.append(_current_frame(env))  # the first frame of the next episode
        for j in np.flatnonzero(dones):
            if done_count >= n:
                break
            row = completion_row(infos[j], env_index=int(j), timestep=int(model.num_timesteps), rollout=0)
            row = {k: v for k, v in row.items() if v is not None and k not in ("rollout", "env", "frame")}
            row.update(episode=done_count, reward=float(returns[j]), steps=int(steps[j]))
            yield row
            done_count += 1
            returns[j], steps[j] = 0.0, 0


def _current_frame(env: Any) -> np.ndarray:
    """The one env's frame now (``rgb_array``)."""
    frame = env.get_images()[0]
    if frame is None:
        raise ValueError("the env renders no frames; make it with make_sample_env(..., render_mode='rgb_array')")
    return np.asarray(frame, dtype=np.uint8)


def _final_frame(info: dict[str, Any]) -> np.ndarray:
    """The frame of a finished episode's last state, from its last step's info."""
    if info.get("frame") is None:
        raise ValueError("the env's last step has no info['frame']; make it with make_sample_env(..., render_mode=...)")
    return np.asarray(info["frame"], dtype=np.uint8)


def check_video_path(path: str | os.PathLike) -> str:
    """The format of a ``--video`` path (``"gif"`` or ``"mp4"``); a ``ValueError`` for another suffix, or for mp4
    without imageio-ffmpeg."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in VIDEO_SUFFIXES:
        raise ValueError(f"--video {os.fspath(path)!r}: give a file ending in {' or '.join(VIDEO_SUFFIXES)}")
    if suffix == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            msg = f"--video .mp4 needs imageio-ffmpeg (its bundled ffmpeg): {_MP4_INSTALL} (or write a .gif)"
            raise ValueError(msg) from None
    return suffix[1:]


def write_video(path: str | os.PathLike, frames: list[np.ndarray], fps: float) -> Path:
    """Write ``frames`` (``uint8`` arrays ``(H, W, 3)`` of one size) as a GIF (Pillow) or an mp4 (H.264, the ffmpeg
    of imageio-ffmpeg), by ``path``'s suffix, atomically (:func:`~sb3_grpo.file_io.atomic_write`).

    A GIF shows each frame for ``1000 / fps`` ms rounded to 10 ms (the format's unit); Pillow merges a frame equal
    to the one before into it (one longer frame), so the total duration stays ``len(frames)`` times that.
    """
    from sb3_grpo.file_io import atomic_write

    kind = check_video_path(path)
    if not frames:
        raise ValueError("no frames to write")
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    if len({f.shape for f in frames}) != 1:
        raise ValueError(f"frames of one video must have one size; got {sorted({f.shape for f in frames})}")

    def write_gif(tmp: str) -> None:
        from PIL import Image

        images = [Image.fromarray(f) for f in frames]
        duration = gif_frame_ms(fps)
        images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0)

    def write_mp4(tmp: str) -> None:
        import imageio_ffmpeg

        height, width = frames[0].shape[:2]
        # H.264 in yuv420p needs even sides (macro_block_size=2 resizes odd ones); -f mp4: the temp name has no .mp4
        writer = imageio_ffmpeg.write_frames(
            tmp, (width, height), fps=fps, macro_block_size=2, output_params=["-f", "mp4"], ffmpeg_log_level="error"
        )
        writer.send(None)  # start ffmpeg
        try:
            for f in frames:
                writer.send(np.ascontiguousarray(f))
        finally:
            writer.close()

    return atomic_write(path, write_gif if kind == "gif" else write_mp4)


def gif_frame_ms(fps: float) -> int:
    """A GIF frame's duration in ms for ``fps``: GIF counts in 10 ms units, so ``1000 / fps`` rounded to 10 (at
    least 20 ms, as browsers show shorter frames at 100 ms)."""
    return max(20, int(round(100.0 / fps)) * 10)


def format_row(row: dict[str, Any]) -> str:
    """A row as text for the terminal: the transcript (or prompt and completion) and the reward."""
    head = f"episode {row['episode']}: reward {row['reward']:.4g}, {row['steps']} steps"
    if "transcript" in row:
        lines = [f"  prompt: {row.get('prompt', '')!r}"] + [f"  {m['role']}: {m['text']!r}" for m in row["transcript"]]
        return "\n".join([head, *lines])
    if "completion" in row:
        return f"{head}\n  prompt: {row.get('prompt', '')!r}\n  completion: {row['completion']!r}"
    return head
