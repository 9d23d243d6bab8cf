"""Quantized base weights (bitsandbytes, optional) for a LoRA :class:`~sb3_grpo.policies.CausalLMPolicy`.

A quantized base is loaded with ``from_pretrained(..., quantization_config=BitsAndBytesConfig(...))``: its linear
layers hold 8-bit (LLM.int8(), Dettmers et al. 2022, arXiv 2208.07339) or 4-bit NormalFloat weights (QLoRA, Dettmers
et al. 2023, arXiv 2305.14314), frozen, and the LoRA adapters on top of them train in float32.
:func:`quantization_spec` turns what a user passes (``"8bit"``, ``"4bit"``, a dict of ``BitsAndBytesConfig``
arguments or a ``BitsAndBytesConfig``) into the JSON-able spec the policy saves; :func:`bnb_config` builds the
``BitsAndBytesConfig`` back from it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch as th

__all__ = ["QUANT_INSTALL_HINT", "QUANTIZATION_SHORTHANDS", "bnb_config", "quantization_spec", "quantized_device"]

QUANT_INSTALL_HINT = 'pip install "textrl[quant]"  (or: pip install "bitsandbytes>=0.46")'

#: The shorthands ``quantization=`` takes, and the ``BitsAndBytesConfig`` arguments each stands for (4-bit: NF4 with
#: double quantization, QLoRA's recipe; the compute dtype is the policy's ``dtype``, float32 without one).
QUANTIZATION_SHORTHANDS: dict[str, dict[str, Any]] = {
    "8bit": {"load_in_8bit": True},
    "4bit": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
}


def _import_bitsandbytes() -> None:
    try:
        with quiet_bnb_import():
            import bitsandbytes  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"CausalLMPolicy(quantization=...) needs the optional dependency bitsandbytes, which is not installed "
            f"({err}); install it with: {QUANT_INSTALL_HINT}; or drop policy_kwargs['quantization'] to load the base "
            "in full precision"
        ) from err


def quantization_spec(value: Any, dtype: th.dtype | None = None) -> dict[str, Any]:
    """The JSON-able spec of a bitsandbytes quantization: the ``BitsAndBytesConfig`` arguments that differ from
    their defaults (``load_in_8bit`` or ``load_in_4bit`` always included); ``BitsAndBytesConfig(**spec)`` rebuilds it.

    :param value: ``"8bit"``, ``"4bit"`` (NF4, double quantization, compute dtype ``dtype`` or float32), a dict of
        ``transformers.BitsAndBytesConfig`` arguments (dtypes as names or ``torch.dtype``), or a
        ``BitsAndBytesConfig``.
    :param dtype: the policy's ``dtype``: the 4-bit compute dtype of the ``"4bit"`` shorthand.
    :return: the spec, a plain dict of JSON types.
    :raises ValueError: for an unknown shorthand, invalid arguments, or a config that quantizes to neither 8 nor 4 bits.
    """
    _import_bitsandbytes()
    from transformers import BitsAndBytesConfig

    if isinstance(value, str):
        if value not in QUANTIZATION_SHORTHANDS:
            raise ValueError(
                f"policy_kwargs['quantization']={value!r} is not known; use one of "
                f"{', '.join(map(repr, QUANTIZATION_SHORTHANDS))}, a dict of transformers.BitsAndBytesConfig "
                "arguments, or a BitsAndBytesConfig"
            )
        args = dict(QUANTIZATION_SHORTHANDS[value])
        if "load_in_4bit" in args:
            args["bnb_4bit_compute_dtype"] = dtype or th.float32
        value = args
    if isinstance(value, dict):
        try:
            config = BitsAndBytesConfig(**value)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"policy_kwargs['quantization'] is not a valid set of transformers.BitsAndBytesConfig arguments "
                f"({err}); pass e.g. {{'load_in_4bit': True, 'bnb_4bit_quant_type': 'nf4'}}, or '8bit' / '4bit'"
            ) from err
    elif isinstance(value, BitsAndBytesConfig):
        config = value
    else:
        raise TypeError(
            "policy_kwargs['quantization'] must be '8bit', '4bit', a dict of BitsAndBytesConfig arguments or a "
            f"BitsAndBytesConfig, got {type(value).__name__}"
        )
    if not (config.load_in_8bit or config.load_in_4bit):
        raise ValueError(
            "policy_kwargs['quantization'] quantizes nothing (neither load_in_8bit nor load_in_4bit is set); pass "
            "'8bit' or '4bit', or drop it"
        )
    given, defaults = _public(config.to_dict()), _public(BitsAndBytesConfig().to_dict())
    keep = {"load_in_8bit"} if config.load_in_8bit else {"load_in_4bit"}
    return {k: v for k, v in given.items() if k in keep or defaults.get(k, object()) != v}


def _public(config: dict[str, Any]) -> dict[str, Any]:
    """A ``BitsAndBytesConfig.to_dict()`` without its private copies and its method tag, dtypes as names."""
    out = {}
    for key, value in config.items():
        if key.startswith("_") or key == "quant_method":
            continue
        out[key] = str(value).replace("torch.", "") if isinstance(value, th.dtype) else value
    return out


#: The logger of bitsandbytes' 8-bit matmul, which notes on every call that float32 inputs are cast to float16.
_MATMUL_8BIT_LOGGER = "bitsandbytes.autograd._functions"
#: Loggers that report, when bitsandbytes is imported, that an optional CPU kernel package is not in the cache.
_BNB_IMPORT_LOGGERS = ("bitsandbytes", "kernels")


class _DropCastNotice(logging.Filter):
    """Drops bitsandbytes' ``MatMul8bitLt: inputs will be cast ...`` notice (one per forward call otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("MatMul8bitLt: inputs will be cast")


