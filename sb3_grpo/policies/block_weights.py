"""The rollout's decoding products of the transformer blocks, from weights laid out for the CPU's BLAS.

A linear layer stores its weight ``[out, in]`` row by row, and ``F.linear(x, W)`` asks BLAS for ``x @ W.T``: MKL's
``sgemm`` then gathers the weight's columns into its panels at every call, a transposing copy of a weight that a
decoding step reads once and from memory. Two other layouts spare it that work:

- ``"column"``: a column-major copy of the weight (``W.T`` contiguous, the tensor ``W.T.contiguous().T``), whose
  panels MKL copies straight and multiplies in the same order;
- ``"packed"``: the weight packed once for MKL's product at a given number of rows (``cblas_sgemm_pack``, which
  PyTorch reaches through ``torch.ops.mkl._mkl_reorder_linear_weight`` and ``_mkl_linear``, as in
  :mod:`~sb3_grpo.policies.packed_head`). Projections that read the same input (a layer's query, key and value; its
  gate and up) are packed together, their weights stacked, and run as one product whose columns are theirs.

Both can give the same numbers as ``F.linear`` to the bit, and which one pays depends on the CPU, the thread count
and the shape (``textrl-bench real-speed`` times each of a model's weight shapes every way): on one core of an
AVX-512 Xeon at batch 64, SmolLM2-135M-Instruct's block products ran 1.2x to 1.4x as fast from column-major copies
and at most 1.14x from packs; on two cores the copies gained at most 1.06x and the packs of the query, key and value
and of the gate and up about 1.1x and 1.2x, while the ``576 x 1536`` product's pack gave other numbers (MKL splits it
otherwise at two threads). So nothing is assumed.

:class:`BlockWeights` serves the products (:meth:`BlockWeights.project`, which the lean decoding step of
:mod:`~sb3_grpo.policies.lean_step` calls for each group of projections) from the layout that was measured to pay.
Per group's weight shapes, row count and thread count it first runs the products every way on the same inputs for
:data:`TRIAL_PRODUCTS` calls, in rotating order (the layers of one decoding step share a few shapes, so this takes
part of one step). A layout is out as soon as one of its products differs from ``F.linear``'s by a bit; of those
left, in the order of what they cost to make at each rollout (``F.linear`` nothing, then the copy, then the pack),
each replaces the pick so far only if its median time is under :data:`KEEP_BELOW` of the pick's, and the shapes are
never tried again. A copy or pack is made anew when a weight changes (an optimizer step or a loaded state dict bumps the
tensor's version; a new tensor has another address). The copies and packs take about as much memory as the weights
they hold (SmolLM2-135M's blocks: 0.42 GB in float32; MKL reserves more address space for a pack than it writes),
from a rollout's first decoding steps until the policy drops them before an update (:meth:`BlockWeights.clear`).
``CausalLMPolicy(column_major_weights=False, pack_block_weights=False)`` turns both off.

It serves float32 products on the CPU without gradients or autocast, of plain ``nn.Linear`` layers whose weights are
contiguous and have at least :data:`MIN_SERVED_WEIGHTS` elements, for at least :data:`MIN_SERVED_ROWS` rows (under
about 16 MKL takes another kernel, with other roundings); anything else is the layer's own call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch as th
from torch import nn
from torch.nn import functional as F

from sb3_grpo.policies.packed_head import mkl_packing_available

__all__ = [
    "KEEP_BELOW",
    "LAYOUTS",
    "MIN_SERVED_ROWS",
    "MIN_SERVED_WEIGHTS",
    "TRIAL_PRODUCTS",
    "BlockWeights",
    "laid_out",
    "served_products",
]

#: The layouts a product can be served from, besides ``"plain"`` (``F.linear`` on the weight as stored).
LAYOUTS = ("column", "packed")
#: The fewest weight elements a layer needs for its product to be served from another layout.
MIN_SERVED_WEIGHTS = 1 << 16
#: The fewest rows a product needs (MKL takes another kernel, with other roundings, for fewer than about 16).
MIN_SERVED_ROWS = 16
#: Products per (weight shapes, rows, threads) run every way before a way is chosen.
TRIAL_PRODUCTS = 8
#: A layout replaces the pick so far (``F.linear``, or a layout cheaper to make) where its median product time is below
#: this share of the pick's (it costs a copy of the weights per rollout, which a few percent of the products pays for).
KEEP_BELOW = 0.95

#: the clock the trials are timed with (a test can replace it)
_clock = time.perf_counter

#: ``((out, in, biased), ...)`` of a group's layers, its rows and the thread count: what a verdict holds for
Key = tuple[tuple[tuple[int, int, bool], ...], int, int]
Group = tuple[nn.Module, ...]


class BlockWeights:
    """The blocks' products from other weight layouts, served where measured faster and equal (see the module's
    docstring).

    :param column: try column-major copies.
    :param packed: try MKL packs (where PyTorch has MKL's packed products).
    """

    def __init__(self, column: bool = True, packed: bool = True) -> None:
        #: the layouts tried, of :data:`LAYOUTS`
        self.layouts = tuple(
            name for name, wanted in zip(LAYOUTS, (column, packed and mkl_packing_available()), strict=True) if wanted
        )
        #: per ``(group, layout, rows)`` (rows for packs only), the verdict's key, the weights' stamps and the tensors
        self._held: dict[tuple[Group, str, int | None], tuple[Key, tuple, tuple[th.Tensor, ...]]] = {}
        #: per key under trial, each way still in and its timings (seconds)
        self._trials: dict[Key, dict[str, list[float]]] = {}
        #: per key decided, the way its products are served: ``"plain"`` or one of :attr:`layouts`
        self.verdicts: dict[Key, str] = {}

    @property
    def holds(self) -> bool:
        """Whether any copy or pack is held (its memory in use)."""
        return bool(self._held)

    def clear(self) -> None:
        """Drop every copy and pack (the verdicts are kept: they depend on shapes and threads, not on the weights)."""
        self._held.clear()

    def linear(self, module: nn.Module, x: th.Tensor) -> th.Tensor:
        """``module(x)``, served as :meth:`project` serves a group of one."""
        return self.project((module,), x)[0]

    def project(self, modules: Sequence[nn.Module], x: th.Tensor) -> tuple[th.Tensor, ...]:
        """``tuple(m(x) for m in modules)`` (layers that read the same input), served from the layout measured to pay.

        :param modules: the layers (a layer that is not a plain ``nn.Linear`` is called as it is, the others served
            one by one then).
        :param x: ``[..., in]`` inputs.
        """
        group = tuple(modules)
        servable = [_servable(m, x) for m in group]
        if not self.layouts or not any(servable):
            return tuple(m(x) for m in group)
        if not all(servable):
            return tuple(self.project((m,), x)[0] if ok else m(x) for m, ok in zip(group, servable, strict=True))
        rows = x.numel() // x.shape[-1]
        key = (tuple((*m.weight.shape, m.bias is not None) for m in group), rows, th.get_num_threads())
        verdict = self.verdicts.get(key)
        if verdict is None:
            return self._trial(key, group, x)
        return self._products(verdict, key, group, x)

    def _products(self, way: str, key: Key, group: Group, x: th.Tensor) -> tuple[th.Tensor, ...]:
        """``group``'s products of ``x`` served ``way``."""
        tensors = () if way == "plain" else self._layout(way, key, group)
        return served_products(way, group, x, tensors, key[1])

    def _layout(self, way: str, key: Key, group: Group) -> tuple[th.Tensor, ...]:
        """``group``'s weights in layout ``way`` (made anew if a weight changed since they were made)."""
        rows = key[1]
        slot = (group, way, rows if way == "packed" else None)
        stamps = tuple((m.weight.data_ptr(), m.weight._version) for m in group)
        held = self._held.get(slot)
        if held is None or held[1] != stamps:
            self._held.pop(slot, None)  # the old tensors' memory is free before the new ones are made
            held = (key, stamps, laid_out(way, [m.weight.detach() for m in group], rows))
            self._held[slot] = held
        return held[2]

    def _trial(self, key: Key, group: Group, x: th.Tensor) -> tuple[th.Tensor, ...]:
        """One trial: the products every way still in, timed in rotating order and compared with ``F.linear``'s; the
        verdict once the trial has :data:`TRIAL_PRODUCTS` timings. Returns ``F.linear``'s products."""
        times = self._trials.setdefault(key, {"plain": [], **{way: [] for way in self.layouts}})
        ways = list(times)
        turn = len(times["plain"]) % len(ways)
        layouts = {way: () if way == "plain" else self._layout(way, key, group) for way in ways}  # made untimed
        outs, spent = {}, {}
        for way in ways[turn:] + ways[:turn]:
            start = _clock()
            outs[way] = served_products(way, group, x, layouts[way], key[1])
            spent[way] = _clock() - start
        plain = outs["plain"]
        unequal = [w for w in ways[1:] if not all(th.equal(a, b) for a, b in zip(outs[w], plain, strict=True))]
        if unequal:
            if all(bool(th.isfinite(p).all()) for p in plain):  # (non-finite inputs prove nothing: tried again)
                for way in unequal:
                    del times[way]
                self._drop(key, unequal)
                if len(times) == 1:
                    self._decide(key, "plain")
            return plain
        for way in ways:
            times[way].append(spent[way])
        if len(times["plain"]) >= TRIAL_PRODUCTS:
            self._decide(key, _pick({way: statistics.median(t) for way, t in times.items()}))
        return plain

    def _decide(self, key: Key, way: str) -> None:
        self.verdicts[key] = way
        self._trials.pop(key, None)
        self._drop(key, [other for other in self.layouts if other != way])

    def _drop(self, key: Key, ways: list[str]) -> None:
        """Free the tensors held for ``key`` in the layouts ``ways``."""
        for slot in [s for s, held in self._held.items() if held[0] == key and s[1] in ways]:
            del self._held[slot]


def _pick(medians: dict[str, float]) -> str:
    """The way to serve, from each way's median product time (``"plain"`` first, then :data:`LAYOUTS` in the order
    of what they cost to make: a transposing copy, then a stacked copy packed): each costlier layout must beat the
    pick so far by :data:`KEEP_BELOW` to take its place."""
    pick = "plain"
    for way in ("plain", *LAYOUTS):
        if way in medians and medians[way] < KEEP_BELOW * medians[pick]:
            pick = way
    return pick


def _cpu_autocast() -> bool:
    """Whether autocast is on for the CPU (``torch.is_autocast_enabled`` takes a device type from torch 2.4 on)."""
    try:
        return th.is_autocast_enabled("cpu")
    except TypeError:
        return th.is_autocast_cpu_enabled()


def _servable(module: nn.Module, x: th.Tensor) -> bool:
    if type(module) is not nn.Linear or x.device.type != "cpu" or th.is_grad_enabled() or _cpu_autocast():
        return False
    weight, bias = module.weight, module.bias
    return (
        x.dtype == weight.dtype == th.float32
        and (bias is None or bias.dtype == th.float32)
        and weight.is_contiguous()
        and weight.numel() >= MIN_SERVED_WEIGHTS
        and x.numel() // max(1, x.shape[-1]) >= MIN_SERVED_ROWS
    )


def laid_out(way: str, weights: Sequence[th.Tensor], rows: int) -> tuple[th.Tensor, ...]:
    """A group's weights (``[out, in]`` each, one input) in layout ``way`` of :data:`LAYOUTS`: a column-major copy of
    each, or one MKL pack of them all stacked, for products of ``rows`` rows."""
    if way == "column":
        return tuple(w.t().contiguous() for w in weights)
    stacked = weights[0] if len(weights) == 1 else th.cat(list(weights))
    return (th.ops.mkl._mkl_reorder_linear_weight(stacked, rows),)


def served_products(
    way: str, group: Sequence[nn.Module], x: th.Tensor, tensors: tuple[th.Tensor, ...], rows: int
) -> tuple[th.Tensor, ...]:
    """The products of ``group``'s linear layers with ``x`` (``rows`` rows), served ``way`` (``"plain"`` or one of
    :data:`LAYOUTS`) from ``tensors``, the layers' weights in that layout (:func:`laid_out`)."""
    if way == "plain":
        return tuple(F.linear(x, m.weight, m.bias) for m in group)
    if way == "column":
        return tuple(_column_product(x, c, m.bias) for m, c in zip(group, tensors, strict=True))
    sizes = [m.weight.shape[0] for m in group]
    return _packed_product(x, tensors[0], sum(sizes), _stacked_bias(group), rows).split(sizes, dim=-1)


def _stacked_bias(group: Group) -> th.Tensor | None:
    """The group's biases end to end (``None`` where none has one; zeros stand in for a missing one)."""
    biases = [m.bias for m in group]
    if all(b is None for b in biases):
        return None
    if len(biases) == 1:
        return biases[0]
    return th.cat([b if b is not None else m.weight.new_zeros(m.weight.shape[0]) for m, b in zip(group, biases)])


def _column_product(x: th.Tensor, column: th.Tensor, bias: th.Tensor | None) -> th.Tensor:
    """``F.linear(x, W, bias)`` from ``column = W.T`` contiguous (``column.T`` is ``W``, stored column by column)."""
    return F.linear(x, column.t(), bias)


def _packed_product(x: th.Tensor, pack: th.Tensor, out: int, bias: th.Tensor | None, rows: int) -> th.Tensor:
    """MKL's product of ``x`` (``rows`` rows, as many as the pack was made for) with a weight of ``out`` rows packed in
    ``pack``. MKL's operator reads the unpacked weight only for another row count, which never reaches it here: it
    gets a zero-stride stand-in of the weight's shape."""
    return th.ops.mkl._mkl_linear(x, pack, x.new_zeros(()).expand(out, x.shape[-1]), bias, rows)
