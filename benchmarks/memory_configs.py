"""Memory of one GRPO update (rollout + train, the text fast path), with and without LoRA and checkpointing.

Each configuration runs in its own subprocess, so the peaks do not mix: peak RSS (``ru_maxrss``) and, on CUDA, peak
GPU memory (``torch.cuda.max_memory_allocated``). The figures per configuration:

- ``base MB``: peak RSS after the imports (Python, torch, transformers, peft; TRL and datasets in TRL's rows) and the
  env (tokenizer, prompts, reward), before any model is built;
- ``built MB``: peak RSS once ``GRPO`` is built (the model, its KL reference: a frozen copy without LoRA, the
  adapter-off
  model with LoRA);
- ``peak MB``: peak RSS over the rollout and the update (activations, gradients, Adam state);
- ``update MB``: ``peak - base``, what the training itself costs; the ratios compare it with the full model's.

Setup (the same for every row, and for TRL's ``GRPOTrainer`` when TRL is importable): ``TextGen-v0`` with its bundled
tokenizer and reward, ``--n-envs`` completions of up to ``--tokens`` tokens in groups of ``--group-size`` (one
episode per env: ``n_steps = tokens``), ``advantage="group"`` with ``kl_coef=0.04`` (DeepSeekMath's beta), one epoch
over the rollout as one minibatch, no gradient-variance penalty (TRL has none). Models: the bundled LM and a
GPT-2-small-size model built from a config (12 layers, 768 wide, 50257-token vocabulary, random weights). LoRA: rank 8
on ``c_attn``. TRL is not a dependency: without it the TRL rows print "TRL not installed"::

    HF_HUB_OFFLINE=1 python -m benchmarks.memory_configs                  # all rows, a few minutes on a CPU
    HF_HUB_OFFLINE=1 python -m benchmarks.memory_configs --models bundled --json mem.json
    PYTHONPATH=/path/to/trl/site HF_HUB_OFFLINE=1 python -m benchmarks.memory_configs   # with TRL rows

Figures of ``--autocast bfloat16`` on a 2-core CPU shared with other jobs (torch 2.13, transformers 5.24, peft 0.21.2,
TRL 1.16.0 on ``PYTHONPATH``), peak RSS in MB (timings are noisy there; memory is not)::

    model       configuration           params M  train M  base MB  built MB  peak MB  update MB  x full
    bundled     GRPO + full                  1.0     0.97      367       384      424         56    1.00
    bundled     GRPO + LoRA + ckpt           1.0     0.02      367       380      416         49    0.87
    bundled     TRL GRPOTrainer + full       1.0     0.97      482       498      536         54    0.97
    gpt2-small  GRPO + full                124.4   124.44      367      1324     3223       2856    1.00
    gpt2-small  GRPO + full + ckpt         124.4   124.44      367      1324     3157       2790    0.98
    gpt2-small  GRPO + LoRA                124.7     0.30      367       990     1151        784    0.27
    gpt2-small  GRPO + LoRA + ckpt         124.7     0.30      367       990     1010        643    0.23
    gpt2-small  GRPO + full + bfloat16     124.4   124.44      367      1324     3181       2814    0.99
    gpt2-small  TRL GRPOTrainer + full     124.4   124.44      482      1106     3012       2530    0.89
    gpt2-small  TRL GRPOTrainer + LoRA     124.7     0.29      482      1106     1346        864    0.30

The full model's update is weights + frozen KL copy + gradients + Adam state (about 4 x 4 bytes x 124M plus the
copy); LoRA drops the copy (the reference is the adapter-off model), the gradients and Adam state of the LM: 0.27x.
With this small rollout (128 tokens) activations are small, so checkpointing saves little; CPU autocast keeps fp32
weights, so it saves little memory here (it is for speed and activation memory on GPUs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.perf.memory import KL_COEF, child, label, run_child  # noqa: E402  (after the environment variables above)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bundled", "gpt2-small"], choices=["bundled", "gpt2-small"])
    parser.add_argument("--n-envs", type=int, default=8, help="completions per rollout")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="max completion tokens (= n_steps)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per child")
    parser.add_argument("--autocast", default=None, help="also run GRPO rows with this autocast dtype (bfloat16)")
    parser.add_argument("--no-trl", action="store_true", help="skip TRL even when it is installed")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per configuration")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return []

    if args.device is None:
        import torch as th

        args.device = "cuda" if th.cuda.is_available() else "cpu"
    have_trl = importlib.util.find_spec("trl") is not None and not args.no_trl
    common = {
        "n_envs": args.n_envs,
        "group_size": args.group_size,
        "tokens": args.tokens,
        "device": args.device,
        "threads": args.threads,
    }
    rows = []
    for model in args.models:
        variants = [(False, False), (False, True), (True, False), (True, True)]
        configs = [{**common, "impl": "grpo", "model": model, "lora": lo, "ckpt": ck} for lo, ck in variants]
        if args.autocast:
            configs.append({**common, "impl": "grpo", "model": model, "lora": False, "ckpt": False,
                            "autocast": args.autocast})  # fmt: skip
        if have_trl:
            configs += [{**common, "impl": "trl", "model": model, "lora": lo, "ckpt": False} for lo in (False, True)]
        for cfg in configs:
            print(f"running {model}: {label(cfg)} ...", file=sys.stderr, flush=True)
            rows.append(run_child(cfg, args.timeout))

    print(
        f"\nOne GRPO update (rollout + train) on TextGen-v0: {args.n_envs} completions of up to {args.tokens} tokens, "
        f"groups of {args.group_size}, kl_coef={KL_COEF}, device {args.device}, {args.threads} torch thread(s) per run"
    )
    gpu = args.device.startswith("cuda")
    head = f"{'model':11s} {'configuration':32s} {'params M':>8s} {'train M':>8s} {'base MB':>8s} {'built MB':>8s} "
    head += f"{'peak MB':>8s} {'update MB':>9s} {'x full':>7s} {'update s':>8s}" + (f" {'GPU MB':>8s}" if gpu else "")
    print(head)
    for model in args.models:
        ref = next((r for r in rows if r["model"] == model and r["impl"] == "grpo" and not r["lora"] and not r["ckpt"]
                    and not r.get("autocast") and "error" not in r), None)  # fmt: skip
        for r in (r for r in rows if r["model"] == model):
            if "error" in r:
                print(f"{model:11s} {label(r):32s} failed: {r['error'][:200]}")
                continue
            update = r["peak_mb"] - r["base_mb"]
            ratio = update / (ref["peak_mb"] - ref["base_mb"]) if ref else float("nan")
            line = f"{model:11s} {label(r):32s} {r['params_m']:8.1f} {r['trainable_m']:8.2f} {r['base_mb']:8.0f} "
            line += f"{r['built_mb']:8.0f} {r['peak_mb']:8.0f} {update:9.0f} {ratio:7.2f} {r['update_s']:8.1f}"
            if gpu:
                line += f" {r['gpu_peak_mb'] or float('nan'):8.0f}"
            print(line)
    if not have_trl:
        print("TRL not installed: no GRPOTrainer rows (pip install trl, or put it on PYTHONPATH, to compare)")
    print(
        "update MB = peak RSS - RSS after the imports and the env (base MB); "
        "x full = update MB / that of the same model's GRPO + full row"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
