"""The matrix products of one decoding step on a real model, timed by weight layout: for ``textrl-bench real-speed``.

A decoding step of ``B`` rows multiplies ``[B, d]`` activations by every weight once, each weight read from memory
(the step streams the whole model). :func:`decode_product_rows` runs one step's products of the transformer blocks
in the model's order, from each weight as stored (``F.linear``, which has MKL gather the weight's columns at every
call) and from a column-major copy (:mod:`sb3_grpo.policies.column_weights`), the two ways alternating over
``repeats`` passes, and the output layer's product plain and packed for MKL (:mod:`sb3_grpo.policies.packed_head`).
Each row gives a weight shape's median time per product both ways and whether the two products are equal to the bit
(a layout MKL multiplies in another order would not be served by the policy).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["decode_product_rows", "decode_products_section"]


def decode_product_rows(lm: Any, batch: int, threads: int, repeats: int = 5) -> list[dict]:
    """Per weight shape of ``lm``'s blocks (and its output layer), the time of one decoding product of ``batch`` rows
    both ways (see the module's docstring), at torch's current thread count (``threads``, recorded)."""
    import torch as th
    from torch import nn
    from torch.nn import functional as F

    from sb3_grpo.policies.packed_head import PackedHead, mkl_packing_available

    head = lm.get_output_embeddings()
    linears = [m for m in lm.base_model.modules() if type(m) is nn.Linear and m is not head]
    rows: list[dict] = []
    with th.no_grad():
        gen = th.Generator().manual_seed(0)
        inputs = {m.in_features: th.randn(batch, m.in_features, generator=gen) for m in linears}
        weights = [m.weight.detach() for m in linears]
        copies = [w.t().contiguous().t() for w in weights]
        shapes = sorted({tuple(w.shape) for w in weights})
        spent: dict[str, dict[tuple, list[float]]] = {m: {s: [] for s in shapes} for m in ("plain", "column")}
        for r in range(repeats + 1):  # the first pass warms up
            for mode in ("plain", "column") if r % 2 == 0 else ("column", "plain"):
                totals = dict.fromkeys(shapes, 0.0)
                for w in weights if mode == "plain" else copies:
                    x = inputs[w.shape[1]]
                    start = time.perf_counter()
                    F.linear(x, w)
                    totals[tuple(w.shape)] += time.perf_counter() - start
                if r:
                    for s in shapes:
                        spent[mode][s].append(totals[s])
        for s in shapes:
            n = sum(1 for w in weights if tuple(w.shape) == s)
            w, copy = next((w, c) for w, c in zip(weights, copies, strict=True) if tuple(w.shape) == s)
            x = inputs[s[1]]
            equal = bool(th.equal(F.linear(x, w), F.linear(x, copy)))
            plain, column = (statistics.median(spent[m][s]) / n for m in ("plain", "column"))
            rows.append({"threads": threads, "batch": batch, "weight": f"{s[0]} x {s[1]}", "products": n,
                         "layout": "column-major copy", "plain_ms": plain * 1e3, "other_ms": column * 1e3,
                         "speedup": plain / column, "equal": equal})  # fmt: skip
        del copies
        if head is not None and type(head) is nn.Linear and mkl_packing_available():
            row = _packed_head_row(head.weight.detach(), batch, threads, repeats, PackedHead())
            rows += [] if row is None else [row]
    return rows


def _packed_head_row(weight: Any, batch: int, threads: int, repeats: int, packed: Any) -> dict | None:
    """The output layer's product plain and packed for MKL (the pack made by two calls at ``batch`` rows; ``None``
    where the pack is refused)."""
    import torch as th
    from torch.nn import functional as F

    x = th.randn(batch, weight.shape[1], generator=th.Generator().manual_seed(1))
    packed.linear(x, weight, None)
    served = packed.linear(x, weight, None)  # packed and checked here (None where refused)
    if served is None:
        return None
    equal = bool(th.equal(served, F.linear(x, weight)))
    times: dict[str, list[float]] = {"plain": [], "packed": []}
    for r in range(repeats):
        for mode in ("plain", "packed") if r % 2 == 0 else ("packed", "plain"):
            start = time.perf_counter()
            F.linear(x, weight) if mode == "plain" else packed.linear(x, weight, None)
            times[mode].append(time.perf_counter() - start)
    plain, other = statistics.median(times["plain"]), statistics.median(times["packed"])
    packed.clear()
    return {"threads": threads, "batch": batch, "weight": f"{weight.shape[0]} x {weight.shape[1]} (output layer)",
            "products": 1, "layout": "packed for MKL", "plain_ms": plain * 1e3, "other_ms": other * 1e3,
            "speedup": plain / other, "equal": equal}  # fmt: skip


def decode_products_section(rows: list[dict]) -> list[str]:
    """The page's section of :func:`decode_product_rows`'s rows."""
    if not rows:
        return []
    lines = ["", "## A decoding step's products by weight layout", "",
             "One decoding step's matrix products of the transformer blocks, in the model's order (every weight read "
             "from memory, as in a rollout), from each weight as stored (`F.linear`) and from a column-major copy, "
             "the two ways alternating; and the output layer's product plain and packed for MKL. Times are per "
             "product (median of the passes); `products` is how many a step runs of that weight shape; `equal` says "
             "whether the two ways give the same numbers to the bit (the policy serves a copy only where they do, and "
             "only where its own trials on the first decoding steps find it at least 5% faster).", "",
             "| threads | batch | weight (out x in) | products | other layout | F.linear ms | other ms | speed-up | "
             "equal |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['threads']} | {r['batch']} | {r['weight']} | {r['products']} | {r['layout']} | "
                     f"{r['plain_ms']:.3f} | {r['other_ms']:.3f} | {r['speedup']:.2f}x | "
                     f"{'yes' if r['equal'] else 'no'} |")  # fmt: skip
    return lines
