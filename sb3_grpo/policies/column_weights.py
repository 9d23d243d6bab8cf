"""Column-major copies of the transformer blocks' weights for the rollout's decoding products on a CPU.

A linear layer stores its weight ``[out, in]`` row by row, and ``F.linear(x, W)`` asks BLAS for ``x @ W.T``: MKL's
``sgemm`` then gathers the weight's columns into its panels at every call, a transposing copy of a weight that a
decoding step reads once and from memory. Given the same weight laid out column by column (``W.T`` contiguous, the
tensor ``W.T.contiguous().T``) it copies the panels straight, and multiplies in the same order, so the numbers are the
same to the bit for 16 rows or more (under that it takes another kernel). How much faster depends on the CPU, the
thread count and the shape (``textrl-bench real-speed`` times each of a model's weight shapes both ways): on one core
of an AVX-512 Xeon at batch 64, SmolLM2-135M-Instruct's block products ran 1.2x to 1.5x as fast; on two cores 1.05x
to 1.1x, and in the policy's own trials on two cores some shapes did not gain. So nothing is assumed.

:class:`ColumnWeights` serves a layer's product (:meth:`ColumnWeights.linear`, which the lean decoding step of
:mod:`~sb3_grpo.policies.lean_step` calls for each projection) from a column-major copy of its weight where that was
measured to pay. Per weight shape, row count and thread count it first runs both products on the same inputs for
:data:`TRIAL_PRODUCTS` calls (the layers of one decoding step share a few shapes, so this takes part of one step):
the copy is kept if its products equal ``F.linear``'s to the bit on every trial and take less than
:data:`KEEP_BELOW` of its median time, and is never tried again otherwise. A copy is made anew when its weight
changes (an optimizer step or a loaded state dict bumps the tensor's version; a new tensor has another address). The
copies take as much memory as the weights they copy (SmolLM2-135M's blocks: 0.42 GB in float32), from a rollout's
first decoding steps until the policy drops them before an update (:meth:`ColumnWeights.clear`).
``CausalLMPolicy(column_major_weights=False)`` turns it off.

It serves float32 products on the CPU without gradients or autocast, of a plain ``nn.Linear`` whose weight is
contiguous and has at least :data:`MIN_COLUMN_WEIGHTS` elements, for at least :data:`MIN_COLUMN_ROWS` rows; anything
else is the layer's own call.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch as th
from torch import nn
from torch.nn import functional as F

__all__ = ["KEEP_BELOW", "MIN_COLUMN_ROWS", "MIN_COLUMN_WEIGHTS", "TRIAL_PRODUCTS", "ColumnWeights"]

#: The fewest weight elements a layer needs for its product to be served from a column-major copy.
MIN_COLUMN_WEIGHTS = 1 << 16
#: The fewest rows a product needs (MKL takes another kernel, with other roundings, for fewer than about 16).
MIN_COLUMN_ROWS = 16
#: Products per (weight shape, rows, threads) run both ways before the faster way is chosen.
TRIAL_PRODUCTS = 8
#: The copy is kept where its median product time is below this share of ``F.linear``'s (it costs a copy of the
#: weight per rollout, which a few percent of the decoding products pays for).
KEEP_BELOW = 0.95

#: the clock the trials are timed with (a test can replace it)
_clock = time.perf_counter


@dataclass
class _Trial:
    """The timings of one key's trial products: ``F.linear``'s and the copy's, in seconds."""

    plain: list[float] = field(default_factory=list)
    column: list[float] = field(default_factory=list)


