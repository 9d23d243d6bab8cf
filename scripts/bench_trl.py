"""Complete GRPO training loop (rollout + update) against Hugging Face TRL's ``GRPOTrainer`` on the same setup.

TRL is not a dependency. Without it (``import trl`` fails) this prints "TRL not installed: pip install trl to run
this comparison" and exits 0. TRL may live outside the environment, e.g. installed with
``pip install --target /tmp/trl_site trl``::

    HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/trl_site python scripts/bench_trl.py
    HF_HUB_OFFLINE=1 python scripts/bench_trl.py --trl-path /tmp/trl_site          # the same, via sys.path
    HF_HUB_OFFLINE=1 python scripts/bench_trl.py --trl-path /tmp/trl_site --updates 8 --repeats 2 --json trl.json

What runs, side by side in one process (``--repeats`` > 1 alternates which goes first; the table gives medians), one
torch thread (``--threads``), on the CPU:

(a) ours: ``GRPO("CausalLMPolicy", env, advantage="group", kl_coef=0.04, grad_var_coef=0, adaptive_clip=None,
    explore_alpha=0, n_epochs=1, n_steps=T, batch_size=T * N)`` on ``make_vec_env("TextGen-v0", n_envs=N,
    group_size=G, max_new_tokens=T)``, trained with ``learn(updates * N * T)``: each update is one rollout of N
    envs x T steps through the env's KV-cached loop, then one gradient step over it as one minibatch;
(b) TRL: ``GRPOTrainer`` with ``GRPOConfig(num_generations=G, max_completion_length=T, beta=0.04,
    num_iterations=1, per_device_train_batch_size=N, max_steps=updates, use_cpu=True, ...)``: each step generates
    N completions (N / G prompts x G) with ``model.generate`` and takes one optimizer step over them.

Shared: the bundled tiny GPT-2 (``textrl_envs.assets.lm_path()``) and its tokenizer, TextGen-v0's 16 prompts, its
reward (VADER-style lexicon sentiment, compound score) called with TRL's ``f(prompts, completions, **kw)``
signature, G = 4, T = 24, N = 64 completions per update, sampling at temperature 1 with no top-k / top-p, learning
rate ``--lr`` held constant (TRL: ``lr_scheduler_type="constant"``), AdamW (eps 1e-8, no weight decay; ours is
given the same optimizer), gradient-norm clip 1.0, clip range 0.2 (inactive at one epoch: the ratio is 1), KL
coefficient 0.04 to a frozen copy of the initial model (k3 estimator in both), dropout off in both (TRL:
``disable_dropout=True``; our policy always runs the LM in eval mode), group-normalised advantages
``(r - mean_g) / (std_g + eps)``, fp32 (no bf16 / fp16), no logging (TRL: ``report_to=[]``,
``logging_strategy="no"``, no checkpoints, no progress bar).

Figures per implementation: wall and process-CPU seconds of the whole loop (model and env construction excluded;
for ours ``learn`` including its first ``reset``, for TRL ``trainer.train()`` including its dataloader set-up),
completions (finished episodes) and generated tokens (sampled tokens, EOS included, padding excluded), their rates,
``rollout s`` (ours: ``collect_rollouts``, i.e. sampling, env and reward; TRL: its ``_generate`` calls plus the
reward calls) and ``update s`` (the rest: for TRL also its reference and old-policy forwards and the batch
bookkeeping of ``_generate_and_score_completions``), and the mean training reward of the first and of the last
update (of the completions each update trains on; about 64-100 samples each, so expect noise of a few hundredths).
The last line gives ours / TRL of completions/s (wall), tokens/s and completions per CPU second.

Unavoidable differences:

- Generation: TRL calls HF ``generate`` once per step on the N prompts, left-padded, and pads the completions to the
  longest in the batch (a batch runs until every completion has hit EOS or T tokens; the padded positions are
  computed then masked). Ours steps N envs through the KV-cached env loop for exactly T steps per update; an env
  whose episode ends on EOS restarts at once on its group's next prompt, so no step is idle, an update can hold more
  than N completions (and partial episodes that finish in the next rollout), and tokens/update is exactly N x T.
  Both thus run N x T sampling positions per update, but the bundled LM ends many completions on EOS (mean length
  about 14 of 24): TRL's steps hold N completions of about 15 tokens plus padding, ours about 1.65 N completions
  (some begun in the previous rollout) and N x T useful tokens, so each of our updates also trains on more tokens.
  Compare the rates, not the totals: the totals are equal in updates and in sampling positions, not in
  completions.
- Prompts: TRL's sampler takes each of the 16 prompts once per step (shuffled), G completions each; the env's groups
  draw their prompt at random from the same 16 (seeded), so a step may repeat or skip prompts.
- Loss: TRL's default ``loss_type="dapo"`` (token-level: the sum of per-token losses over the active completion
  tokens of the whole batch divided by their number, no per-sequence length normalisation); ours averages the
  per-token PPO loss over the update's transitions (also token-level), plus the k3 KL term per token in both. TRL
  computes the reference log-probs in a no-grad forward of the batch before its loss (in
  ``_generate_and_score_completions``); ours in the update (the sequence path: one packed forward over the
  update's episodes for the policy, one for the frozen reference). The steps of episodes cut by the rollout's end get
  advantage 0 in ours.
- The group std: unbiased (n - 1) in both (``torch.std``; :func:`sb3_grpo.objectives.group_advantages`).
- Ours also carries the (untrained, with group advantages) value head of ``CausalLMPolicy``.

Figures of the defaults (torch 2.13 CPU, transformers 5.24, TRL 1.16.0 on ``PYTHONPATH``, a 2-core CPU, 1 thread,
medians of 3 alternating loops, about 1 minute in all; the completions/CPU s column left out)::

    (the script prints one table; shown here in two halves)
    | loop                       | updates | completions | gen. tokens | mean len | wall s | CPU s | completions/s |
    | ours: GRPO (group)         |      16 |        1848 |       24576 |     13.0 |    9.0 |   8.9 |         204.4 |
    | TRL GRPOTrainer (generate) |      16 |        1024 |       15267 |     14.9 |    7.4 |   7.3 |         138.1 |
    | loop                       | tokens/s | rollout s | update s | reward first | reward last |
    | ours: GRPO (group)         |     2719 |       3.7 |      5.3 |       +0.185 |       +0.506 |
    | TRL GRPOTrainer (generate) |     2060 |       2.2 |      5.2 |       +0.108 |       +0.684 |
    ours / TRL: completions/s x1.48, tokens/s x1.32 (TRL padded completion positions: 24512)

Ours is faster on both rates (1.3-1.6x over repeated runs). Per update ours samples the same N x T positions as TRL;
its rollout still takes longer (the envs that auto-reset get their prompt prefilled at nearly every step, where
``generate`` prefills once; a prompt already prefilled under the same weights, e.g. by another member of its group,
is copied from the policy's prefill memo instead), and its update trains on about 1.6x the tokens in about the
same time, because the sequences of an update are packed end to end into shared rows
(:mod:`sb3_grpo.common.packing`) rather than padded. TRL's reward rose further over these 16 updates (one seed; the
loss normalisations differ, see above).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

KL_COEF = 0.04
NOT_INSTALLED = "TRL not installed: pip install trl to run this comparison"


def _spec():
    """TextGen-v0's prompts and reward, as the env uses them."""
    import gymnasium as gym

    import textrl_envs  # noqa: F401  (registers the envs)

    env = gym.make("TextGen-v0")
    try:
        spec = env.unwrapped.text_spec
        return list(spec.prompt_texts), spec.reward
    finally:
        env.close()


