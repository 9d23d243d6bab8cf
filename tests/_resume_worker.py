"""Training process that tests/test_resume.py kills with SIGKILL (not a test module).

    python tests/_resume_worker.py OUT_DIR {cartpole,text} [--slow-save] [--plain] [--resume]

Trains GRPO with :class:`~sb3_grpo.callbacks.AtomicCheckpointCallback` (or SB3's plain ``CheckpointCallback``
with ``--plain``) into ``OUT_DIR/ckpt`` and appends ``num_timesteps`` to ``OUT_DIR/progress.txt`` every
``PROGRESS_EVERY`` steps, *after* the checkpoint callback ran for that step, so that a reported timestep ``T``
guarantees that the checkpoint of every interval up to ``T`` is complete.

``--slow-save`` simulates a slow disk: each model zip after the first two is written in two halves with a pause in
between,
and ``OUT_DIR/writing`` is created when the first half is on disk, so that the test can kill the process
while a checkpoint is half-written.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch as th
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback

from sb3_grpo import GRPO
from sb3_grpo.callbacks import AtomicCheckpointCallback, latest_checkpoint

SAVE_FREQ = {"cartpole": 64, "text": 8}  # calls (env.step()s); n_envs 1 and 2
N_ENVS = {"cartpole": 1, "text": 2}
PROGRESS_EVERY = 8


def make_env(kind: str):
    if kind == "cartpole":
        from stable_baselines3.common.env_util import make_vec_env

        return make_vec_env("CartPole-v1", n_envs=1, seed=0)
    from textrl_envs.sb3 import make_vec_env

    return make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=6)


def make_model(kind: str, env):
    if kind == "cartpole":
        return GRPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
    return GRPO("CausalLMPolicy", env, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")


class Progress(BaseCallback):
    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def _on_step(self) -> bool:
        if self.n_calls % PROGRESS_EVERY == 0:
            with open(self.path, "a") as f:
                f.write(f"{self.num_timesteps}\n")
        return True


def slow_disk(out: str, fast_saves: int = 2) -> None:
    """Make SB3 write model zips (after the first ``fast_saves``) in two halves, 30 s apart (``out/writing``
    marks the pause)."""
    from stable_baselines3.common import base_class

    original = base_class.save_to_zip_file
    count = [0]

    def slow_save(save_path, *args, **kwargs):
        count[0] += 1
        if count[0] <= fast_saves:
            return original(save_path, *args, **kwargs)
        side = f"{save_path}.full"
        original(side, *args, **kwargs)
        with open(side, "rb") as f:
            data = f.read()
        os.remove(side)
        with open(save_path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            open(os.path.join(out, "writing"), "w").close()
            time.sleep(30)
            f.write(data[len(data) // 2 :])

    base_class.save_to_zip_file = slow_save


def main() -> None:
    out, kind = sys.argv[1], sys.argv[2]
    flags = set(sys.argv[3:])
    th.set_num_threads(1)
    ckpt = os.path.join(out, "ckpt")
    env = make_env(kind)
    if "--resume" in flags:
        model = GRPO.load(latest_checkpoint(ckpt), env=env, device="cpu")
    else:
        model = make_model(kind, env)
    callback_class = CheckpointCallback if "--plain" in flags else AtomicCheckpointCallback
    checkpoints = callback_class(SAVE_FREQ[kind], ckpt)
    if "--slow-save" in flags:
        slow_disk(out)
    model.learn(
        10_000_000, callback=[checkpoints, Progress(os.path.join(out, "progress.txt"))], reset_num_timesteps=False
    )


if __name__ == "__main__":
    main()
