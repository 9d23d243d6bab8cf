"""GPU check: the vector env and one GRPO update on CUDA, with tokens/s, for whenever a GPU machine is at hand.

Three figures, each after a warm-up (CUDA context, kernels, allocator):

1. env steps/s: ``textrl_envs.sb3.make_vec_env`` stepped with random tokens (the env's state lives on the device);
2. rollout tokens/s: ``GRPO.collect_rollouts`` with ``CausalLMPolicy`` (KV-cached sampling, one forward per token);
3. update tokens/s: ``GRPO.train`` on that rollout (the text fast path: one forward per sequence), transitions x
   epochs per second.

It also prints the device, the peak GPU memory and whether parameters and buffers ended up on the device. Without
CUDA it says so and exits with status 0; ``--device cpu`` runs the same check on the CPU as a dry run::

    HF_HUB_OFFLINE=1 python scripts/gpu_check.py                           # CUDA, bundled LM
    HF_HUB_OFFLINE=1 python scripts/gpu_check.py --model gpt2-small --autocast bfloat16 --n-envs 64
    HF_HUB_OFFLINE=1 python scripts/gpu_check.py --device cpu --n-envs 4 --tokens 8   # dry run
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch as th

GPT2_SMALL = {"vocab_size": 50257, "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024}


def sync(device: th.device) -> None:
    if device.type == "cuda":
        th.cuda.synchronize(device)


def env_steps_per_s(env, device: th.device, steps: int, seed: int = 0) -> float:
    """Random-token steps of the SB3 VecEnv per second (all envs together)."""
    rng = np.random.default_rng(seed)
    env.reset()
    n = env.num_envs
    high = env.action_space.n
    for _ in range(min(steps, 8)):  # warm-up
        env.step(rng.integers(0, high, size=n))
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(rng.integers(0, high, size=n))
    sync(device)
    return n * steps / (time.perf_counter() - t0)


def grpo_rates(model, device: th.device, n_steps: int, epochs: int) -> tuple[float, float]:
    """(rollout tokens/s, update tokens/s) of one timed rollout + update after one warm-up of each."""
    from stable_baselines3.common.callbacks import CallbackList

    tokens = n_steps * model.env.num_envs
    model._setup_learn(10 * tokens, None)
    callback = CallbackList([])
    callback.init_callback(model)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_steps)  # warm-up
    model.train()
    sync(device)
    t0 = time.perf_counter()
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_steps)
    sync(device)
    t1 = time.perf_counter()
    model.train()
    sync(device)
    t2 = time.perf_counter()
    return tokens / (t1 - t0), tokens * epochs / (t2 - t1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    parser.add_argument("--model", default="bundled", choices=["bundled", "gpt2-small"])
    parser.add_argument("--n-envs", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="max new tokens per completion (= n_steps)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--env-steps", type=int, default=64, help="timed env steps")
    parser.add_argument("--autocast", default=None, help="bfloat16 or float16 autocast for the LM")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (needs peft)")
    args = parser.parse_args(argv)

    device = th.device(args.device)
    if device.type == "cuda" and not th.cuda.is_available():
        print(
            "CUDA is not available on this machine (torch.cuda.is_available() is False): nothing to check. "
            "Run it on a GPU machine, or pass --device cpu for a dry run of the same code on the CPU."
        )
        return 0
    if device.type == "cuda":
        th.cuda.set_device(device)
        th.cuda.reset_peak_memory_stats(device)
        print(f"device: {th.cuda.get_device_name(device)} ({device}), torch {th.__version__}, CUDA {th.version.cuda}")
    else:
        print(f"device: cpu (dry run), torch {th.__version__}, {th.get_num_threads()} threads")

    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    def make_env():
        return make_vec_env(
            "TextGen-v0",
            n_envs=args.n_envs,
            group_size=args.group_size,
            seed=0,
            device=str(device),
            max_new_tokens=args.tokens,
        )

    env_rate = env_steps_per_s(make_env(), device, args.env_steps)

    policy_kwargs: dict = {}
    if args.model == "gpt2-small":
        from transformers import GPT2Config, GPT2LMHeadModel

        th.manual_seed(0)
        policy_kwargs["model"] = GPT2LMHeadModel(GPT2Config(**GPT2_SMALL))
    if args.autocast:
        policy_kwargs["autocast_dtype"] = args.autocast
    if args.lora:
        policy_kwargs["lora"] = {"r": 8, "target_modules": ["c_attn"], "fan_in_fan_out": True}
    n_steps = args.tokens
    model = GRPO(
        "CausalLMPolicy",
        make_env(),
        n_steps=n_steps,
        batch_size=n_steps * args.n_envs // 2,
        n_epochs=args.epochs,
        learning_rate=1e-5,
        advantage="group",
        kl_coef=0.04,
        grad_var_coef=0.0,
        seed=0,
        device=device,
        policy_kwargs=policy_kwargs,
    )
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(None, []))
    rollout_rate, update_rate = grpo_rates(model, device, n_steps, args.epochs)

    on_device = all(p.device.type == device.type for p in model.policy.parameters())
    buffer_device = model.rollout_buffer.token_ids.device
    print(f"model: {args.model}, {sum(p.numel() for p in model.policy.parameters()) / 1e6:.1f}M params, "
          f"autocast={args.autocast}, lora={args.lora}")  # fmt: skip
    print(f"rollout: {args.n_envs} envs x {n_steps} steps (groups of {args.group_size}), {args.epochs} epoch(s)")
    print(f"{'env steps/s (random tokens)':34s} {env_rate:12.0f}")
    print(f"{'rollout tokens/s (GRPO, KV cache)':34s} {rollout_rate:12.0f}")
    print(f"{'update tokens/s (GRPO fast path)':34s} {update_rate:12.0f}")
    print(f"parameters on {device.type}: {on_device}; rollout buffer on {buffer_device}")
    if device.type == "cuda":
        print(f"peak GPU memory: {th.cuda.max_memory_allocated(device) / 2**20:.0f} MB")
    ok = on_device and np.isfinite(update_rate) and np.isfinite(rollout_rate)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
