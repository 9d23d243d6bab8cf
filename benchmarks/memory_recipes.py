"""The recipe table: peak memory of one GRPO update per option, measured, beside ``sb3-grpo estimate-memory``.

For each model shape (GPT-2-small, the Qwen2 shapes of Qwen2.5-0.5B and 1.5B; built from a config with seeded random
weights and nothing downloaded) and option (full fine-tune, micro-batches, gradient checkpointing, LoRA, LoRA on an
8-bit and a 4-bit base when bitsandbytes is installed, FSDP over 2 ranks), a subprocess builds
``GRPO("CausalLMPolicy", TextGen-v0)`` (the text fast path, ``advantage="group"``, no penalty, no KL term), collects
one rollout of ``n_envs`` completions of exactly ``tokens`` tokens, returns the heap's free pages to the operating
system (glibc's ``malloc_trim(0)``, :func:`~sb3_grpo.common.update.host_memory.release_free_heap`), resets the process's
peak RSS (Linux ``/proc/self/clear_refs``) and runs the first update (one epoch, the rollout as one minibatch), the one
that allocates the gradients and Adam's state. ``measured MB`` is the peak RSS during that update minus the RSS after
the imports and the env (also trimmed), before the model was built: the weights, the gradients, Adam's state, the
activations and whatever the allocator keeps. ``next rollout MB`` is the peak RSS, less the same base, of the rollout
after that update (trimmed and reset again first), which still holds the update's gradients and Adam's state.
Without the trim a quantized row would also count the full-precision weights freed while the base was quantized,
which glibc keeps in the heap. ``estimate MB`` is
:func:`~sb3_grpo.policies.memory_estimate.estimate_memory` for the same settings (it leaves out allocator overhead).
The quantized rows load the base from a folder the benchmark writes first (bitsandbytes quantizes while loading).

FSDP rows run 2 gloo processes (``torchrun --nproc_per_node 2``, ``data_parallel="fsdp"``, one torch thread each),
each with its own env of ``n_envs`` completions (so each rank's minibatch is the single-process one); each rank
measures its own peak and the bytes it holds of the parameters, gradients and Adam's state (an FSDP shard counted by
its local part). In the update each rank gathers one block at a time; in a rollout it holds every block gathered
(see :class:`~sb3_grpo.common.data_parallel.FullyShardedDataParallel`), which ``next rollout MB`` shows.

A row runs only when the memory it needs by the estimate (times 1.25, plus the process itself; at least the float32
model every row builds before it is quantized or sharded) is below both ``--max-gb`` and what the machine has free
(``MemAvailable`` less 2 GB); otherwise the page says it was not run, and why.

Run: ``nice python -m benchmarks.memory_recipes`` (tens of minutes on 2 CPU cores with the 1.5B shape); it writes
``docs/results/memory_recipes.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.micro_batch_memory import collect_one_rollout, one_update_model
from sb3_grpo.compare.pages import write_results_page

PAGE = Path("docs/results/memory_recipes.md")
SHAPES = ("gpt2-small", "qwen2-0.5b", "qwen2-1.5b")
LORA_TARGETS = {"gpt2-small": ["c_attn"], "qwen2-0.5b": ["q_proj", "v_proj"], "qwen2-1.5b": ["q_proj", "v_proj"]}
RANK = 8
FSDP_RANKS = 2
#: The shapes with FSDP rows (every rank builds the whole model before it is sharded: 2 x 6 GB for the 1.5B shape).
FSDP_SHAPES = ("gpt2-small", "qwen2-0.5b")
#: What a row may need beyond the estimate: the allocator and the estimate's omissions (x), the process (+ MB).
NEED_FACTOR, PROCESS_MB = 1.25, 600.0
#: What is left free for the other jobs on the machine when a row runs.
RESERVE_MB = 2048.0


def _rss_mb(field: str = "VmHWM") -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}: this benchmark needs Linux")


def _trimmed_rss_mb() -> float:
    """The RSS now, after the heap's free pages were given back (``malloc_trim(0)``)."""
    from sb3_grpo.common.update.host_memory import release_free_heap

    release_free_heap()
    return _rss_mb("VmRSS")


