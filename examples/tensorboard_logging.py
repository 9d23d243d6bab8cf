"""Log a GRPO run to TensorBoard, then view it.

SB3 writes ``rollout/ep_rew_mean``, ``train/*`` (PPO's keys) and GRPO's own (``train/grad_var``,
``train/clip_fraction_pos``, ``train/explore_alpha``, ...) under ``--logdir``::

    python examples/tensorboard_logging.py --logdir runs/tb
    tensorboard --logdir runs/tb          # then open http://localhost:6006
"""

from __future__ import annotations

import argparse
import os
import tempfile

from sb3_grpo import GRPO
from textrl_envs.sb3 import make_vec_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=768, help="env steps (tokens) to train for")
    parser.add_argument("--logdir", default=None, help="tensorboard folder (default: a temporary folder)")
    args = parser.parse_args()
    logdir = args.logdir or tempfile.mkdtemp(prefix="sb3-grpo-tb-")

    env = make_vec_env("TextGen-v0", n_envs=8, seed=0)
    n_steps = min(48, max(8, args.timesteps // 8))  # tokens per env per rollout (8 envs)
    model = GRPO(
        "CausalLMPolicy",
        env,
        n_steps=n_steps,
        batch_size=192,
        n_epochs=1,  # settings for a pretrained LM: one pass over each rollout, a small step, a KL penalty to
        learning_rate=1e-4,  # the initial model (its estimate is logged as train/kl_ref)
        kl_coef=0.05,
        gamma=1.0,
        seed=0,
        device="cpu",
        tensorboard_log=logdir,
    )
    model.learn(total_timesteps=args.timesteps, tb_log_name="grpo_textgen")

    events = [os.path.join(d, f) for d, _, files in os.walk(logdir) for f in files if f.startswith("events.")]
    print(f"wrote {len(events)} event file(s): {', '.join(events)}")
    print(f"view them with:  tensorboard --logdir {logdir}")


if __name__ == "__main__":
    main()
