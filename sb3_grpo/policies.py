"""``CausalLMPolicy``: any Hugging Face causal LM as a stable-baselines3 actor-critic policy.

The observation is a right-aligned (left-padded) window of token ids with its attention mask; the action is
the next token id. The actor is the LM's next-token distribution (after temperature / top-k / top-p), the
critic a scalar value head. During rollout the policy keeps a per-row KV cache (see :class:`CausalLMPolicy`)
so that stock SB3 ``collect_rollouts`` runs one single-token forward per step instead of one per prefix.

The math lives in small pure functions (:func:`positions_from_mask`, :func:`process_logits`,
:func:`extends_by_one`, :func:`left_pad_columns`) that the tests pin down.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import CategoricalDistribution
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import nn

__all__ = [
    "CausalLMPolicy",
    "extends_by_one",
    "left_pad_columns",
    "lora_spec",
    "model_spec",
    "positions_from_mask",
    "process_logits",
]

OBS_KEYS = ("input_ids", "attention_mask")


# --------------------------------------------------------------------------------------------------------------
# Small pure functions
# --------------------------------------------------------------------------------------------------------------


def positions_from_mask(attention_mask: th.Tensor) -> th.Tensor:
    """Position ids from an attention mask: ``cumsum - 1``, clamped at 0.

    A token's position is the number of valid tokens before it, so it does not depend on how much left
    padding the window carries. Every path of the policy (full recompute, cached step, whole sequences)
    uses this rule, which is what makes them agree.

    :param attention_mask: ``[B, L]`` mask, 1 for real tokens, 0 for padding.
    :return: ``[B, L]`` long tensor of position ids (0 on leading padding).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def process_logits(
    logits: th.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> th.Tensor:
    """Apply temperature, then top-k, then top-p (nucleus) filtering, in Hugging Face's order.

    Removed tokens get ``-inf``; the result is the logits of the distribution the policy samples from *and*
    scores log-probs with. Ties at the top-k boundary are all kept (as in ``transformers``' ``TopKLogitsWarper``);
    top-p keeps the smallest set of most likely tokens whose probability reaches ``top_p`` (at least one).

    :param logits: ``[..., V]`` raw logits.
    :param temperature: divide the logits by this (> 0).
    :param top_k: keep the ``top_k`` most likely tokens; ``None`` or 0 keeps all.
    :param top_p: keep the nucleus of mass ``top_p``; ``None`` or 1.0 keeps all.
    :return: ``[..., V]`` processed logits (float32 or the input dtype).
    """
    if temperature != 1.0:
        logits = logits / temperature
    vocab = logits.shape[-1]
    if top_k is not None and 0 < top_k < vocab:
        kth = th.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = th.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1.0 - top_p)
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def extends_by_one(
    old_ids: th.Tensor, old_mask: th.Tensor, new_ids: th.Tensor, new_mask: th.Tensor
) -> th.Tensor:
    """Which rows of a new right-aligned window extend the old window by exactly one token.

    True for row ``b`` when the window shifted left by one (``new[:-1] == old[1:]`` for ids and mask), the
    new last token is valid, and nothing valid fell off the left edge (``old_mask[0] == 0``), i.e. the valid
    tokens of the new window are the valid tokens of the old one plus one.

    :param old_ids: ``[B, W]`` ids of the cached window.
    :param old_mask: ``[B, W]`` its mask.
    :param new_ids: ``[B, W]`` ids of the new window.
    :param new_mask: ``[B, W]`` its mask.
    :return: ``[B]`` bool tensor.
    """
    if old_ids.shape != new_ids.shape:
        return th.zeros(new_ids.shape[0], dtype=th.bool, device=new_ids.device)
    same_ids = (new_ids[:, :-1] == old_ids[:, 1:]).all(dim=1)
    same_mask = (new_mask[:, :-1] == old_mask[:, 1:]).all(dim=1)
    return same_ids & same_mask & (new_mask[:, -1] == 1) & (old_mask[:, 0] == 0)


def left_pad_columns(t: th.Tensor, length: int, dim: int = -2) -> th.Tensor:
    """Pad ``t`` with zeros on the left of dimension ``dim`` up to ``length`` (no-op if already as long).

    :param t: tensor, e.g. cached keys ``[B, H, K, D]``.
    :param length: the target size of ``dim``.
    :param dim: the sequence dimension.
    :return: the padded tensor.
    """
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return th.cat([t.new_zeros(shape), t], dim=dim)


def model_spec(lm: nn.Module) -> dict[str, Any]:
    """A JSON-serialisable description of a Hugging Face model: its full config, no weights.

    SB3 stores this instead of the model object; the weights come back from the state dict SB3 saves.

    :param lm: a ``PreTrainedModel``.
    :return: ``{"config": dict, "name_or_path": str}``.
    """
    return {
        "config": json.loads(lm.config.to_json_string(use_diff=False)),
        "name_or_path": str(
            getattr(lm.config, "_name_or_path", "") or getattr(lm, "name_or_path", "")
        ),
    }


# --------------------------------------------------------------------------------------------------------------
# Model loading
# --------------------------------------------------------------------------------------------------------------


def _default_model_path() -> str:
    try:
        from textrl_envs.assets import (
            lm_path,  # lazy: the bundled LM is optional at import
        )

        return str(lm_path())
    except (ImportError, AttributeError, FileNotFoundError) as e:
        raise FileNotFoundError(
            "CausalLMPolicy got model=None, which means the bundled LM from textrl_envs.assets.lm_path(), "
            f"but it is not available ({e}); pass policy_kwargs={{'model': <local model dir or PreTrainedModel>}}"
        ) from e


def _as_dtype(dtype: th.dtype | str | None) -> th.dtype | None:
    if dtype is None or isinstance(dtype, th.dtype):
        return dtype
    if dtype == "auto":
        return None
    name = str(dtype).replace("torch.", "")
    value = getattr(th, name, None)
    if not isinstance(value, th.dtype):
        raise ValueError(  # noqa: TRY004
            f"dtype {dtype!r} is not a torch dtype; use e.g. 'float32', 'bfloat16' or th.float16"
        )
    return value