class ColumnWeights:
    """Column-major weight copies, served where measured faster and equal (see the module's docstring)."""

    def __init__(self) -> None:
        #: per served layer, its weight's ``(address, version)`` when copied and the copy ``[in, out]``
        self._copies: dict[nn.Linear, tuple[tuple[int, int], th.Tensor]] = {}
        self._trials: dict[tuple[int, int, int, int], _Trial] = {}
        #: ``(out, in, rows, threads)`` decided: ``True`` served from the copy, ``False`` by ``F.linear``
        self.verdicts: dict[tuple[int, int, int, int], bool] = {}

    @property
    def holds(self) -> bool:
        """Whether any copy is held (its memory in use)."""
        return bool(self._copies)

    def clear(self) -> None:
        """Drop every copy (the verdicts are kept: they depend on shapes and threads, not on the weights)."""
        self._copies.clear()

    def linear(self, module: nn.Module, x: th.Tensor) -> th.Tensor:
        """``module(x)``, served from ``module``'s column-major weight copy where that was measured to pay.

        :param module: the layer (anything but a plain ``nn.Linear`` is called as it is).
        :param x: ``[..., in]`` inputs.
        """
        if not _servable(module, x):
            return module(x)
        weight, bias = module.weight, module.bias
        rows = x.numel() // x.shape[-1]
        key = (weight.shape[0], weight.shape[1], rows, th.get_num_threads())
        verdict = self.verdicts.get(key)
        if verdict is False:
            self._copies.pop(module, None)
            return F.linear(x, weight, bias)
        column = self._copy(module)
        if verdict:
            return _column_product(x, column, bias)
        return self._trial(key, module, x, column)

    def _copy(self, module: nn.Linear) -> th.Tensor:
        """``module``'s weight transposed into a contiguous ``[in, out]`` tensor, copied anew if the weight changed."""
        weight = module.weight
        stamp = (weight.data_ptr(), weight._version)
        held = self._copies.get(module)
        if held is None or held[0] != stamp:
            self._copies.pop(module, None)  # the old copy's memory is free before the new one is made
            held = (stamp, weight.detach().t().contiguous())
            self._copies[module] = held
        return held[1]

    def _trial(self, key: tuple[int, int, int, int], module: nn.Linear, x: th.Tensor, column: th.Tensor) -> th.Tensor:
        """Both products of one trial, timed (in alternating order) and compared; the verdict once the trial has
        :data:`TRIAL_PRODUCTS` timings. Returns ``F.linear``'s product."""
        weight, bias = module.weight, module.bias
        trial = self._trials.setdefault(key, _Trial())
        first_plain = len(trial.plain) % 2 == 0
        if first_plain:
            start = _clock()
            plain = F.linear(x, weight, bias)
            middle = _clock()
            served = _column_product(x, column, bias)
            end = _clock()
            plain_s, column_s = middle - start, end - middle
        else:
            start = _clock()
            served = _column_product(x, column, bias)
            middle = _clock()
            plain = F.linear(x, weight, bias)
            end = _clock()
            column_s, plain_s = middle - start, end - middle
        if not th.equal(served, plain):
            if bool(th.isfinite(plain).all()):  # (non-finite inputs prove nothing: the next call checks again)
                self._decide(key, False)
                self._copies.pop(module, None)
            return plain
        trial.plain.append(plain_s)
        trial.column.append(column_s)
        if len(trial.plain) >= TRIAL_PRODUCTS:
            serve = statistics.median(trial.column) < KEEP_BELOW * statistics.median(trial.plain)
            self._decide(key, serve)
            if not serve:
                self._copies.pop(module, None)
        return plain

    def _decide(self, key: tuple[int, int, int, int], serve: bool) -> None:
        self.verdicts[key] = serve
        self._trials.pop(key, None)


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
        and weight.numel() >= MIN_COLUMN_WEIGHTS
        and x.numel() // max(1, x.shape[-1]) >= MIN_COLUMN_ROWS
    )


def _column_product(x: th.Tensor, column: th.Tensor, bias: th.Tensor | None) -> th.Tensor:
    """``F.linear(x, W, bias)`` from ``column = W.T`` contiguous (``column.T`` is ``W``, stored column by column)."""
    return F.linear(x, column.t(), bias)
