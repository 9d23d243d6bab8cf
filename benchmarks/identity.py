"""GRPO's defaults against stock PPO on SB3's identity checks (``tests/test_identity.py`` of stable-baselines3).

Discrete, MultiDiscrete and MultiBinary identities of dimension 4 (gamma 0.4, 2,500 steps, SB3's threshold 90 of 100)
on seeds 3 and 0, and ``IdentityEnvBox(eps=0.5)`` (net 64x64, gamma 0.95, 2,000 steps) on seed 0; the mean reward of
20 deterministic evaluation episodes, and the CPU seconds of each run. About a minute of CPU::

    python -m benchmarks.identity
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.envs import IdentityEnv, IdentityEnvBox, IdentityEnvMultiBinary, IdentityEnvMultiDiscrete
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_grpo import GRPO


def score(cls: type, make_env, seed: int, steps: int, **kwargs) -> tuple[float, float]:
    """Train ``cls`` with its defaults (plus ``kwargs``) and return (mean evaluation reward, CPU seconds)."""
    start = time.process_time()
    env = DummyVecEnv([make_env])
    model = cls("MlpPolicy", env, seed=seed, **kwargs).learn(steps)
    reward, _ = evaluate_policy(model, env, n_eval_episodes=20, warn=False)
    return reward, time.process_time() - start


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # only --help
    th.set_num_threads(1)
    warnings.filterwarnings("ignore")
    cases = [
        ("Discrete", lambda: IdentityEnv(4)),
        ("MultiDiscrete", lambda: IdentityEnvMultiDiscrete(4)),
        ("MultiBinary", lambda: IdentityEnvMultiBinary(4)),
    ]
    print("env | seed | PPO | GRPO (defaults) | CPU s PPO / GRPO")
    for name, make_env in cases:
        for seed in (3, 0):
            ppo, t_ppo = score(PPO, make_env, seed, 2500, gamma=0.4)
            grpo, t_grpo = score(GRPO, make_env, seed, 2500, gamma=0.4)
            print(f"{name} | {seed} | {ppo:.1f} | {grpo:.1f} | {t_ppo:.1f} / {t_grpo:.1f}", flush=True)
    box = dict(policy_kwargs=dict(net_arch=[64, 64]), gamma=0.95)
    ppo, t_ppo = score(PPO, lambda: IdentityEnvBox(eps=0.5), 0, 2000, **box)
    grpo, t_grpo = score(GRPO, lambda: IdentityEnvBox(eps=0.5), 0, 2000, **box)
    print(f"Box | 0 | {ppo:.1f} | {grpo:.1f} | {t_ppo:.1f} / {t_grpo:.1f}")


if __name__ == "__main__":
    main()
