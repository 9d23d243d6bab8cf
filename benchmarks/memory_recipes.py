"""The recipe table: peak memory of one GRPO update per option, measured, beside ``sb3-grpo estimate-memory``.

For each model shape (GPT-2-small, the Qwen2 shape of Qwen2.5-0.5B; built from a config with seeded random weights
and nothing downloaded) and option (full fine-tune, micro-batches, gradient checkpointing, LoRA, LoRA on an 8-bit and
a 4-bit base when bitsandbytes is installed), a subprocess builds ``GRPO("CausalLMPolicy", TextGen-v0)`` (the text
fast path, ``advantage="group"``, no penalty, no KL term), collects one rollout of ``n_envs`` completions of exactly
``tokens`` tokens, resets the process's peak RSS (Linux ``/proc/self/clear_refs``) and runs the first update (one
epoch, the rollout as one minibatch), the one that allocates the gradients and Adam's state. ``measured MB`` is the
peak RSS during that update minus the RSS after the imports and the env, before the model was built: the weights, the
gradients, Adam's state, the activations and whatever the allocator keeps. ``estimate MB`` is
:func:`~sb3_grpo.policies.memory_estimate.estimate_memory` for the same settings (it leaves out allocator overhead).
The quantized rows load the base from a folder the benchmark writes first (bitsandbytes quantizes while loading).

Run: ``nice python -m benchmarks.memory_recipes`` (a few minutes on 2 CPU cores); it writes
``docs/results/memory_recipes.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.micro_batch_memory import collect_one_rollout, one_update_model
from sb3_grpo.compare.pages import write_results_page

PAGE = Path("docs/results/memory_recipes.md")
SHAPES = ("gpt2-small", "qwen2-0.5b")
LORA_TARGETS = {"gpt2-small": ["c_attn"], "qwen2-0.5b": ["q_proj", "v_proj"]}
RANK = 8


def _rss_mb(field: str = "VmHWM") -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}: this benchmark needs Linux")


def _shape_model(shape: str, vocab: int):
    import torch as th
    from transformers import AutoModelForCausalLM

    from sb3_grpo.policies.memory_estimate import load_config

    config = load_config(shape)
    config.vocab_size = max(config.vocab_size, vocab)
    th.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def save_base(shape: str, folder: str) -> None:
    """Write the shape's random-weight model to ``folder`` (for the quantized rows, which load from a folder)."""
    from textrl_envs.assets import tokenizer_path
    from textrl_envs.core import load_tokenizer

    _shape_model(shape, len(load_tokenizer(str(tokenizer_path())))).save_pretrained(folder)


def child(cfg: dict) -> dict:
    """One row: build, roll out, reset the peak, run the first update; return the figures."""
    import torch as th

    th.set_num_threads(cfg["threads"])
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path
    from textrl_envs.sb3 import make_vec_env

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    tokenizer.eos_token = None  # every completion runs its whole budget
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="the tokenizer has no EOS token")
        env = make_vec_env(
            "TextGen-v0",
            n_envs=cfg["n_envs"],
            group_size=4,
            seed=0,
            device="cpu",
            max_new_tokens=cfg["tokens"],
            tokenizer=tokenizer,
        )
    import peft  # noqa: F401  (imported before the base RSS in every row, as torch and transformers are; it imports
    # bitsandbytes when that is installed)

    base = _rss_mb("VmRSS")
    policy_kwargs: dict = {"gradient_checkpointing": cfg["ckpt"]}
    if cfg["lora"]:
        policy_kwargs["lora"] = {"r": RANK, "lora_alpha": 2 * RANK, "target_modules": LORA_TARGETS[cfg["shape"]]}
    if cfg["quant"]:
        policy_kwargs.update(model=cfg["folder"], quantization=cfg["quant"])
    else:
        policy_kwargs["model"] = _shape_model(cfg["shape"], len(tokenizer))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = one_update_model(env, cfg, policy_kwargs)
        policy_kwargs.pop("model")
        collect_one_rollout(model)
        built = _rss_mb("VmRSS")
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset VmHWM to the RSS now
        t0 = time.perf_counter()
        model.train()  # the first update: it allocates the gradients and Adam's state
        seconds = time.perf_counter() - t0
    return {
        **{k: cfg[k] for k in ("shape", "lora", "quant", "micro", "ckpt")},
        "base_mb": base,
        "built_mb": built,
        "measured_mb": _rss_mb() - base,
        "seconds": seconds,
        "loss": model.logger.name_to_value["train/loss"],
        "seq_len": int(model.observation_space["input_ids"].shape[0]),  # the window: prompt + completion
    }


