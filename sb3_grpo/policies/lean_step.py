"""The built-in decoder's single-token forward, written over a Hugging Face model's own weights.

A Hugging Face model's ``forward`` does much besides the arithmetic of one decoding step: argument handling, the
attention mask's construction, the cache's bookkeeping, output records, a module call per sub-layer. For the small
models of a CPU run that overhead is most of the step (the bundled LM: about 3 ms of a forward's 4, measured by
``textrl-bench perf --only engine``), and on a GPU it is the host time between kernels. :func:`lean_step` returns,
for an architecture it knows, a function that runs the same operations in the same order on the same tensors and
nothing else, so its hidden states equal the model's own forward to the bit (tested): the model's own activation
and rotary-embedding modules are called where the arithmetic depends on them.

Each layer's keys and values grow by one column a step. ``torch.cat`` would copy the whole cache for that, every
layer and step (at batch 64 on SmolLM2-135M, a tenth of a bfloat16 rollout's time); :func:`_append_column` writes
the new column into spare room that a layer keeps beyond its columns, and the layer's keys become a view of the
first ones (the same numbers: attention reads a view as it reads a copy).

It reads the weights at each call (a step after an optimizer update sees the new weights) and serves only a model
whose modules are the stock ones: in eval mode, with no forward hooks (FSDP, user hooks), no quantized layers
(their classes differ) and the config options the stock attention takes. LoRA layers (peft's, over plain linear
layers) are taken in the Llama family, whose step calls each projection as the model's forward does; GPT-2's step
multiplies its weights itself, so a GPT-2 with LoRA uses the model's forward. Anything else gets ``None``, and the
decoder uses the model's forward.

Architectures: GPT-2 (``GPT2Model``), and the Llama family with rotary embeddings, RMSNorm, grouped-query attention
and a gated MLP (``LlamaModel``, ``Qwen2Model``, ``MistralModel`` without a sliding window).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch as th
from torch import nn
from torch.nn import functional as F

__all__ = ["LeanStep", "Projections", "lean_step", "projection_groups"]

#: ``step(ids [B, 1], mask [B, S], positions [B, 1], cache) -> hidden [B, 1, d]``: one token per row, appended to
#: each layer's keys and values in ``cache`` (a ``transformers.DynamicCache`` whose ``S - 1`` columns ``mask`` covers).
LeanStep = Callable[[th.Tensor, th.Tensor, th.Tensor, Any], th.Tensor]
#: ``project(modules, x)``: the products of projections that read the same input, ``tuple(m(x) for m in modules)``
#: to the bit (a layer's query, key and value; its gate and up; or one projection).
Projections = Callable[[tuple[nn.Module, ...], th.Tensor], tuple[th.Tensor, ...]]


def _call_each(modules: tuple[nn.Module, ...], x: th.Tensor) -> tuple[th.Tensor, ...]:
    return tuple(m(x) for m in modules)


def lean_step(body: nn.Module, project: Projections | None = None) -> LeanStep | None:
    """The lean single-token forward of ``body`` (a causal LM's base model, e.g. ``lm.base_model``), or ``None``
    where its architecture, its modules or its state are not the stock ones this module knows.

    :param project: how the Llama family's step runs its projections, a group that reads the same input at a time
        (``project(modules, x)``, which must equal ``tuple(m(x) for m in modules)`` to the bit:
        :meth:`~sb3_grpo.policies.block_weights.BlockWeights.project`); ``None``: each module's call.
    """
    if body.training or _has_hooks(body):
        return None
    name = type(body).__name__
    if name == "GPT2Model" and _stock_gpt2(body):
        return lambda ids, mask, positions, cache: _gpt2_step(body, ids, mask, positions, cache)
    if name in ("LlamaModel", "Qwen2Model", "MistralModel") and _stock_llama(body):
        projections = project or _call_each
        return lambda ids, mask, positions, cache: _llama_step(body, ids, mask, positions, cache, projections)
    return None


def _has_hooks(module: nn.Module) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


def _all_of(modules: Any, cls: type) -> bool:
    return all(type(m) is cls for m in modules)


def _stock_gpt2(body: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D

    config = body.config
    if (
        getattr(config, "add_cross_attention", False)
        or getattr(config, "scale_attn_by_inverse_layer_idx", False)
        or getattr(config, "reorder_and_upcast_attn", False)
        or not getattr(config, "scale_attn_weights", True)
        or getattr(config, "_attn_implementation", "sdpa") != "sdpa"
    ):
        return False
    blocks = list(body.h)
    linears = [m for b in blocks for m in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    norms = [body.ln_f, *(n for b in blocks for n in (b.ln_1, b.ln_2))]
    return _all_of(linears, Conv1D) and _all_of(norms, nn.LayerNorm) and type(body.wte) is nn.Embedding


def _gpt2_step(body: Any, ids: th.Tensor, mask: th.Tensor, positions: th.Tensor, cache: Any) -> th.Tensor:
    """``GPT2Model.forward`` of one token per row with a cache, in its own order of operations."""
    b = ids.shape[0]
    x = F.embedding(ids, body.wte.weight) + F.embedding(positions, body.wpe.weight)
    attend = _attention_mask(mask)
    heads = body.config.n_head
    for block, layer in zip(body.h, cache.layers, strict=True):
        attn, mlp = block.attn, block.mlp
        h = F.layer_norm(x, x.shape[-1:], block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
        qkv = th.addmm(attn.c_attn.bias, h.view(b, -1), attn.c_attn.weight).view(b, 1, 3, heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        layer.keys = _append_column(layer, "keys", k)
        layer.values = _append_column(layer, "values", v)
        a = _attention(q, layer.keys, layer.values, attend, None)
        x = th.addmm(attn.c_proj.bias, a.view(b, -1), attn.c_proj.weight).view(b, 1, -1) + x
        h = F.layer_norm(x, x.shape[-1:], block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
        f = mlp.act(th.addmm(mlp.c_fc.bias, h.view(b, -1), mlp.c_fc.weight))
        x = x + th.addmm(mlp.c_proj.bias, f, mlp.c_proj.weight).view(b, 1, -1)
    return F.layer_norm(x, x.shape[-1:], body.ln_f.weight, body.ln_f.bias, body.ln_f.eps)


#: Spare columns a layer's buffer gets when it is (re)allocated: this many, or half its columns if more.
SPARE_COLUMNS = 32


def _append_column(layer: Any, name: str, new: th.Tensor) -> th.Tensor:
    """``th.cat([getattr(layer, name), new], dim=-2)`` (``[B, H, S, D]`` and ``[B, H, 1, D]``) without copying the old
    columns: the result is a view of a buffer the layer keeps (``layer._lean_spare[name]``) with room beyond them.

    The old tensor is ``S`` consecutive columns of the buffer when the last call made it and nothing replaced it since
    (its leading columns may have been cropped since: a view further into the buffer); then the new column is written
    after them and the view widened. Anything else (a cache the model's own forward grew by ``cat``, rows gathered, a
    full buffer) gets a new buffer with the old columns copied in and :data:`SPARE_COLUMNS` or ``S // 2`` columns of
    room. Writing the column after the view changes no tensor anyone holds: every view handed out ends at or before
    it.
    """
    old = getattr(layer, name)
    spare = layer.__dict__.setdefault("_lean_spare", {})
    buf = spare.get(name)
    b, h, n, d = old.shape
    start = _column_offset(old, buf)
    if start is None or start + n >= buf.shape[-2]:
        buf = old.new_empty(b, h, n + max(SPARE_COLUMNS, n // 2), d)
        buf[:, :, :n].copy_(old)
        spare[name] = buf
        start = 0
    buf[:, :, start + n : start + n + 1].copy_(new)
    return buf[:, :, start : start + n + 1]


def _column_offset(old: th.Tensor, buf: th.Tensor | None) -> int | None:
    """The first buffer column of ``old`` when ``old`` is ``buf[:, :, s : s + n]`` for some ``s`` (the view the last
    call made, or that view with leading columns cropped), else ``None``."""
    if (
        buf is None
        or buf.shape[:2] != old.shape[:2]
        or buf.shape[-1] != old.shape[-1]
        or buf.dtype != old.dtype
        or buf.device != old.device
        or old.stride() != buf.stride()
    ):
        return None
    step = buf.stride(-2) * buf.element_size()
    offset, rest = divmod(old.data_ptr() - buf.data_ptr(), step)
    if rest or offset < 0 or offset + old.shape[-2] > buf.shape[-2]:
        return None
    return offset


def _attention_mask(mask: th.Tensor) -> th.Tensor | None:
    """The attention mask of one query per row over the cache's columns, as the models' sdpa path gets it: ``None``
    where no column is masked (the mask is skipped then), else ``[B, 1, 1, S]`` booleans."""
    return None if bool(mask.all()) else mask.bool()[:, None, None, :]


def _attention(q: th.Tensor, k: th.Tensor, v: th.Tensor, attend: th.Tensor | None, scale: float | None) -> th.Tensor:
    """Attention of one query per row, ``[B, 1, heads * d]`` out, as the models' sdpa path computes it; with grouped
    query heads, by the key/value heads (each group's queries packed as a key/value head's rows) or, without a mask,
    by sdpa's own grouped-query mode."""
    b, heads, _, dim = q.shape
    groups = heads // k.shape[1]
    extra = {}
    if groups > 1:
        if attend is None and k.shape[-1] == v.shape[-1] <= 256:
            extra["enable_gqa"] = True
        else:
            q = q.reshape(b, heads // groups, groups, dim)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, scale=scale, **extra)
    return a.reshape(b, -1, 1, v.shape[-1]).transpose(1, 2).reshape(b, 1, -1)


def _stock_llama(body: nn.Module) -> bool:
    config = body.config
    if getattr(config, "_attn_implementation", "sdpa") != "sdpa" or getattr(config, "sliding_window", None):
        return False
    if getattr(config, "layer_types", None) and any(t != "full_attention" for t in config.layer_types):
        return False
    layers = list(body.layers)
    linears = [m for layer in layers for group in projection_groups(layer) for m in group]
    norms = [body.norm, *(n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm))]
    norm_class = type(body.norm)
    return (
        all(type(m) is nn.Linear or _lora_linear(m) for m in linears)
        and _all_of(norms, norm_class)
        and norm_class.__name__.endswith("RMSNorm")
        and type(body.embed_tokens) is nn.Embedding
        and all(getattr(layer.self_attn, "q_norm", None) is None for layer in layers)
    )


def projection_groups(layer: Any) -> tuple[tuple[nn.Module, ...], ...]:
    """A Llama-family decoder layer's projections in the groups, and the order, its step runs them: the query, key and
    value (one input), the output, the gate and up (one input), the down projection."""
    attn, mlp = layer.self_attn, layer.mlp
    return (attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,), (mlp.gate_proj, mlp.up_proj), (mlp.down_proj,)


def _lora_linear(module: nn.Module) -> bool:
    """A peft LoRA layer over a plain ``nn.Linear``: the Llama step calls its projections as modules, as the model's
    forward does, so the adapters' arithmetic is the layer's own either way."""
    base = getattr(module, "base_layer", None)
    return type(module).__module__.startswith("peft.tuners.lora") and type(base) is nn.Linear


def _rms_norm(norm: Any, x: th.Tensor) -> th.Tensor:
    """Llama's RMSNorm, as its module computes it (float32 variance, the weight applied in the input's dtype)."""
    dtype = x.dtype
    x32 = x.to(th.float32)
    x32 = x32 * th.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(dtype)


def _rotate_half(x: th.Tensor) -> th.Tensor:
    half = x.shape[-1] // 2
    return th.cat((-x[..., half:], x[..., :half]), dim=-1)


def _llama_step(
    body: Any, ids: th.Tensor, mask: th.Tensor, positions: th.Tensor, cache: Any, project: Projections = _call_each
) -> th.Tensor:
    """``LlamaModel.forward`` (and its kin's) of one token per row with a cache, in its own order of operations
    (``project(modules, x)`` runs the projections that read the same input; their products may be views of one
    tensor, so the activation, whose vectorized and scalar paths may round apart, gets a contiguous copy)."""
    b = ids.shape[0]
    x = F.embedding(ids, body.embed_tokens.weight)
    cos, sin = body.rotary_emb(x, positions)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    attend = _attention_mask(mask)
    for layer, kv in zip(body.layers, cache.layers, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        qkv, out, gate_up, down = projection_groups(layer)
        h = _rms_norm(layer.input_layernorm, x)
        q, k, v = project(qkv, h)
        q = q.view(b, 1, -1, attn.head_dim).transpose(1, 2)
        k = k.view(b, 1, -1, attn.head_dim).transpose(1, 2)
        v = v.view(b, 1, -1, attn.head_dim).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        kv.keys = _append_column(kv, "keys", k)
        kv.values = _append_column(kv, "values", v)
        a = _attention(q, kv.keys, kv.values, attend, attn.scaling)
        x = x + project(out, a.reshape(b, 1, -1))[0]
        h = _rms_norm(layer.post_attention_layernorm, x)
        gate, up = project(gate_up, h)
        x = x + project(down, mlp.act_fn(gate.contiguous()) * up)[0]
    return _rms_norm(body.norm, x)
