"""``python -m textrl_envs``: sample completions from the bundled LM on an env and print their rewards.

This is the offline smoke job of the package: it builds ``gym.make(env_id)`` on the bundled
tokenizer, lets the bundled causal LM act as the policy (plain sampling, one token per step),
and prints each prompt, completion and reward (an interactive env's completion is the conversation
after the prompt, the environment's replies included, and its reward the episode's total).
"""

from __future__ import annotations

import argparse
import os

from textrl_envs.tasks import SENTIMENT

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m textrl_envs", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default=SENTIMENT.env_id, help=f"registered env id (default: {SENTIMENT.env_id})")
    parser.add_argument("--episodes", type=int, default=8, help="number of completions to sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    if args.temperature <= 0:
        parser.error("--temperature must be > 0")

    import gymnasium as gym
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    import textrl_envs
    from textrl_envs.assets import lm_path

    if args.env not in textrl_envs.ENV_IDS:
        parser.error(f"unknown env {args.env!r}; known: {', '.join(textrl_envs.ENV_IDS)}")
    torch.manual_seed(args.seed)
    env = gym.make(args.env)
    model = AutoModelForCausalLM.from_pretrained(lm_path()).eval()
    vocab = env.action_space.n
    rewards = []
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=args.seed + episode)
        done, total = False, 0.0
        while not done:
            ids = torch.as_tensor(obs["input_ids"])[None]
            mask = torch.as_tensor(obs["attention_mask"])[None]
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[0, -1, :vocab]
            action = int(torch.multinomial(torch.softmax(logits / args.temperature, -1), 1))
            obs, reward, terminated, truncated, info = env.step(action)
            done, total = terminated or truncated, total + reward  # interactive tasks may pay per turn
        rewards.append(total)
        print(f"[{total:+.3f}] {info['prompt']!r} -> {info['completion']!r}")
    print(f"{args.env}: mean reward {np.mean(rewards):+.3f} over {len(rewards)} completions")


if __name__ == "__main__":
    main()
