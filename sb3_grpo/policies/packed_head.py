"""The output layer's product with its weight packed once for MKL, for the rollout's decoding steps on a CPU.

At a decoding step the output layer is the largest single product: at batch 64 on SmolLM2-135M-Instruct,
``[64, 576] x [576, 49152]``, 3.6 GFLOP, which ``F.linear`` (MKL's ``sgemm``) runs at about half the machine's matmul
rate, re-packing the weight's panels at every call. MKL can pack a weight once for a given number of rows
(``cblas_sgemm_pack``; PyTorch reaches it through ``torch.ops.mkl._mkl_reorder_linear_weight`` and ``_mkl_linear``,
which ``torch.compile``'s CPU freezing uses): the same product then took 34 ms instead of 51-56 ms on one core of an
AVX-512 Xeon (``textrl-bench real-speed`` measures what a whole rollout gains).

:class:`PackedHead` holds one packed copy of one weight, for one row count. It packs when the same row count comes
twice in a row (a decoding loop, not a one-off prefill), serves only products that give ``F.linear``'s numbers to the
bit (checked once per pack, against ``F.linear`` on the rows that made it: for fewer than about 16 rows MKL takes
another kernel, and another CPU may take others; such a row count stays unpacked), and packs anew when the weight
changes (an optimizer step or a loaded state dict bumps the tensor's version; a new tensor has another address). The
pack's resident memory is the weight's own (measured on 49,152 x 576, 50,257 x 768, 151,936 x 896 and 32,000 x 2,048
weights), though MKL reserves more address space for its padded form than it writes (2.06x the weight for
SmolLM2-135M's 49,152 x 576, 1.1x for 32,000 x 2,048); it is held from the first decoding steps of a rollout until the
policy drops it before an update (:meth:`PackedHead.clear`).
``CausalLMPolicy(pack_output_layer=False)`` turns it off.

It serves float32 products on the CPU without gradients, of a contiguous weight of at least :data:`MIN_PACKED_WEIGHTS`
elements (below that the product is too small for the packing to pay), where PyTorch was built with MKL; anything
else gets ``None`` and the caller's ``F.linear``.
"""

from __future__ import annotations

import torch as th
from torch.nn import functional as F

__all__ = ["MIN_PACKED_WEIGHTS", "PackedHead", "mkl_packing_available"]

#: The fewest weight elements a layer needs for :class:`PackedHead` to pack it.
MIN_PACKED_WEIGHTS = 1 << 20


def mkl_packing_available() -> bool:
    """Whether this PyTorch has MKL's packed products (x86 CPU builds do; macOS arm64 builds do not)."""
    if not th.backends.mkl.is_available():
        return False
    try:
        ops = (getattr(th.ops.mkl, name, None) for name in ("_mkl_linear", "_mkl_reorder_linear_weight"))
        return all(op is not None for op in ops)
    except RuntimeError:  # an operator namespace that fails to load
        return False


class PackedHead:
    """One MKL-packed copy of a weight for one row count (see the module's docstring)."""

    def __init__(self) -> None:
        self._available = mkl_packing_available()
        self._packed: th.Tensor | None = None
        self._key: tuple | None = None
        self._last_rows: int | None = None
        #: ``(weight shape, rows)`` whose packed product differed from ``F.linear`` here (MKL takes another kernel for
        #: a few rows, under about 16): never packed again
        self.refused: set[tuple[tuple[int, ...], int]] = set()

    @property
    def holds(self) -> bool:
        """Whether a packed weight is held (its memory in use)."""
        return self._packed is not None

    def clear(self) -> None:
        """Drop the packed weight (and the row count seen last)."""
        self._packed, self._key, self._last_rows = None, None, None

    def linear(self, hidden: th.Tensor, weight: th.Tensor, bias: th.Tensor | None) -> th.Tensor | None:
        """``F.linear(hidden, weight, bias)`` through the packed weight, or ``None`` where the pack does not serve.

        :param hidden: ``[rows, d]`` inputs.
        :param weight: ``[out, d]`` weight.
        :param bias: ``[out]`` or ``None``.
        """
        if not self._servable(hidden, weight, bias):
            return None
        rows = hidden.shape[0]
        last, self._last_rows = self._last_rows, rows
        key = (weight.data_ptr(), weight._version, tuple(weight.shape), rows)
        if key != self._key:
            if (tuple(weight.shape), rows) in self.refused:
                return None
            if rows != last:  # a one-off row count (a prefill) keeps the pack of the decoding loop
                return None
            return self._pack(hidden, weight, bias, key)
        return _packed_product(hidden, self._packed, weight, bias, rows)

    def _servable(self, hidden: th.Tensor, weight: th.Tensor, bias: th.Tensor | None) -> bool:
        return (
            self._available
            and not th.is_grad_enabled()
            and hidden.device.type == "cpu"
            and hidden.dim() == 2
            and weight.dim() == 2
            and hidden.dtype == weight.dtype == th.float32
            and (bias is None or bias.dtype == th.float32)
            and weight.is_contiguous()
            and weight.numel() >= MIN_PACKED_WEIGHTS
        )

    def _pack(self, hidden: th.Tensor, weight: th.Tensor, bias: th.Tensor | None, key: tuple) -> th.Tensor:
        """Pack ``weight`` for ``hidden``'s rows, check the packed product against ``F.linear`` and return it."""
        self.clear()  # the old pack's memory is free before the new one is made
        rows = hidden.shape[0]
        packed = th.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        out = _packed_product(hidden, packed, weight, bias, rows)
        plain = F.linear(hidden, weight, bias)
        if not th.equal(out, plain):
            if bool(th.isfinite(plain).all()):  # (non-finite inputs prove nothing: the next call checks again)
                self.refused.add((tuple(weight.shape), rows))
            return plain
        self._packed, self._key, self._last_rows = packed, key, rows
        return out


def _packed_product(
    hidden: th.Tensor, packed: th.Tensor, weight: th.Tensor, bias: th.Tensor | None, rows: int
) -> th.Tensor:
    """MKL's product of ``hidden`` with ``weight`` packed for ``rows`` rows (``weight`` is the unpacked original)."""
    return th.ops.mkl._mkl_linear(hidden, packed, weight, bias, rows)
