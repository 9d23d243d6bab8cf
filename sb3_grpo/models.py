"""Loading and describing the Hugging Face causal LM behind :class:`~sb3_grpo.policies.CausalLMPolicy`.

:func:`model_spec` is the JSON-able description SB3 saves instead of the model object; ``_load_lm`` builds the LM
from a local path, a ``PreTrainedModel``, a spec or ``None`` (the bundled LM); ``_make_portable`` swaps a model
object in the calling algorithm's ``policy_kwargs`` for its spec. The optional LoRA adapters (``peft``) are
described by :func:`lora_spec` and injected by ``_apply_lora``; ``_autocast_dtype`` validates the mixed-precision
setting. ``sb3_grpo.policies`` re-exports the public names.
"""

from __future__ import annotations

import enum
import json
import os
import sys
from typing import Any

import torch as th
from torch import nn

__all__ = ["AUTOCAST_DTYPES", "LORA_INSTALL_HINT", "lora_spec", "model_spec"]


def model_spec(lm: nn.Module) -> dict[str, Any]:
    """A JSON-serialisable description of a Hugging Face model: its full config, no weights.

    SB3 stores this instead of the model object; the weights come back from the state dict SB3 saves.

    :param lm: a ``PreTrainedModel``.
    :return: ``{"config": dict, "name_or_path": str}``.
    """
    return {
        "config": json.loads(lm.config.to_json_string(use_diff=False)),
        "name_or_path": str(getattr(lm.config, "_name_or_path", "") or getattr(lm, "name_or_path", "")),
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
            raise ValueError(f"model dict must be a model_spec with a 'config' key, got keys {sorted(model)}")
        cfg = dict(model["config"])
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        dtype = dtype or _as_dtype(cfg.get("dtype") or cfg.get("torch_dtype"))  # the saved model's own dtype
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
        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)
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
        if isinstance(algo, BaseAlgorithm) and isinstance(getattr(algo, "policy_kwargs", None), dict):
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