def _load_lm(model: Any, dtype: th.dtype | None) -> nn.Module:
    """Build the causal LM from a path, a model instance, a :func:`model_spec` dict, or ``None``."""
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

    if model is None:
        model = _default_model_path()
    if isinstance(model, PreTrainedModel):
        return model.to(dtype) if dtype is not None else model
    if isinstance(model, dict):
        if "config" not in model:
            raise ValueError(
                f"model dict must be a model_spec with a 'config' key, got keys {sorted(model)}"
            )
        cfg = dict(model["config"])
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        dtype = dtype or _as_dtype(
            cfg.get("dtype") or cfg.get("torch_dtype")
        )  # the saved model's own dtype
        kwargs = {"dtype": dtype} if dtype is not None else {}
        return AutoModelForCausalLM.from_config(config, **kwargs)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"CausalLMPolicy model directory {path!r} does not exist (or is not a directory); pass an existing "
                "local model directory, a PreTrainedModel, or a model_spec dict (config only; weights then come "
                "from the SB3 checkpoint)"
            )
        kwargs = {"dtype": dtype} if dtype is not None else {}
        return AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, **kwargs
        )
    raise TypeError(
        f"model must be None, a local path, a transformers PreTrainedModel or a model_spec dict; got {type(model)}"
    )


def _make_portable(model: Any, spec: dict[str, Any]) -> None:
    """Replace a model *object* in the calling SB3 algorithm's ``policy_kwargs`` by its config spec.

    SB3 saves ``algo.policy_kwargs`` with the algorithm (cloudpickled when not JSON), which would pickle the whole
    Hugging Face model into the zip. The policy never sees the algorithm, so it looks up the few frames above it
    for the ``BaseAlgorithm`` whose ``policy_kwargs["model"]`` is this very object and swaps in the spec; the
    weights are saved anyway in the state dict. Paths and specs are left as they are.
    """
    from stable_baselines3.common.base_class import BaseAlgorithm

    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return
        algo = frame.f_locals.get("self")
        if isinstance(algo, BaseAlgorithm) and isinstance(
            getattr(algo, "policy_kwargs", None), dict
        ):
            if algo.policy_kwargs.get("model") is model:
                # a new dict: the user's own policy_kwargs (which SB3 keeps by reference) still holds their model
                algo.policy_kwargs = {**algo.policy_kwargs, "model": spec}
            return
        frame = frame.f_back


# --------------------------------------------------------------------------------------------------------------
# LoRA (peft, optional) and mixed precision
# --------------------------------------------------------------------------------------------------------------

LORA_INSTALL_HINT = 'pip install "textrl[lora]"  (or: pip install peft)'


def _import_peft() -> Any:
    try:
        import peft
    except ImportError as err:
        raise ImportError(
            f"CausalLMPolicy(lora=...) needs the optional dependency peft, which is not installed ({err}); "
            f"install it with: {LORA_INSTALL_HINT}; or drop policy_kwargs['lora'] to train the full model"
        ) from err
    return peft


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple, list)):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def lora_spec(lora: Any) -> dict[str, Any]:
    """The JSON-able spec of a LoRA configuration: the ``peft.LoraConfig`` fields that differ from their defaults.

    This is what ``CausalLMPolicy`` stores (and SB3 saves) instead of a pickled peft object; ``LoraConfig(**spec)``
    rebuilds the configuration. Sets become sorted lists and enums their values.

    :param lora: a ``peft.LoraConfig``, or a dict of its keyword arguments (e.g. ``{"r": 8, "lora_alpha": 16}``).
    :return: the spec (a plain dict of JSON types).
    """
    peft = _import_peft()
    if isinstance(lora, dict):
        try:
            config = peft.LoraConfig(**lora)
        except TypeError as err:
            raise ValueError(
                f"policy_kwargs['lora'] is not a valid set of peft.LoraConfig arguments ({err}); pass e.g. "
                "{'r': 8, 'lora_alpha': 16, 'target_modules': ['c_attn']} or a peft.LoraConfig"
            ) from err
    elif isinstance(lora, peft.LoraConfig):
        config = lora
    else:
        raise TypeError(
            f"policy_kwargs['lora'] must be a peft.LoraConfig or a dict of its arguments, got {type(lora).__name__}"
        )
    defaults = _jsonable(peft.LoraConfig().to_dict())
    given = _jsonable(config.to_dict())
    skip = {"peft_type", "peft_version"}
    return {k: v for k, v in given.items() if k not in skip and defaults.get(k, object()) != v}


def _apply_lora(lm: nn.Module, spec: dict[str, Any]) -> Any:
    """Inject LoRA adapters into ``lm`` in place (its other weights are frozen); returns the ``PeftModel``."""
    peft = _import_peft()
    try:
        return peft.get_peft_model(lm, peft.LoraConfig(**spec))
    except ValueError as err:
        raise ValueError(
            f"peft could not add LoRA adapters to this {type(lm).__name__} ({err}); name the layers to adapt, "
            "e.g. policy_kwargs['lora'] = {'r': 8, 'target_modules': ['q_proj', 'v_proj']} (module names from "
            "model.named_modules())"
        ) from err


AUTOCAST_DTYPES = ("bfloat16", "float16")


def _autocast_dtype(value: th.dtype | str | None) -> th.dtype | None:
    dtype = _as_dtype(value)
    if dtype is not None and dtype not in (th.bfloat16, th.float16):
        raise ValueError(
            f"autocast_dtype={value!r} is not supported; use one of {', '.join(AUTOCAST_DTYPES)} (mixed precision) "
            "or None (no autocast; to run the whole model in a lower precision use dtype=...)"
        )
    return dtype


# --------------------------------------------------------------------------------------------------------------
# The critic used with separate_critic=True
# --------------------------------------------------------------------------------------------------------------


