"""Quickstart: train the bundled tiny LM on TextGen-v0 with GRPO, then write one completion.

``gym.make("TextGen-v0")`` is a text-generation MDP (prompt + tokens so far -> next token, reward at the end
from a sentiment scorer). ``GRPO`` takes it like any SB3 algorithm takes an env::

    python examples/quickstart.py                 # ~1,000 tokens of training, well under a minute on a CPU
    python examples/quickstart.py --timesteps 96  # smoke test
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import textrl_envs  # noqa: F401  (registers TextGen-v0 and the other text envs)
from sb3_grpo import GRPO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=960, help="env steps (tokens) to train for")
    args = parser.parse_args()

    env = gym.make("TextGen-v0")
    model = GRPO(
        "CausalLMPolicy",  # the bundled tiny GPT-2, matching the env's bundled tokenizer
        env,
        n_steps=min(48, args.timesteps),  # tokens per rollout (up to two episodes of at most 24 tokens)
        batch_size=24,
        # settings for a pretrained LM rather than SB3's control defaults (10 epochs at 3e-4), under which the LM
        # drifts far from where it started: one pass over each rollout, a small step, and a KL penalty to the
        # initial model (logged as train/kl_ref)
        n_epochs=1,
        learning_rate=1e-4,
        kl_coef=0.05,
        # GRPO's gradient-variance penalty on its scale-free form (Var / mean squared norm, in [0, 1]): the raw
        # variance's gradient dwarfs the LM's own on batches this small (norms in the thousands, a warning)
        grad_var_normalize=True,
        gamma=1.0,  # the reward comes at the end of the completion
        seed=0,
        device="cpu",
    )
    model.learn(total_timesteps=args.timesteps)

    env = gym.make("TextGen-v0")  # a fresh env: training left an episode of the first one unfinished
    obs, info = env.reset(seed=0)
    done = False
    while not done:
        action, _ = model.predict(obs, deterministic=False)
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    print(f"prompt:     {info['prompt']!r}")
    print(f"completion: {info['completion']!r}")
    print(f"reward:     {reward:.3f}")


if __name__ == "__main__":
    main()