def mem_available_mb() -> float:
    """``MemAvailable`` of ``/proc/meminfo``, in MB: what the machine can give a new process without swapping."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable: this benchmark needs Linux")


def memory_needed_mb(estimate_mb: float, build_mb: float, processes: int = 1) -> float:
    """What a row may take on the machine: per process, the larger of the update's estimate and the float32 model
    it builds first (``build_mb``), times :data:`NEED_FACTOR`, plus :data:`PROCESS_MB`; times ``processes``."""
    return processes * (NEED_FACTOR * max(estimate_mb, build_mb) + PROCESS_MB)


def skip_reason(need_mb: float, available_mb: float, max_mb: float) -> str | None:
    """Why a row that needs ``need_mb`` is not run (``None``: it runs): over the cap a run may take, or over what the
    machine has free now less :data:`RESERVE_MB`."""
    free = available_mb - RESERVE_MB
    if need_mb > max_mb:
        return f"needs about {need_mb / 1024:.1f} GB, over the {max_mb / 1024:.0f} GB a run may take here (--max-gb)"
    if need_mb > free:
        return f"needs about {need_mb / 1024:.1f} GB, over the {max(free, 0) / 1024:.1f} GB free here now"
    return None


def _shape_config(shape: str, vocab: int):
    from sb3_grpo.policies.memory_estimate import load_config

    config = load_config(shape)
    config.vocab_size = max(config.vocab_size, vocab)
    return config


def _shape_model(shape: str, vocab: int):
    import torch as th
    from transformers import AutoModelForCausalLM

    th.manual_seed(0)
    return AutoModelForCausalLM.from_config(_shape_config(shape, vocab)).eval()


def save_base(shape: str, folder: str) -> None:
    """Write the shape's random-weight model to ``folder`` (for the quantized rows, which load from a folder)."""
    from textrl_envs.assets import tokenizer_path
    from textrl_envs.core import load_tokenizer

    _shape_model(shape, len(load_tokenizer(str(tokenizer_path())))).save_pretrained(folder)


def make_env(n_envs: int, tokens: int, seed: int = 0):
    """``TextGen-v0`` with the bundled tokenizer without EOS, so every completion runs its whole budget."""
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path
    from textrl_envs.sb3 import make_vec_env

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    tokenizer.eos_token = None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="the tokenizer has no EOS token")
        env = make_vec_env(
            "TextGen-v0",
            n_envs=n_envs,
            group_size=4,
            seed=seed,
            device="cpu",
            max_new_tokens=tokens,
            tokenizer=tokenizer,
        )
    return env, len(tokenizer)


def held_state_mb(policy) -> dict[str, float]:
    """The bytes this process holds of the policy's parameters, gradients and optimizer state, in MB (an FSDP shard
    by its local part), and the local and total elements of the sharded parameters and of their optimizer state."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    params = list(dict.fromkeys(policy.parameters()))
    state = [v for s in policy.optimizer.state.values() for v in s.values() if hasattr(v, "dim") and v.dim() > 0]
    sharded = [p for p in params if isinstance(p, DTensor)]
    sharded_state = [v for v in state if isinstance(v, DTensor)]
    return {
        "params_mb": sum(local(p).numel() * p.element_size() for p in params) / 2**20,
        "grads_mb": sum(local(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None) / 2**20,
        "optim_mb": sum(local(v).numel() * v.element_size() for v in state) / 2**20,
        "sharded_local": sum(local(p).numel() for p in sharded),
        "sharded_total": sum(p.numel() for p in sharded),
        "sharded_state_local": sum(local(v).numel() for v in sharded_state),
        "sharded_state_total": sum(v.numel() for v in sharded_state),
    }


def own_memory(policy) -> None:
    """Copy the policy's tensors that are not quantized into memory of the process's own.

    A model loaded from safetensors keeps the weights that need no conversion (the embeddings, norms and head that
    bitsandbytes does not quantize) as views of the memory-mapped file, so the whole file stays mapped and every
    float32 page the loader read while it quantized the rest counts in the resident size. With the copies the file
    is closed, and the resident size holds the quantized model (as a GPU's memory would after the load)."""
    import gc

    import torch as th

    quantized = ("Params4bit", "Int8Params")
    with th.no_grad():
        for tensor in [*policy.parameters(), *policy.buffers()]:
            if type(tensor).__name__ not in quantized:
                tensor.data = tensor.data.clone()
    gc.collect()


def next_rollout(model) -> None:
    """Fill ``model``'s buffer with the rollout after its update (as ``learn``'s next iteration would)."""
    from stable_baselines3.common.callbacks import CallbackList

    callback = CallbackList([])
    callback.init_callback(model)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)


