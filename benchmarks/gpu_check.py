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
4. the scaling checks on the device: one update with ``micro_batch_size`` against the unsplit one (the parameters
   after it equal to float rounding, and the peak memory of each), and LoRA on a 4-bit (NF4) bitsandbytes base (only
   the adapters move, the loss is finite, a reloaded checkpoint predicts the same; skipped, saying why, without
   bitsandbytes); FSDP over 2 ranks is not part of it yet (``tests/test_fsdp.py`` runs it on gloo);
5. the ``"vllm"`` rollout engine against ``generate`` at batch 64 (bundled LM and GPT-2-small size, EOS on; the
   target is 3x), when vLLM is importable (``pip install vllm``), else a line saying it is skipped;
6. ``perf.json`` / ``perf.md`` in ``--out``, and "OK" when every measurement ran.

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


def _grpo(device: th.device, **kwargs):
    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=8, group_size=4, seed=0, device=str(device), max_new_tokens=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GRPO("CausalLMPolicy", env, n_steps=8, batch_size=64, n_epochs=1, seed=0, advantage="group",
                    grad_var_coef=0.0, device=str(device), **kwargs)  # fmt: skip


def _peak_mb(device: th.device) -> float:
    return th.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")


def micro_batch_check(device: th.device) -> dict:
    """One ``learn`` unsplit and with ``micro_batch_size=2``: the largest parameter difference and the peaks."""
    results = {}
    for micro in (None, 2):
        if device.type == "cuda":
            th.cuda.reset_peak_memory_stats(device)
        model = _grpo(device, micro_batch_size=micro)
        model.learn(64)
        results[micro] = ({n: p.detach().cpu() for n, p in model.policy.named_parameters()}, _peak_mb(device))
    diff = max((results[None][0][n] - results[2][0][n]).abs().max().item() for n in results[None][0])
    return {"max_param_diff": diff, "peak_mb_unsplit": results[None][1], "peak_mb_micro2": results[2][1]}


def quantized_lora_check(device: th.device, folder: Path) -> dict:
    """LoRA on a 4-bit NF4 base (bitsandbytes): base unchanged, adapters moved, finite loss, exact reload."""
    import shutil

    from sb3_grpo import GRPO
    from textrl_envs.assets import lm_path

    base_dir = shutil.copytree(lm_path(), folder / "base", dirs_exist_ok=True)
    if device.type == "cuda":
        th.cuda.reset_peak_memory_stats(device)
    lora = {"r": 8, "target_modules": ["c_attn"]}
    model = _grpo(device, kl_coef=0.05, policy_kwargs={"model": str(base_dir), "quantization": "4bit", "lora": lora})
    base = [t.detach().clone() for t in model.policy._base_tensors()]
    adapters = {n: p.detach().clone() for n, p in model.policy.named_parameters() if p.requires_grad}
    model.learn(64)
    unchanged = all(th.equal(a, b) for a, b in zip(base, model.policy._base_tensors()))
    moved = sum(not th.equal(p, adapters[n]) for n, p in model.policy.named_parameters() if p.requires_grad)
    model.save(folder / "qlora.zip")
    loaded = GRPO.load(folder / "qlora.zip", env=model.env, device=str(device))
    ids = th.randint(4, 1000, (2, 12), device=device)
    mask, act = th.ones_like(ids), th.ones_like(ids, dtype=th.bool)
    act[:, 0] = False  # an action needs a token before it
    with th.no_grad():
        same = th.equal(
            model.policy.evaluate_sequences(ids, mask, act)[0], loaded.policy.evaluate_sequences(ids, mask, act)[0]
        )
    return {"base_unchanged": unchanged, "adapters_moved": moved, "loss": model.logger.name_to_value["train/loss"],
            "reload_equal": same, "peak_mb": _peak_mb(device)}  # fmt: skip


def scaling_checks(device: th.device, out: Path) -> bool:
    """The micro-batch and 4-bit LoRA checks, printed; False when one failed."""
    import importlib.util

    ok = True
    micro = micro_batch_check(device)
    good = micro["max_param_diff"] < 1e-4
    ok &= good
    print(f"\nmicro-batches: max |param(micro 2) - param(unsplit)| = {micro['max_param_diff']:.2e} "
          f"({'ok' if good else 'TOO LARGE'}); peak MB unsplit {micro['peak_mb_unsplit']:.0f}, "
          f"micro 2 {micro['peak_mb_micro2']:.0f}")  # fmt: skip
    if importlib.util.find_spec("bitsandbytes") is None:
        print("4-bit LoRA: skipped, bitsandbytes is not installed (pip install 'textrl[quant]')")
        return ok
    q = quantized_lora_check(device, out)
    good = q["base_unchanged"] and q["adapters_moved"] > 0 and q["reload_equal"] and q["loss"] == q["loss"]
    ok &= bool(good)
    print(f"4-bit LoRA: base unchanged {q['base_unchanged']}, {q['adapters_moved']} adapter tensors moved, loss "
          f"{q['loss']:.4g}, reload equal {q['reload_equal']}, peak MB {q['peak_mb']:.0f} "
          f"({'ok' if good else 'FAILED'})")  # fmt: skip
    return ok


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
        print("skipped: the micro-batch and 4-bit LoRA checks on CUDA")
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
    ok &= scaling_checks(device, out)
    ok = vllm_check(device, dry_run, out) and ok
    print(f"\nall in {time.perf_counter() - start:.0f} s")
    print("OK" if ok else "FAILED: " + "; ".join(f"{e['measurement']}: {e['error']}" for e in result["errors"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
