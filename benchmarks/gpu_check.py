"""GPU check: every row of ``textrl-bench perf`` that a GPU changes, on CUDA, in one prepared run of under 5 minutes.

For whenever a GPU machine is at hand. It prints:

1. the device and versions;
2. the host-device synchronisations in GRPO's rollout loop on CUDA: one ``collect_rollouts`` with GRPO's defaults on
   ``TextGen-v0`` (EOS on, the env's reward) under ``torch.cuda.set_sync_debug_mode("warn")``, the number of
   synchronising calls per rollout step and the lines they come from (the CPU path needs the actions on the host for
   the env each step; anything else there is a sync to remove);
3. the perf rows on CUDA (:func:`benchmarks.perf.run_perf` with ``device="cuda"``): the vector env (against
   ``SyncVectorEnv``, ``"auto"`` against ``"cpu"``, special tokens), the rollout against ``generate`` without and with
   EOS and with a large batch, the reward's cost, GPT-2-small size against ``generate``, the update against stock
   ``PPO.train``, the penalty's cost (bundled LM and GPT-2-small size) and the peak GPU memory of one update (against
   TRL's when TRL is importable); the CPU-only rows (CartPole, the MLP penalty) and the loops against TRL are left to
   ``textrl-bench perf`` on a CPU;
4. the ``"vllm"`` rollout engine against ``generate`` at batch 64 (bundled LM and GPT-2-small size, EOS on; the
   target is 3x), when vLLM is importable (``pip install vllm``), else a line saying it is skipped;
5. ``perf.json`` / ``perf.md`` in ``--out``, and "OK" when every measurement ran.

Without CUDA it says which parts it skips and exits with status 0; ``--device cpu`` runs the same code on the CPU
with the smallest sizes as a dry run::

    HF_HUB_OFFLINE=1 python -m benchmarks.gpu_check --out runs/gpu-check         # CUDA
    HF_HUB_OFFLINE=1 python -m benchmarks.gpu_check --device cpu --out /tmp/dry  # dry run of the same code on the CPU
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch as th

#: The perf measurements a GPU changes (the others run on the CPU whatever the machine).
GPU_ROWS = ["env", "rollout", "reward", "rollout-gpt2", "update", "penalty-gpt2", "memory"]


def sync_check(device: th.device, n_envs: int = 64, tokens: int = 32) -> dict:
    """Synchronising CUDA calls in one ``collect_rollouts`` (GRPO defaults, TextGen-v0, EOS on), per step and by
    source line.

    :param device: A CUDA device.
    :param n_envs: Envs.
    :param tokens: Steps of the rollout.
    :return: ``{"syncs", "steps", "per_step", "sites": [(file:line, count), ...]}``.
    """
    from benchmarks.perf.rollout import collector, text_env

    collect = collector(text_env(n_envs, tokens, str(device)), tokens, str(device))
    collect()  # warm-up: kernels, allocator, the prefill memo's first fills
    th.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        th.cuda.set_sync_debug_mode("warn")
        try:
            collect()
        finally:
            th.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    sites = collections.Counter(f"{os.path.relpath(w.filename)}:{w.lineno}" for w in syncs)
    return {"syncs": len(syncs), "steps": tokens, "per_step": len(syncs) / tokens, "sites": sites.most_common(12)}


def vllm_check(device: th.device, dry_run: bool, out: Path) -> bool:
    """The ``"vllm"`` engine against ``generate`` at batch 64 (target 3x), printed and written to
    ``out/vllm.json``; skipped, saying so, without vLLM. Returns whether it ran without error (or was skipped)."""
    import json

    from benchmarks.perf.engine import vllm_available, vllm_vs_generate
    from benchmarks.perf.rollout import GPT2_SMOKE

    if not vllm_available():
        print("\nskipped: the vllm engine vs generate at batch 64 (vLLM not importable: pip install vllm)")
        return True
    n_envs, tokens = (8, 8) if dry_run else (64, 32)
    print(f"\nvllm engine vs generate, {n_envs} envs x {tokens} tokens, EOS on (target 3x):")
    try:
        rows = vllm_vs_generate(n_envs, tokens, 1 if dry_run else 3, str(device), gpt2=(n_envs, tokens),
                                gpt2_config=GPT2_SMOKE if dry_run else None, target=3.0)  # fmt: skip
    except Exception as err:  # reported, and the check fails
        print(f"  FAILED: {type(err).__name__}: {err}")
        return False
    for row in rows:
        ratio = "-" if row.get("ratio") is None else f"{row['ratio']:.2f}x"
        print(f"  {row['name']}: ours {row['ours']}, generate {row['baseline']} tokens/s, {ratio}, met: {row['met']}")
    (out / "vllm.json").write_text(json.dumps(rows, indent=2, default=str))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    parser.add_argument("--out", default=None, help="folder for perf.json / perf.md (default runs/gpu-check-<time>)")
    parser.add_argument("--threads", type=int, default=4, help="torch CPU threads (the CPU sides of the comparisons)")
    args = parser.parse_args(argv)
    device = th.device(args.device)
    if device.type == "cuda" and not th.cuda.is_available():
        print("CUDA is not available on this machine (torch.cuda.is_available() is False).")
        print("skipped: the sync check of the rollout loop on CUDA")
        print(f"skipped: the perf rows on CUDA ({', '.join(GPU_ROWS)})")
        print("Run it on a GPU machine, or pass --device cpu for a dry run of the same code on the CPU.")
        return 0
    th.set_num_threads(args.threads)
    dry_run = device.type != "cuda"
    if dry_run:
        print(f"device: cpu (dry run, smallest sizes), torch {th.__version__}, {th.get_num_threads()} threads")
    else:
        th.cuda.set_device(device)
        print(f"device: {th.cuda.get_device_name(device)} ({device}), torch {th.__version__}, CUDA {th.version.cuda}")

    start = time.perf_counter()
    ok = True
    if dry_run:
        print("\nsync check: CUDA only, skipped in a dry run")
    else:
        sync = sync_check(device)
        print(f"\nsync check: {sync['syncs']} synchronising calls in one rollout of {sync['steps']} steps "
              f"({sync['per_step']:.1f} per step); by line:")  # fmt: skip
        for site, count in sync["sites"]:
            print(f"  {count:5d}  {site}")

    from benchmarks.perf import run_perf

    out = Path(args.out) if args.out else Path("runs") / time.strftime("gpu-check-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    print()
    result = run_perf(out, quick=dry_run, device=str(device), only=GPU_ROWS)
    if result["errors"]:
        ok = False
    ok = vllm_check(device, dry_run, out) and ok
    print(f"\nall in {time.perf_counter() - start:.0f} s")
    print("OK" if ok else "FAILED: " + "; ".join(f"{e['measurement']}: {e['error']}" for e in result["errors"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
