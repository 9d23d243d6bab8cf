"""``CausalLMPolicy``: any Hugging Face causal LM as a stable-baselines3 actor-critic policy.

The observation is a right-aligned (left-padded) window of token ids with its attention mask; the action is
the next token id. The actor is the LM's next-token distribution (after temperature / top-k / top-p), the
critic a scalar value head. During rollout the policy keeps a per-row KV cache (see :class:`CausalLMPolicy`)
so that stock SB3 ``collect_rollouts`` runs one single-token forward per step instead of one per prefix.

This module holds the policy. Its pieces live beside it in :mod:`sb3_grpo.policies`: the logit processing and
sampling (:mod:`.token_sampling`), the separate critic (:mod:`.critics`), the rollout cache (:mod:`.kv_cache`) and its
window math (:mod:`.windows`, :mod:`.prefill_memo`), the update forward over whole sequences (:mod:`.sequences`,
packed by :mod:`sb3_grpo.policies.packing`), and loading and describing the Hugging Face model and its LoRA adapters
(:mod:`.models`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import CategoricalDistribution
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import nn
from torch.nn import functional as F

from sb3_grpo.policies.block_weights import BlockWeights
from sb3_grpo.policies.critics import EmbeddingCritic
from sb3_grpo.policies.decoder import LiveBatch
from sb3_grpo.policies.experts import ExpertMixtureMixin
from sb3_grpo.policies.kv_cache import RolloutCache
from sb3_grpo.policies.lean_step import lean_step
from sb3_grpo.policies.models import (
    BASE_WEIGHTS,
    LoRAReferenceMixin,
    adapters_only_checkpoint,
    apply_lora,
    as_dtype,
    base_fingerprint,
    check_autocast_dtype,
    export_pretrained,
    is_quantized,
    load_lm,
    lora_spec,
    model_spec,
)
from sb3_grpo.policies.moe import moe_spec
from sb3_grpo.policies.packed_head import PackedHead
from sb3_grpo.policies.policy_kwargs import (
    check_layout,
    check_policy_args,
    check_token_range,
    check_window_fits,
)
from sb3_grpo.policies.prefill_memo import FROZEN_MEMO_BYTES, memo_budget
from sb3_grpo.policies.quantization import keep_training_layout, quantization_spec, quiet_8bit_casts
from sb3_grpo.policies.sequences import SequenceEvaluationMixin
from sb3_grpo.policies.threads import apply_cpu_thread_default, cpu_thread_setting
from sb3_grpo.policies.token_sampling import draw_tokens, process_logits, token_log_probs
from sb3_grpo.policies.tokenizer_identity import TOKENIZER_CHECKS
from sb3_grpo.policies.windows import positions_from_mask, shared_prefixes, trim_padding
from textrl_envs.validation import check_choice

__all__ = ["CausalLMPolicy"]

OBS_KEYS = ("input_ids", "attention_mask")


# --------------------------------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------------------------------


class CausalLMPolicy(ExpertMixtureMixin, LoRAReferenceMixin, SequenceEvaluationMixin, BasePolicy):
    """A Hugging Face causal LM (+ value head) as an SB3 actor-critic policy for text-generation envs.

    Works unchanged with stock ``PPO``, ``A2C`` and ``sb3_grpo.GRPO``: ``PPO(CausalLMPolicy, env).learn(...)``.

    **Spaces.** Observation ``Dict(input_ids=Box(int, (W,)), attention_mask=Box(int, (W,)))``: the prompt plus the
    tokens generated so far, right-aligned (left padding), newest token at ``W - 1``. Action ``Discrete(V)``, the next
    token id; the LM's vocabulary may be larger than ``V`` (logits are sliced to ``V``), never smaller. Observations
    that come back from SB3's rollout buffer as floats are cast to long. Position ids are ``cumsum(mask) - 1``
    (clamped at 0) in every path, so padding never changes a token's position.

    **Actor and critic.** The actor is the LM's next-token distribution. The critic is, by default, a scalar linear
    value head on the LM's final hidden state at the last position (shared trunk: the value loss also trains the
    LM). With ``separate_critic=True`` it is an :class:`EmbeddingCritic`, a small MLP over the frozen LM input
    embeddings that shares no trainable weights with the LM.

    **Sampling controls are part of the policy.** ``temperature``, ``top_k`` and ``top_p`` change the distribution
    that actions are sampled from *and* the log-probs and entropies reported in ``forward`` (rollout),
    ``evaluate_actions`` and ``evaluate_sequences`` (update), so the PPO ratio is an honest importance weight between
    the sampling distributions of the old and the new policy. A consequence: a token outside the top-k / top-p set
    of the *updated* policy gets log-prob ``-inf`` (ratio 0); that is the truth about that policy.

    **Dropout.** The LM (and critic) always run in eval mode, in rollout and in update alike, so dropout never makes
    the rollout log-probs and the update log-probs disagree (with no dropout, the first PPO epoch starts at ratio 1
    exactly, up to float error). ``set_training_mode`` only toggles gradient checkpointing.

    **Initialisation and optimiser.** SB3's ``ortho_init`` touches only the value head (orthogonal, gain 1), never
    the pretrained LM; ``value_head_init_std`` (if given) overrides it with ``N(0, std)`` weights and zero bias. The
    optimiser covers every trainable parameter: the LM and the value head (or the separate critic).

    **Incremental decoding.** Under ``torch.no_grad`` (rollout, ``predict_values``, ``predict``) and with
    ``use_cache=True``, the policy keeps a per-row KV cache for the batch of envs, a
    :class:`~sb3_grpo.policies.kv_cache.RolloutCache` that runs the LM through the policy's ``_trunk``, ``_logits``
    and ``_value``: one batched single-token forward per generated token, prefills only for rows whose window is new
    (auto-resets, new group prompts), a memo of recent prefills, and a look-ahead step after sampling.
    :mod:`sb3_grpo.policies.kv_cache` documents the rules; cached outputs equal a full recompute (tested). The cache
    is dropped when the parameters change and is never used with gradients.

    **Packed update forward.** :meth:`evaluate_sequences` (the text fast path's update) gets a batch of episode
    segments of different lengths. With ``pack_sequences=True`` (default), right-aligned rows, and an LM that uses
    ``"sdpa"`` or ``"eager"`` attention, their valid tokens are laid end to end into rows as long as the longest
    segment (first-fit decreasing, :mod:`sb3_grpo.policies.packing`), with position ids restarting at each segment and a
    block-diagonal causal 4-D attention mask, so no token attends across segments. Segments that begin alike (the
    completions of one group share their prompt) share those tokens: the common prefix is laid down once, then each
    segment's own tokens, which see the prefix and themselves only (a tree mask;
    :func:`~sb3_grpo.policies.packing.shared_prefix_groups`). Every token's hidden state is the
    padded forward's up to float rounding, computed over fewer positions (``textrl-bench perf``'s update row: 1,434
    instead of 2,258). The first packed forward of a policy is checked against the padded one (hidden states at every
    action position of the segments that share its fullest packed row, within float tolerance); a model that does not
    honour 4-D masks fails the check, is told so in a warning and is evaluated padded from then on.

    **Shared prefixes.** A stock SB3 algorithm (``PPO``) evaluates a minibatch of single-token transitions with
    :meth:`evaluate_actions`, each a whole window, and many of them are earlier states of one episode: the window of
    step ``t`` is a prefix of the window of step ``t + k``. With ``share_prefixes=True`` (default) the policy runs
    only the windows that are a prefix of no other (:func:`~sb3_grpo.policies.windows.shared_prefixes`, an exact
    comparison of the ids) and reads each prefix's hidden state off its longer window; under a causal LM that is the
    hidden state a forward of the prefix alone gives (equal up to float rounding, tested), and the gradient is the
    same sum. A minibatch of 256 windows from 16 envs of ``LongReview-v0`` then runs one row per episode it
    touches (16 to 32) instead of 256.

    **CPU threads.** The policy's first forward on the CPU sets torch to one intra-op thread
    (``torch.set_num_threads(1)``, process-wide) when the LM is small (at most
    :data:`~sb3_grpo.policies.threads.SMALL_LM_PARAMETERS` parameters, as the bundled LM is), as the ``sb3-grpo``
    command line does: tiny matrix products are fastest on one thread, and on a busy machine the default pool (one
    thread per core) can make a run ten times slower. A larger LM (a real model) gets every usable core. The choice
    is logged (INFO). A count the user chose is kept: ``OMP_NUM_THREADS`` or
    ``MKL_NUM_THREADS`` set, or ``torch.set_num_threads`` called after importing ``sb3_grpo``. The environment
    variable ``SB3_GRPO_CPU_THREADS`` overrides the rule: ``keep`` leaves torch's count alone, an integer ``N`` sets
    ``N`` threads (:mod:`sb3_grpo.policies.threads`). The thread count changes the speed, not the results.

    **Saving.** ``_get_constructor_parameters`` stores the model as a config-only :func:`model_spec` dict
    (:attr:`lm_spec`), so no Hugging Face object is pickled and loading needs no model directory; the weights come
    from SB3's state dict. ``GRPO`` also replaces a model *object* in its ``policy_kwargs`` by that spec after
    building the policy. Stock SB3 algorithms save ``policy_kwargs`` as they were given: pass them a local path or
    ``PortableModel.of(lm)`` (:class:`~sb3_grpo.policies.models.PortableModel`, a spec that carries the model) rather
    than the bare model object, which they would pickle into the file. A model given as a path stays a path: loading
    reads that directory, and when it is gone ``GRPO.load`` builds the LM from the config it saved beside the weights
    (with a warning).

    **LoRA checkpoints hold the adapters, not the base.** With ``lora`` and a base that has a name to load it from (a
    local directory or a Hub id, given as such or as the ``name_or_path`` of a model object), :meth:`state_dict` leaves
    the frozen base weights out: a checkpoint holds the adapters, the value head (or separate critic), any other
    trainable weights and ``base_fingerprint`` (a cheap checksum of the base, :func:`~.models.base_fingerprint`), and
    the spec records the base by name and revision (``"weights": "name_or_path"``). Loading rebuilds the base from
    that name (a Hub id at the saved commit, from the Hugging Face cache with ``HF_HUB_OFFLINE=1``; quantized again
    with the saved ``quantization``) and applies the adapters, so predictions are the saved model's exactly. A base
    that cannot be found is an error naming it and what to do (``GRPO.load(path, base_model=...)`` names its new
    place); a base whose fingerprint differs (another revision, a changed folder) is refused. A base with no name (a
    model built in memory from a config, a config-only spec, a :class:`~.models.PortableModel`) stays in the
    checkpoint, as a full fine-tune's weights do.

    :param observation_space: the env's ``Dict`` observation space.
    :param action_space: the env's ``Discrete(V)`` action space.
    :param lr_schedule: learning-rate schedule (SB3 passes it).
    :param model: a local model directory, a Hugging Face Hub id such as ``"org/name"`` (downloaded into the Hugging
        Face cache when online, read from it with ``HF_HUB_OFFLINE=1``), a ``transformers.PreTrainedModel`` (used in
        place, not copied), a :class:`~sb3_grpo.policies.models.PortableModel` (its model, in place), a
        :func:`model_spec` dict (config only: random weights until a state dict is loaded), or ``None`` for the
        bundled LM at ``textrl_envs.assets.lm_path()``.
    :param revision: the Hub revision (branch, tag or commit hash) of a ``model`` given by Hub id (``None``: ``main``);
        saved with the model's spec.
    :param dtype: dtype to load / cast the LM to (``th.dtype`` or a name such as ``"bfloat16"``); heads stay float32.
    :param temperature: sampling temperature (> 0).
    :param top_k: keep only the ``top_k`` most likely tokens (``None`` or 0: all), an int.
    :param top_p: nucleus sampling mass in ``(0, 1]`` (``None``: all).
    :param separate_critic: use an :class:`EmbeddingCritic` instead of a value head on the shared trunk.
    :param use_cache: keep the rollout KV cache (``False``: recompute every prefix, for benchmarks and debugging).
    :param pack_sequences: in :meth:`evaluate_sequences`, pack short sequences end to end into shared rows (see
        "Packed update forward" above) when that saves at least a sixth of the padded positions; ``False``: always pad.
    :param share_prefixes: in :meth:`evaluate_actions`, read the windows that are prefixes of another window of the
        batch off that window's forward (see "Shared prefixes" above); ``False``: one forward row per window.
    :param pack_output_layer: on a CPU (float32, PyTorch built with MKL), keep the output layer's weight packed for
        MKL during a rollout's decoding steps, whose largest product it is (:mod:`~sb3_grpo.policies.packed_head`:
        the same logits to the bit, faster; a packed copy of the layer's weight in memory while a rollout runs,
        dropped before each update); ``False``: plain ``F.linear`` always.
    :param column_major_weights: on a CPU (float32), let the rollout's decoding products of the transformer blocks
        run from column-major copies of their weights where that is measured to pay on this machine
        (:mod:`~sb3_grpo.policies.block_weights`: the same numbers to the bit, checked; a copy of each served weight
        in memory while a rollout runs, dropped before each update); ``False``: never from copies.
    :param pack_block_weights: likewise, from the blocks' weights packed for MKL (where PyTorch has MKL), the
        projections that read the same input packed together and run as one product; ``False``: never from packs.
        With both ``False``, the layers' own products always.
    :param gradient_checkpointing: trade compute for memory in the update forward.
    :param lora: train LoRA adapters instead of the LM (needs ``peft``: ``pip install "textrl[lora]"``): a
        ``peft.LoraConfig`` or a dict of its arguments (e.g. ``{"r": 8, "lora_alpha": 16}``). The adapters are
        injected into the LM in place; only they and the value head (or separate critic) are trained and given to the
        optimizer. The policy then defines ``reference_evaluate_actions`` / ``reference_evaluate_sequences``: the same
        model with the adapters switched off (peft's ``disable_adapter()``), which ``GRPO(kl_coef > 0)`` uses as the
        KL reference instead of a frozen copy. Stored as a JSON-able :func:`lora_spec`; the adapter weights are in the
        state dict.
    :param quantization: load the frozen base with bitsandbytes-quantized weights under the LoRA adapters (needs
        ``lora`` and ``pip install "textrl[quant]"``): ``"8bit"`` (LLM.int8()), ``"4bit"`` (NF4 with double
        quantization, computing in ``dtype`` or float32: QLoRA's recipe), a dict of ``transformers.BitsAndBytesConfig``
        arguments, or a ``BitsAndBytesConfig``. The adapters train in float32; the KL reference is the quantized base
        with the adapters off. The model must be a path or Hub id (the weights are quantized while they load, on the
        first CUDA device, else the CPU) or a model object already loaded quantized. Stored as a JSON-able
        :func:`~sb3_grpo.policies.quantization.quantization_spec`.
    :param moe: a mixture of ``K`` LoRA experts on the one base (needs ``lora``, each expert's adapter config): ``K``
        or ``{"experts": K, "gate_init_std": std}``. ``p(a|s) = sum_k g_k(s) p_k(a|s)`` with ``g = softmax(W h_0(s) +
        b)``, ``h_0(s)`` expert 0's final hidden state at the state's last token; the value head reads ``h_0`` too.
        Every path scores and samples the mixture exactly (temperature / top-k / top-p apply to the mixture's
        distribution); the trunk runs once per expert; the KL reference is the base (all adapters off); checkpoints
        keep the adapters, the gate and the value head (:mod:`sb3_grpo.policies.experts`, ``docs/algorithms/moe.md``).
        Not with ``engine="vllm"`` or ``save_pretrained`` (no single model equals the mixture).
    :param router_aux_loss_coef: for an LM that is a mixture-of-experts architecture (Mixtral, Qwen2-MoE, OLMoE, ...):
        the weight of its routers' load-balancing loss (Switch Transformer's, :func:`~.moe.load_balancing_loss`),
        which the package's algorithms add to the update's loss and log as ``train/router_aux_loss`` (TRL's name;
        stock SB3 ``PPO`` does not add it). ``0``: off.
    :param autocast_dtype: ``"bfloat16"`` or ``"float16"``: run the LM (trunk and output layer) under
        ``torch.autocast`` in rollout and update; logits are cast to float32 before the softmax, so log-probs,
        entropies, values (the value head runs outside autocast) and advantages stay float32. ``None``: no autocast.
    :param value_head_init_std: std of the value head's normal init (``None``: orthogonal if ``ortho_init``).
    :param ortho_init: SB3's flag; here it only decides the value head's init.
    :param critic_hidden: width of the separate critic's MLP.
    :param use_sde: SB3 passes it; must be False.
    :param normalize_images: SB3's flag, stored and ignored (token ids are not images).
    :param optimizer_class: the optimizer (default Adam, ``eps=1e-5`` like SB3's ``ActorCriticPolicy``, with torch's
        fused kernel where the parameters allow it).
    :param optimizer_kwargs: extra optimizer arguments.
    :param tokenizer_check: what ``GRPO`` does when the env's tokenizer is not the one saved with the model (other
        vocabulary or special ids, not only another size; :mod:`~sb3_grpo.policies.tokenizer_identity`): ``"warn"``
        (default), ``"strict"`` (refuse) or ``"off"``.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        model: Any = None,
        revision: str | None = None,
        dtype: th.dtype | str | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        separate_critic: bool = False,
        use_cache: bool = True,
        pack_sequences: bool = True,
        share_prefixes: bool = True,
        pack_output_layer: bool = True,
        column_major_weights: bool = True,
        pack_block_weights: bool = True,
        gradient_checkpointing: bool = False,
        lora: Any = None,
        quantization: Any = None,
        moe: Any = None,
        router_aux_loss_coef: float = 0.0,
        autocast_dtype: th.dtype | str | None = None,
        value_head_init_std: float | None = None,
        ortho_init: bool = True,
        critic_hidden: int = 256,
        use_sde: bool = False,
        normalize_images: bool = True,
        optimizer_class: type[th.optim.Optimizer] = th.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
        tokenizer_check: str = "warn",
    ):
        if optimizer_kwargs is None:
            # SB3's Adam eps; the fused kernel: one pass per step and no temporaries the size of a parameter (the peak
            # memory of an update is at its first step, when Adam's state is allocated)
            optimizer_kwargs = {"eps": 1e-5, "fused": True} if optimizer_class == th.optim.Adam else {}
        super().__init__(
            observation_space,
            action_space,
            normalize_images=normalize_images,
            optimizer_class=optimizer_class,
            optimizer_kwargs=optimizer_kwargs,
        )
        if use_sde:
            raise ValueError("CausalLMPolicy has a discrete (token) action space; use_sde must be False")
        self._check_spaces(observation_space, action_space)
        flags = {"separate_critic": separate_critic, "use_cache": use_cache, "pack_sequences": pack_sequences}
        flags.update(share_prefixes=share_prefixes, gradient_checkpointing=gradient_checkpointing)
        flags.update(pack_output_layer=pack_output_layer, column_major_weights=column_major_weights)
        flags.update(pack_block_weights=pack_block_weights)
        flags.update(ortho_init=ortho_init)
        check_policy_args(temperature, top_k, top_p, critic_hidden, value_head_init_std, flags)
        cpu_thread_setting()  # a bad SB3_GRPO_CPU_THREADS is refused here, not at the first forward
        #: whether the CPU thread default (see "CPU threads" above) is still to be applied, at the first forward
        self._threads_pending = True

        resolved_dtype = as_dtype(dtype)
        self.dtype_name = None if resolved_dtype is None else str(resolved_dtype).replace("torch.", "")
        self.temperature = float(temperature)
        self.top_k = top_k
        self.top_p = top_p
        self.separate_critic = separate_critic
        self.use_cache = use_cache
        self.pack_sequences = bool(pack_sequences)
        self._packing_verified = False
        self.share_prefixes = bool(share_prefixes)
        self.pack_output_layer = bool(pack_output_layer)
        #: the output layer's weight packed for MKL during rollouts (decoding steps on a CPU), dropped before updates
        self._packed_head = PackedHead() if self.pack_output_layer else None
        self.column_major_weights = bool(column_major_weights)
        self.pack_block_weights = bool(pack_block_weights)
        #: the blocks' weights copied column-major or packed for the decoding products where faster, dropped before
        #: updates
        self._block_weights = (
            BlockWeights(column=self.column_major_weights, packed=self.pack_block_weights)
            if self.column_major_weights or self.pack_block_weights
            else None
        )
        self.gradient_checkpointing = gradient_checkpointing
        self._autocast = check_autocast_dtype(autocast_dtype)
        self.autocast_dtype = None if self._autocast is None else str(self._autocast).replace("torch.", "")
        self.value_head_init_std = value_head_init_std
        self.ortho_init = ortho_init
        self.critic_hidden = critic_hidden
        self.tokenizer_check = check_choice("tokenizer_check", tokenizer_check, TOKENIZER_CHECKS)
        if revision is not None and not isinstance(revision, str):
            raise TypeError(f"revision must be a str (a branch, tag or commit hash) or None, got {revision!r}")
        self.revision = revision

        self._load_lm(model, resolved_dtype, lora, quantization, observation_space, action_space, moe)
        self._build_critic(int(self.lm.get_input_embeddings().weight.shape[1]))
        self._build_gate()
        self._set_router_aux(router_aux_loss_coef)
        if gradient_checkpointing:
            self._enable_gradient_checkpointing()
        self.action_dist = CategoricalDistribution(self.n_actions)
        self._rollout_cache = self._new_rollout_cache()
        self.train(False)
        self._build_optimizer(lr_schedule)

    def _load_lm(
        self,
        model: Any,
        dtype: th.dtype | None,
        lora: Any,
        quantization: Any,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        moe: Any = None,
    ) -> None:
        """Load the LM (``self.lm``), quantized if asked, inject the LoRA adapters if asked (one per expert with
        ``moe``), and check that the env's windows fit its context and its vocabulary covers the env's action space."""
        self.lora = None if lora is None else lora_spec(lora)
        self.moe = None if moe is None else moe_spec(moe)
        if self.moe is not None and self.lora is None:
            raise ValueError(
                "policy_kwargs['moe'] mixes K experts that are LoRA adapters on the one base model, so it needs "
                "policy_kwargs['lora'] (each expert's adapter config), e.g. policy_kwargs={'moe': {'experts': 4}, "
                "'lora': {'r': 8, 'target_modules': ['q_proj', 'v_proj']}}"
            )
        self.quantization = None if quantization is None else quantization_spec(quantization, dtype)
        if self.quantization is not None and self.lora is None:
            raise ValueError(
                "policy_kwargs['quantization'] freezes the base weights in 8 or 4 bits, which cannot be trained "
                "directly; add LoRA adapters to train on top of them, e.g. policy_kwargs={'quantization': '4bit', "
                "'lora': {'r': 8, 'target_modules': ['q_proj', 'v_proj']}}, or drop 'quantization'"
            )
        self.lm = load_lm(model, dtype, self.revision, self.quantization)
        if self.quantization is None and is_quantized(self.lm):  # a model object loaded quantized by the user
            self.quantization = quantization_spec(self.lm.config.quantization_config)
        if self.quantization is not None:
            keep_training_layout(self.lm)
        check_window_fits(observation_space, self.lm.config)  # before a window fails mid-rollout
        # a saved spec keeps the Hub revision it recorded
        revision = self.revision or (model.get("revision") if isinstance(model, dict) else None)
        self._spec = model_spec(self.lm, revision)
        #: LoRA only: whether checkpoints hold the adapters and the value head without the base weights, which load
        #: from the base's name or path; a base without one (built from a config, or a spec that carries no name to
        #: load from) stays in the checkpoint
        self._adapters_only = self.lora is not None and adapters_only_checkpoint(model, self._spec["name_or_path"])
        if self.quantization is not None and not self._adapters_only:
            raise ValueError(
                "policy_kwargs['quantization'] needs a base model that can be loaded again by its name (a local "
                f"directory or a Hub id), but this one's name_or_path is {self._spec['name_or_path']!r}; pass the "
                "model as a path or Hub id in policy_kwargs['model']"
            )
        if self._adapters_only:
            self._spec["weights"] = BASE_WEIGHTS
        if self.lora is not None:
            # adapters injected into self.lm in place (self.lm stays the transformers model); the PeftModel wrapper
            # is kept unregistered, only for disable_adapter(), so the state dict has no duplicate keys
            self.__dict__["_peft_model"] = apply_lora(self.lm, self.lora)
        if self.moe is not None:
            self._add_experts()
        if self._adapters_only:
            trainable = {name for name, p in self.lm.named_parameters() if p.requires_grad}
            #: the state-dict keys of the frozen base weights, which a LoRA checkpoint leaves out (in the order of
            #: the rows of ``base_fingerprint``)
            self.base_keys = tuple("lm." + name for name in self.lm.state_dict() if name not in trainable)
            self._base_keys = frozenset(self.base_keys)
            self.register_buffer("base_fingerprint", base_fingerprint(self._base_tensors()))

        self.n_actions = int(action_space.n)
        self.lm_vocab = int(self.lm.get_output_embeddings().weight.shape[0])
        if self.lm_vocab < self.n_actions:
            raise ValueError(
                f"the LM's vocabulary has {self.lm_vocab} tokens but the env's action space is Discrete("
                f"{self.n_actions}) (len(tokenizer)); use a model whose vocabulary covers the env's tokenizer, "
                "or resize its token embeddings to at least the tokenizer length"
            )

    def _build_optimizer(self, lr_schedule: Schedule) -> None:
        """The optimizer over every trainable parameter (only the adapters and the critic with LoRA); a default fused
        Adam falls back to the unfused kernel where these parameters' dtype or device has none."""
        params = [p for p in self.parameters() if p.requires_grad] if self.lora is not None else self.parameters()
        params = list(params)
        try:
            self.optimizer = self.optimizer_class(params, lr=lr_schedule(1), **self.optimizer_kwargs)
        except (RuntimeError, ValueError):
            if not self.optimizer_kwargs.get("fused"):
                raise
            # the default asked for the fused kernel, which these parameters' dtype or device does not have
            self.optimizer_kwargs = {k: v for k, v in self.optimizer_kwargs.items() if k != "fused"}
            self.optimizer = self.optimizer_class(params, lr=lr_schedule(1), **self.optimizer_kwargs)

    def _build_critic(self, hidden: int) -> None:
        """The value head on the LM's last hidden state, or the separate :class:`EmbeddingCritic`; initialised as SB3
        initialises its heads (``ortho_init``), or ``N(0, value_head_init_std)`` with zero bias."""
        if self.separate_critic:
            self.critic = EmbeddingCritic(self.lm.get_input_embeddings(), hidden=self.critic_hidden)
            self.value_head = self.critic.head
            init_modules = [self.critic.mlp, self.critic.head]
        else:
            self.value_head = nn.Linear(hidden, 1)
            init_modules = [self.value_head]
        for module in init_modules:
            if self.value_head_init_std is not None and module is self.value_head:
                nn.init.normal_(module.weight, std=self.value_head_init_std)
                nn.init.zeros_(module.bias)
            elif self.ortho_init:
                gain = 1.0 if module is self.value_head else float(np.sqrt(2))
                module.apply(lambda m, g=gain: self.init_weights(m, gain=g))

    def _enable_gradient_checkpointing(self) -> None:
        enable = getattr(self.lm, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # transformers releases before the rename
            self.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # ---------------------------------------------------------------------------------------------------------
    # SB3 plumbing
    # ---------------------------------------------------------------------------------------------------------

    @staticmethod
    def _check_spaces(observation_space: spaces.Space, action_space: spaces.Space) -> None:
        if not isinstance(observation_space, spaces.Dict) or any(k not in observation_space.spaces for k in OBS_KEYS):
            got = sorted(observation_space.spaces) if isinstance(observation_space, spaces.Dict) else observation_space
            raise ValueError(
                f"CausalLMPolicy needs a Dict observation space with keys {list(OBS_KEYS)} (right-aligned token "
                f"window and its mask); the env gives {got}"
            )
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(  # a wrong space is a bad value here, as SB3 raises for unsupported spaces
                f"CausalLMPolicy needs a Discrete(len(tokenizer)) action space; the env gives {action_space}"
            )

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            {
                "lr_schedule": self._dummy_schedule,
                "model": self._spec,
                "tokenizer_check": self.tokenizer_check,
                "revision": self.revision,
                "dtype": self.dtype_name,
                "temperature": self.temperature,
                "top_k": self.top_k,
                "top_p": self.top_p,
                "separate_critic": self.separate_critic,
                "use_cache": self.use_cache,
                "pack_output_layer": self.pack_output_layer,
                "column_major_weights": self.column_major_weights,
                "pack_block_weights": self.pack_block_weights,
                "pack_sequences": self.pack_sequences,
                "share_prefixes": self.share_prefixes,
                "gradient_checkpointing": self.gradient_checkpointing,
                "lora": self.lora,
                "quantization": self.quantization,
                "moe": self.moe,
                "router_aux_loss_coef": self.router_aux_loss_coef,
                "autocast_dtype": self.autocast_dtype,
                "value_head_init_std": self.value_head_init_std,
                "ortho_init": self.ortho_init,
                "critic_hidden": self.critic_hidden,
                "optimizer_class": self.optimizer_class,
                "optimizer_kwargs": self.optimizer_kwargs,
            }
        )
        return data

    def save_pretrained(self, path: Any, merge_lora: bool = True) -> str:
        """Export the LM as a Hugging Face model directory that ``AutoModelForCausalLM.from_pretrained`` loads, with
        logits equal to this policy's LM logits; a LoRA policy's adapters merged (``merge_lora=True``) or kept as a
        peft adapter (:func:`~sb3_grpo.policies.models.export_pretrained`).

        :param path: The directory to write.
        :param merge_lora: LoRA only: merge the adapters into the weights, or write them as an adapter.
        :return: ``path`` as a string.
        """
        if self._n_experts() > 1:
            raise ValueError(
                f"save_pretrained writes one Hugging Face model, but this policy mixes {self._n_experts()} LoRA "
                "experts with a learned gate (policy_kwargs['moe']), which no single model's logits equal; save the "
                "policy with model.save(path) (adapters, gate and value head) instead"
            )
        return export_pretrained(self, path, merge_lora=merge_lora)

    @property
    def lm_spec(self) -> dict[str, Any]:
        """The LM's :func:`model_spec` (its config, no weights): what saving stores in place of the model."""
        return self._spec

    def state_dict(self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        """``nn.Module.state_dict``; a LoRA policy whose base loads by name (see "Saving" above) leaves the frozen
        base weights out: it holds the adapters, the value head (or separate critic), any other trainable weights and
        ``base_fingerprint``."""
        state = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        if not self.__dict__.get("_adapters_only"):
            return state
        for key in [k for k in state if k.startswith(prefix) and k[len(prefix) :] in self._base_keys]:
            del state[key]
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``; for a LoRA checkpoint without its base weights (:meth:`state_dict`), the
        base is the one this policy was built with, loaded by name: its ``base_fingerprint`` must equal the
        checkpoint's, else the adapters would sit on another base (another revision, a changed folder), and that is
        refused naming the base and the first tensor that differs. A checkpoint that holds the base weights loads
        them as before."""
        if not self.__dict__.get("_adapters_only"):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        if any(k in state_dict for k in self._base_keys):  # a checkpoint with its base weights (saved before LoRA
            # checkpoints left them out): they load, and the fingerprint is that of the weights loaded
            state_dict = {"base_fingerprint": self.base_fingerprint, **state_dict}
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
            self.base_fingerprint.copy_(base_fingerprint(self._base_tensors()))
            return result
        saved = state_dict.get("base_fingerprint")
        if saved is not None:
            self._check_base_fingerprint(th.as_tensor(saved))
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        missing = [k for k in result.missing_keys if k not in self._base_keys]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}: missing keys {missing}, unexpected keys "
                f"{result.unexpected_keys}"
            )
        return type(result)(missing, result.unexpected_keys)

    def _check_base_fingerprint(self, saved: th.Tensor) -> None:
        ours = self.base_fingerprint
        if saved.shape == ours.shape and th.allclose(saved.to(ours), ours, rtol=1e-6, atol=1e-6):
            return
        name, revision = self._spec.get("name_or_path"), self._spec.get("revision")
        at = "" if revision is None else f" at revision {revision!r}"
        if saved.shape != ours.shape:
            what = f"it has {saved.shape[0]} base tensors, the base loaded here {ours.shape[0]}"
        else:
            rows = (~th.isclose(saved.to(ours), ours, rtol=1e-6, atol=1e-6)).any(dim=1).nonzero()
            what = f"first differing tensor: {self.base_keys[int(rows[0])]}"
        raise ValueError(
            f"the LoRA adapters being loaded were trained on a base model whose weights differ from those of "
            f"{name!r}{at} loaded here ({what}); the base at that name has changed since the checkpoint was saved "
            "(another revision, a changed folder, other quantization settings). Load the base the adapters were "
            "trained on: restore its folder or revision, or pass it with GRPO.load(path, base_model=...)"
        )

    def _base_tensors(self) -> list[th.Tensor]:
        """The frozen base weights, in the order of :attr:`base_keys`."""
        state = self.lm.state_dict(keep_vars=True)
        return [state[key[len("lm.") :]] for key in self.base_keys]

    def train(self, mode: bool = True) -> CausalLMPolicy:
        """Set the module's mode; the LM and critic stay in eval mode (no dropout) in both modes.

        With gradient checkpointing, only the checkpointed decoder layers follow ``mode`` (their ``training`` flag
        switches checkpointing on); their attention / MLP submodules, which own the dropout, stay in eval mode.
        """
        super().train(mode)
        self.lm.eval()
        if self.separate_critic:
            self.critic.eval()
        # the rollout's single-token forwards (no gradients) take the lean step where the model has one
        self._lean_decode = None if mode or self.moe is not None else lean_step(self.lm.base_model, self._projection())
        if self.gradient_checkpointing and mode:
            from transformers.modeling_layers import GradientCheckpointingLayer

            for module in self.lm.modules():
                if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
                    module.training = True
        return self

    def _projection(self) -> Any:
        """How the lean step runs the blocks' projections: from the weights' other layouts on the CPU without autocast
        (:mod:`~sb3_grpo.policies.block_weights`, which serves float32 products), else ``None`` (the layers' own
        calls)."""
        if self._block_weights is None or self._autocast is not None or self.device.type != "cpu":
            return None
        return self._block_weights.project

    def set_training_mode(self, mode: bool) -> None:
        """SB3 hook: ``True`` before an update (drops the rollout cache), ``False`` before a rollout.

        :param mode: training mode flag.
        """
        if mode:
            self.reset_cache()
        self.train(mode)

    def reset_cache(self) -> None:
        """Drop every rollout KV cache (the next call recomputes all rows), the packed output layer and the
        blocks' weight copies and packs."""
        self._rollout_cache.reset()
        if self._packed_head is not None:
            self._packed_head.clear()
        if self._block_weights is not None:
            self._block_weights.clear()

    def _new_rollout_cache(self, memo_bytes: int | None = None) -> RolloutCache:
        """An empty rollout KV cache over this policy's forward pieces, its prefill memo of ``memo_bytes`` (``None``:
        :func:`~sb3_grpo.policies.prefill_memo.memo_budget` of the LM)."""
        if memo_bytes is None:
            memo_bytes = memo_budget(self.lm.config, next(self.lm.parameters()).element_size())
        return RolloutCache(
            trunk=self._trunk,
            step_trunk=self._step_trunk,
            logits=self._logits,
            value=self._value,
            parameters=self.parameters,
            lm_config=self.lm.config,
            model_name=type(self.lm).__name__,
            memo_bytes=memo_bytes,
        )

    def frozen_copy(self) -> CausalLMPolicy:
        """A copy that plays as this policy does now and never changes: its trainable tensors (LoRA adapters, the value
        head; every weight of a full fine-tune) copied, the frozen ones (a LoRA policy's base model) shared with this
        policy rather than copied, no optimizer, an empty rollout cache, eval mode, no gradients.

        What an opponent snapshot needs (:meth:`textrl_envs.games.PolicyOpponent.snapshot`): a league of LoRA
        snapshots of a real model holds one base and one small set of adapters per member. The shared base is never
        written (LoRA keeps it frozen), so training this policy does not change the copy. Its prefill memo gets
        :data:`~sb3_grpo.policies.prefill_memo.FROZEN_MEMO_BYTES` (64 MiB), not the learner's budget (about 750 MB
        for SmolLM2-135M in float32): no update ever empties a frozen copy's memo.
        """
        import copy

        memo: dict[int, Any] = {id(t): t for t in self.parameters() if not t.requires_grad}
        memo.update({id(t): t for t in self.lm.buffers()})  # the model's constant tables (rotary frequencies)
        # neither the optimizer nor the cached keys and values belong to a frozen copy (the cache is rebuilt empty
        # below), nor the last step's distribution (tensors of a graph)
        memo[id(self.optimizer)] = None
        memo[id(self._rollout_cache)] = None
        memo[id(self.action_dist)] = CategoricalDistribution(self.n_actions)
        frozen = copy.deepcopy(self, memo)
        frozen._rollout_cache = frozen._new_rollout_cache(FROZEN_MEMO_BYTES)
        frozen.set_training_mode(False)
        for param in frozen.parameters():
            param.requires_grad_(False)
        return frozen

    def warm_prefills(self, obs: PyTorchObs) -> int:
        """Prefill these windows into the rollout cache's memo in one batched forward (no-op without the cache):
        GRPO passes the env's prompts at the start of a rollout, so that episodes that auto-reset onto them copy
        their keys/values instead of running a prefill at the step they start.

        :param obs: dict observation of the windows (``input_ids``, ``attention_mask``), batched.
        :return: How many windows were computed.
        """
        return self._hand_to_cache(obs, RolloutCache.warm)

    def prefetch_prompts(self, obs: PyTorchObs) -> int:
        """Queue these windows in the rollout cache (no-op without it): each prefill that runs while the parameters
        stay the same also computes a few of them in its forward (:meth:`RolloutCache.prefetch
        <sb3_grpo.policies.kv_cache.RolloutCache.prefetch>`). GRPO passes the prompts the env's groups will draw
        next, at the start of a rollout whose env has too many prompts to prefill them all.

        :param obs: dict observation of the windows (``input_ids``, ``attention_mask``), batched.
        :return: How many windows are queued.
        """
        return self._hand_to_cache(obs, RolloutCache.prefetch)

    def _hand_to_cache(self, obs: PyTorchObs, method: Callable[[RolloutCache, th.Tensor, th.Tensor], int]) -> int:
        """``method(rollout cache, ids, mask)`` of these windows without gradients (0 without the cache)."""
        with th.no_grad():
            if not self._caching():
                return 0
            ids, mask = self._parse_obs(obs)
            return method(self._rollout_cache, ids, mask)

    def _parse_obs(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor]:
        if not isinstance(obs, dict) or any(k not in obs for k in OBS_KEYS):
            got = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            raise ValueError(f"CausalLMPolicy expects observations with keys {list(OBS_KEYS)}; got {got}")
        ids = th.as_tensor(obs["input_ids"], device=self.device)
        mask = th.as_tensor(obs["attention_mask"], device=self.device)
        if ids.dim() == 1:
            ids, mask = ids.unsqueeze(0), mask.unsqueeze(0)
        check_layout(ids, mask)  # right-aligned integer windows, or a clear error naming the wrapper that broke them
        if ids.is_floating_point():
            ids = ids.round()
        if mask.is_floating_point():
            mask = mask.round()
        # copies: SB3's obs_as_tensor shares memory with the env's numpy arrays, which an env may reuse in place
        # (masked_fill below returns a new tensor, the ids' copy)
        mask = mask.to(th.long, copy=True)
        # padding ids may be anything (even out of the LM's range): they are masked, so make them 0
        ids = ids.to(th.long).masked_fill(mask == 0, 0)
        check_token_range(ids, self.lm.get_input_embeddings().num_embeddings)
        return ids, mask

    # ---------------------------------------------------------------------------------------------------------
    # Model pieces
    # ---------------------------------------------------------------------------------------------------------

    def _trunk(
        self,
        ids: th.Tensor,
        mask: th.Tensor,
        position_ids: th.Tensor,
        cache: Any = None,
    ) -> th.Tensor:
        """Final hidden states ``[B, L, d]`` of the LM body (after its final norm); with ``moe``, the K experts'
        side by side, ``[B, L, K * d]``, each expert's keys and values in its own layers of ``cache``
        (:mod:`sb3_grpo.policies.experts`)."""
        if self._threads_pending:
            self._threads_pending = False
            if ids.device.type == "cpu":
                apply_cpu_thread_default(sum(p.numel() for p in self.lm.parameters()))
        return self._expert_hidden(lambda c: self._one_trunk(ids, mask, position_ids, c), cache)

    def _step_trunk(self, ids: th.Tensor, mask: th.Tensor, position_ids: th.Tensor, cache: Any) -> th.Tensor:
        """:meth:`_trunk` of one new token per row over a KV cache (the rollout's decoding steps): the lean step of
        :mod:`.lean_step` where the model has one (the same numbers as the model's forward, with less overhead), else
        :meth:`_trunk`."""
        step = self.__dict__.get("_lean_decode")
        if step is None or self._threads_pending or th.is_grad_enabled() or ids.shape[1] != 1:
            return self._trunk(ids, mask, position_ids, cache)
        with self._autocast_context(), quiet_8bit_casts(self._quiet_casts):
            return step(ids, mask, position_ids, cache)

    def _one_trunk(self, ids: th.Tensor, mask: th.Tensor, position_ids: th.Tensor, cache: Any) -> th.Tensor:
        """One forward of the LM body with its active adapter: final hidden states ``[B, L, d]``."""
        router = self._collecting_router_losses()
        extra = {"output_router_logits": True} if router else {}
        with self._autocast_context(), quiet_8bit_casts(self._quiet_casts):
            out = self.lm.base_model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                use_cache=cache is not None,
                **{cache_argument(self.lm.base_model): cache},
                **extra,
            )
        if router:
            self._record_router_loss(out.router_logits, mask)
        return out.last_hidden_state

    @property
    def _quiet_casts(self) -> bool:
        """Whether the base is 8-bit, whose matmul notes a float32-to-float16 cast on every call (silenced in our
        forwards, :func:`~sb3_grpo.policies.quantization.quiet_8bit_casts`)."""
        return bool(self.quantization) and bool(self.quantization.get("load_in_8bit"))

    def _autocast_context(self) -> Any:
        """``torch.autocast`` to ``autocast_dtype`` on the policy's device (a no-op context without it)."""
        if self._autocast is None:
            return contextlib.nullcontext()
        return th.autocast(device_type=self.device.type, dtype=self._autocast)

    def _logits(self, hidden: th.Tensor) -> th.Tensor:
        """Next-token logits over the env's ``V`` actions (float32): the output layer's (:meth:`_head_logits`), or
        with ``moe`` and the experts' hidden states the mixture's log-probs."""
        return self._mixture_logits(hidden, self._head_logits)

    def _head_logits(self, hidden: th.Tensor) -> th.Tensor:
        """Raw next-token logits over the env's ``V`` actions (float32).

        When the LM's vocabulary is larger than ``V`` and its output layer is a plain ``nn.Linear``, only the first
        ``V`` rows of the output layer are applied (the same numbers as slicing the full logits, without computing
        the logits of tokens that are not actions, in the rollout and in the update's backward alike).
        """
        head = self.lm.get_output_embeddings()
        with self._autocast_context():
            if type(head) is nn.Linear:
                weight, bias = head.weight, head.bias
                if head.out_features > self.n_actions:
                    weight = weight[: self.n_actions]
                    bias = None if bias is None else bias[: self.n_actions]
                logits = None
                if self._packed_head is not None and self._autocast is None:
                    logits = self._packed_head.linear(hidden, weight, bias)
                if logits is None:
                    logits = F.linear(hidden, weight, bias)
            else:
                logits = head(hidden)[..., : self.n_actions]
        cap = getattr(self.lm.config, "final_logit_softcapping", None)
        if cap:
            logits = th.tanh(logits / cap) * cap
        return logits.float()

    def _value(self, hidden_last: th.Tensor, ids: th.Tensor, mask: th.Tensor) -> th.Tensor:
        """Values ``[B]`` of the states given by whole windows (``hidden_last``: trunk output at the last column)."""
        if self.separate_critic:
            return self.critic.values_per_position(ids, mask)[:, -1]
        return self.value_head(self._critic_hidden(hidden_last).float()).squeeze(-1)

    def _processed(self, logits: th.Tensor) -> th.Tensor:
        return process_logits(logits, self.temperature, self.top_k, self.top_p)

    def _distribution(self, logits: th.Tensor) -> CategoricalDistribution:
        return self.action_dist.proba_distribution(action_logits=self._processed(logits))

    def _full_outputs(self, ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Logits ``[B, V]`` and values ``[B]`` for whole windows, no cache (differentiable)."""
        ids, mask = trim_padding(ids, mask)
        hidden = self._trunk(ids, mask, positions_from_mask(mask))[:, -1]
        return self._logits(hidden), self._value(hidden, ids, mask)

    def _shared_outputs(self, ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """:meth:`_full_outputs`, with the windows that are prefixes of another window read off its forward."""
        plan = shared_prefixes(ids, mask) if self.share_prefixes else None
        if plan is None:
            return self._full_outputs(ids, mask)
        parents, parent_of, column = plan
        ids, mask = trim_padding(ids[parents], mask[parents])
        hidden = self._trunk(ids, mask, positions_from_mask(mask))[parent_of, column]
        if self.separate_critic:
            values = self.critic.values_per_position(ids, mask)[parent_of, column]
        else:
            values = self.value_head(self._critic_hidden(hidden).float()).squeeze(-1)
        return self._logits(hidden), values

    def _outputs(self, ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        if self._caching():
            served = self._rollout_cache.outputs(ids, mask)
            if served is not None:
                return served
        return self._full_outputs(ids, mask)

    def _caching(self) -> bool:
        return self.use_cache and self._rollout_cache.supported and not th.is_grad_enabled()

    def _look_ahead(self, ids: th.Tensor, mask: th.Tensor, actions: th.Tensor) -> None:
        """Extend the batch cache by the tokens just chosen (:meth:`~.kv_cache.RolloutCache.look_ahead`)."""
        self._rollout_cache.look_ahead(ids, mask, actions)

    # ---------------------------------------------------------------------------------------------------------
    # The SB3 policy API
    # ---------------------------------------------------------------------------------------------------------

    #: :meth:`forward` takes an ``action_filter`` (GRPO's exploration draws its actions through it, in one call).
    accepts_action_filter = True
    #: :meth:`forward` takes ``look_ahead`` (the rollout turns it off for its last step when nothing reads the next
    #: outputs: group advantages need no bootstrap value).
    accepts_look_ahead = True

    def forward(
        self,
        obs: PyTorchObs,
        deterministic: bool = False,
        action_filter: Callable[[th.Tensor, CategoricalDistribution], th.Tensor] | None = None,
        look_ahead: bool = True,
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Sample (or pick the mode of) the next token; uses the rollout cache under ``no_grad``.

        :param obs: dict observation (``input_ids``, ``attention_mask``), batched.
        :param deterministic: take the most likely token instead of sampling.
        :param action_filter: ``f(actions, dist) -> actions``, applied to the drawn actions before their log-probs
            and the look-ahead (GRPO's mixed exploration and greedy group members: one call instead of a second
            forward for the replaced actions, and a look-ahead that already has the actions taken). ``dist`` stands
            for the step's ``CategoricalDistribution`` and is built at its first attribute read (``dist.mode()``), so
            a filter that reads nothing costs no pass over the vocabulary.
        :param look_ahead: extend the rollout cache by the tokens chosen, so that the next step's call costs one
            token's forward (``False``: a rollout's last step, when nothing reads the next outputs).
        :return: actions ``[B]``, values ``[B, 1]``, log-probs ``[B]`` of the processed distribution.
        """
        ids, mask = self._parse_obs(obs)
        logits, values = self._outputs(ids, mask)
        processed = self._processed(logits)
        # the distribution object is built only where it is read (the mode, a filter's greedy members): the draw and
        # its log-probs come from one set of passes (draw_tokens), the same log-probs as the distribution's log_prob
        dist = _DeferredDistribution(lambda: self.action_dist.proba_distribution(action_logits=processed))
        if deterministic:
            actions, log_normaliser = dist.mode(), processed.logsumexp(dim=-1)
        else:
            actions, log_normaliser = draw_tokens(processed)
        if action_filter is not None:
            actions = action_filter(actions, dist)
        log_prob = token_log_probs(processed, log_normaliser, actions)
        if look_ahead and self._caching():
            self._look_ahead(ids, mask, actions)
        return actions, values.unsqueeze(-1), log_prob

    def turn_decoder(self, *args: Any) -> LiveBatch:
        """A live batch of the built-in decoder over the LM's own KV cache, for the ``"hf"`` rollout engine
        (:class:`~sb3_grpo.policies.decoder.LiveBatch` documents the arguments). It runs under ``torch.no_grad``."""
        return LiveBatch(self, *args)

    def evaluate_actions(self, obs: PyTorchObs, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Values, log-probs and entropies for given transitions: full recompute, never the cache.

        :param obs: dict observation, batched (floats from the rollout buffer are fine).
        :param actions: token ids ``[B]`` or ``[B, 1]``.
        :return: values ``[B, 1]``, log-probs ``[B]``, entropies ``[B]``.
        """
        ids, mask = self._parse_obs(obs)
        logits, values = self._shared_outputs(ids, mask)
        dist = self._distribution(logits)
        actions = actions.reshape(-1).long()
        return values.unsqueeze(-1), dist.log_prob(actions), dist.entropy()

    def get_distribution(self, obs: PyTorchObs) -> CategoricalDistribution:
        """The processed next-token distribution for the given observations.

        :param obs: dict observation, batched.
        :return: an SB3 ``CategoricalDistribution``.
        """
        ids, mask = self._parse_obs(obs)
        return self._distribution(self._outputs(ids, mask)[0])

    def predict_values(self, obs: PyTorchObs) -> th.Tensor:
        """State values; under ``no_grad`` it extends the rollout cache by one token when it can.

        :param obs: dict observation, batched.
        :return: values ``[B, 1]``.
        """
        ids, mask = self._parse_obs(obs)
        return self._outputs(ids, mask)[1].unsqueeze(-1)

    def _predict(self, observation: PyTorchObs, deterministic: bool = False) -> th.Tensor:
        return self.forward(observation, deterministic=deterministic)[0]


class _DeferredDistribution:
    """A :class:`~stable_baselines3.common.distributions.CategoricalDistribution` built at its first attribute read
    (``make()`` builds it), so that an ``action_filter`` that reads none (no greedy member this step) costs no pass
    over the vocabulary."""

    def __init__(self, make: Callable[[], CategoricalDistribution]) -> None:
        self._make = make
        self._built: CategoricalDistribution | None = None

    def __getattr__(self, name: str) -> Any:  # only names this object lacks: the distribution's
        if self._built is None:
            self._built = self._make()
        return getattr(self._built, name)


def cache_argument(model: Any) -> str:
    """The name under which ``model.forward`` takes its KV cache: ``cache`` (recent transformers 5.x releases) or
    ``past_key_values`` (earlier 5.x releases, e.g. those vLLM pins)."""
    name = _CACHE_ARGUMENT.get(type(model))
    if name is None:
        params = inspect.signature(model.forward).parameters
        name = "cache" if "cache" in params or "past_key_values" not in params else "past_key_values"
        _CACHE_ARGUMENT[type(model)] = name
    return name


_CACHE_ARGUMENT: dict[type, str] = {}
