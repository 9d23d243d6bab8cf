"""Learning on an interactive task: untrained vs trained reward and turns on GuessNumber-v0, GRPO and stock PPO.

Both train ``CausalLMPolicy`` (the bundled LM) on ``make_vec_env("GuessNumber-v0", n_envs=16)``: GRPO with
group-relative advantages on prompt groups of 4 through the text fast path (one epoch per update, rollouts of 64
steps, learning rate 5e-4, no critic loss and no gradient-variance penalty: group advantages use neither), stock
SB3 ``PPO`` (GAE, the per-transition path, four epochs, rollouts of 32 steps, learning rate 2e-4) on ungrouped
envs. Before and after training, the policy plays 512 sampled episodes on a separately seeded env; the script prints
their mean reward (with its standard error) and mean number of turns, and the wall-clock and CPU seconds of the
training::

    python -m benchmarks.learn_interactive                       # the README's figures (seed 0, 16 updates)
    python -m benchmarks.learn_interactive --seeds 0-3 --algos grpo-group

The test ``tests/test_learning_interactive.py`` pins the GRPO run. The README lists the seeds tried and the gains.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO, CausalLMPolicy
from textrl_envs.sb3 import make_vec_env

HP = {"n_steps": 32, "batch_size": 256, "n_epochs": 4, "learning_rate": 2e-4, "device": "cpu"}
# GRPO takes one epoch per update: with four (PPO's) its first update moved the policy by an approx_kl near 1 and
# the reward collapsed (0.20 -> 0.02 on seed 0). Groups of 4 (not 8) and 64-step rollouts: more of the steps belong
# to a group that finished within the rollout and get an advantage; vf_coef=0 and grad_var_coef=0 because group
# advantages need no critic (its loss only pulled on the shared LM) and the penalty only measured the value head.
GRPO_HP = {"n_steps": 64, "n_epochs": 1, "learning_rate": 5e-4, "vf_coef": 0.0, "grad_var_coef": 0.0}


def evaluate(model, env_id: str, episodes: int = 512, seed: int = 123) -> tuple[float, float, float]:
    """Mean reward, its standard error and mean turns of ``episodes`` sampled episodes on a separately seeded env."""
    env = make_vec_env(env_id, n_envs=16, seed=seed, device="cpu")
    obs, rewards, turns, running = env.reset(), [], [], np.zeros(16)
    while len(rewards) < episodes:
        actions, _ = model.predict(obs, deterministic=False)
        obs, r, dones, infos = env.step(actions)
        running += r
        for i in np.flatnonzero(dones):
            rewards.append(running[i])
            turns.append(infos[i]["turns"])
            running[i] = 0.0
    rewards = np.asarray(rewards[:episodes])
    return float(rewards.mean()), float(rewards.std(ddof=1) / np.sqrt(episodes)), float(np.mean(turns[:episodes]))


def build(algo: str, env_id: str, seed: int, group_size: int):
    if algo == "grpo-group":
        env = make_vec_env(env_id, n_envs=16, group_size=group_size, seed=seed, device="cpu")
        return GRPO("CausalLMPolicy", env, seed=seed, advantage="group", explore_alpha=0.0, **{**HP, **GRPO_HP})
    if algo == "ppo":
        env = make_vec_env(env_id, n_envs=16, seed=seed, device="cpu")
        return PPO(CausalLMPolicy, env, seed=seed, **HP)
    raise ValueError(f"unknown algo {algo!r}; use grpo-group or ppo")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="GuessNumber-v0", help="an interactive env id")
    parser.add_argument("--algos", default="grpo-group,ppo", help="comma-separated: grpo-group, ppo")
    parser.add_argument("--seeds", default="0", help="a seed or a range, e.g. 0-4")
    parser.add_argument("--updates", type=int, default=16, help="updates (rollouts of 16 envs x n_steps)")
    parser.add_argument("--group-size", type=int, default=4, help="prompt group size of grpo-group")
    parser.add_argument("--lr", type=float, default=HP["learning_rate"], help="learning rate (PPO)")
    parser.add_argument("--grpo-lr", type=float, default=GRPO_HP["learning_rate"], help="learning rate (GRPO)")
    parser.add_argument("--epochs", type=int, default=HP["n_epochs"], help="epochs per update (PPO)")
    parser.add_argument("--grpo-epochs", type=int, default=GRPO_HP["n_epochs"], help="epochs per update (GRPO)")
    parser.add_argument("--grpo-steps", type=int, default=GRPO_HP["n_steps"], help="rollout steps per env (GRPO)")
    parser.add_argument("--episodes", type=int, default=512, help="evaluation episodes")
    args = parser.parse_args(argv)
    HP.update(learning_rate=args.lr, n_epochs=args.epochs)
    GRPO_HP.update(learning_rate=args.grpo_lr, n_epochs=args.grpo_epochs, n_steps=args.grpo_steps)
    first, _, last = args.seeds.partition("-")
    th.set_num_threads(1)
    print("| algorithm | seed | reward untrained -> trained ± SE | turns | train wall s | CPU s |")
    print("|---|---|---|---|---|---|")
    for algo in args.algos.split(","):
        for seed in range(int(first), int(last or first) + 1):
            th.manual_seed(seed)
            model = build(algo, args.env, seed, args.group_size)
            model.set_logger(configure(None, []))
            before = evaluate(model, args.env, args.episodes)
            wall, cpu = time.perf_counter(), time.process_time()
            model.learn(16 * model.n_steps * args.updates)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            after = evaluate(model, args.env, args.episodes)
            print(
                f"| {algo} | {seed} | {before[0]:.3f} ± {before[1]:.3f} -> {after[0]:.3f} ± {after[1]:.3f} "
                f"| {before[2]:.2f} -> {after[2]:.2f} | {wall:.0f} | {cpu:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