def run_ours(args, seed: int) -> dict:
    """Our GRPO: ``learn`` over ``updates`` rollouts of ``n_envs`` x ``tokens`` steps."""
    import torch as th
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import configure

    import sb3_grpo.policies  # noqa: F401  (registers "CausalLMPolicy")
    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    class Record(BaseCallback):
        """Finished episodes' rewards and lengths, per rollout."""

        def __init__(self):
            super().__init__()
            self.rewards: list[list[float]] = [[]]
            self.lengths: list[int] = []
            self.rollout_s = 0.0
            self._t0 = 0.0

        def _on_rollout_start(self) -> None:
            self._t0 = time.perf_counter()

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"]):
                if done and "episode" in info:
                    self.rewards[-1].append(float(info["episode"]["r"]))
                    self.lengths.append(int(info["episode"]["l"]))
            return True

        def _on_rollout_end(self) -> None:
            self.rollout_s += time.perf_counter() - self._t0
            self.rewards.append([])

    env = make_vec_env("TextGen-v0", n_envs=args.n_envs, group_size=args.group_size, max_new_tokens=args.tokens,
                       seed=seed, device="cpu")  # fmt: skip
    model = GRPO(
        "CausalLMPolicy",
        env,
        learning_rate=args.lr,
        n_steps=args.tokens,
        batch_size=args.tokens * args.n_envs,
        n_epochs=1,
        clip_range=0.2,
        max_grad_norm=1.0,
        advantage="group",
        kl_coef=KL_COEF,
        grad_var_coef=0.0,
        adaptive_clip=None,
        explore_alpha=0.0,
        seed=seed,
        device="cpu",
        policy_kwargs={"optimizer_class": th.optim.AdamW, "optimizer_kwargs": {"eps": 1e-8, "weight_decay": 0.0}},
    )
    model.set_logger(configure(None, []))
    record = Record()
    steps = args.updates * args.n_envs * args.tokens
    w0, c0 = time.perf_counter(), time.process_time()
    model.learn(steps, callback=record)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    per_update = [r for r in record.rewards if r][: args.updates]
    env.close()
    return {
        "impl": "ours",
        "wall_s": wall,
        "cpu_s": cpu,
        "updates": args.updates,
        "completions": sum(len(r) for r in record.rewards),
        "tokens": int(model.num_timesteps),
        "rollout_s": record.rollout_s,
        "reward_first": statistics.fmean(per_update[0]),
        "reward_last": statistics.fmean(per_update[-1]),
        "mean_len": statistics.fmean(record.lengths) if record.lengths else float("nan"),
    }


