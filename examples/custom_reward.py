"""A custom reward: any callable ``f(prompts, completions, **kwargs) -> floats`` plugs into a text env.

Here the reward counts a few positive words and penalises long completions. The env calls it once per batch
of finished episodes, with the decoded text (the same shape TRL's reward functions have)::

    python examples/custom_reward.py
    python examples/custom_reward.py --timesteps 192
"""

from __future__ import annotations

import argparse

import numpy as np
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_grpo import GRPO
from textrl_envs.sb3 import make_vec_env

GOOD_WORDS = ("great", "good", "wonderful", "best", "fun", "love", "beautiful")


def enthusiasm(prompts: list[str], completions: list[str], **kwargs) -> list[float]:  # noqa: ARG001  (the reward signature)
    """+1 per positive word, -0.02 per character beyond 60.

    :param prompts: The prompts of the finished episodes.
    :param completions: Their completions (decoded text).
    :return: One reward per completion.
    """
    rewards = []
    for text in completions:
        words = text.lower().split()
        rewards.append(sum(w.strip(".,!") in GOOD_WORDS for w in words) - 0.02 * max(0, len(text) - 60))
    return rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=1536, help="env steps (tokens) to train for")
    args = parser.parse_args()

    env = make_vec_env("TextGen-v0", n_envs=8, group_size=4, reward=enthusiasm, seed=0)
    eval_env = make_vec_env("TextGen-v0", n_envs=8, reward=enthusiasm, seed=100)
    model = GRPO(
        "CausalLMPolicy",
        env,
        advantage="group",  # DeepSeekMath-style: each completion against the other 3 of its prompt group
        n_steps=min(48, max(8, args.timesteps // 8)),  # tokens per env per rollout
        batch_size=96,
        n_epochs=2,  # settings for a pretrained LM: few epochs, a small step, a KL penalty to the initial model
        learning_rate=1e-4,
        kl_coef=0.05,
        gamma=1.0,
        seed=0,
        device="cpu",
    )
    before, _ = evaluate_policy(model, eval_env, n_eval_episodes=32, deterministic=False)
    model.learn(total_timesteps=args.timesteps)
    after, _ = evaluate_policy(model, eval_env, n_eval_episodes=32, deterministic=False)
    print(f"mean custom reward: before {before:.3f}, after {after:.3f} ({args.timesteps} tokens of training)")
    assert np.isfinite(after)


if __name__ == "__main__":
    main()
