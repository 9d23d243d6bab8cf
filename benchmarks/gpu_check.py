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
   bitsandbytes); and FSDP over 2 ranks (:func:`fsdp_check`: ``data_parallel="fsdp"`` against ``"ddp"`` from the
   same seeds under ``torchrun --nproc_per_node 2``, the parameters after ``learn()`` equal to float rounding, each
   rank holding half of the sharded parameters, and each rank's peak memory). With 2 or more GPUs it runs on NCCL,
   one GPU per rank. NCCL cannot put 2 ranks on one GPU, so with one GPU both ranks run on it with gloo (FSDP2's
   collectives on CUDA tensors through gloo); if gloo cannot run them there, that is printed and the check runs on
   gloo with the ranks on the CPU instead, as ``tests/test_fsdp.py`` does (so the sharded update itself is checked
   either way; each mode is given at most 2 minutes);
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


#: How :func:`fsdp_check` runs its 2 ranks: the backend and where each rank's tensors live.
FSDP_MODES = {"nccl": ("nccl", "cuda"), "gloo-cuda": ("gloo", "cuda:0"), "gloo-cpu": ("gloo", "cpu")}


def fsdp_modes(device: th.device, n_gpus: int) -> list[str]:
    """The ways to try the 2-rank FSDP check, in order (the next one runs only when the one before could not start):
    NCCL with 2 GPUs; gloo on the one GPU, then gloo on the CPU, with 1; gloo on the CPU in a dry run."""
    if device.type != "cuda":
        return ["gloo-cpu"]
    return ["nccl"] if n_gpus >= 2 else ["gloo-cuda", "gloo-cpu"]


def fsdp_worker(out: Path, mode: str) -> None:
    """One rank of :func:`fsdp_check` (under ``torchrun``): GRPO on ``TextGen-v0`` (the bundled LM, SB3's
    per-transition buffer, micro-batches, group advantages) with ``data_parallel="ddp"`` then ``"fsdp"``; writes the
    full parameters after ``learn()``, the local and total elements of the sharded parameters and the peak memory to
    ``out/<data_parallel>_rank<r>.pt``."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from sb3_grpo import GRPO, distributed
    from sb3_grpo.common.buffers import GRPODictRolloutBuffer
    from textrl_envs.sb3 import make_vec_env

    backend, device = FSDP_MODES[mode]
    th.set_num_threads(1)
    if backend == "gloo" and device != "cpu":
        dist.init_process_group("gloo")  # GRPO uses this group (it would start NCCL on CUDA)
    rank = distributed.get_rank()
    for data_parallel in ("ddp", "fsdp"):
        env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=distributed.rank_seed(0, rank),
                           device=str(distributed.local_device(device)), max_new_tokens=6)  # fmt: skip
        if device != "cpu":
            th.cuda.reset_peak_memory_stats()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = GRPO("CausalLMPolicy", env, n_steps=8, batch_size=16, n_epochs=2, learning_rate=1e-3, seed=0,
                         advantage="group", grad_var_coef=0.0, micro_batch_size=4, device=device,
                         rollout_buffer_class=GRPODictRolloutBuffer, data_parallel=data_parallel)  # fmt: skip
            model.learn(2 * model.n_steps * model.n_envs)
        state = model.policy.state_dict()
        sharded = [p for p in model.policy.parameters() if isinstance(p, DTensor)]
        record = {
            "params": {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in state.items()},
            "sharded_local": sum(p.to_local().numel() for p in sharded),
            "sharded_total": sum(p.numel() for p in sharded),
            "peak_mb": th.cuda.max_memory_allocated() / 2**20 if device != "cpu" else float("nan"),
        }
        th.save(record, out / f"{data_parallel}_rank{rank}.pt")


def _run_fsdp_ranks(out: Path, mode: str, timeout: float) -> str | None:
    """Run :func:`fsdp_worker` on 2 ranks; ``None`` when it finished, else the error's last line."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(port), "-m"]  # fmt: skip
    cmd = [*launcher, "benchmarks.gpu_check", "--fsdp-worker", str(out), "--fsdp-mode", mode]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}  # fmt: skip
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.splitlines() if "Error" in line] or proc.stderr.splitlines() or ["?"]
    return lines[-1][:300]


