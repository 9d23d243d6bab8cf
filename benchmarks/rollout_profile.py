"""Where a rollout's time goes: one ``collect_rollouts`` under PyTorch's profiler, its wall time split by what ran.

The split (:func:`split_profile`) takes each operator's *self* time (its own, its callees' excluded, so nothing is
counted twice) from ``torch.profiler`` and groups them: the matrix products (the arithmetic the roofline counts),
attention, the rest of the tensor operators (norms, activations, rotary embeddings, the sampler, copies); the time
outside every operator is Python: the policy's and SB3's loop, the env's step and the rollout buffer. The env's step
is also clocked on its own (a wrapper around ``env.step``), operators included. The profiler adds a few microseconds
to each operator call, so the operator groups read a little high, and the whole rollout runs slower than unprofiled:
the page gives the shares, not the rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

#: Operator names (``aten::...``) of each group; anything else is ``other operators``. (``mkl::_mkl_linear``: the
#: packed output layer's product, :mod:`sb3_grpo.policies.packed_head`.)
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::_mkldnn_matmul", "mkldnn::_linear_pointwise", "mkl::_mkl_linear"})  # fmt: skip
ATTENTION_PREFIX = ("aten::_scaled_dot_product", "aten::scaled_dot_product")
#: How many operators the page lists by self time.
TOP_OPS = 8


def op_group(name: str) -> str:
    """The group of an operator's time: ``"matmul"``, ``"attention"`` or ``"other"``."""
    if name in MATMUL_OPS:
        return "matmul"
    if name.startswith(ATTENTION_PREFIX):
        return "attention"
    return "other"


def split_profile(wall_s: float, env_s: float, ops: Iterable[tuple[str, float, int]]) -> dict[str, Any]:
    """The split of a profiled rollout of ``wall_s`` seconds: ``ops`` are ``(name, self seconds, calls)`` of every
    operator (``key_averages()``'s rows), ``env_s`` the seconds inside ``env.step``. Returns each group's seconds
    (``matmul``, ``attention``, ``other``), ``outside`` (the wall time no operator accounts for), ``env``, the
    number of operator calls and the :data:`TOP_OPS` operators by self time."""
    groups = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    rows = list(ops)
    for name, seconds, _ in rows:
        groups[op_group(name)] += seconds
    top = sorted(rows, key=lambda r: -r[1])[:TOP_OPS]
    return {"wall_s": wall_s, **groups, "outside": max(wall_s - sum(groups.values()), 0.0), "env": env_s,
            "op_calls": sum(calls for _, _, calls in rows),
            "top": [{"op": name, "s": seconds, "calls": calls} for name, seconds, calls in top]}  # fmt: skip


def profile_rollout(collect: Callable[[], None], env: Any, warm: bool = True) -> dict[str, Any]:
    """Run ``collect`` (one rollout; with ``warm``, called once before, unprofiled, to warm up) under
    ``torch.profiler`` with ``env.step`` clocked, and split its time (:func:`split_profile`)."""
    from torch.profiler import ProfilerActivity, profile

    if warm:
        collect()
    env_s = [0.0]
    step = env.step

    def clocked_step(actions: Any) -> Any:
        start = time.perf_counter()
        try:
            return step(actions)
        finally:
            env_s[0] += time.perf_counter() - start

    env.step = clocked_step
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            collect()
            wall = time.perf_counter() - start
    finally:
        del env.step  # the instance attribute: the class's own step again
    ops = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()]
    return split_profile(wall, env_s[0], ops)


def profile_section(rows: list[dict[str, Any]]) -> list[str]:
    """The page's table of profiled rollouts (each row a set-up with its ``profile``) and each one's top operators."""
    if not rows:
        return []
    lines = ["", "## Where a rollout's time goes", "",
             "One rollout of each set-up below under PyTorch's profiler (after one unprofiled call): the share of its "
             "wall time in the matrix products (the work the roofline counts), in attention, in the other tensor "
             "operators (norms, activations, rotary embeddings, the sampler, copies: each operator's own time, its "
             "callees excluded), and outside every operator (Python: the policy's and SB3's loop, the env, the "
             "buffer); `env.step` is the time inside the env's step, its operators included. The profiler's own cost "
             "per operator call makes the operator shares read a little high.", "",
             "| model | dtype | threads | batch | group | EOS | engine | wall s | matmul | attention | other ops | "
             "outside ops | env.step | operator calls per token |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        p, wall = r["profile"], r["profile"]["wall_s"]
        share = {k: f"{p[k] / wall:.0%}" for k in ("matmul", "attention", "other", "outside", "env")}
        lines.append(f"| {r['model']} | {r['dtype']} | {r['threads']} | {r['batch']} | {r['group']} | "
                     f"{'on' if r['eos'] else 'off'} | {r['engine']} | {wall:.1f} | {share['matmul']} | "
                     f"{share['attention']} | {share['other']} | {share['outside']} | {share['env']} | "
                     f"{p['op_calls'] / (r['batch'] * r['tokens']):.0f} |")  # fmt: skip
    lines += ["", "The operators of most self time, per profiled set-up (share of the rollout's wall time, calls):", ""]
    for r in rows:
        p = r["profile"]
        tops = ", ".join(f"`{t['op']}` {t['s'] / p['wall_s']:.0%} ({t['calls']})" for t in p["top"])
        lines.append(f"- {r['dtype']}, {r['threads']} thread(s), batch {r['batch']}, group {r['group']}, EOS "
                     f"{'on' if r['eos'] else 'off'}, {r['engine']}: {tops}")  # fmt: skip
    return lines