def estimate_row(cfg: dict, seq_len: int, n_actions: int) -> float:
    from sb3_grpo.policies.memory_estimate import estimate_memory, load_config, model_counts

    config = load_config(cfg["shape"])
    config.vocab_size = max(config.vocab_size, n_actions)
    counts = model_counts(config, LORA_TARGETS[cfg["shape"]])
    est = estimate_memory(
        counts,
        lora_rank=RANK if cfg["lora"] else None,
        quantization=cfg["quant"],
        micro_batch_size=cfg["micro"] or cfg["n_envs"],
        seq_len=seq_len,
        gradient_checkpointing=cfg["ckpt"],
        n_actions=n_actions,
    )
    return est.total / 2**20


def configurations(shape: str, n_envs: int, quant: bool) -> list[dict]:
    rows = [
        {"lora": False, "quant": None, "micro": None, "ckpt": False},
        {"lora": False, "quant": None, "micro": n_envs // 4, "ckpt": False},
        {"lora": False, "quant": None, "micro": None, "ckpt": True},
        {"lora": True, "quant": None, "micro": None, "ckpt": False},
        {"lora": True, "quant": None, "micro": n_envs // 4, "ckpt": True},
    ]
    if quant:
        rows += [{"lora": True, "quant": q, "micro": None, "ckpt": False} for q in ("8bit", "4bit")]
    return [{"shape": shape, **row} for row in rows]


def label(row: dict) -> str:
    text = ("LoRA r=8" if row["lora"] else "full") + (f" + {row['quant']}" if row["quant"] else "")
    text += f", micro {row['micro']}" if row["micro"] else ""
    return text + (", checkpointing" if row["ckpt"] else "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="textrl-bench memory-recipes", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--n-envs", type=int, default=8, help="completions (sequences) in the minibatch")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per completion")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--save-base", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.save_base:
        save_base(*args.save_base)
        return 0
    from textrl_envs.assets import tokenizer_path
    from textrl_envs.core import load_tokenizer

    n_actions = len(load_tokenizer(str(tokenizer_path())))
    quant = importlib.util.find_spec("bitsandbytes") is not None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            folder = str(Path(tmp) / shape)
            if quant:
                cmd = [sys.executable, "-m", "benchmarks.memory_recipes", "--save-base", shape, folder]
                subprocess.run(cmd, check=True, capture_output=True)
            for cfg in configurations(shape, args.n_envs, quant):
                cfg.update(n_envs=args.n_envs, tokens=args.tokens, threads=args.threads, folder=folder)
                print(f"running {shape}: {label(cfg)} ...", file=sys.stderr, flush=True)
                cmd = [sys.executable, "-m", "benchmarks.memory_recipes", "--child", json.dumps(cfg)]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    rows.append({**cfg, "error": out.stderr.strip().splitlines()[-1]})
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["estimate_mb"] = estimate_row(cfg, row["seq_len"], n_actions)
                rows.append(row)
                print(row, file=sys.stderr, flush=True)
    lines = [
        f'One GRPO update on CPU (the text fast path, `advantage="group"`, no penalty, no KL term): a minibatch of '
        f"{args.n_envs} sequences ({args.tokens} generated tokens each, after the prompt), one epoch, float32 "
        f"weights, {args.threads} torch threads. Models built from a config with random weights and the bundled "
        f"tokenizer ({n_actions} tokens: the logits are computed for those). `measured MB`: peak RSS during the first "
        "update (it allocates the gradients and Adam's state) minus the RSS before the model was built. "
        "`estimate MB`: `sb3-grpo estimate-memory` for the same settings (no allocator overhead, no process). "
        "LoRA: rank 8 on the attention projections (GPT-2's `c_attn`; Qwen2's `q_proj`, `v_proj`).",
        "",
        "| model | configuration | measured MB | estimate MB | update s | train/loss |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['shape']} | {label(row)} | failed: {row['error'][:120]} | | | |")
            continue
        lines.append(
            f"| {row['shape']} | {label(row)} | {row['measured_mb']:.0f} | {row['estimate_mb']:.0f} | "
            f"{row['seconds']:.1f} | {row['loss']:.6g} |"
        )
    if not quant:
        lines += ["", "bitsandbytes is not installed here: no 8-bit / 4-bit rows (pip install 'textrl[quant]')."]
    lines += [
        "",
        "Not measured here: the Qwen2 1.5B shape (a full fine-tune needs about 26 GB by the estimate, beyond this "
        "24 GB machine shared with other jobs; `sb3-grpo estimate-memory --model qwen2-1.5b --compare` gives its "
        "figures) and FSDP over 2 ranks (measured per rank by `tests/test_fsdp.py` for the bundled LM; "
        "`benchmarks/gpu_check.py` runs it on CUDA).",
    ]
    command = shlex.join(["textrl-bench", "memory-recipes", *argv])
    write_results_page(args.page, "Memory of one update, per option", "\n".join(lines), command)
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