def fsdp_check(device: th.device, folder: Path, timeout: float = 120.0) -> dict:
    """FSDP over 2 ranks against DDP from the same seeds (see :func:`fsdp_worker`), in the first of
    :func:`fsdp_modes` that runs: the mode, the largest parameter difference, each rank's share of the sharded
    parameters and the peak MB of each rank and mode (GPU memory; NaN for CPU ranks); ``errors`` lists the modes that
    failed, and ``max_param_diff`` is NaN when none ran."""
    n_gpus = th.cuda.device_count() if device.type == "cuda" else 0
    errors = []
    for mode in fsdp_modes(device, n_gpus):
        out = folder / f"fsdp-{mode}"
        out.mkdir(parents=True, exist_ok=True)
        error = _run_fsdp_ranks(out, mode, timeout)
        if error is not None:
            errors.append((mode, error))
            continue
        runs = {(m, r): th.load(out / f"{m}_rank{r}.pt", weights_only=True) for m in ("ddp", "fsdp") for r in (0, 1)}
        ddp = runs["ddp", 0]["params"]
        diff = max((runs["fsdp", r]["params"][k] - v).abs().max().item() for r in (0, 1) for k, v in ddp.items())
        return {
            "mode": mode,
            "errors": errors,
            "max_param_diff": diff,
            "shares": [runs["fsdp", r]["sharded_local"] / max(runs["fsdp", r]["sharded_total"], 1) for r in (0, 1)],
            "peak_mb": {f"{m} rank {r}": runs[m, r]["peak_mb"] for m, r in runs},
        }
    return {"mode": None, "errors": errors, "max_param_diff": float("nan"), "shares": [], "peak_mb": {}}


def scaling_checks(device: th.device, out: Path) -> bool:
    """The micro-batch, FSDP and 4-bit LoRA checks, printed; False when one failed."""
    import importlib.util

    ok = True
    micro = micro_batch_check(device)
    good = micro["max_param_diff"] < 1e-4
    ok &= good
    print(f"\nmicro-batches: max |param(micro 2) - param(unsplit)| = {micro['max_param_diff']:.2e} "
          f"({'ok' if good else 'TOO LARGE'}); peak MB unsplit {micro['peak_mb_unsplit']:.0f}, "
          f"micro 2 {micro['peak_mb_micro2']:.0f}")  # fmt: skip
    ok &= print_fsdp_check(fsdp_check(device, out))
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


def print_fsdp_check(result: dict) -> bool:
    """Print :func:`fsdp_check`'s result; True when a mode ran and FSDP equals DDP with half the shards per rank."""
    for mode, error in result["errors"]:
        backend, where = FSDP_MODES[mode]
        print(f"FSDP, 2 ranks on {backend} with tensors on {where}: could not run ({error})")
    if result["mode"] is None:
        print("FSDP over 2 ranks: FAILED (no mode ran)")
        return False
    backend, where = FSDP_MODES[result["mode"]]
    good = result["max_param_diff"] < 1e-4 and all(0.45 < s < 0.55 for s in result["shares"])
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in result["peak_mb"].items())
    print(f"FSDP, 2 ranks on {backend} with tensors on {where}: max |param(FSDP) - param(DDP)| = "
          f"{result['max_param_diff']:.2e}, sharded parameters held per rank "
          f"{', '.join(f'{s:.1%}' for s in result['shares'])}; peak MB {peaks} "
          f"({'ok' if good else 'FAILED'})")  # fmt: skip
    return good


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
    parser.add_argument("--fsdp-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--fsdp-mode", choices=list(FSDP_MODES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fsdp_worker:
        fsdp_worker(args.fsdp_worker, args.fsdp_mode)
        return 0
    device = th.device(args.device)
    if device.type == "cuda" and not th.cuda.is_available():
        print("CUDA is not available on this machine (torch.cuda.is_available() is False).")
        print("skipped: the sync check of the rollout loop on CUDA")
        print(f"skipped: the perf rows on CUDA ({', '.join(GPU_ROWS)})")
        print("skipped: the micro-batch, FSDP and 4-bit LoRA checks on CUDA")
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
