"""Stock SB3 PPO and GRPO on the same text env, same budget, evaluated the same way.

``PPO`` takes the policy class (``CausalLMPolicy``); ``GRPO`` also knows it by name. For many seeds, a report
and plots, use the command ``sb3-grpo compare`` instead::

    python examples/ppo_vs_grpo.py
    python examples/ppo_vs_grpo.py --timesteps 192
"""

from __future__ import annotations

import argparse
import time

from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_grpo import GRPO, CausalLMPolicy
from textrl_envs.sb3 import make_vec_env

# settings for a pretrained LM (SB3's 10 epochs at 3e-4 move it far from where it started): few epochs, a small step
COMMON = {"batch_size": 192, "n_epochs": 2, "learning_rate": 1e-4, "gamma": 1.0, "seed": 0, "device": "cpu"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=768, help="env steps (tokens) per algorithm")
    args = parser.parse_args()
    n_steps = min(48, max(8, args.timesteps // 8))  # tokens per env per rollout (8 envs)

    models = {
        "ppo": PPO(CausalLMPolicy, make_vec_env("TextGen-v0", n_envs=8, seed=0), n_steps=n_steps, **COMMON),
        # group-relative advantages need prompt groups: 8 envs = 2 prompts x 4 completions
        "grpo-group": GRPO(
            "CausalLMPolicy",
            make_vec_env("TextGen-v0", n_envs=8, group_size=4, seed=0),
            advantage="group",
            n_steps=n_steps,
            **COMMON,
        ),
    }
    for name, model in models.items():
        start = time.perf_counter()
        model.learn(total_timesteps=args.timesteps)
        wall = time.perf_counter() - start
        eval_env = make_vec_env("TextGen-v0", n_envs=8, seed=1000)
        mean, std = evaluate_policy(model, eval_env, n_eval_episodes=32, deterministic=False)
        print(f"{name:<10} eval reward {mean:+.3f} ± {std:.3f}   ({wall:.0f} s for {model.num_timesteps} tokens)")


if __name__ == "__main__":
    main()
