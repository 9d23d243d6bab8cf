"""Policies for language models: :class:`CausalLMPolicy` wraps any Hugging Face causal LM as an SB3 policy.

- :mod:`.causal_lm`: the policy (actor = the LM's next-token distribution, critic = a value head).
- :mod:`.token_sampling`: logit processing (temperature, top-k, top-p) and categorical sampling.
- :mod:`.critics`: the separate critic (``separate_critic=True``).
- :mod:`.decoder`: the built-in decoder of the ``"hf"`` rollout engine (:class:`LiveBatch`).
- :mod:`.kv_cache`: the rollout KV cache; :mod:`.windows` its window math (pure functions), :mod:`.prefill_memo`
  its memo of prefilled windows.
- :mod:`.models`: loading and describing the Hugging Face model, LoRA adapters, :class:`PortableModel`.
- :mod:`.moe`: the mixture-of-experts math (the LoRA experts' gated mixture, the router load-balancing loss);
  :mod:`.experts` the policy's side of it.

A new model adapter (a model family that needs special handling) goes in :mod:`.models` (loading) and
:mod:`.causal_lm` (``_trunk`` / ``_logits``); a new policy for another kind of env gets a module of its own here.
"""

from sb3_grpo.policies.causal_lm import CausalLMPolicy
from sb3_grpo.policies.decoder import LiveBatch
from sb3_grpo.policies.kv_cache import RolloutCache
from sb3_grpo.policies.models import PortableModel, export_pretrained, lora_spec, model_spec
from sb3_grpo.policies.moe import load_balancing_loss, mixture_log_probs, moe_spec
from sb3_grpo.policies.prefill_memo import PrefillMemo
from sb3_grpo.policies.token_sampling import process_logits, sample_categorical
from sb3_grpo.policies.windows import (
    extends_by_one,
    extension_lengths,
    left_pad_columns,
    positions_from_mask,
    realign_columns,
    shared_prefixes,
)

__all__ = [
    "CausalLMPolicy",
    "LiveBatch",
    "PortableModel",
    "PrefillMemo",
    "RolloutCache",
    "extends_by_one",
    "export_pretrained",
    "extension_lengths",
    "left_pad_columns",
    "load_balancing_loss",
    "lora_spec",
    "mixture_log_probs",
    "model_spec",
    "moe_spec",
    "positions_from_mask",
    "process_logits",
    "realign_columns",
    "sample_categorical",
    "shared_prefixes",
]
