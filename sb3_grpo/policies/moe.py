"""Mixtures of experts in :class:`~sb3_grpo.policies.CausalLMPolicy`: the math, as small pure functions.

Two different things share the name, and this module serves both:

- **A mixture-of-experts policy** (``policy_kwargs={"moe": {"experts": K}}``): ``K`` experts, each a LoRA adapter on
  one frozen base LM, mixed by a learned gate, as the seed ``001_19c024931083c042.txt`` (section 4.1) mixes ``K``
  policies::

      p(a | s) = sum_k g_k(s) p_k(a | s),      g(s) = softmax(W h_0(s) + b)

  with ``p_k`` expert ``k``'s next-token distribution and ``h_0(s)`` the final hidden state (after the LM's final
  norm) of expert 0 at the state's last token. :func:`moe_spec` validates the option, :func:`mixture_log_probs` is
  the exact ``log p(a | s)`` (a ``logsumexp``), :func:`expert_cache_view` lets each expert keep its own keys and
  values in the one KV cache the rollout manipulates row by row.
- **A Hugging Face MoE architecture** (Mixtral, Qwen2-MoE, OLMoE, ...) used as the policy's LM: its routers get the
  load-balancing loss of Switch Transformers (Fedus et al. 2021, arXiv 2101.03961, eqs. 4-6; top-k counting as in
  Mixtral), weighted by ``policy_kwargs["router_aux_loss_coef"]`` (TRL's name).
  :func:`router_shape` reads ``(num_experts, top_k)`` off a config, :func:`load_balancing_loss` computes the loss
  from the routers' logits.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch as th

__all__ = [
    "expert_adapter_names",
    "expert_cache_view",
    "load_balancing_loss",
    "mixture_log_probs",
    "moe_spec",
    "router_shape",
]

#: The keys a ``policy_kwargs["moe"]`` dict may hold, with their meaning.
MOE_KEYS = {
    "experts": "K >= 1, the number of LoRA experts",
    "gate_init_std": "std of the gate's normal initial weights (None: 1 / sqrt(hidden size))",
}


def moe_spec(value: Any) -> dict[str, Any]:
    """The JSON-able form of ``policy_kwargs["moe"]``: ``{"experts": K, "gate_init_std": float | None}``.

    :param value: an int ``K`` or a dict with the keys of :data:`MOE_KEYS`.
    :raises ValueError: naming the argument and what to pass.
    """
    if isinstance(value, bool) or not isinstance(value, (int, dict)):
        raise ValueError(
            f"policy_kwargs['moe'] must be a number of experts K or a dict such as {{'experts': 4}}, got {value!r}"
        )
    given = {"experts": value} if isinstance(value, int) else dict(value)
    unknown = sorted(set(given) - set(MOE_KEYS))
    if unknown:
        known = "; ".join(f"{k!r}: {v}" for k, v in MOE_KEYS.items())
        raise ValueError(f"policy_kwargs['moe'] has unknown keys {unknown}; known keys: {known}")
    experts = given.get("experts")
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
        raise ValueError(f"policy_kwargs['moe']['experts'] must be an int K >= 1, got {experts!r}")
    std = given.get("gate_init_std")
    if std is not None and (isinstance(std, bool) or not isinstance(std, (int, float)) or not std >= 0):
        raise ValueError(f"policy_kwargs['moe']['gate_init_std'] must be a float >= 0 or None, got {std!r}")
    return {"experts": experts, "gate_init_std": None if std is None else float(std)}


def expert_adapter_names(experts: int) -> list[str]:
    """The peft adapter names of the experts: ``"default"`` (peft's first adapter: expert 0), ``"expert_1"``, ..."""
    return ["default"] + [f"expert_{k}" for k in range(1, experts)]


def mixture_log_probs(expert_logits: th.Tensor, gate_logits: th.Tensor) -> th.Tensor:
    """``log sum_k g_k p_k(a)`` for every action ``a``: the exact log-probs of the mixture.

    ``g = softmax(gate_logits)`` and ``p_k = softmax(expert_logits[..., k, :])``; computed as
    ``logsumexp_k(log g_k + log p_k(a))``, so no probability is formed and a token only some expert considers is not
    rounded away.

    :param expert_logits: ``[..., K, V]`` each expert's next-token logits.
    :param gate_logits: ``[..., K]`` the gate's logits.
    :return: ``[..., V]`` normalised log-probs (float32 or the inputs' dtype).
    """
    log_gate = th.log_softmax(gate_logits, dim=-1).unsqueeze(-1)
    return th.logsumexp(log_gate + th.log_softmax(expert_logits, dim=-1), dim=-2)


def expert_cache_view(cache: Any, expert: int, n_layers: int) -> Any:
    """Expert ``expert``'s part of a KV cache that holds ``K * n_layers`` layers (expert ``k``'s are layers
    ``k * n_layers`` to ``(k + 1) * n_layers - 1``): a shallow copy of ``cache`` whose ``layers`` are those layer
    objects themselves, so the model's updates land in ``cache``. Missing layers are added first (a cache built for
    one model has ``n_layers``), of the type of its first layer.

    Keeping every expert's layers in one cache lets the rollout's row operations (splice, reorder, crop, which loop
    over ``cache.layers``) move all experts' keys and values at once.
    """
    layers = cache.layers
    while len(layers) < (expert + 1) * n_layers:
        layers.append(type(layers[0])() if layers else _dynamic_layer())
    view = copy.copy(cache)
    view.layers = layers[expert * n_layers : (expert + 1) * n_layers]
    return view


def _dynamic_layer() -> Any:
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer()


def router_shape(config: Any) -> tuple[int, int] | None:
    """``(num_experts, top_k)`` of a Hugging Face MoE architecture's routers, or ``None`` for a dense model.

    Reads ``num_local_experts`` (Mixtral) or ``num_experts`` (Qwen2-MoE, OLMoE, ...) and ``num_experts_per_tok``; a
    config without ``output_router_logits`` does not report its routers and counts as dense.
    """
    top_k = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if not hasattr(config, "output_router_logits") or not isinstance(top_k, int) or not isinstance(experts, int):
        return None
    return experts, top_k


def load_balancing_loss(
    router_logits: Sequence[th.Tensor], num_experts: int, top_k: int, token_mask: th.Tensor | None = None
) -> th.Tensor:
    """The Switch Transformer load-balancing loss over a model's routers (Fedus et al. 2021, eqs. 4-6)::

        loss = E * sum_e f_e * P_e

    pooled over every router layer's tokens, with ``f_e`` the fraction of (token, slot) assignments among each
    token's ``top_k`` choices that go to expert ``e`` (so ``sum_e f_e = top_k``, Mixtral's counting), ``P_e`` the mean
    router probability of expert ``e``, and ``E = num_experts``. Padding tokens (``token_mask == 0``) are left out.
    Its gradient reaches the routers through ``P_e`` (``f_e`` counts a top-k choice).

    :param router_logits: one ``[T, E]`` tensor per router layer (``T`` tokens, the batch flattened).
    :param num_experts: ``E``.
    :param top_k: experts per token.
    :param token_mask: ``[T]`` (or any shape with ``T`` elements) 1 for real tokens; ``None``: all real.
    :return: a scalar (float32).
    """
    if not router_logits:
        raise ValueError("load_balancing_loss needs the logits of at least one router layer")
    logits = th.stack([layer.float() for layer in router_logits])  # [layers, T, E]
    probs = th.softmax(logits, dim=-1)
    chosen = th.topk(probs, top_k, dim=-1).indices  # [layers, T, top_k]
    counts = th.zeros_like(probs).scatter_add_(-1, chosen, th.ones_like(chosen, dtype=probs.dtype))
    if token_mask is None:
        weight = th.ones(probs.shape[1], dtype=probs.dtype, device=probs.device)
    else:
        weight = token_mask.reshape(-1).to(device=probs.device, dtype=probs.dtype)
    weight = weight.view(1, -1, 1)
    total = weight.sum() * logits.shape[0]
    fraction = (counts * weight).sum(dim=(0, 1)) / total  # f_e
    mean_prob = (probs * weight).sum(dim=(0, 1)) / total  # P_e
    return num_experts * (fraction * mean_prob).sum()


def default_gate_std(hidden_size: int) -> float:
    """``1 / sqrt(d)``: gate logits of unit scale over hidden states of unit-scale entries, so that different states
    get different gates from the start (which lets identical experts, LoRA's zero start, grow apart)."""
    return 1.0 / math.sqrt(hidden_size)