class EmbeddingCritic(nn.Module):
    """A small critic that shares no trainable weights with the LM.

    Features of the state ending at position ``j``: the mean of the (detached, frozen) LM input embeddings of the
    valid tokens up to ``j``, concatenated with the embedding of token ``j``; a two-layer MLP maps them to a scalar.
    Gradients of the value loss never reach the LM, and the critic costs an embedding lookup, so it needs no KV
    cache. Its prefix version (:meth:`values_per_position`) is what both the per-transition and the sequence paths
    use, so they agree exactly.

    :param embedding: the LM's input embedding module (read, detached).
    :param hidden: width of the MLP.
    """

    def __init__(self, embedding: nn.Module, hidden: int = 256):
        super().__init__()
        self._embedding = [
            embedding
        ]  # a list keeps it out of this module's parameters / state dict
        dim = embedding.weight.shape[1]
        self.mlp = nn.Sequential(nn.Linear(2 * dim, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, 1)

    def values_per_position(
        self, input_ids: th.Tensor, attention_mask: th.Tensor
    ) -> th.Tensor:
        """Value of every prefix: ``[B, L]``, entry ``j`` for the state whose last token is ``j``."""
        with th.no_grad():
            emb = self._embedding[0](input_ids).float()
        m = attention_mask.float().unsqueeze(-1)
        mean = (emb * m).cumsum(1) / m.cumsum(1).clamp(min=1.0)
        return self.head(self.mlp(th.cat([mean, emb], dim=-1))).squeeze(-1)


# --------------------------------------------------------------------------------------------------------------
# Rollout cache state
# --------------------------------------------------------------------------------------------------------------


class _CacheUnsupported(Exception):
    """The model's cache layers cannot be spliced / cropped per row (e.g. sliding-window layers)."""


@dataclass
class _RowCache:
    """KV cache and bookkeeping for one batch of envs (one batch size).

    Invariants: ``cache`` holds, for every row, the keys/values of exactly the valid tokens of ``ids[b]`` in order;
    ``kv_mask[b]`` marks which cache columns are real for row ``b`` (right-aligned: a suffix, except for the masked
    hole a replaced look-ahead token leaves); leading columns masked for every row are cropped, so ``K`` stays
    within ``W`` plus at most one hole per step of an episode; ``logits``/``values`` are the outputs for ``ids``;
    ``version`` is the parameter version they were computed with. After a look-ahead step, ``prev_ids`` /
    ``prev_mask`` hold the window before it (the look-ahead token is the last cache column), else ``None``.
    """

    cache: Any
    kv_mask: th.Tensor
    ids: th.Tensor
    mask: th.Tensor
    logits: th.Tensor
    values: th.Tensor
    version: int
    prev_ids: th.Tensor | None = None
    prev_mask: th.Tensor | None = None
    prev_logits: th.Tensor | None = None
    prev_values: th.Tensor | None = None


# --------------------------------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------------------------------


class CausalLMPolicy(BasePolicy):
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
    ``use_cache=True``, the policy keeps one ``transformers.DynamicCache`` per batch size (the last two used) holding
    every row's keys/values right-aligned in one batch, with an explicit 2-D mask over the cache columns. Each row of a
    call is classified against the cached window (:meth:`_classify`):

    - ``same``: the cached window; its stored logits and value are returned, no forward;
    - ``extend``: the cached window plus exactly one token (:func:`extends_by_one`: ``new[:-1] == old[1:]`` for ids
      and mask, the new last token valid, nothing valid dropped off the left edge);
    - ``replace``: the window *before* the look-ahead (below) plus a token other than the look-ahead one; the
      look-ahead column is masked out for that row (a masked hole), then it is treated as ``extend``;
    - ``back``: the window before the look-ahead itself (e.g. ``predict`` then ``forward`` on one observation): the
      look-ahead column is masked out and the outputs kept from before the look-ahead are returned;
    - ``redo``: anything else (auto-reset, new group prompt, an outside call with other observations).

    All ``extend``/``replace`` rows share one batched single-token forward over the cache (2-D mask
    ``[cache mask, new column]``, position ``n_valid - 1``; other rows feed a masked dummy token). ``redo`` rows get one
    prefill over those rows only; their cache is left-padded with masked slots and spliced into the batch cache.

    *Look-ahead.* After ``forward`` samples the actions, it immediately runs the single-token step for
    ``window + action`` of every row (:meth:`_look_ahead`). In ``collect_rollouts`` the next observation of every
    continuing env is exactly that, so the next ``forward`` finds those rows ``same``: still one batched forward per
    generated token, just computed one call earlier. The payoff is SB3's bootstrap of truncated episodes, which calls
    ``predict_values(terminal_obs)`` one env at a time: the terminal window is a look-ahead row, so it is a lookup
    (:meth:`_serve_from_other_batches`) rather than a batch-of-one forward per finished env. Calls with a new batch
    size whose rows all match cached rows (same, one token past, or replaced) are served from those rows too.

    Leading cache columns masked for every row are cropped after each step, so the cache stays within ``W`` columns
    (plus at most one hole per replaced token in an episode). The cache is dropped when the parameters change (a
    version counter over the parameters' in-place update counters, plus ``set_training_mode(True)``) and is never
    used with gradients (``evaluate_actions``, ``evaluate_sequences`` always recompute in full). Models whose cache
    layers are not plain ``DynamicLayer`` (sliding windows, linear attention) fall back to full recomputation.

    **Saving.** ``_get_constructor_parameters`` stores the model as a config-only :func:`model_spec` dict, and when
    an SB3 algorithm builds the policy from a model *object*, its ``policy_kwargs["model"]`` is replaced by that spec
    too (see :func:`_make_portable`), so no Hugging Face object is pickled and loading needs no model directory; the
    weights come from SB3's state dict. A model given as a path stays a path: loading then needs that directory and
    says so clearly when it is gone.

    :param observation_space: the env's ``Dict`` observation space.
    :param action_space: the env's ``Discrete(V)`` action space.
    :param lr_schedule: learning-rate schedule (SB3 passes it).
    :param model: a local model directory, a ``transformers.PreTrainedModel`` (used in place, not copied), a
        :func:`model_spec` dict, or ``None`` for the bundled LM at ``textrl_envs.assets.lm_path()``.
    :param dtype: dtype to load / cast the LM to (``th.dtype`` or a name such as ``"bfloat16"``); heads stay float32.
    :param temperature: sampling temperature (> 0).
    :param top_k: keep only the ``top_k`` most likely tokens (``None``: all).
    :param top_p: nucleus sampling mass in ``(0, 1]`` (``None``: all).
    :param separate_critic: use an :class:`EmbeddingCritic` instead of a value head on the shared trunk.
    :param use_cache: keep the rollout KV cache (``False``: recompute every prefix, for benchmarks and debugging).
    :param gradient_checkpointing: trade compute for memory in the update forward.
    :param lora: train LoRA adapters instead of the LM (needs ``peft``: ``pip install "textrl[lora]"``): a
        ``peft.LoraConfig`` or a dict of its arguments (e.g. ``{"r": 8, "lora_alpha": 16}``). The adapters are
        injected into the LM in place; only they and the value head (or separate critic) are trained and given to the
        optimizer. The policy then defines ``reference_evaluate_actions`` / ``reference_evaluate_sequences``: the same
        model with the adapters switched off (peft's ``disable_adapter()``), which ``GRPO(kl_coef > 0)`` uses as the
        KL reference instead of a frozen copy. Stored as a JSON-able :func:`lora_spec`; the adapter weights are in the
        state dict.
    :param autocast_dtype: ``"bfloat16"`` or ``"float16"``: run the LM (trunk and output layer) under
        ``torch.autocast`` in rollout and update; logits are cast to float32 before the softmax, so log-probs,
        entropies, values (the value head runs outside autocast) and advantages stay float32. ``None``: no autocast.
    :param value_head_init_std: std of the value head's normal init (``None``: orthogonal if ``ortho_init``).
    :param ortho_init: SB3's flag; here it only decides the value head's init.
    :param critic_hidden: width of the separate critic's MLP.
    :param use_sde: SB3 passes it; must be False.
    :param normalize_images: SB3's flag, stored and ignored (token ids are not images).
    :param optimizer_class: the optimizer (default Adam, ``eps=1e-5`` like SB3's ``ActorCriticPolicy``).
    :param optimizer_kwargs: extra optimizer arguments.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        model: Any = None,
        dtype: th.dtype | str | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        separate_critic: bool = False,
        use_cache: bool = True,
        gradient_checkpointing: bool = False,
        lora: Any = None,
        autocast_dtype: th.dtype | str | None = None,
        value_head_init_std: float | None = None,
        ortho_init: bool = True,
        critic_hidden: int = 256,
        use_sde: bool = False,
        normalize_images: bool = True,
        optimizer_class: type[th.optim.Optimizer] = th.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
    ):
        if optimizer_kwargs is None:
            optimizer_kwargs = {"eps": 1e-5} if optimizer_class == th.optim.Adam else {}
        super().__init__(
            observation_space,
            action_space,
            normalize_images=normalize_images,
            optimizer_class=optimizer_class,
            optimizer_kwargs=optimizer_kwargs,
        )
        if use_sde:
            raise ValueError(
                "CausalLMPolicy has a discrete (token) action space; use_sde must be False"
            )
        self._check_spaces(observation_space, action_space)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k is not None and top_k < 0:
            raise ValueError(f"top_k must be >= 0 or None, got {top_k}")

        resolved_dtype = _as_dtype(dtype)
        self.dtype_name = (
            None
            if resolved_dtype is None
            else str(resolved_dtype).replace("torch.", "")
        )
        self.temperature = float(temperature)
        self.top_k = top_k
        self.top_p = top_p
        self.separate_critic = separate_critic
        self.use_cache = use_cache
        self.gradient_checkpointing = gradient_checkpointing
        self._autocast = _autocast_dtype(autocast_dtype)
        self.autocast_dtype = None if self._autocast is None else str(self._autocast).replace("torch.", "")
        self.value_head_init_std = value_head_init_std
        self.ortho_init = ortho_init
        self.critic_hidden = critic_hidden

        self.lm = _load_lm(model, resolved_dtype)
        self._spec = model_spec(self.lm)
        if not isinstance(model, (str, os.PathLike)) and model is not None:
            _make_portable(model, self._spec)
        self.lora = None if lora is None else lora_spec(lora)
        if self.lora is not None:
            # adapters injected into self.lm in place (self.lm stays the transformers model); the PeftModel wrapper
            # is kept unregistered, only for disable_adapter(), so the state dict has no duplicate keys
            self.__dict__["_peft_model"] = _apply_lora(self.lm, self.lora)

        self.n_actions = int(action_space.n)
        self.lm_vocab = int(self.lm.get_output_embeddings().weight.shape[0])
        if self.lm_vocab < self.n_actions:
            raise ValueError(
                f"the LM's vocabulary has {self.lm_vocab} tokens but the env's action space is Discrete("
                f"{self.n_actions}) (len(tokenizer)); use a model whose vocabulary covers the env's tokenizer, "
                "or resize its token embeddings to at least the tokenizer length"
            )
        hidden = int(self.lm.get_input_embeddings().weight.shape[1])
        if separate_critic:
            self.critic = EmbeddingCritic(
                self.lm.get_input_embeddings(), hidden=critic_hidden
            )
            self.value_head = self.critic.head
            init_modules = [self.critic.mlp, self.critic.head]
        else:
            self.value_head = nn.Linear(hidden, 1)
            init_modules = [self.value_head]
        for module in init_modules:
            if value_head_init_std is not None and module is self.value_head:
                nn.init.normal_(module.weight, std=value_head_init_std)
                nn.init.zeros_(module.bias)
            elif ortho_init:
                gain = 1.0 if module is self.value_head else float(np.sqrt(2))
                module.apply(lambda m, g=gain: self.init_weights(m, gain=g))

        if gradient_checkpointing:
            enable = getattr(self.lm, "activation_checkpointing_enable", None)
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:  # transformers releases before the rename
                self.lm.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
        self.action_dist = CategoricalDistribution(self.n_actions)
        self._caches: OrderedDict[int, _RowCache] = OrderedDict()
        self._cache_supported = True
        self.train(False)
        params = (
            [p for p in self.parameters() if p.requires_grad]
            if self.lora is not None
            else self.parameters()
        )
        self.optimizer = self.optimizer_class(
            params, lr=lr_schedule(1), **self.optimizer_kwargs
        )

    # ---------------------------------------------------------------------------------------------------------
    # SB3 plumbing
    # ---------------------------------------------------------------------------------------------------------

    @staticmethod
    def _check_spaces(
        observation_space: spaces.Space, action_space: spaces.Space
    ) -> None:
        if not isinstance(observation_space, spaces.Dict) or any(
            k not in observation_space.spaces for k in OBS_KEYS
        ):
            got = (
                sorted(observation_space.spaces)
                if isinstance(observation_space, spaces.Dict)
                else observation_space
            )
            raise ValueError(
                f"CausalLMPolicy needs a Dict observation space with keys {list(OBS_KEYS)} (right-aligned token "
                f"window and its mask); the env gives {got}"
            )
        if not isinstance(action_space, spaces.Discrete):
            raise ValueError(  # noqa: TRY004
                f"CausalLMPolicy needs a Discrete(len(tokenizer)) action space; the env gives {action_space}"
            )

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            {
                "lr_schedule": self._dummy_schedule,
                "model": self._spec,
                "dtype": self.dtype_name,
                "temperature": self.temperature,
                "top_k": self.top_k,
                "top_p": self.top_p,
                "separate_critic": self.separate_critic,
                "use_cache": self.use_cache,
                "gradient_checkpointing": self.gradient_checkpointing,
                "lora": self.lora,
                "autocast_dtype": self.autocast_dtype,
                "value_head_init_std": self.value_head_init_std,
                "ortho_init": self.ortho_init,
                "critic_hidden": self.critic_hidden,
                "optimizer_class": self.optimizer_class,
                "optimizer_kwargs": self.optimizer_kwargs,
            }
        )
        return data

    def train(self, mode: bool = True) -> CausalLMPolicy:
        """Set the module's mode; the LM and critic stay in eval mode (no dropout) in both modes.

        With gradient checkpointing, only the checkpointed decoder layers follow ``mode`` (their ``training`` flag
        switches checkpointing on); their attention / MLP submodules, which own the dropout, stay in eval mode.
        """
        super().train(mode)
        self.lm.eval()
        if self.separate_critic:
            self.critic.eval()
        if self.gradient_checkpointing and mode:
            from transformers.modeling_layers import GradientCheckpointingLayer

            for module in self.lm.modules():
                if (
                    isinstance(module, GradientCheckpointingLayer)
                    and module.gradient_checkpointing
                ):
                    module.training = True
        return self

    def set_training_mode(self, mode: bool) -> None:
        """SB3 hook: ``True`` before an update (drops the rollout cache), ``False`` before a rollout.

        :param mode: training mode flag.
        """
        if mode:
            self.reset_cache()
        self.train(mode)

    def reset_cache(self) -> None:
        """Drop every rollout KV cache (the next call recomputes all rows)."""
        self._caches.clear()

    def _param_version(self) -> int:
        # In-place updates (optimizer.step, load_state_dict, copy_) bump each tensor's version counter.
        params = self.__dict__.get("_param_list")
        if params is None or params[0] is not next(self.parameters()):
            params = self.__dict__["_param_list"] = list(self.parameters())
        return sum(p._version for p in params)

    def _parse_obs(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor]:
        if not isinstance(obs, dict) or any(k not in obs for k in OBS_KEYS):
            got = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            raise ValueError(
                f"CausalLMPolicy expects observations with keys {list(OBS_KEYS)}; got {got}"
            )
        ids = th.as_tensor(obs["input_ids"], device=self.device)
        mask = th.as_tensor(obs["attention_mask"], device=self.device)
        if ids.is_floating_point():
            ids = ids.round()
        if mask.is_floating_point():
            mask = mask.round()
        # copies: SB3's obs_as_tensor shares memory with the env's numpy arrays, which an env may reuse in place
        ids, mask = ids.to(th.long, copy=True), mask.to(th.long, copy=True)
        if ids.dim() == 1:
            ids, mask = ids.unsqueeze(0), mask.unsqueeze(0)
        # padding ids may be anything (even out of the LM's range): they are masked, so make them 0
        return ids.masked_fill(mask == 0, 0), mask

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
        """Final hidden states ``[B, L, d]`` of the LM body (after its final norm)."""
        with self._autocast_context():
            out = self.lm.base_model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=cache is not None,
            )
        return out.last_hidden_state

    def _autocast_context(self) -> Any:
        """``torch.autocast`` to ``autocast_dtype`` on the policy's device (a no-op context without it)."""
        if self._autocast is None:
            return contextlib.nullcontext()
        return th.autocast(device_type=self.device.type, dtype=self._autocast)

    def _logits(self, hidden: th.Tensor) -> th.Tensor:
        """Raw next-token logits over the env's ``V`` actions (float32)."""
        with self._autocast_context():
            logits = self.lm.get_output_embeddings()(hidden)
        cap = getattr(self.lm.config, "final_logit_softcapping", None)
        if cap:
            logits = th.tanh(logits / cap) * cap
        return logits[..., : self.n_actions].float()

    def _value(
        self, hidden_last: th.Tensor, ids: th.Tensor, mask: th.Tensor
    ) -> th.Tensor:
        """Values ``[B]`` of the states given by whole windows (``hidden_last``: trunk output at the last column)."""
        if self.separate_critic:
            return self.critic.values_per_position(ids, mask)[:, -1]
        return self.value_head(hidden_last.float()).squeeze(-1)

    def _processed(self, logits: th.Tensor) -> th.Tensor:
        return process_logits(logits, self.temperature, self.top_k, self.top_p)

    def _distribution(self, logits: th.Tensor) -> CategoricalDistribution:
        return self.action_dist.proba_distribution(
            action_logits=self._processed(logits)
        )

    @staticmethod
    def _trim(ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Drop leading columns that are padding in every row (exactly neutral: masked keys weigh 0)."""
        any_valid = mask.any(dim=0)
        start = (
            int(any_valid.nonzero()[0, 0])
            if bool(any_valid.any())
            else mask.shape[1] - 1
        )
        return ids[:, start:], mask[:, start:]

    def _full_outputs(
        self, ids: th.Tensor, mask: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor]:
        """Logits ``[B, V]`` and values ``[B]`` for whole windows, no cache (differentiable)."""
        ids, mask = self._trim(ids, mask)
        hidden = self._trunk(ids, mask, positions_from_mask(mask))[:, -1]
        return self._logits(hidden), self._value(hidden, ids, mask)

    def _outputs(self, ids: th.Tensor, mask: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        if self._caching():
            try:
                return self._cached_outputs(ids, mask)
            except _CacheUnsupported:
                self.reset_cache()
        return self._full_outputs(ids, mask)

    def _caching(self) -> bool:
        return self.use_cache and self._cache_supported and not th.is_grad_enabled()

    # ---------------------------------------------------------------------------------------------------------
    # Incremental decoding
    # ---------------------------------------------------------------------------------------------------------

    def _prefill(
        self, ids: th.Tensor, mask: th.Tensor
    ) -> tuple[Any, th.Tensor, th.Tensor, th.Tensor]:
        """Full forward of some rows, building their cache: ``(cache, kv_mask, logits, values)``."""
        from transformers import DynamicCache

        t_ids, t_mask = self._trim(ids, mask)
        cache = DynamicCache(config=self.lm.config)
        hidden = self._trunk(t_ids, t_mask, positions_from_mask(t_mask), cache=cache)[
            :, -1
        ]
        if not self._cache_layers_ok(cache):
            raise _CacheUnsupported
        return (
            cache,
            t_mask.clone(),
            self._logits(hidden),
            self._value(hidden, ids, mask),
        )

    def _cache_layers_ok(self, cache: Any) -> bool:
        from transformers.cache_utils import DynamicLayer

        ok = all(type(layer) is DynamicLayer for layer in cache.layers)
        if not ok:
            self._cache_supported = (
                False  # e.g. sliding-window layers: splicing/cropping would be wrong
            )
        return ok

    def _cached_outputs(
        self, ids: th.Tensor, mask: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor]:
        batch = ids.shape[0]
        version = self._param_version()
        state = self._caches.pop(batch, None)
        if state is not None and (
            state.version != version
            or state.ids.shape != ids.shape
            or state.ids.device != ids.device
        ):
            state = None
        if state is None or not bool(
            self._classify(state, ids, mask)[-1].logical_not().any()
        ):
            # nothing to reuse in this slot (e.g. a new batch size): try rows of the other cached batches
            served = self._serve_from_other_batches(ids, mask, version)
            if isinstance(served, tuple):
                return served
            if served is not None:
                state = served
        if state is None:
            state = self._new_state(ids, mask, version)
        else:
            self._advance(state, ids, mask)
        state.version = version
        self._crop(state)
        self._caches[batch] = state
        while len(self._caches) > 2:
            self._caches.popitem(last=False)
        return state.logits, state.values

    @staticmethod
    def _classify(
        state: _RowCache, ids: th.Tensor, mask: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """Per row: ``same`` (the cached window), ``extend`` (cached window + 1 token), ``replace`` (the window
        before the look-ahead + a token other than the look-ahead one), ``back`` (the window before the look-ahead
        itself), ``redo`` (anything else)."""
        same = (state.ids == ids).all(dim=1) & (state.mask == mask).all(dim=1)
        extend = extends_by_one(state.ids, state.mask, ids, mask) & ~same
        replace = back = th.zeros_like(same)
        if state.prev_ids is not None:
            replace = (
                extends_by_one(state.prev_ids, state.prev_mask, ids, mask)
                & ~same
                & ~extend
            )
            back = (
                (state.prev_ids == ids).all(dim=1)
                & (state.prev_mask == mask).all(dim=1)
                & ~same
            )
        return same, extend, replace, back, ~(same | extend | replace | back)

    def _new_state(self, ids: th.Tensor, mask: th.Tensor, version: int) -> _RowCache:
        cache, kv_mask, logits, values = self._prefill(ids, mask)
        return _RowCache(cache, kv_mask, ids, mask, logits, values, version)

    def _advance(self, state: _RowCache, ids: th.Tensor, mask: th.Tensor) -> None:
        """Bring every row of ``state`` to the new windows: reuse, one batched one-token step, and/or a prefill."""
        _same, extend, replace, back, redo = self._classify(state, ids, mask)
        logits, values = (
            state.logits.clone(),
            state.values.clone(),
        )  # rows in `same` keep theirs
        if bool(
            (replace | back).any()
        ):  # drop the look-ahead token of these rows: its column becomes a masked hole
            state.kv_mask = state.kv_mask.clone()
            state.kv_mask[replace | back, -1] = 0
            logits[back], values[back] = (
                state.prev_logits[back],
                state.prev_values[back],
            )
        step = extend | replace
        if bool(step.any()):
            # one single-token step for the whole batch; the other rows feed a masked dummy token
            new_tok = th.where(step, ids[:, -1], th.zeros_like(ids[:, -1])).unsqueeze(1)
            kv_mask = th.cat([state.kv_mask, step.long().unsqueeze(1)], dim=1)
            pos = (mask.sum(dim=1, keepdim=True) - 1).clamp(min=0)
            hidden = self._trunk(new_tok, kv_mask, pos, cache=state.cache)[:, -1]
            state.kv_mask = kv_mask
            logits[step] = self._logits(hidden[step])
            if self.separate_critic:
                values[step] = self.critic.values_per_position(ids[step], mask[step])[
                    :, -1
                ]
            else:
                values[step] = self.value_head(hidden[step].float()).squeeze(-1)
        if bool(redo.any()):
            rows = redo.nonzero().squeeze(1)
            cache_r, kv_mask_r, logits_r, values_r = self._prefill(
                ids[rows], mask[rows]
            )
            logits[rows], values[rows] = logits_r, values_r
            if bool(redo.all()):
                state.cache, state.kv_mask = cache_r, kv_mask_r
            else:
                self._splice(state, rows, cache_r, kv_mask_r)
        state.ids, state.mask, state.logits, state.values = ids, mask, logits, values
        state.prev_ids = state.prev_mask = state.prev_logits = state.prev_values = None

    def _look_ahead(self, ids: th.Tensor, mask: th.Tensor, actions: th.Tensor) -> None:
        """Extend the batch cache by the tokens just chosen, computing the *next* step's outputs now.

        In ``collect_rollouts`` the next observation of a continuing env is this window plus its action, and the
        terminal observation of a finished env is too; so the next ``forward`` finds those rows ``same`` and SB3's
        per-env ``predict_values(terminal_obs)`` bootstrap is a lookup instead of a batch-of-one forward. A row
        whose next window turns out different (an outside caller chose another token) masks the look-ahead column
        and takes a normal step; any other change is recomputed as usual.
        """
        state = self._caches.get(ids.shape[0])
        if state is None or state.ids is not ids or bool(mask[:, 0].any()):
            return  # not the state of this call, or a full window (the next one would drop a token)
        prev = (ids, mask, state.logits, state.values)
        next_ids = th.cat([ids[:, 1:], actions.reshape(-1, 1).long()], dim=1)
        next_mask = th.cat([mask[:, 1:], th.ones_like(mask[:, :1])], dim=1)
        self._advance(state, next_ids, next_mask)
        state.prev_ids, state.prev_mask, state.prev_logits, state.prev_values = prev

    def _serve_from_other_batches(
        self, ids: th.Tensor, mask: th.Tensor, version: int
    ) -> tuple[th.Tensor, th.Tensor] | _RowCache | None:
        """Serve a batch (typically of a new size) from rows of another cached batch, when every row matches one.

        SB3 bootstraps truncated episodes with ``predict_values(terminal_obs)``, one env at a time; each terminal
        window is a batch-cache row plus its action, i.e. a look-ahead row (returned as is: ``(logits, values)``)
        or one token past a cached row (its keys/values are copied into a new small cache and one single-token step
        does the rest). Returns ``None`` when some row matches no cached row.
        """
        from transformers import DynamicCache

        for other in reversed(list(self._caches.values())):
            if (
                other.version != version
                or other.ids.shape[1] != ids.shape[1]
                or other.ids.device != ids.device
            ):
                continue
            same = (ids[:, None] == other.ids[None]).all(-1) & (
                mask[:, None] == other.mask[None]
            ).all(-1)
            if bool(same.any(dim=1).all()):
                src = same.float().argmax(dim=1)
                return other.logits[src], other.values[src]
            ext = self._extends_matrix(other.ids, other.mask, ids, mask)
            rep = (
                self._extends_matrix(other.prev_ids, other.prev_mask, ids, mask)
                if other.prev_ids is not None
                else th.zeros_like(ext)
            )
            ok = same | ext | rep  # [B_new, B_cached]
            if not bool(ok.any(dim=1).all()):
                continue
            src = ok.float().argmax(dim=1)
            rows = th.arange(ids.shape[0], device=ids.device)
            from_prev = ~(same | ext)[
                rows, src
            ]  # served from the window before the look-ahead
            kv_mask = other.kv_mask[src].clone()
            kv_mask[from_prev, -1] = 0  # the look-ahead token is not part of these rows
            c_ids, c_mask = other.ids[src].clone(), other.mask[src].clone()
            if bool(from_prev.any()):
                c_ids[from_prev], c_mask[from_prev] = (
                    other.prev_ids[src][from_prev],
                    other.prev_mask[src][from_prev],
                )
            cache = DynamicCache()
            for i, layer in enumerate(other.cache.layers):
                cache.update(layer.keys[src], layer.values[src], i)
            return _RowCache(
                cache,
                kv_mask,
                c_ids,
                c_mask,
                other.logits[src],
                other.values[src],
                version,
            )
        return None

    @staticmethod
    def _extends_matrix(
        old_ids: th.Tensor, old_mask: th.Tensor, ids: th.Tensor, mask: th.Tensor
    ) -> th.Tensor:
        """``[B_new, B_old]``: new row ``i`` extends old row ``j`` by one token (see :func:`extends_by_one`)."""
        return (
            (ids[:, None, :-1] == old_ids[None, :, 1:]).all(-1)
            & (mask[:, None, :-1] == old_mask[None, :, 1:]).all(-1)
            & (mask[:, None, -1] == 1)
            & (old_mask[None, :, 0] == 0)
        )

    @staticmethod
    def _splice(
        state: _RowCache, rows: th.Tensor, cache_r: Any, kv_mask_r: th.Tensor
    ) -> None:
        """Write recomputed rows into the batch cache, left-padding whichever is shorter with masked slots."""
        length = max(state.kv_mask.shape[1], kv_mask_r.shape[1])
        kv_mask = left_pad_columns(state.kv_mask, length, dim=1)
        kv_mask[rows] = left_pad_columns(kv_mask_r, length, dim=1)
        state.kv_mask = kv_mask
        for layer, layer_r in zip(state.cache.layers, cache_r.layers, strict=True):
            keys = left_pad_columns(layer.keys, length)
            vals = left_pad_columns(layer.values, length)
            keys[rows] = left_pad_columns(layer_r.keys, length)
            vals[rows] = left_pad_columns(layer_r.values, length)
            layer.keys, layer.values = keys, vals

    @staticmethod
    def _crop(state: _RowCache) -> None:
        """Remove leading cache columns masked for every row, so the cache stays within the window width."""
        any_valid = state.kv_mask.any(dim=0)
        if not bool(any_valid.any()):
            return
        start = int(any_valid.nonzero()[0, 0])
        if start == 0:
            return
        state.kv_mask = state.kv_mask[:, start:]
        for layer in state.cache.layers:
            layer.keys = layer.keys[..., start:, :]
            layer.values = layer.values[..., start:, :]

    # ---------------------------------------------------------------------------------------------------------
    # The SB3 policy API
    # ---------------------------------------------------------------------------------------------------------

    def forward(
        self, obs: PyTorchObs, deterministic: bool = False
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Sample (or pick the mode of) the next token; uses the rollout cache under ``no_grad``.

        :param obs: dict observation (``input_ids``, ``attention_mask``), batched.
        :param deterministic: take the most likely token instead of sampling.
        :return: actions ``[B]``, values ``[B, 1]``, log-probs ``[B]`` of the processed distribution.
        """
        ids, mask = self._parse_obs(obs)
        logits, values = self._outputs(ids, mask)
        dist = self._distribution(logits)
        actions = dist.get_actions(deterministic=deterministic)
        log_prob = dist.log_prob(actions)
        if self._caching():
            self._look_ahead(ids, mask, actions)
        return actions, values.unsqueeze(-1), log_prob

    def evaluate_actions(
        self, obs: PyTorchObs, actions: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Values, log-probs and entropies for given transitions: full recompute, never the cache.

        :param obs: dict observation, batched (floats from the rollout buffer are fine).
        :param actions: token ids ``[B]`` or ``[B, 1]``.
        :return: values ``[B, 1]``, log-probs ``[B]``, entropies ``[B]``.
        """
        ids, mask = self._parse_obs(obs)
        logits, values = self._full_outputs(ids, mask)
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

    def _predict(
        self, observation: PyTorchObs, deterministic: bool = False
    ) -> th.Tensor:
        return self.forward(observation, deterministic=deterministic)[0]

    # ---------------------------------------------------------------------------------------------------------
    # Whole sequences (the fast update path)
    # ---------------------------------------------------------------------------------------------------------

    def evaluate_sequences(
        self, input_ids: th.Tensor, attention_mask: th.Tensor, action_mask: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Every generated token's log-prob, entropy and value in one forward per sequence.

        For each ``(b, j)`` with ``action_mask[b, j]`` true, token ``input_ids[b, j]`` was generated as an action:
        ``log_prob[b, j] = log pi(input_ids[b, j] | tokens < j)`` from the logits at ``j - 1`` after the same
        temperature / top-k / top-p processing as rollout; ``entropy[b, j]`` is that distribution's entropy;
        ``values[b, j]`` is the value of the state whose last token is ``j - 1``. Zero elsewhere. Inputs are
        right-aligned windows (the episode's final window), with the same position-id rule as everywhere else.

        :param input_ids: ``[B, L]`` token ids (any numeric dtype).
        :param attention_mask: ``[B, L]`` mask.
        :param action_mask: ``[B, L]`` bool-like, true where the token was an action (never at column 0).
        :return: ``(log_prob, entropy, values)``, each ``[B, L]`` float32.
        """
        ids, mask = self._parse_obs(
            {"input_ids": input_ids, "attention_mask": attention_mask}
        )
        act = th.as_tensor(action_mask, device=ids.device).bool()
        if act.dim() == 1:
            act = act.unsqueeze(0)
        if bool(act[:, 0].any()):
            raise ValueError(
                "action_mask[:, 0] is set, but an action needs at least one token before it"
            )
        batch, length = ids.shape
        any_valid = mask.any(dim=0)
        start = int(any_valid.nonzero()[0, 0]) if bool(any_valid.any()) else length - 1
        t_ids, t_mask = ids[:, start:], mask[:, start:]
        hidden = self._trunk(
            t_ids, t_mask, positions_from_mask(t_mask)
        )  # [B, L - start, d]

        b_idx, j_idx = act.nonzero(
            as_tuple=True
        )  # positions of actions (in full coordinates)
        state_h = hidden[
            b_idx, j_idx - 1 - start
        ]  # hidden state of the state whose last token is j - 1
        dist = self._distribution(self._logits(state_h))
        zeros = th.zeros(batch, length, device=ids.device)
        log_prob = zeros.index_put((b_idx, j_idx), dist.log_prob(ids[b_idx, j_idx]))
        entropy = zeros.index_put((b_idx, j_idx), dist.entropy())
        if self.separate_critic:
            v_all = self.critic.values_per_position(ids, mask)
            v = v_all[b_idx, j_idx - 1]
        else:
            v = self.value_head(state_h.float()).squeeze(-1)
        values = zeros.index_put((b_idx, j_idx), v)
        return log_prob, entropy, values

    # ---------------------------------------------------------------------------------------------------------
    # The KL reference of a LoRA policy: the same LM with its adapters switched off
    # ---------------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def adapters_disabled(self):
        """Context in which the LM runs without its LoRA adapters (the base model); needs ``lora``."""
        peft_model = self.__dict__.get("_peft_model")
        if peft_model is None:
            raise ValueError(
                "adapters_disabled() needs a LoRA policy; pass policy_kwargs={'lora': {...}} to CausalLMPolicy"
            )
        with peft_model.disable_adapter():
            yield

    @property
    def reference_evaluate_actions(self):
        """``evaluate_actions`` of the base model (adapters off); defined only with ``lora``.

        ``GRPO(kl_coef > 0)`` uses it as the KL reference instead of a frozen copy of the policy. Without ``lora``
        the attribute does not exist (``hasattr`` is False), so GRPO keeps its frozen copy.
        """
        if self.__dict__.get("_peft_model") is None:
            raise AttributeError("reference_evaluate_actions exists only for a LoRA policy (policy_kwargs['lora'])")
        return self._reference_evaluate_actions

    @property
    def reference_evaluate_sequences(self):
        """``evaluate_sequences`` of the base model (adapters off); defined only with ``lora``."""
        if self.__dict__.get("_peft_model") is None:
            raise AttributeError("reference_evaluate_sequences exists only for a LoRA policy (policy_kwargs['lora'])")
        return self._reference_evaluate_sequences

    def _reference_evaluate_actions(
        self, obs: PyTorchObs, actions: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        with self.adapters_disabled():
            return self.evaluate_actions(obs, actions)

    def _reference_evaluate_sequences(
        self, input_ids: th.Tensor, attention_mask: th.Tensor, action_mask: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        with self.adapters_disabled():
            return self.evaluate_sequences(input_ids, attention_mask, action_mask)
