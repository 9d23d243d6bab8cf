"""Update throughput: GRPO's sequence path against stock SB3 ``PPO.train`` on the same rollout.

Measured side by side in one run, on this machine:

1. update tokens/s (transitions x epochs per second of ``train()``) of GRPO's text fast path
   (:class:`~sb3_grpo.buffers.SequenceRolloutBuffer`, one forward per sequence) with every extra off,
   against stock ``PPO.train`` (one forward per transition over its whole prefix) on the same rollout,
   same policy weights and hyperparameters; target >= 10x at 32 tokens;
2. the cost factor of the gradient-variance penalty: GRPO's fast-path update with ``grad_var_coef > 0``
   against the same update without it.

The rollout: ``TextGen-v0`` with the bundled LM, ``--n-envs`` envs, ``--tokens``-token completions,
``--n-steps`` steps per env. Each figure is the median of ``--repeats`` updates; every update starts from
the same weights and optimizer state (a copy), so they do the same work::

    HF_HUB_OFFLINE=1 python scripts/bench_update.py                # 16 envs, 32 tokens, 64 steps
    HF_HUB_OFFLINE=1 python scripts/bench_update.py --json out.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import DictRolloutBuffer
from stable_baselines3.common.callbacks import CallbackList
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO, CausalLMPolicy
from sb3_grpo.buffers import episode_segments
from textrl_envs.sb3 import make_vec_env

OFF = {"grad_var_coef": 0.0, "adaptive_clip": None, "explore_alpha": 0.0, "advantage": "gae", "kl_coef": 0.0}


def collect_rollout(model, n_steps: int) -> None:
    """Fill ``model.rollout_buffer`` with one rollout (no update)."""
    model._setup_learn(n_steps * model.env.num_envs, None)
    callback = CallbackList([])
    callback.init_callback(model)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_steps)


def per_transition_copy(model, buf) -> DictRolloutBuffer:
    """A ``DictRolloutBuffer`` with exactly the data of a ``SequenceRolloutBuffer`` (for stock PPO)."""
    out = DictRolloutBuffer(
        buf.buffer_size, model.observation_space, model.action_space, model.device, buf.gae_lambda, buf.gamma, buf.n_envs
    )
    out.observations = {"input_ids": buf.token_ids.cpu().numpy().copy(), "attention_mask": buf.token_mask.cpu().numpy().copy()}
    for name in ("actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages"):
        setattr(out, name, getattr(buf, name).copy())
    out.full, out.pos = True, buf.pos
    return out


def time_updates(model, make_buffer, repeats: int) -> list[float]:
    """Seconds of ``model.train()``, each on a fresh ``make_buffer()`` from the same starting weights and
    optimizer state (SB3's ``get`` reorders a ``DictRolloutBuffer`` in place, so each update gets its own)."""
    start_policy = copy.deepcopy(model.policy.state_dict())
    start_optim = copy.deepcopy(model.policy.optimizer.state_dict())
    times = []
    for _ in range(repeats):
        model.policy.load_state_dict(start_policy)
        model.policy.optimizer.load_state_dict(start_optim)
        model.rollout_buffer = make_buffer()
        t0 = time.perf_counter()
        model.train()
        times.append(time.perf_counter() - t0)
    return times


def measure(n_envs: int = 16, tokens: int = 32, n_steps: int = 64, epochs: int = 1, repeats: int = 3,
            grad_var_params: list[str] | None = None) -> dict:
    """Run the side-by-side measurement; returns a dict of figures (seconds, tokens/s, ratios)."""
    env = make_vec_env("TextGen-v0", n_envs=n_envs, seed=0, device="cpu", max_new_tokens=tokens)
    batch = n_steps * n_envs // 4
    hp = {"n_steps": n_steps, "batch_size": batch, "n_epochs": epochs, "seed": 0, "device": "cpu"}
    fast = GRPO("CausalLMPolicy", env, **hp, **OFF)
    fast.set_logger(configure(None, []))
    collect_rollout(fast, n_steps)
    seq_buffer = fast.rollout_buffer
    transitions = n_steps * n_envs

    ppo = PPO(CausalLMPolicy, env, **hp)
    ppo.set_logger(configure(None, []))
    ppo.policy.load_state_dict(fast.policy.state_dict())

    penalty = GRPO("CausalLMPolicy", env, **hp, **{**OFF, "grad_var_coef": 0.01, "grad_var_params": grad_var_params})
    penalty.set_logger(configure(None, []))
    penalty.policy.load_state_dict(fast.policy.state_dict())

    t_fast = statistics.median(time_updates(fast, lambda: seq_buffer, repeats))
    t_penalty = statistics.median(time_updates(penalty, lambda: seq_buffer, repeats))
    t_ppo = statistics.median(time_updates(ppo, lambda: per_transition_copy(ppo, seq_buffer), repeats))
    episodes = len(episode_segments(seq_buffer.episode_starts))
    return {
        "n_envs": n_envs,
        "tokens": tokens,
        "n_steps": n_steps,
        "epochs": epochs,
        "transitions": transitions,
        "sequences": episodes,
        "window": int(seq_buffer.token_ids.shape[-1]),
        "torch_threads": th.get_num_threads(),
        "ppo_train_s": t_ppo,
        "sequence_train_s": t_fast,
        "grad_var_train_s": t_penalty,
        "grad_var_params": grad_var_params or "all",
        "ppo_tokens_per_s": transitions * epochs / t_ppo,
        "sequence_tokens_per_s": transitions * epochs / t_fast,
        "speedup": t_ppo / t_fast,
        "grad_var_cost_factor": t_penalty / t_fast,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--n-steps", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadiest on a shared 2-core machine)")
    parser.add_argument("--grad-var-params", nargs="*", default=None, help="parameter-name prefixes (default: all)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    r = measure(args.n_envs, args.tokens, args.n_steps, args.epochs, args.repeats, args.grad_var_params)
    print(
        f"update on one TextGen-v0 rollout: {r['n_envs']} envs x {r['n_steps']} steps = {r['transitions']} transitions "
        f"in {r['sequences']} sequences, {r['tokens']}-token completions (window {r['window']}), {r['epochs']} epoch(s), "
        f"{r['torch_threads']} torch thread(s), median of repeats"
    )
    print(f"{'path':38s} {'s/update':>9s} {'tokens/s':>10s}")
    print(f"{'stock PPO.train (per transition)':38s} {r['ppo_train_s']:9.3f} {r['ppo_tokens_per_s']:10.0f}")
    print(f"{'GRPO sequence path (extras off)':38s} {r['sequence_train_s']:9.3f} {r['sequence_tokens_per_s']:10.0f}")
    print(f"{'GRPO sequence path + grad-var penalty':38s} {r['grad_var_train_s']:9.3f}")
    print(f"speed-up of the sequence path: {r['speedup']:.1f}x (target >= 10x)")
    print(f"cost factor of the gradient-variance penalty (params: {r['grad_var_params']}): {r['grad_var_cost_factor']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return r


if __name__ == "__main__":
    main()
