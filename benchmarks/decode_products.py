"""The matrix products of one decoding step on a real model, timed by weight layout: for ``textrl-bench real-speed``.

A decoding step of ``B`` rows multiplies ``[B, d]`` activations by every weight once, each weight read from memory
(the step streams the whole model). :func:`decode_product_rows` runs one step's products of the transformer blocks
in the model's order three ways, alternating over ``repeats`` passes: from each weight as stored (``F.linear``, which
has MKL gather the weight's columns at every call), from a column-major copy of each, and from MKL packs, the
projections that read the same input (a layer's query, key and value; its gate and up) packed together as the lean
step serves them (:mod:`sb3_grpo.policies.block_weights`); and the output layer's product plain and packed for MKL
(:mod:`sb3_grpo.policies.packed_head`). Each row gives a weight shape's (or a group's) median time per product both
ways and whether the products are equal to the bit (a layout MKL multiplies in another order is never served).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["decode_product_rows", "decode_products_section"]


def decode_groups(body: Any) -> list[tuple]:
    """The linear layers of ``body``'s blocks in the order of a decoding step, in the groups the lean step projects
    together (:func:`~sb3_grpo.policies.lean_step.projection_groups` of each Llama-family layer whose projections are
    plain linear layers); every linear layer alone for other models."""
    from torch import nn

    from sb3_grpo.policies.lean_step import projection_groups

    groups = [
        group
        for layer in getattr(body, "layers", [])
        if hasattr(getattr(layer, "self_attn", None), "q_proj") and hasattr(getattr(layer, "mlp", None), "gate_proj")
        for group in projection_groups(layer)
        if all(type(m) is nn.Linear for m in group)
    ]
    return groups or [(m,) for m in body.modules() if type(m) is nn.Linear]


def decode_product_rows(lm: Any, batch: int, threads: int, repeats: int = 5) -> list[dict]:
    """Per weight shape of ``lm``'s blocks (and per group packed together, and its output layer), the time of one
    decoding product of ``batch`` rows each way (see the module's docstring), at torch's current thread count
    (``threads``, recorded)."""
    import torch as th
    from torch import nn

    from sb3_grpo.policies.block_weights import laid_out
    from sb3_grpo.policies.packed_head import PackedHead, mkl_packing_available

    head = lm.get_output_embeddings()
    groups = [g for g in decode_groups(lm.base_model) if head not in g]
    ways = ("plain", "column", "packed") if mkl_packing_available() else ("plain", "column")
    with th.no_grad():
        gen = th.Generator().manual_seed(0)
        inputs = {m.in_features: th.randn(batch, m.in_features, generator=gen) for g in groups for m in g}
        layouts = {way: [laid_out(way, [m.weight.detach() for m in g], batch) for g in groups] for way in ways[1:]}
        spent: dict[str, dict[tuple, list[float]]] = {way: {} for way in ways}
        for r in range(repeats + 1):  # the first pass warms up
            for way in ways[r % len(ways) :] + ways[: r % len(ways)]:
                totals = _one_pass(way, groups, inputs, layouts.get(way), batch)
                for key, total in totals.items() if r else ():
                    spent[way].setdefault(key, []).append(total)
        rows = _layout_rows(groups, inputs, layouts, spent, batch, threads)
        del layouts
        if head is not None and type(head) is nn.Linear and mkl_packing_available():
            row = _packed_head_row(head.weight.detach(), batch, threads, repeats, PackedHead())
            rows += [] if row is None else [row]
    return rows


def _group_key(group: tuple) -> tuple:
    return tuple(tuple(m.weight.shape) for m in group)


def _one_pass(way: str, groups: list[tuple], inputs: dict, layouts: list | None, batch: int) -> dict[tuple, float]:
    """One decoding step's block products served ``way``, timed: per ``("weight", shape)`` (every way but packs) and
    per ``("group", shapes)`` (plain and packs), seconds summed over the step."""
    from sb3_grpo.policies.block_weights import served_products

    totals: dict[tuple, float] = {}
    for i, group in enumerate(groups):
        x = inputs[group[0].in_features]
        if way == "packed":
            start = time.perf_counter()
            served_products(way, group, x, layouts[i], batch)
            spent = {("group", _group_key(group)): time.perf_counter() - start}
        else:
            spent = {}
            for j, m in enumerate(group):
                start = time.perf_counter()
                served_products(way, (m,), x, () if layouts is None else (layouts[i][j],), batch)
                key = ("weight", tuple(m.weight.shape))  # (a group's layers may share a shape: key and value)
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - start
            if way == "plain":
                spent[("group", _group_key(group))] = sum(spent.values())
        for key, seconds in spent.items():
            totals[key] = totals.get(key, 0.0) + seconds
    return totals


def _layout_rows(groups, inputs, layouts, spent, batch, threads) -> list[dict]:
    """The rows of each weight shape (column-major copies) and each group's shapes (packs), with whether their
    products equal ``F.linear``'s to the bit."""
    import torch as th

    from sb3_grpo.policies.block_weights import served_products

    first: dict[tuple, tuple[int, int]] = {}  # per key, its first group and layer there
    for i, group in enumerate(groups):
        for j, m in enumerate(group):
            first.setdefault(("column", ("weight", tuple(m.weight.shape))), (i, j))
        first.setdefault(("packed", ("group", _group_key(group))), (i, -1))
    order = sorted(first, key=lambda k: (k[0], k[1][1]) if k[0] == "column" else (k[0], first[k]))
    rows: list[dict] = []
    for way, key in order:
        if way not in layouts:
            continue
        i, j = first[(way, key)]
        group, x = groups[i], inputs[groups[i][0].in_features]
        tensors = layouts[way][i]
        if j >= 0:
            group, tensors = (group[j],), (tensors[j],)
        count = sum(1 for g in groups for m in g if tuple(m.weight.shape) == key[1]) if j >= 0 else (
            sum(1 for g in groups if _group_key(g) == key[1]))  # fmt: skip
        plain = served_products("plain", group, x, (), batch)
        served = served_products(way, group, x, tensors, batch)
        equal = all(th.equal(a, b) for a, b in zip(served, plain, strict=True))
        plain_s, other_s = (statistics.median(spent[w][key]) / count for w in ("plain", way))
        layout = "column-major copy" if way == "column" else "packed for MKL" + (", together" if len(group) > 1 else "")
        shapes = [key[1]] if j >= 0 else key[1]
        rows.append({"threads": threads, "batch": batch, "weight": " + ".join(f"{o} x {n}" for o, n in shapes),
                     "products": count, "layout": layout, "plain_ms": plain_s * 1e3, "other_ms": other_s * 1e3,
                     "speedup": plain_s / other_s, "equal": equal})  # fmt: skip
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
             "from memory, as in a rollout), three ways in rotating order: from each weight as stored (`F.linear`), "
             "from a column-major copy of each, and from MKL packs, the projections that read the same input packed "
             "together and run as one product (for such a group, `F.linear ms` is its layers' products summed); and "
             "the output layer's product plain and packed for MKL. Times are per product (median of the passes); "
             "`products` is how many a step runs of that shape; `equal` says whether the two ways give the same "
             "numbers to the bit. The policy serves a layout only where they do, from its own trials on the first "
             "decoding steps: weighed in the order of what they cost to make (`F.linear`, the copy, the pack), each "
             "replaces the pick so far only if at least 5% faster than it.", "",
             "| threads | batch | weight (out x in) | products | other layout | F.linear ms | other ms | speed-up | "
             "equal |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['threads']} | {r['batch']} | {r['weight']} | {r['products']} | {r['layout']} | "
                     f"{r['plain_ms']:.3f} | {r['other_ms']:.3f} | {r['speedup']:.2f}x | "
                     f"{'yes' if r['equal'] else 'no'} |")  # fmt: skip
    return lines
