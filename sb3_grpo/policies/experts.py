"""The mixture-of-experts pieces of :class:`~sb3_grpo.policies.CausalLMPolicy`: LoRA experts mixed by a gate, and
the router load-balancing loss of a Hugging Face MoE architecture.

:class:`ExpertMixtureMixin` is mixed into the policy. With ``policy_kwargs["moe"] = {"experts": K}`` the LM carries
``K`` peft LoRA adapters (``"default"`` is expert 0, then ``"expert_1"``, ...), all trained; the policy's trunk runs
the LM once per expert, each with its adapter active, and returns the experts' final hidden states side by side
(``[..., K * d]``); the output layer turns them into the mixture's exact log-probs
(:func:`~sb3_grpo.policies.moe.mixture_log_probs`), the gate reading expert 0's hidden state. Every path of the
policy (rollout with or without the KV cache, the built-in decoder, ``evaluate_actions``, the sequence update,
packed or padded) goes through that trunk and output layer, so all of them score and sample the mixture. The formulas
are in :mod:`sb3_grpo.policies.moe`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch as th
from torch import nn

from sb3_grpo.policies.moe import (
    default_gate_std,
    expert_adapter_names,
    expert_cache_view,
    load_balancing_loss,
    mixture_log_probs,
    router_shape,
)

__all__ = ["ExpertMixtureMixin"]


class ExpertMixtureMixin:
    """LoRA experts, their gate and the router loss, for a policy with ``lm``, ``lora``, ``moe`` and the unregistered
    ``PeftModel`` in ``self.__dict__["_peft_model"]`` (see :mod:`sb3_grpo.policies.experts`)."""

    # ---------------------------------------------------------------------------------------------------------
    # Building
    # ---------------------------------------------------------------------------------------------------------

    def _add_experts(self) -> None:
        """Add experts 1 .. K-1 as peft adapters beside ``"default"`` (expert 0), all trainable."""
        from peft import LoraConfig
        from peft.tuners.tuners_utils import BaseTunerLayer

        if self.gradient_checkpointing and self.moe["experts"] > 1:
            raise ValueError(
                "policy_kwargs['moe'] with gradient_checkpointing=True: the checkpointed layers are recomputed during "
                "the backward, when another expert's adapter is active, so the experts' gradients would be wrong; "
                "drop gradient_checkpointing (or use micro_batch_size to bound the update's memory)"
            )
        peft_model = self.__dict__["_peft_model"]
        for name in expert_adapter_names(self.moe["experts"])[1:]:
            peft_model.add_adapter(name, LoraConfig(**self.lora))
        for name, param in self.lm.named_parameters():
            if "lora_" in name:  # peft trains only the active adapter; every expert trains here
                param.requires_grad_(True)
        self.__dict__["_expert_layers"] = [m for m in self.lm.modules() if isinstance(m, BaseTunerLayer)]
        self.__dict__["_trainable_lm"] = [p for p in self.lm.parameters() if p.requires_grad]

    def _build_gate(self) -> None:
        """The gate ``W h_0 + b`` (``moe_gate``, float32), ``W ~ N(0, gate_init_std)``, ``b = 0``; no gate without
        ``moe``."""
        self._hidden_size = int(self.lm.get_output_embeddings().weight.shape[1])
        if self.moe is None:
            return
        self.moe_gate = nn.Linear(self._hidden_size, self.moe["experts"])
        std = self.moe["gate_init_std"]
        nn.init.normal_(self.moe_gate.weight, std=default_gate_std(self._hidden_size) if std is None else std)
        nn.init.zeros_(self.moe_gate.bias)

    def _set_router_aux(self, coef: float) -> None:
        """Check and keep ``router_aux_loss_coef`` (needs an LM whose routers report their logits)."""
        if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
            raise ValueError(f"router_aux_loss_coef must be a finite float >= 0, got {coef!r}")
        self.router_aux_loss_coef = float(coef)
        self._router_shape = router_shape(self.lm.config)
        if self.router_aux_loss_coef > 0 and self._router_shape is None:
            raise ValueError(
                f"router_aux_loss_coef={coef:g} weights the load-balancing loss of a mixture-of-experts "
                f"architecture's routers, but this {type(self.lm).__name__} has none (its config has no "
                "num_experts_per_tok / num_experts and output_router_logits); use an MoE model (Mixtral, Qwen2-MoE, "
                "OLMoE, ...) or router_aux_loss_coef=0"
            )
        self.__dict__["_router_losses"] = None

    # ---------------------------------------------------------------------------------------------------------
    # Running the experts
    # ---------------------------------------------------------------------------------------------------------

    def _n_experts(self) -> int:
        return 1 if self.moe is None else int(self.moe["experts"])

    def _activate_expert(self, name: str) -> None:
        """Route the LoRA layers through expert ``name``'s adapter; every expert stays trainable (peft's
        ``set_adapter`` would freeze the others)."""
        for layer in self.__dict__["_expert_layers"]:
            layer.set_adapter(name)
        for param in self.__dict__["_trainable_lm"]:
            param.requires_grad_(True)

    def _expert_hidden(self, run: Callable[[Any], th.Tensor], cache: Any) -> th.Tensor:
        """``run(cache) -> [B, L, d]`` once per expert (its adapter active, its layers of ``cache``), side by side:
        ``[B, L, K * d]``; one run with the adapters off (the reference) or with one expert."""
        experts = self._n_experts()
        if experts == 1 or self.__dict__.get("_adapters_off"):
            return run(cache)
        names = expert_adapter_names(experts)
        n_layers = self.lm.config.get_text_config(decoder=True).num_hidden_layers
        hidden = []
        try:
            for k, name in enumerate(names):
                self._activate_expert(name)
                hidden.append(run(None if cache is None else expert_cache_view(cache, k, n_layers)))
        finally:
            self._activate_expert(names[0])
        return th.cat(hidden, dim=-1)

    def _mixture_logits(self, hidden: th.Tensor, head: Callable[[th.Tensor], th.Tensor]) -> th.Tensor:
        """The next-token logits of ``hidden`` through the output layer ``head``: for the experts' side-by-side
        hidden states, the mixture's log-probs ``log sum_k g_k(h_0) p_k`` (normalised, so valid logits); otherwise
        (one expert, the reference) the head's logits."""
        experts, d = self._n_experts(), self._hidden_size
        if experts == 1 or hidden.shape[-1] != experts * d:
            return head(hidden)
        parts = hidden.unflatten(-1, (experts, d))  # [..., K, d]
        return mixture_log_probs(head(parts), self.moe_gate(parts[..., 0, :].float()))

    def _critic_hidden(self, hidden: th.Tensor) -> th.Tensor:
        """The hidden state the value head reads: expert 0's (the first ``d`` features)."""
        return hidden[..., : self._hidden_size]

    # ---------------------------------------------------------------------------------------------------------
    # The router loss of an MoE architecture
    # ---------------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def router_aux_losses(self) -> Iterator[list[th.Tensor]]:
        """Context in which every forward of the LM with gradients (not the adapters-off reference) also returns
        its routers' logits and appends their load-balancing loss
        (:func:`~sb3_grpo.policies.moe.load_balancing_loss`, padding left out) to the yielded list. The update
        forward is padded, not packed, meanwhile (the loss needs each token's padding flag). ``GRPO`` and the other
        algorithms of this package open it around a minibatch's loss when ``router_aux_loss_coef > 0``.

        :raises ValueError: for an LM without routers.
        """
        if self._router_shape is None:
            raise ValueError(f"router_aux_losses() needs a mixture-of-experts LM; {type(self.lm).__name__} has none")
        losses: list[th.Tensor] = []
        self.__dict__["_router_losses"] = losses
        try:
            yield losses
        finally:
            self.__dict__["_router_losses"] = None

    def _collecting_router_losses(self) -> bool:
        return (
            self.__dict__.get("_router_losses") is not None
            and th.is_grad_enabled()
            and not self.__dict__.get("_adapters_off")
        )

    def _record_router_loss(self, router_logits: Any, mask: th.Tensor) -> None:
        experts, top_k = self._router_shape
        self.__dict__["_router_losses"].append(load_balancing_loss(tuple(router_logits), experts, top_k, mask))