def _dataset(prompts: list[str]):
    from datasets import Dataset

    try:
        return Dataset.from_dict({"prompt": prompts})
    except Exception:  # noqa: BLE001  (a datasets / pyarrow mismatch): a generator-backed dataset serves as well
        from datasets import IterableDataset

        def rows(prompts):
            for p in prompts:
                yield {"prompt": p}

        return IterableDataset.from_generator(rows, gen_kwargs={"prompts": prompts})


def run_trl(args, seed: int) -> dict:
    """TRL's GRPOTrainer: ``updates`` steps of ``n_envs`` completions each."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from textrl_envs.assets import lm_path, tokenizer_path

    prompts, env_reward = _spec()
    calls: list[dict] = []
    rollout_s = [0.0]

    def sentiment(prompts, completions, completion_ids=None, **kwargs):
        t0 = time.perf_counter()
        rewards = [float(r) for r in env_reward(list(prompts), list(completions))]
        lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else []
        calls.append({"rewards": rewards, "lengths": lengths})
        rollout_s[0] += time.perf_counter() - t0
        return rewards

    sentiment.__name__ = "sentiment"
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path()))
    out = tempfile.mkdtemp(prefix="bench_trl_")
    config = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=args.n_envs,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.tokens,
        beta=KL_COEF,
        num_iterations=1,
        epsilon=0.2,
        max_steps=args.updates,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        disable_dropout=True,
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
    )
    trainer = GRPOTrainer(
        model=str(lm_path()),
        reward_funcs=sentiment,
        args=config,
        train_dataset=_dataset(prompts * max(1, args.n_envs // args.group_size // len(prompts))),
        processing_class=tokenizer,
    )
    generate = getattr(trainer, "_generate", None)  # TRL 1.x: sampling only (no reward, no reference forward)
    if generate is not None:

        def timed_generate(*a, **kw):
            t0 = time.perf_counter()
            try:
                return generate(*a, **kw)
            finally:
                rollout_s[0] += time.perf_counter() - t0

        trainer._generate = timed_generate
    else:
        rollout_s[0] = float("nan")
    w0, c0 = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints its end-of-training metrics
        trainer.train()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    lengths = [n for c in calls for n in c["lengths"]]
    return {
        "impl": "TRL",
        "wall_s": wall,
        "cpu_s": cpu,
        "updates": len(calls),
        "completions": sum(len(c["rewards"]) for c in calls),
        "tokens": sum(lengths),
        "rollout_s": rollout_s[0],
        "padded_tokens": sum(len(c["lengths"]) * max(c["lengths"], default=0) for c in calls),
        "reward_first": statistics.fmean(calls[0]["rewards"]),
        "reward_last": statistics.fmean(calls[-1]["rewards"]),
        "mean_len": statistics.fmean(lengths) if lengths else float("nan"),
    }


def summarize(runs: list[dict]) -> dict:
    """Median of each figure over the repeats of one implementation."""
    row = {"impl": runs[0]["impl"], "repeats": len(runs)}
    for key in runs[0]:
        if key != "impl":
            row[key] = statistics.median(r[key] for r in runs)
    row["completions_per_s"] = statistics.median(r["completions"] / r["wall_s"] for r in runs)
    row["tokens_per_s"] = statistics.median(r["tokens"] / r["wall_s"] for r in runs)
    row["completions_per_cpu_s"] = statistics.median(r["completions"] / r["cpu_s"] for r in runs)
    return row


def markdown(rows: list[dict]) -> str:
    head = ("| loop | updates | completions | gen. tokens | mean len | wall s | CPU s | completions/s | tokens/s "
            "| completions/CPU s | rollout s | update s | reward first | reward last |")  # fmt: skip
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        name = "ours: GRPO (group), KV-cached env loop" if r["impl"] == "ours" else "TRL GRPOTrainer (generate)"
        lines.append(
            f"| {name} | {r['updates']:.0f} | {r['completions']:.0f} | {r['tokens']:.0f} | {r['mean_len']:.1f} "
            f"| {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['completions_per_s']:.1f} | {r['tokens_per_s']:.0f} "
            f"| {r['completions_per_cpu_s']:.1f} | {r['rollout_s']:.1f} | {r['wall_s'] - r['rollout_s']:.1f} "
            f"| {r['reward_first']:+.3f} | {r['reward_last']:+.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-path", default=None, help="a directory to put first on sys.path (where TRL lives)")
    parser.add_argument("--n-envs", type=int, default=64, help="completions per update (N)")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--tokens", type=int, default=24, help="max completion tokens (T)")
    parser.add_argument("--updates", type=int, default=16, help="updates (TRL: optimizer steps) per loop")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate of both")
    parser.add_argument("--repeats", type=int, default=3, help="loops of each, alternating which goes first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadiest on a shared machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the per-loop results and the summary to this file")
    args = parser.parse_args(argv)
    if args.trl_path:
        sys.path.insert(0, os.path.abspath(args.trl_path))
    try:
        importlib.import_module("trl")
    except ImportError as exc:
        print(NOT_INSTALLED)
        if not isinstance(exc, ModuleNotFoundError) or exc.name != "trl":
            print(f"(import trl failed: {exc})")
        return []

    import torch as th
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    th.set_num_threads(args.threads)
    if args.n_envs % args.group_size:
        parser.error("--n-envs must be a multiple of --group-size")

    runs: dict[str, list[dict]] = {"ours": [], "TRL": []}
    for rep in range(args.repeats):
        order = [("ours", run_ours), ("TRL", run_trl)]
        for name, fn in order if rep % 2 == 0 else order[::-1]:
            print(f"repeat {rep + 1}/{args.repeats}: {name} ...", file=sys.stderr, flush=True)
            result = fn(args, args.seed + rep)
            print(f"  {json.dumps(result)}", file=sys.stderr, flush=True)
            runs[name].append(result)
    rows = [summarize(runs["ours"]), summarize(runs["TRL"])]
    import trl

    print(
        f"\nComplete GRPO loop (rollout + update) on TextGen-v0, bundled LM: {args.updates} updates x {args.n_envs} "
        f"completions (groups of {args.group_size}) of up to {args.tokens} tokens, beta {KL_COEF}, lr {args.lr:g}, "
        f"CPU, {args.threads} torch thread(s), TRL {trl.__version__}, median of {args.repeats} loop(s) each\n"
    )
    print(markdown(rows))
    ours, ref = rows
    print(
        f"\nours / TRL: completions/s x{ours['completions_per_s'] / ref['completions_per_s']:.2f}, "
        f"tokens/s x{ours['tokens_per_s'] / ref['tokens_per_s']:.2f}, "
        f"completions per CPU s x{ours['completions_per_cpu_s'] / ref['completions_per_cpu_s']:.2f} "
        f"(TRL padded completion positions: {ref['padded_tokens']:.0f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "summary": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
