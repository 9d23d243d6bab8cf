"""Env-only throughput: TextGenVectorEnv against SyncVectorEnv of N single envs, side by side.

Random actions, N envs, ``--max-new-tokens``-token episodes (random word tokens, no EOS, so every
episode runs the full budget; ``--eos-prob p`` makes a random action EOS with probability p, so
episodes end at different times), a cheap length reward so the env itself is what is measured. Each repeat times the
vector env and the SyncVectorEnv on the same pre-drawn actions;
the script prints the median env-steps per second of each and their ratio (per wall-clock second,
and per CPU second of the process, which other processes on a shared machine do not distort), the
same on CUDA when available, and the memory figure (observation dtype, bytes per env, N=1024 x 256-token windows)::

    python scripts/bench_vector.py                 # N=256, 32-token episodes, 5 repeats
    python scripts/bench_vector.py --eos-prob 0.03 # episodes of ~20 tokens on average, out of step
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from textrl_envs.vector import TextGenVectorEnv

BENCH_ID = "TextRLBench/Tiny-v0"


def length_reward(prompts, completions, **kwargs):  # noqa: ARG001  (a reward's signature)
    """Cheap reward: number of characters of the completion."""
    return [float(len(c)) for c in completions]


def make_tokenizer(vocab_words: int):
    """A word-level Hugging Face tokenizer with ``vocab_words`` words plus pad/eos/unk (built offline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(vocab_words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


def env_kwargs(tokenizer, max_new_tokens: int, max_prompt_tokens: int, n_prompts: int = 64) -> dict:
    rng = np.random.default_rng(0)
    words = len(tokenizer) - 3
    prompts = [" ".join(f"w{w}" for w in rng.integers(0, words, rng.integers(3, 9))) for _ in range(n_prompts)]
    return dict(
        prompts=prompts,
        reward=length_reward,
        tokenizer=tokenizer,
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
    )


def time_steps(env, actions: np.ndarray, to_device=None) -> tuple[float, float]:
    """Env-steps per second of ``env`` over the rows of ``actions`` (after a reset).

    :return: ``(per wall-clock second, per CPU second of this process)``; the second is robust to
        other processes taking the cores of a shared machine.
    """
    env.reset(seed=0)
    batches = [torch.as_tensor(a, device=to_device) for a in actions] if to_device is not None else list(actions)
    if to_device is not None and to_device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    for a in batches:
        env.step(a)
    if to_device is not None and to_device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return actions.size / wall, actions.size / max(cpu, 1e-9)


def draw_actions(rng: np.random.Generator, shape: tuple[int, int], vocab: int, eos_prob: float) -> np.ndarray:
    """Uniform random word tokens (ids 3..vocab-1); EOS (id 1) with probability ``eos_prob``."""
    actions = rng.integers(3, vocab, shape)
    if eos_prob > 0:
        actions[rng.random(shape) < eos_prob] = 1
    return actions


def bench(num_envs: int, steps: int, repeats: int, kw: dict, device: str, obs_backend: str, eos_prob: float) -> dict:
    vocab = len(kw["tokenizer"])
    rng = np.random.default_rng(1)
    vec = TextGenVectorEnv(num_envs=num_envs, device=device, obs_backend=obs_backend, **kw)
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(BENCH_ID, **kw) for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    dev = vec.device if obs_backend == "torch" else None
    vec_rates, sync_rates = [], []
    time_steps(vec, draw_actions(rng, (5, num_envs), vocab, eos_prob), dev)  # warm-up (allocator, kernels)
    for _ in range(repeats):
        actions = draw_actions(rng, (steps, num_envs), vocab, eos_prob)
        vec_rates.append(time_steps(vec, actions, dev))
        sync_rates.append(time_steps(sync, actions))
    sync.close()
    v, s = statistics.median(r[0] for r in vec_rates), statistics.median(r[0] for r in sync_rates)
    v_cpu, s_cpu = statistics.median(r[1] for r in vec_rates), statistics.median(r[1] for r in sync_rates)
    return {
        "device": str(vec.device),
        "obs_backend": obs_backend,
        "vector": v,
        "sync": s,
        "ratio": v / s,
        "vector_cpu": v_cpu,
        "sync_cpu": s_cpu,
        "ratio_cpu": v_cpu / s_cpu,
    }


def memory_figure(kw: dict, device: str) -> dict:
    kw = dict(kw, max_prompt_tokens=64, max_new_tokens=192)
    vec = TextGenVectorEnv(num_envs=1024, device=device, **kw)
    obs, _ = vec.reset(seed=0)
    for _ in range(3):
        obs, *_ = vec.step(np.full(1024, 5))
    return {
        "window": vec.text_spec.window,
        "dtype": str(obs["input_ids"].dtype),
        "state_bytes": vec.state_nbytes(),
        "bytes_per_env": vec.state_nbytes() / 1024,
        "obs_bytes": sum(a.nbytes for a in obs.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=320, help="vector steps per timed run (10 episodes of 32)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=2000, help="tokenizer words (plus pad, eos, unk)")
    parser.add_argument(
        "--eos-prob",
        type=float,
        default=0.0,
        help="probability that a random action is EOS (default 0: every episode is max-new-tokens long; "
        "> 0 ends episodes at different times)",
    )
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch intra-op threads (default: torch's own choice)"
    )
    args = parser.parse_args()
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)

    if BENCH_ID not in gym.registry:
        gym.register(
            BENCH_ID,
            entry_point="textrl_envs.env:TextGenEnv",
            vector_entry_point="textrl_envs.vector:TextGenVectorEnv",
            kwargs={"task": None},
        )
    kw = env_kwargs(make_tokenizer(args.vocab), args.max_new_tokens, args.max_prompt_tokens)
    print(
        f"env-only throughput: N={args.num_envs}, {args.max_new_tokens}-token episodes "
        f"(W={args.max_prompt_tokens + args.max_new_tokens}), random word tokens out of {len(kw['tokenizer'])}, "
        f"EOS probability {args.eos_prob}, "
        f"{args.steps} steps x {args.repeats} repeats (median); torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads"
    )
    print(
        f"{'device':<8} {'obs':<6} {'vector env-steps/s':>20} {'SyncVectorEnv env-steps/s':>27} {'ratio':>8}"
        f"   | per CPU-second: {'vector':>11} {'sync':>9} {'ratio':>7}"
    )
    configs = [("cpu", "numpy"), ("cpu", "torch")]
    if torch.cuda.is_available():
        configs += [("cuda", "numpy"), ("cuda", "torch")]
    for device, backend in configs:
        r = bench(args.num_envs, args.steps, args.repeats, kw, device, backend, args.eos_prob)
        print(
            f"{r['device']:<8} {r['obs_backend']:<6} {r['vector']:>20,.0f} {r['sync']:>27,.0f} {r['ratio']:>7.1f}x"
            f"   |                 {r['vector_cpu']:>11,.0f} {r['sync_cpu']:>9,.0f} {r['ratio_cpu']:>6.1f}x"
        )
    m = memory_figure(kw, "cpu")
    print(
        f"memory: N=1024 x W={m['window']} windows, observations {m['dtype']}: device state "
        f"{m['state_bytes']:,} bytes ({m['bytes_per_env']:,.0f} bytes per env = ids + mask int64 + counter); "
        f"one returned observation batch {m['obs_bytes']:,} bytes"
    )


if __name__ == "__main__":
    main()
