"""An estimate of the memory one update of a :class:`~sb3_grpo.policies.CausalLMPolicy` needs, from a model's config
alone (no weights: the model is built on PyTorch's ``meta`` device), per option: full fine-tune or LoRA, a quantized
base, the weights' dtype, micro-batches, gradient checkpointing, FSDP over ``n`` ranks and a frozen KL reference.

What is counted, per rank, in bytes:

- **weights**: every parameter once (tied ones once) in ``dtype``; under ``quantization`` the linear layers of the
  transformer blocks (not the embeddings, the norms or the output head, which bitsandbytes keeps) take 1 byte per
  weight plus a float32 scale per output row (8-bit, LLM.int8()), or half a byte plus a float32 absmax per block of
  64 (4-bit; with double quantization an 8-bit absmax per block and a float32 per 256 blocks); LoRA's adapters
  ``r * (in + out)`` per adapted layer in float32; the value head ``(d + 1)`` in float32;
- **gradients**: one per trainable parameter, in its dtype (all of them in a full fine-tune; the adapters and the
  value head with LoRA);
- **Adam state**: two moments per trainable parameter, in its dtype;
- **KL reference**: a frozen copy of the weights for ``kl_coef > 0`` in a full fine-tune (with LoRA the reference is
  the adapters-off model: nothing);
- **activations**: what the backward keeps of one micro-batch of ``micro_batch_size`` sequences of ``seq_len``
  tokens. Per token and transformer block: the inputs and outputs of its norms, projections and activation
  function, ``8 d + 2 d_kv + k i`` elements (``d`` the width, ``d_kv`` the key/value width, ``i`` the MLP's inner
  width, ``k = 4`` for a gated MLP (SwiGLU: gate, up, act, product), 2 otherwise (fc, activation)), a form of
  Korthikanti et al. 2022 (arXiv 2205.05198, eq. 2, ``34 s b h`` bytes at 2 bytes per element for GPT-style blocks)
  without dropout masks (the policy runs its LM in eval mode) and without the ``a s^2`` attention scores (scaled
  dot-product attention keeps none); with gradient checkpointing only each block's input (``d`` per token) is kept,
  plus one block's activations while it is recomputed. The output layer adds the logits, their log-softmax and
  softmax (``3 V`` float32 per token). Elements are ``dtype``'s width (``autocast_dtype``'s when set);
- **FSDP** (``fsdp`` ranks): the blocks' weights, gradients and Adam state divided by the ranks (the embeddings, norms
  and head stay whole, as :func:`~sb3_grpo.common.data_parallel.fsdp_units` shards them), plus one block's full
  weights gathered at a time (and its full gradient, in a full fine-tune).

Allocator overhead, the rollout's KV cache, CUDA's context and the Python process are not counted: the estimate is of
what the update itself holds (under FSDP a rollout holds more: every block gathered, beside the shards; see
:class:`~sb3_grpo.common.data_parallel.FullyShardedDataParallel`). ``sb3-grpo estimate-memory`` prints it;
``textrl-bench memory-recipes`` sets it beside measured peaks.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

__all__ = [
    "COMPARED",
    "MODEL_SHAPES",
    "MemoryEstimate",
    "ModelCounts",
    "estimate_memory",
    "format_estimates",
    "load_config",
    "model_counts",
]

#: Model shapes by name, as config dicts (no download): GPT-2-small and the Qwen2 shapes of Qwen2.5-0.5B / 1.5B.
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "gpt2-small": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257},
    "qwen2-0.5b": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen2-1.5b": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
}

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MB = 1024**2


def load_config(model: str, revision: str | None = None) -> Any:
    """A ``transformers`` config from a shape name (:data:`MODEL_SHAPES`), a ``config.json`` file, a model directory or
    a Hub id (only its ``config.json`` is read: from the Hugging Face cache with ``HF_HUB_OFFLINE=1``).

    :raises ValueError: naming ``model`` when none of these has a config.
    """
    from transformers import AutoConfig

    if model in MODEL_SHAPES:
        shape = dict(MODEL_SHAPES[model])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)
    if os.path.isfile(model):
        try:
            with open(model, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(
                f"--model {model!r} is a file but not a model's config.json ({type(err).__name__}: {err}); give a "
                f"config.json, a model directory, a Hub id or a shape ({', '.join(MODEL_SHAPES)})"
            ) from None
        if not isinstance(data, dict) or "model_type" not in data:
            raise ValueError(f"--model {model!r}: this JSON file has no 'model_type'; give a model's config.json")
        return AutoConfig.for_model(data.pop("model_type"), **data)
    try:
        return AutoConfig.from_pretrained(model, revision=revision)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"--model {model!r} is not a known shape ({', '.join(MODEL_SHAPES)}), a config.json, a model directory "
            f"or a Hub id whose config could be read ({type(err).__name__}: {err})"
        ) from None


@dataclasses.dataclass(frozen=True)
class ModelCounts:
    """Parameter counts of a causal LM, read off the model built on the ``meta`` device.

    :param total: every parameter, tied ones once.
    :param quantizable: weights of the blocks' linear layers (what bitsandbytes quantizes).
    :param quantizable_rows: their output rows (one 8-bit scale each).
    :param block: the parameters inside the transformer blocks (what FSDP shards), and ``largest_block`` of one.
    :param lora: ``r * (in + out)`` summed over the layers LoRA adapts, per unit of rank.
    :param width: the hidden width ``d``; ``kv_width``, ``inner`` (MLP), ``gated``, ``layers``, ``vocab``.
    """

    total: int
    quantizable: int
    quantizable_rows: int
    block: int
    largest_block: int
    lora_per_rank: int
    width: int
    kv_width: int
    inner: int
    gated: bool
    layers: int
    vocab: int


def model_counts(config: Any, lora_targets: list[str] | None = None) -> ModelCounts:
    """Count a model's parameters from its config (built on the ``meta`` device: no memory, no weights).

    :param config: a ``transformers`` config.
    :param lora_targets: the module names LoRA adapts (``None``: peft's default for the model type, when peft knows
        it; else none).
    """
    import torch as th
    from torch import nn
    from transformers import AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    with th.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    if lora_targets is None:
        lora_targets = _default_lora_targets(config.model_type)
    head = lm.get_output_embeddings()
    blocks = [m for m in lm.modules() if type(m).__name__ in set(getattr(lm, "_no_split_modules", None) or [])]
    seen: set[int] = set()
    total = 0
    for p in lm.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    quantizable = rows = lora = 0
    for block in blocks:
        for name, module in block.named_modules():
            if isinstance(module, nn.Linear) and module is not head:
                quantizable += module.weight.numel()
                rows += module.out_features
                fan_in, fan_out = module.in_features, module.out_features
            elif isinstance(module, Conv1D):
                quantizable += module.weight.numel()
                fan_in, fan_out = module.weight.shape  # Conv1D stores (in, out)
                rows += fan_out
            else:
                continue
            if name and name.split(".")[-1] in lora_targets:
                lora += fan_in + fan_out
    sizes = [sum(p.numel() for p in b.parameters()) for b in blocks]
    width = int(lm.get_input_embeddings().weight.shape[1])
    heads = int(getattr(config, "num_attention_heads", getattr(config, "n_head", 1)))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    inner = int(getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * width)
    gated = any("gate" in n for b in blocks[:1] for n, _ in b.named_modules())
    return ModelCounts(
        total=total,
        quantizable=quantizable,
        quantizable_rows=rows,
        block=sum(sizes),
        largest_block=max(sizes, default=0),
        lora_per_rank=lora,
        width=width,
        kv_width=width * kv_heads // heads,
        inner=inner,
        gated=gated,
        layers=len(blocks),
        vocab=int(head.weight.shape[0]),
    )


def _default_lora_targets(model_type: str) -> list[str]:
    try:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as targets
    except ImportError:
        return []
    return list(targets.get(model_type, []))


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """One configuration's estimate, in bytes per rank (see the module's docstring for what each holds)."""

    params: int
    trainable: int
    weights: int
    gradients: int
    adam: int
    kl_reference: int
    activations: int
    fsdp_gathered: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.adam + self.kl_reference + self.activations + self.fsdp_gathered

    def as_mb(self) -> dict[str, float]:
        """Every figure in MiB (and the parameter counts as they are)."""
        out: dict[str, float] = {"params": self.params, "trainable": self.trainable}
        for field in ("weights", "gradients", "adam", "kl_reference", "activations", "fsdp_gathered"):
            out[field] = getattr(self, field) / MB
        out["total"] = self.total / MB
        return out


def quantized_bytes(n_weights: int, n_rows: int, quantization: str) -> float:
    """Bytes of ``n_weights`` linear weights (``n_rows`` output rows) stored quantized: ``"8bit"`` (int8 and a
    float32 scale per row) or ``"4bit"`` (NF4: 4 bits, an 8-bit absmax per block of 64, a float32 per 256 blocks)."""
    if quantization == "8bit":
        return n_weights * 1 + n_rows * 4
    if quantization == "4bit":
        return n_weights * 0.5 + n_weights / 64 * 1 + n_weights / (64 * 256) * 4
    raise ValueError(f"quantization must be '8bit', '4bit' or None, got {quantization!r}")


def activation_elements_per_token(counts: ModelCounts, checkpointing: bool) -> int:
    """Elements the blocks' backward keeps per token: ``8 d + 2 d_kv + k i`` per block, or under checkpointing each
    block's input ``d`` plus one block's ``8 d + 2 d_kv + k i`` (the output layer's float32 logits are counted apart,
    in :func:`estimate_memory`)."""
    per_block = 8 * counts.width + 2 * counts.kv_width + (4 if counts.gated else 2) * counts.inner
    if checkpointing:
        return counts.layers * counts.width + per_block
    return counts.layers * per_block


def estimate_memory(
    counts: ModelCounts,
    *,
    lora_rank: int | None = None,
    quantization: str | None = None,
    dtype: str = "float32",
    autocast_dtype: str | None = None,
    micro_batch_size: int = 8,
    seq_len: int = 256,
    gradient_checkpointing: bool = False,
    fsdp: int = 1,
    kl_reference: bool = False,
    n_actions: int | None = None,
) -> MemoryEstimate:
    """The update's memory per rank for one configuration (the module's docstring lists each term).

    :param counts: :func:`model_counts` of the model.
    :param lora_rank: LoRA's rank ``r`` (``None``: full fine-tune).
    :param quantization: ``"8bit"``, ``"4bit"`` or ``None`` (needs ``lora_rank``).
    :param dtype: the weights' dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
    :param autocast_dtype: the activations' dtype under autocast (``None``: ``dtype``).
    :param micro_batch_size: sequences per forward and backward.
    :param seq_len: tokens per sequence (prompt and completion).
    :param gradient_checkpointing: keep only each block's input for the backward.
    :param fsdp: ranks the blocks are sharded over (1: no sharding).
    :param kl_reference: a KL term (``kl_coef > 0``): a frozen copy of the weights in a full fine-tune.
    :param n_actions: the env's action space (``len(tokenizer)``): the policy computes logits for these tokens only
        (``None``: the model's whole vocabulary).
    """
    if dtype not in _DTYPE_BYTES or (autocast_dtype is not None and autocast_dtype not in _DTYPE_BYTES):
        raise ValueError(f"dtype and autocast_dtype must be one of {', '.join(_DTYPE_BYTES)}")
    if quantization is not None and lora_rank is None:
        raise ValueError("quantization needs LoRA (a quantized base cannot be trained directly): give a LoRA rank")
    if micro_batch_size < 1 or seq_len < 1 or fsdp < 1 or (lora_rank is not None and lora_rank < 1):
        raise ValueError("micro_batch_size, seq_len, fsdp and the LoRA rank must be >= 1")
    if quantization is not None and fsdp > 1:
        raise ValueError("a quantized base is not sharded by FSDP here; estimate quantized LoRA with fsdp=1")
    width = _DTYPE_BYTES[dtype]
    head = counts.width + 1  # the value head, float32
    adapters = 0 if lora_rank is None else lora_rank * counts.lora_per_rank  # all inside the blocks: sharded
    outside = counts.total - counts.block  # embeddings, final norm, head: whole on every rank
    shard = counts.block / fsdp + outside  # parameters held per rank
    if quantization is None:
        base = shard * width
    else:
        dense = counts.total - counts.quantizable
        base = dense * width + quantized_bytes(counts.quantizable, counts.quantizable_rows, quantization)
    if lora_rank is None:
        trainable = counts.total
        state_bytes = shard * width + head * 4  # one value per trainable parameter, per rank
    else:
        trainable = adapters
        state_bytes = adapters / fsdp * 4 + head * 4
    act_width = _DTYPE_BYTES[autocast_dtype or dtype]
    tokens = micro_batch_size * seq_len
    activations = tokens * activation_elements_per_token(counts, gradient_checkpointing) * act_width
    activations += tokens * 3 * (n_actions or counts.vocab) * 4  # logits, log-softmax, softmax: float32
    # FSDP gathers one block's full weights at a time (and, in a full fine-tune, its full gradient before the
    # reduce-scatter)
    gathered = 0 if fsdp == 1 else counts.largest_block * width * (2 if lora_rank is None else 1)
    return MemoryEstimate(
        params=counts.total + head + adapters,
        trainable=trainable + head,
        weights=int(base + head * 4 + adapters / fsdp * 4),
        gradients=int(state_bytes),
        adam=int(2 * state_bytes),
        kl_reference=int(shard * width) if kl_reference and lora_rank is None else 0,
        activations=int(activations),
        fsdp_gathered=int(gathered),
    )


#: The configurations ``sb3-grpo estimate-memory --compare`` sets side by side: (label, LoRA, quantization).
COMPARED = (("full", False, None), ("LoRA", True, None), ("LoRA + 8-bit", True, "8bit"), ("LoRA + 4-bit", True, "4bit"))


def format_estimates(rows: list[tuple[str, MemoryEstimate]]) -> str:
    """A plain-text table of estimates, one row per configuration, MiB per rank."""
    head = f"{'configuration':34s} {'params M':>9s} {'train M':>8s} {'weights':>8s} {'grads':>8s} {'Adam':>8s} "
    head += f"{'KL ref':>7s} {'activ.':>8s} {'FSDP':>6s} {'total MB':>9s}"
    lines = [head]
    for name, est in rows:
        mb = est.as_mb()
        lines.append(
            f"{name:34s} {est.params / 1e6:9.1f} {est.trainable / 1e6:8.2f} {mb['weights']:8.0f} "
            f"{mb['gradients']:8.0f} {mb['adam']:8.0f} {mb['kl_reference']:7.0f} {mb['activations']:8.0f} "
            f"{mb['fsdp_gathered']:6.0f} {mb['total']:9.0f}"
        )
    return "\n".join(lines)
