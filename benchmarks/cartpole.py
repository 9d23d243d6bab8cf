"""
Stock SB3 PPO against GRPO with its defaults, over a few seeds (a benchmark, not a test).

Prints, per algorithm and seed, the mean evaluation return (deterministic policy, ``--eval-episodes``
episodes on a separately seeded env), the wall time, and the mean time of one ``train()`` call (one update:
``n_epochs`` passes over the rollout), so the cost factor of the gradient-variance penalty can be read off
the ``grpo`` and ``grpo-nogradvar`` rows (the penalty's cost on one update alone, calls interleaved, is the
``grad-var-mlp`` row of ``textrl-bench perf``).

    python -m benchmarks.cartpole                                  # CartPole-v1, 100k steps, seeds 0 1 2
    python -m benchmarks.cartpole --algos grpo --seeds 0 1 2 3 4
    # Pendulum-v1 with the rl-zoo PPO hyperparameters, GRPO exploring with alpha = 0.2
    python -m benchmarks.cartpole --env Pendulum-v1 --n-envs 4 --steps 100000 --algos ppo grpo-explore \\
        --kwargs '{"n_steps": 1024, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10, "learning_rate": 1e-3,
                   "use_sde": true, "sde_sample_freq": 4}'

Results on this project's 2-core CPU box shared with other jobs (2026-11-29; wall times are noisy):

- CartPole-v1, 100k steps, seeds 0 1 2, 10 deterministic eval episodes: ``ppo`` 500 / 500 / 500,
  ``grpo`` (defaults) 500 / 500 / 500, ``grpo-nogradvar`` 500 / 500 / 500; seeds 3 4 on a quieter
  machine: ``ppo`` 500 / 500 (37 s each, 0.37 s per update), ``grpo`` 500 / 500 (65 s, 0.87 s per update).
- Pendulum-v1 (rl-zoo hyperparameters below, 4 envs, 100k steps, seed 0): ``ppo`` -119 +- 72,
  ``grpo-explore`` (defaults, ``explore_alpha=0.2``) -119 +- 72 (the untrained policy: -1049 +- 206).

Algorithms: ``ppo`` (stock SB3 PPO), ``grpo`` (GRPO defaults), ``grpo-nogradvar`` (defaults with
``grad_var_coef=0``), ``grpo-explore`` (defaults with ``explore_alpha=0.2``), ``grpo-off`` (every GRPO extra off: must
match ``ppo`` exactly).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_grpo import GRPO
from sb3_grpo.grpo.extras import EXTRAS_OFF

ALGOS = {
    "ppo": (PPO, {}),
    "grpo": (GRPO, {}),
    "grpo-nogradvar": (GRPO, {"grad_var_coef": 0.0}),
    "grpo-explore": (GRPO, {"explore_alpha": 0.2}),
    "grpo-off": (GRPO, EXTRAS_OFF.switches()),
}


def run(algo: str, env_id: str, seed: int, steps: int, eval_episodes: int, extra: dict, n_envs: int = 1) -> dict:
    cls, algo_kwargs = ALGOS[algo]
    env = env_id if n_envs == 1 else make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model = cls("MlpPolicy", env, seed=seed, device="cpu", **{**extra, **algo_kwargs})
    train_times: list[float] = []
    original_train = model.train

    def timed_train() -> None:
        start = time.perf_counter()
        original_train()
        train_times.append(time.perf_counter() - start)

    model.train = timed_train  # type: ignore[method-assign]
    start = time.perf_counter()
    model.learn(steps)
    wall = time.perf_counter() - start
    eval_env = make_vec_env(env_id, n_envs=1, seed=10_000 + seed)
    mean_return, std_return = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes, deterministic=True)
    return {
        "algo": algo,
        "seed": seed,
        "eval_return": float(mean_return),
        "eval_std": float(std_return),
        "wall_s": wall,
        "update_s": float(np.mean(train_times)) if train_times else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", default=["ppo", "grpo", "grpo-nogradvar"], choices=sorted(ALGOS))
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--n-envs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for small MLPs)")
    parser.add_argument("--kwargs", default="{}", help="JSON dict of extra constructor kwargs for every algo")
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    extra = json.loads(args.kwargs)
    results = []
    print(f"{args.env}, {args.steps} steps, seeds {args.seeds}, extra kwargs {extra}")
    print(f"{'algo':<16}{'seed':>5}{'eval return':>14}{'wall s':>9}{'s/update':>10}")
    for algo in args.algos:
        for seed in args.seeds:
            res = run(algo, args.env, seed, args.steps, args.eval_episodes, extra, args.n_envs)
            results.append(res)
            print(
                f"{algo:<16}{seed:>5}{res['eval_return']:>9.1f} ±{res['eval_std']:<4.0f}"
                f"{res['wall_s']:>9.1f}{res['update_s']:>10.3f}",
                flush=True,
            )
    print("\nsummary")
    for algo in args.algos:
        rows = [r for r in results if r["algo"] == algo]
        returns = [r["eval_return"] for r in rows]
        print(
            f"{algo:<16} mean eval return {np.mean(returns):7.1f}  min {np.min(returns):7.1f}  "
            f"mean s/update {np.mean([r['update_s'] for r in rows]):.3f}  "
            f"mean wall {np.mean([r['wall_s'] for r in rows]):.1f} s"
        )
    if "grpo" in args.algos and "grpo-nogradvar" in args.algos:
        with_gv = np.mean([r["update_s"] for r in results if r["algo"] == "grpo"])
        without = np.mean([r["update_s"] for r in results if r["algo"] == "grpo-nogradvar"])
        print(f"grad-var penalty cost factor (time per update, with / without): {with_gv / without:.2f}x")


if __name__ == "__main__":
    main()
