"""What CausalLMPolicy's observation-layout check costs a rollout (it runs at every step).

Times one SB3 ``collect_rollouts`` of the bundled LM on ``TextGen-v0`` (the rollout row of ``textrl-bench perf``) with
the check (:func:`sb3_grpo.policies.policy_kwargs.check_layout`) and with it replaced by a no-op, calls alternating in
one process, and the check alone on one step's batch. Prints medians and the ratio::

    python -m benchmarks.layout_check            # 16 envs x 32 tokens, 7 repeats
    python -m benchmarks.layout_check --repeats 15 --n-envs 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-envs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    import torch as th

    from benchmarks.perf.rollout import collector, text_env
    from benchmarks.timing import interleaved
    from sb3_grpo.policies import causal_lm, validation

    th.set_num_threads(1)
    collect = collector(text_env(args.n_envs, args.tokens, "cpu"), args.tokens, "cpu")

    def without_check() -> None:
        causal_lm.check_layout = lambda *_observations: None  # the check off: nothing is checked
        try:
            collect()
        finally:
            causal_lm.check_layout = validation.check_layout

    wall, cpu = interleaved({"with check": collect, "without check": without_check}, args.repeats)

    from textrl_envs.tasks import get_task

    width = get_task("TextGen-v0").max_prompt_tokens + args.tokens  # the env's window W
    ids = th.randint(1, 100, (args.n_envs, width))
    mask = th.ones(args.n_envs, width, dtype=th.long)
    mask[:, : width // 3] = 0
    times = []
    for _ in range(2000):
        start = time.perf_counter()
        validation.check_layout(ids, mask)
        times.append(time.perf_counter() - start)
    one = statistics.median(times)

    steps = args.tokens
    print(f"TextGen-v0, bundled LM, {args.n_envs} envs x {steps} tokens, 1 thread, median of {args.repeats}")
    for name in wall:
        print(f"  rollout {name:14s} {wall[name]:.3f} s wall, {cpu[name]:.3f} s CPU")
    print(f"  ratio with / without (wall): {wall['with check'] / wall['without check']:.3f}")
    print(f"  ratio with / without (CPU):  {cpu['with check'] / cpu['without check']:.3f}")
    print(
        f"  check_layout alone on a ({args.n_envs}, {width}) batch: {one * 1e6:.1f} us; "
        f"{one * steps * 2 / wall['with check'] * 100:.2f}% of the rollout at two calls per step"
    )


if __name__ == "__main__":
    main()
