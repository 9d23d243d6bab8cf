"""Update throughput: GRPO's sequence path against stock SB3 ``PPO.train`` on the same rollout.

A command-line front end to :func:`sb3_grpo.bench.perf.update_seq_vs_stock` (also run by ``sb3-grpo perf``).
Measured side by side in one run, calls interleaved, medians of ``--repeats``:

1. seconds per update (and tokens/s) of GRPO's text fast path (``SequenceRolloutBuffer``, one forward per
   sequence) with every extra off, against stock ``PPO.train`` (one forward per transition over its whole
   prefix), on one TextGen-v0 rollout of the bundled LM, same weights and hyperparameters; target >= 10x at
   32 tokens;
2. on that rollout, the cost factor of the gradient-variance penalty (all LM parameters, and the last block).

::

    HF_HUB_OFFLINE=1 python scripts/bench_update.py            # 16 envs x 64 steps, 32-token budget
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch as th

from sb3_grpo.bench.perf import markdown_table, update_seq_vs_stock


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32, help="the env's completion budget")
    parser.add_argument("--n-steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is steadiest on a shared 2-core machine)"
    )
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    rows = update_seq_vs_stock(args.n_envs, args.tokens, args.n_steps, args.repeats)
    print(markdown_table(rows))
    tokens = args.n_envs * args.n_steps
    print(
        f"sequence path {tokens / rows[0]['ours']:.0f} tokens/s, stock PPO.train {tokens / rows[0]['baseline']:.0f} "
        f"tokens/s: {rows[0]['ratio']:.1f}x (target >= 10x)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