_DROP_CAST_NOTICE = _DropCastNotice()


@contextlib.contextmanager
def quiet_8bit_casts(active: bool = True) -> Iterator[None]:
    """While the block runs (our policy's forward of an 8-bit base), drop bitsandbytes' notice that float32 inputs
    are cast to float16, which it logs on every call; the filter is removed after, so the user's own 8-bit models
    still say it."""
    if not active:
        yield
        return
    logger = logging.getLogger(_MATMUL_8BIT_LOGGER)
    logger.addFilter(_DROP_CAST_NOTICE)
    try:
        yield
    finally:
        logger.removeFilter(_DROP_CAST_NOTICE)


@contextlib.contextmanager
def quiet_bnb_import() -> Iterator[None]:
    """While the block runs (our import of peft or bitsandbytes), bitsandbytes' and the ``kernels`` package's
    warnings that an optional CPU kernel is not in the local cache (``Failed to load CPU gemm_4bit_forward ...``,
    printed on import even without quantization) are silenced; the loggers' levels are restored after."""
    loggers = [logging.getLogger(name) for name in _BNB_IMPORT_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def bnb_config(spec: dict[str, Any]) -> Any:
    """The ``transformers.BitsAndBytesConfig`` a :func:`quantization_spec` describes."""
    _import_bitsandbytes()
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(**spec)


def quantized_device() -> str:
    """Where a quantized base is loaded: the first CUDA device when there is one, else the CPU (bitsandbytes
    quantizes while loading, so the weights are placed there at once rather than moved afterwards)."""
    return "cuda:0" if th.cuda.is_available() else "cpu"


def keep_training_layout(lm: th.nn.Module) -> int:
    """Switch off bitsandbytes' CPU inference repacking of 4-bit weights in ``lm``'s layers.

    On a CPU with AVX512-BF16, a ``Linear4bit`` in eval mode repacks its weights for faster inference the first time it
    runs without gradients, and its backward then fails. The policy runs the LM in eval mode in rollout (no gradients)
    and update alike, so the repacking would break the update that follows the first rollout.

    :param lm: the quantized model.
    :return: how many layers were changed.
    """
    changed = 0
    for module in lm.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
            changed += 1
    return changed
