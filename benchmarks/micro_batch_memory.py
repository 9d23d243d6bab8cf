"""Peak memory of one GRPO update with ``micro_batch_size`` None, half and a quarter of the minibatch's sequences.

The model is GPT-2-small's shape (12 layers, width 768, 12 heads) built from its config with seeded random weights
and the bundled tokenizer's vocabulary (nothing is downloaded). Each setting runs in its own subprocess: it builds
``GRPO("CausalLMPolicy", TextGen-v0)`` (the text fast path, ``advantage="group"``, no penalty), collects one rollout
of ``n_envs`` completions of exactly ``tokens`` tokens (no EOS), resets the process's peak RSS (Linux
``/proc/self/clear_refs``) after a first update (which allocates Adam's state) and measures a second, steady-state
update of one epoch over the rollout as one minibatch. ``update peak MB`` is the peak RSS during that update minus the
RSS just before it (which holds the weights, Adam's state and the previous update's gradients): the activations kept
for the backward and the transient buffers, which are what the micro-batch changes.

Run: ``python -m benchmarks.micro_batch_memory`` (about a minute on 2 CPU cores); it writes
``docs/results/micro_batch_memory.md``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
import warnings
from pathlib import Path

from sb3_grpo.compare.pages import write_results_page

#: GPT-2-small's shape; the vocabulary is the bundled tokenizer's (set in the child).
GPT2_SMALL_SHAPE = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 256}
PAGE = Path("docs/results/micro_batch_memory.md")


def _rss_mb(field: str = "VmHWM") -> float:
    """``VmHWM`` (peak) or ``VmRSS`` (now) of this process, in MB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}: this benchmark needs Linux")


def one_update_model(env, cfg: dict, policy_kwargs: dict, data_parallel: str = "ddp"):
    """The GRPO whose one update is measured: one rollout of ``cfg["tokens"]`` steps as one minibatch, one epoch,
    group advantages, no penalty, no exploration, ``micro_batch_size=cfg["micro"]`` (``data_parallel`` under
    ``torchrun``)."""
    from sb3_grpo import GRPO

    n_steps = cfg["tokens"]
    return GRPO(
        "CausalLMPolicy",
        env,
        n_steps=n_steps,
        batch_size=n_steps * cfg["n_envs"],
        n_epochs=1,
        learning_rate=1e-5,
        seed=0,
        advantage="group",
        grad_var_coef=0.0,
        explore_alpha=0.0,
        device="cpu",
        micro_batch_size=cfg["micro"],
        data_parallel=data_parallel,
        policy_kwargs=policy_kwargs,
    )


def collect_one_rollout(model) -> None:
    """Set ``model`` up to learn (a silent logger) and fill its buffer with one rollout, as ``learn`` would."""
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(None, []))
    model._setup_learn(model.n_steps * model.n_envs, None)
    callback = CallbackList([])
    callback.init_callback(model)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)


def child(cfg: dict) -> dict:
    """One setting: build, roll out, reset the peak, update; return the figures."""
    import torch as th

    th.set_num_threads(cfg["threads"])
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from textrl_envs.assets import tokenizer_path
    from textrl_envs.sb3 import make_vec_env

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    tokenizer.eos_token = None  # every completion runs its whole budget: the same tokens in every setting
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
    th.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), **GPT2_SMALL_SHAPE)).eval()
    model = one_update_model(env, cfg, {"model": lm})
    collect_one_rollout(model)
    model.train()  # a first update allocates Adam's state; the one measured is a steady-state update
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset VmHWM to the RSS now
    before = _rss_mb("VmRSS")
    t0 = time.perf_counter()
    model.train()
    seconds = time.perf_counter() - t0
    return {
        "micro": cfg["micro"],
        "params_m": sum(p.numel() for p in model.policy.parameters()) / 1e6,
        "before_mb": before,
        "peak_mb": _rss_mb(),
        "update_mb": _rss_mb() - before,
        "seconds": seconds,
        "loss": model.logger.name_to_value["train/loss"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="textrl-bench micro-batch-memory", description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=8, help="completions (sequences) in the minibatch")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per completion")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    rows = []
    for micro in (None, args.n_envs // 2, args.n_envs // 4):
        cfg = {"n_envs": args.n_envs, "tokens": args.tokens, "threads": args.threads, "micro": micro}
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.micro_batch_memory", "--child", json.dumps(cfg)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    lines = [
        f"GPT-2-small's shape ({rows[0]['params_m']:.1f}M parameters, the bundled tokenizer's vocabulary), "
        f"random weights, on CPU; one minibatch of {args.n_envs} sequences of {args.tokens} generated tokens, "
        "one epoch, the text fast path. `update peak MB`: peak RSS during `train()` minus the RSS before it "
        "in a steady-state update (the weights, Adam's state and the last gradients are held before it): the "
        "activations kept for the backward and transient buffers. The loss is the same in every row to float "
        "rounding (the same rollout and update).",
        "",
        "| micro_batch_size (sequences) | update peak MB | peak RSS MB | update s | train/loss |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        micro = "None (whole minibatch)" if row["micro"] is None else str(row["micro"])
        lines.append(
            f"| {micro} | {row['update_mb']:.0f} | {row['peak_mb']:.0f} | {row['seconds']:.1f} | {row['loss']:.6g} |"
        )
    command = shlex.join(["textrl-bench", "micro-batch-memory", *argv])
    write_results_page(args.page, "Peak memory of one update with micro-batches", "\n".join(lines), command)
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