def child(cfg: dict) -> dict:
    """One row (or one rank of an FSDP row): build, roll out, trim, reset the peak, run the first update."""
    import torch as th

    th.set_num_threads(cfg["threads"])
    from sb3_grpo import distributed

    rank = distributed.get_rank()
    env, n_tokens = make_env(cfg["n_envs"], cfg["tokens"], seed=distributed.rank_seed(0, rank))
    import peft  # noqa: F401  (imported before the base RSS in every row, as torch and transformers are; it imports
    # bitsandbytes when that is installed)

    base = _trimmed_rss_mb()
    policy_kwargs: dict = {"gradient_checkpointing": cfg["ckpt"]}
    if cfg["lora"]:
        policy_kwargs["lora"] = {"r": RANK, "lora_alpha": 2 * RANK, "target_modules": LORA_TARGETS[cfg["shape"]]}
    if cfg["quant"]:
        policy_kwargs.update(model=cfg["folder"], quantization=cfg["quant"])
    else:
        policy_kwargs["model"] = _shape_model(cfg["shape"], n_tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = one_update_model(env, cfg, policy_kwargs, data_parallel="fsdp" if cfg["fsdp"] else "ddp")
        policy_kwargs.pop("model")
        if cfg["quant"]:
            own_memory(model.policy)
        collect_one_rollout(model)
        built = _trimmed_rss_mb()
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset VmHWM to the RSS now
        t0 = time.perf_counter()
        model.train()  # the first update: it allocates the gradients and Adam's state
        seconds = time.perf_counter() - t0
        measured = _rss_mb() - base
        held = held_state_mb(model.policy)
        _trimmed_rss_mb()
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        next_rollout(model)  # with the gradients and Adam's state the update left (FSDP: the blocks gathered)
        rollout = _rss_mb() - base
    row = {
        **{k: cfg[k] for k in ("shape", "lora", "quant", "micro", "ckpt", "fsdp")},
        "rank": rank,
        "base_mb": base,
        "built_mb": built,
        "measured_mb": measured,
        "rollout_mb": rollout,
        "seconds": seconds,
        "loss": model.logger.name_to_value.get("train/loss", float("nan")),
        **held,
    }
    if cfg["fsdp"]:
        Path(cfg["out"], f"rank{rank}.json").write_text(json.dumps(row))
    return row


def estimate_row(cfg: dict, seq_len: int, n_actions: int):
    """``estimate_memory`` for the row's settings, per rank, and the float32 model's MB (what every row builds)."""
    from sb3_grpo.policies.memory_estimate import estimate_memory, model_counts

    counts = model_counts(_shape_config(cfg["shape"], n_actions), LORA_TARGETS[cfg["shape"]])
    est = estimate_memory(
        counts,
        lora_rank=RANK if cfg["lora"] else None,
        quantization=cfg["quant"],
        micro_batch_size=cfg["micro"] or cfg["n_envs"],
        seq_len=seq_len,
        gradient_checkpointing=cfg["ckpt"],
        fsdp=cfg["fsdp"] or 1,
        n_actions=n_actions,
    )
    return est.total / 2**20, counts.total * 4 / 2**20


def configurations(shape: str, n_envs: int, quant: bool) -> list[dict]:
    off = {"lora": False, "quant": None, "micro": None, "ckpt": False, "fsdp": None}
    rows = [
        off,
        {**off, "micro": n_envs // 4},
        {**off, "ckpt": True},
        {**off, "lora": True},
        {**off, "lora": True, "micro": n_envs // 4, "ckpt": True},
    ]
    if quant:
        rows += [{**off, "lora": True, "quant": q} for q in ("8bit", "4bit")]
    if shape in FSDP_SHAPES:
        rows += [{**off, "fsdp": FSDP_RANKS}, {**off, "lora": True, "fsdp": FSDP_RANKS}]
    return [{"shape": shape, **row} for row in rows]


def label(row: dict) -> str:
    text = ("LoRA r=8" if row["lora"] else "full") + (f" + {row['quant']}" if row["quant"] else "")
    text += f", micro {row['micro']}" if row["micro"] else ""
    text += ", checkpointing" if row["ckpt"] else ""
    return text + (f", FSDP {row['fsdp']} ranks" if row["fsdp"] else "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_row(cfg: dict, timeout: float) -> dict:
    """Run one row in a subprocess (an FSDP row under ``torchrun``): its figures, or ``{"error": ...}``."""
    module = [sys.executable, "-m", "benchmarks.memory_recipes"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}  # fmt: skip
    env.setdefault("OMP_NUM_THREADS", str(cfg["threads"]))
    with tempfile.TemporaryDirectory() as out:
        if cfg["fsdp"]:
            cfg = {**cfg, "out": out}
            launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(cfg["fsdp"]),
                        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m"]  # fmt: skip
            cmd = [*launcher, "benchmarks.memory_recipes", "--child", json.dumps(cfg)]
        else:
            cmd = [*module, "--child", json.dumps(cfg)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.strip().splitlines() if "Error" in line] or proc.stderr.splitlines()
            return {"error": (lines or ["no output"])[-1]}
        if not cfg["fsdp"]:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(cfg["fsdp"])]
    return {**ranks[0], "ranks": ranks}


def _mb(row: dict, key: str) -> str:
    values = [r[key] for r in row.get("ranks", [row])]
    return " / ".join(f"{v:.0f}" for v in values)


def _state(r: dict) -> float:
    return r["params_mb"] + r["grads_mb"] + r["optim_mb"]


def table_lines(rows: list[dict]) -> list[str]:
    """The table's rows (measured, failed, or not run and why)."""
    lines = [
        "| model | configuration | measured MB | estimate MB | params + grads + Adam MB | next rollout MB | update s "
        "| train/loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        head = f"| {row['shape']} | {label(row)} |"
        if "skipped" in row:
            lines.append(f"{head} not run: {row['skipped']} | {row['estimate_mb']:.0f} | | | | |")
        elif "error" in row:
            lines.append(f"{head} failed: {row['error'][:120]} | {row['estimate_mb']:.0f} | | | | |")
        else:
            held = " / ".join(f"{_state(r):.0f}" for r in row.get("ranks", [row]))
            seconds = max(r["seconds"] for r in row.get("ranks", [row]))
            lines.append(
                f"{head} {_mb(row, 'measured_mb')} | {row['estimate_mb']:.0f} | {held} | {_mb(row, 'rollout_mb')} | "
                f"{seconds:.1f} | {row['loss']:.6g} |"
            )
    return lines


def fsdp_share_lines(rows: list[dict]) -> list[str]:
    """For each FSDP row: what share of the sharded parameters and of their optimizer state each rank holds, and its
    held state against the same configuration on one process."""
    lines = []
    for row in rows:
        if not row.get("fsdp") or "ranks" not in row:
            continue
        single = next((r for r in rows if r["shape"] == row["shape"] and not r["fsdp"] and r["lora"] == row["lora"]
                       and not r["quant"] and not r["micro"] and not r["ckpt"] and "params_mb" in r), None)  # fmt: skip
        parts = []
        for r in row["ranks"]:
            text = f"rank {r['rank']} holds {r['sharded_local'] / r['sharded_total']:.1%} of the sharded parameters"
            if r["sharded_state_total"]:
                text += f" and {r['sharded_state_local'] / r['sharded_state_total']:.1%} of their Adam state"
            if single is not None:
                text += f", {_state(r) / _state(single):.2f}x the one-process params + grads + Adam"
            parts.append(text)
        lines.append(f"- {row['shape']}, {label(row)}: " + "; ".join(parts) + ".")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="textrl-bench memory-recipes", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--n-envs", type=int, default=8, help="completions (sequences) in the minibatch")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per completion")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of a one-process row (FSDP: 1 a rank)")
    parser.add_argument("--max-gb", type=float, default=14.0, help="the most memory one row may take (GB)")
    parser.add_argument("--no-fsdp", action="store_true", help="leave out the FSDP rows")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per row")
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--save-base", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        row = child(json.loads(args.child))
        print(json.dumps(row))
        return 0
    if args.save_base:
        save_base(*args.save_base)
        return 0
    env, n_actions = make_env(args.n_envs, args.tokens)
    seq_len = int(env.observation_space["input_ids"].shape[0])  # the window: prompt + completion
    env.close()
    quant = importlib.util.find_spec("bitsandbytes") is not None
    max_mb = args.max_gb * 1024
    from sb3_grpo.compare.results import git_commit

    commit = f"`{git_commit()}`"  # at the start: the page written after every row is itself a change to the checkout
    plan = []
    for shape in args.shapes:
        for cfg in configurations(shape, args.n_envs, quant):
            if not (cfg["fsdp"] and args.no_fsdp):
                threads = 1 if cfg["fsdp"] else args.threads
                cfg.update(n_envs=args.n_envs, tokens=args.tokens, threads=threads)
                cfg["estimate_mb"], cfg["build_mb"] = estimate_row(cfg, seq_len, n_actions)
                plan.append(cfg)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, cfg in enumerate(plan):
            cfg["folder"] = folder = str(Path(tmp) / cfg["shape"])
            need = memory_needed_mb(cfg["estimate_mb"], cfg["build_mb"], cfg["fsdp"] or 1)
            reason = skip_reason(need, mem_available_mb(), max_mb)
            print(f"{cfg['shape']}: {label(cfg)}: " + (f"not run, {reason}" if reason else "running ..."),
                  file=sys.stderr, flush=True)  # fmt: skip
            if reason:
                rows.append({**cfg, "skipped": reason})
            else:
                if cfg["quant"] and not Path(folder).exists():
                    cmd = [sys.executable, "-m", "benchmarks.memory_recipes", "--save-base", cfg["shape"], folder]
                    subprocess.run(cmd, check=True, capture_output=True)
                rows.append({**cfg, **run_row(cfg, args.timeout)})
                print({k: v for k, v in rows[-1].items() if k != "ranks"}, file=sys.stderr, flush=True)
            # the page after every row: a run stopped early leaves a page that says which rows it did not reach
            pending = [{**c, "skipped": "not reached yet: the benchmark was still running"} for c in plan[i + 1 :]]
            write_page(args, argv, [*rows, *pending], seq_len, n_actions, quant, commit)
    print(f"wrote {args.page}")
    return 0


def write_page(args, argv: list[str], rows: list[dict], seq_len: int, n_actions: int, quant: bool, commit: str) -> None:
    """Write the results page of ``rows`` (measured, failed, or not run and why), stamped with ``commit``."""
    lines = [
        f'One GRPO update on CPU (the text fast path, `advantage="group"`, no penalty, no KL term): a minibatch of '
        f"{args.n_envs} sequences ({args.tokens} generated tokens each, after the prompt; {seq_len} tokens in all), "
        f"one epoch, float32 weights, {args.threads} torch threads. Models built from a config with random weights "
        f"and the bundled tokenizer ({n_actions} tokens: the logits are computed for those). `measured MB`: peak RSS "
        "during the first update (it allocates the gradients and Adam's state) minus the RSS before the model was "
        "built; both are read after glibc's `malloc_trim(0)` has given the heap's free pages back to the system, and "
        "a quantized row's weights that stay in full precision (embeddings, norms, head) are copied out of the "
        "memory-mapped file they were loaded from, so that the file is closed: a quantized row counts its quantized "
        "model, not the full-precision weights freed, or read from the file, while it was quantized. "
        "`estimate MB`: `sb3-grpo estimate-memory` for the same settings, per rank (no allocator overhead, no "
        "process). `params + grads + Adam MB`: the bytes of the policy's parameters, gradients and optimizer state "
        "that the process holds after the update (an FSDP rank: its shards and the parameters that stay whole). "
        "`next rollout MB`: the peak RSS, less the same base, during the rollout that follows the update (as "
        "`learn`'s next iteration; the update's gradients and Adam's state are still held; not estimated). "
        "LoRA: rank 8 on the attention projections (GPT-2's `c_attn`; Qwen2's `q_proj`, `v_proj`).",
        "",
        f"FSDP rows: {FSDP_RANKS} processes under `torchrun` with gloo, one torch thread each, "
        f'`data_parallel="fsdp"`; each rank steps its own {args.n_envs} envs (the minibatch of a one-process row, '
        "so a global batch twice as large) and shards the transformer blocks, under the LM body as their common "
        "FSDP root; the embeddings, the final norm, the tied output head and the critic stay whole on every rank. "
        "In the update each block is gathered for its forward and again for its backward, and resharded after each; "
        "in a rollout each rank gathers every block in its first forward and holds them until the rollout ends (the "
        "ranks may make different numbers of forwards there, and a gather is a collective call), so `next rollout "
        "MB` holds the whole model's weights beside the shards. Their figures are per rank (`rank 0 / rank 1`).",
        "",
        *table_lines(rows),
    ]
    shares = fsdp_share_lines(rows)
    if shares:
        lines += ["", "What each FSDP rank holds, measured from its shards:", "", *shares]
    if not quant:
        lines += ["", "bitsandbytes is not installed here: no 8-bit / 4-bit rows (pip install 'textrl[quant]')."]
    if any("skipped" in row for row in rows):
        lines += [
            "",
            f"`not run`: before each row the benchmark compares what the row may take (the estimate or the float32 "
            f"model it builds first, whichever is larger, times {NEED_FACTOR}, plus {PROCESS_MB:.0f} MB for the "
            f"process, per rank) with `--max-gb` ({args.max_gb:g} GB) and with the machine's free memory less "
            f"{RESERVE_MB / 1024:.0f} GB, and runs only what fits; the estimate column still gives the row's figure "
            "(`sb3-grpo estimate-memory --model qwen2-1.5b --compare` prints it for other settings).",
        ]
    command = shlex.join(["textrl-bench", "memory-recipes", *argv])
    write_results_page(args.page, "Memory of one update, per option", "\n".join(lines), command, commit=commit)


if __name__ == "__main__":
    raise SystemExit(main())
