"""Reliable training: crash-safe checkpoints, resume, early stopping, rollback, a curriculum and a monitor.

Run it, kill it at any moment (Ctrl-C, or even ``kill -9``), run it again: it resumes from the newest complete
checkpoint in ``--out`` and loses at most one checkpoint interval::

    python examples/reliable_training.py --out runs/reliable          # ~2,000 tokens, about a minute on a CPU
    python examples/reliable_training.py --out runs/reliable          # again: resumes where it stopped
    python examples/reliable_training.py --timesteps 128 --out /tmp/x # smoke test
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sb3_grpo import GRPO
from sb3_grpo.callbacks import (
    AtomicCheckpointCallback,
    EarlyStoppingCallback,
    GammaSchedule,
    MaxNewTokensCurriculum,
    RollbackCallback,
    TrainingMonitor,
    latest_checkpoint,
)
from textrl_envs.sb3 import make_vec_env

MAX_NEW_TOKENS = 16  # the env's budget fixes the observation width; the curriculum only lowers it


def make_env(seed: int):
    # nonfinite_reward="skip": a NaN/inf reward scores 0 and is flagged, and GRPO(nonfinite="skip") drops the
    # episode; reward_timeout: a reward that hangs raises a TimeoutError instead of stalling the run forever
    return make_vec_env(
        "TextGen-v0",
        n_envs=4,
        seed=seed,
        device="cpu",
        max_new_tokens=MAX_NEW_TOKENS,
        nonfinite_reward="skip",
        reward_timeout=60.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=2048, help="total env steps (tokens) of the run")
    parser.add_argument("--out", default="runs/reliable", help="folder for checkpoints and the best model")
    args = parser.parse_args()
    out = Path(args.out)
    ckpt = out / "ckpt"
    n_steps = 16  # tokens per env per rollout: 64 per rollout with 4 envs

    env = make_env(seed=0)
    last = latest_checkpoint(ckpt)
    if last is not None:
        model = GRPO.load(last, env=env, device="cpu")
        print(f"resuming from {last} ({model.num_timesteps} timesteps)")
    else:
        model = GRPO(
            "CausalLMPolicy",
            env,
            n_steps=n_steps,
            batch_size=32,
            n_epochs=1,  # settings for a pretrained LM: one pass over each rollout, a small step
            learning_rate=1e-4,
            kl_coef=0.05,  # KL to the frozen initial model, watched by the monitor below
            nonfinite="skip",
            seed=0,
            device="cpu",
        )
    remaining = args.timesteps - model.num_timesteps
    if remaining <= 0:
        print(f"already trained for {model.num_timesteps} timesteps; raise --timesteps to continue")
        return

    rollout = n_steps * env.num_envs
    callbacks = [
        # every other rollout; files appear whole or not at all, never half-written
        AtomicCheckpointCallback(save_freq=2 * n_steps, save_path=ckpt, keep_last=3),
        # roll back when the evaluation reward collapses by 0.5 or the weights turn non-finite
        RollbackCallback(make_env(seed=100), eval_freq=4 * rollout, threshold=0.5, n_eval_episodes=8),
        # stop when 4 evaluations in a row did not improve; keep the best model
        EarlyStoppingCallback(
            make_env(seed=200),
            patience=4,
            eval_freq=4 * rollout,
            n_eval_episodes=8,
            best_model_path=out / "best_model.zip",
        ),
        # short completions first: 4 tokens, then 8, then the full 16
        MaxNewTokensCurriculum([(0, 4), (args.timesteps // 3, 8), (2 * args.timesteps // 3, MAX_NEW_TOKENS)]),
        # discount from 0.95 up to 1.0 over the run (the reward comes at the end of a completion)
        GammaSchedule(0.95, 1.0),
        # warn when the KL to the initial model passes 0.5 or the gradient norm before clipping passes 1,000 (GRPO's
        # own grad_norm_warn: this LM's norm runs in the hundreds in a healthy run)
        TrainingMonitor(max_grad_norm=1000.0, kl_target=0.5),
    ]
    model.learn(remaining, callback=callbacks, reset_num_timesteps=False)
    print(f"trained to {model.num_timesteps} timesteps; newest checkpoint: {latest_checkpoint(ckpt)}")


if __name__ == "__main__":
    main()
