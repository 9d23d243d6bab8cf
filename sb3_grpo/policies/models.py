"""Loading and describing the Hugging Face causal LM behind :class:`~sb3_grpo.policies.CausalLMPolicy`.

:func:`model_spec` is the JSON-able description SB3 saves instead of the model object; :func:`load_lm` builds the
LM from a local path, a Hugging Face Hub id (downloaded, or read from the local Hugging Face cache with
``HF_HUB_OFFLINE=1``), a ``PreTrainedModel``, a spec, a :class:`PortableModel` or ``None`` (the bundled LM);
:func:`export_pretrained` writes a trained policy's LM back out as a Hugging Face model directory.
:class:`PortableModel` is the spec that carries its live model: what to pass a stock SB3 algorithm so that its
saved ``policy_kwargs`` stay plain JSON (``GRPO`` makes the swap itself). The optional LoRA adapters (``peft``)
are described by :func:`lora_spec` and injected by :func:`apply_lora`; :func:`check_autocast_dtype` validates the
mixed-precision setting. ``sb3_grpo.policies`` re-exports the public names.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import torch as th
from stable_baselines3.common.type_aliases import PyTorchObs
from torch import nn

from sb3_grpo.file_io import to_jsonable
from textrl_envs.gguf import gguf_folder, gguf_name, gguf_revision, is_gguf_name
from textrl_envs.hf_loading import cached_commit, load_from_hub, looks_like_hub_id, no_progress_bars

__all__ = [
    "AUTOCAST_DTYPES",
    "BASE_WEIGHTS",
    "LORA_INSTALL_HINT",
    "LoRAReferenceMixin",
    "PortableModel",
    "portable_policy_kwargs",
    "apply_lora",
    "as_dtype",
    "base_fingerprint",
    "base_missing_message",
    "check_autocast_dtype",
    "export_pretrained",
    "load_lm",
    "lora_spec",
    "model_spec",
    "reloadable_base",
]

#: The value of a :func:`model_spec`'s ``"weights"`` key when the LM's weights are not in the checkpoint but those
#: of the model named by its ``"name_or_path"`` (at its ``"revision"``): a LoRA policy's spec, whose checkpoint keeps
#: the adapters and the value head only.
BASE_WEIGHTS = "name_or_path"


def model_spec(lm: nn.Module, revision: str | None = None) -> dict[str, Any]:
    """A JSON-serialisable description of a Hugging Face model: its full config, no weights.

    SB3 stores this instead of the model object; the weights come back from the state dict SB3 saves.

    :param lm: a ``PreTrainedModel``.
    :param revision: the Hub revision it was loaded at (``None``: ``main``).
    :return: ``{"config": dict, "name_or_path": str}``, plus ``"revision"`` for a model loaded by Hub id: the commit
        hash the Hugging Face cache resolved ``revision`` to (``revision`` itself where the cache does not say); and for
        a model loaded from a GGUF file (a ``.gguf`` path or a packaged model's name): ``"sha256:<hex>"``, the file's
        checksum.
    """
    spec: dict[str, Any] = {
        "config": json.loads(lm.config.to_json_string(use_diff=False)),
        "name_or_path": str(getattr(lm.config, "_name_or_path", "") or getattr(lm, "name_or_path", "")),
    }
    name = spec["name_or_path"]
    if is_gguf_name(name):
        with contextlib.suppress(OSError):  # a file gone since the load keeps the revision it was given
            revision = gguf_revision(name)
    elif name and not os.path.isdir(name) and looks_like_hub_id(name):
        revision = cached_commit(name, revision) or revision  # the exact commit, where the cache knows it
    if revision:
        spec["revision"] = str(revision)
    return spec


class PortableModel(dict):
    """A :func:`model_spec` (config, no weights) that carries the live model it describes.

    Pass it where a stock SB3 algorithm takes ``policy_kwargs`` so that the saved model stays portable::

        PPO(CausalLMPolicy, env, policy_kwargs={"model": PortableModel.of(lm)})

    The policy uses the carried model in place (not a copy). SB3 saves ``policy_kwargs`` as JSON where it can, and
    this is a ``dict`` holding the spec, so the saved file holds the model's config; loading builds the model from
    it and the weights come from the saved state dict, with no model directory needed. Pickles and copies carry the
    spec only. ``GRPO`` makes this swap itself for a model object given in ``policy_kwargs``.
    """

    model: nn.Module | None = None

    @classmethod
    def of(cls, lm: nn.Module) -> PortableModel:
        """The portable spec of ``lm``, carrying ``lm``.

        :param lm: a ``PreTrainedModel``.
        """
        portable = cls(model_spec(lm))
        portable.model = lm
        return portable

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


def portable_policy_kwargs(
    policy_kwargs: Any, lm_spec: dict[str, Any] | None, quantization: dict[str, Any] | None = None
) -> Any:
    """``policy_kwargs`` with a model *object* in ``"model"`` replaced by ``lm_spec`` (a new dict; the given one is left
    alone), so that SB3 saves JSON rather than a pickled Hugging Face model; and likewise a Hub id, so that loading the
    saved model needs neither the network nor the Hugging Face cache (the spec records the id and its revision; the
    weights are in the saved state dict, except a LoRA model's base weights, which load by the id). Local paths, specs
    and ``None`` stay as they are. A ``quantization`` given as an object (a ``BitsAndBytesConfig``) becomes its
    JSON spec.

    :param policy_kwargs: An algorithm's ``policy_kwargs``.
    :param lm_spec: The built policy's :func:`model_spec` (``None``: not an LM policy, nothing changes).
    :param quantization: The built policy's quantization spec (``None``: none).
    """
    if isinstance(policy_kwargs, dict) and quantization is not None:
        if not isinstance(policy_kwargs.get("quantization"), str):
            policy_kwargs = {**policy_kwargs, "quantization": quantization}
    model = policy_kwargs.get("model") if isinstance(policy_kwargs, dict) else None
    if model is None or lm_spec is None or isinstance(model, dict):
        return policy_kwargs
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if os.path.isdir(path) or is_gguf_name(path) or not looks_like_hub_id(path):
            return policy_kwargs
    return {**policy_kwargs, "model": lm_spec}


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


def as_dtype(dtype: th.dtype | str | None) -> th.dtype | None:
    if dtype is None or isinstance(dtype, th.dtype):
        return dtype
    if dtype == "auto":
        return None
    name = str(dtype).replace("torch.", "")
    value = getattr(th, name, None)
    if not isinstance(value, th.dtype):
        raise ValueError(  # a bad dtype argument is a bad value, whatever its type
            f"dtype {dtype!r} is not a torch dtype; use e.g. 'float32', 'bfloat16' or th.float16"
        )
    return value


def load_lm(
    model: Any, dtype: th.dtype | None, revision: str | None = None, quantization: dict[str, Any] | None = None
) -> nn.Module:
    """Build the causal LM from a local path, a Hub id, a model instance, a :func:`model_spec` dict, or ``None``.

    A string that names no local directory but has a Hub id's shape (``"org/name"``) loads as
    ``AutoModelForCausalLM.from_pretrained`` loads it: downloaded online, from the Hugging Face cache with
    ``HF_HUB_OFFLINE=1``, at ``revision`` (a branch, tag or commit; ``None``: ``main``). A ``.gguf`` path or a packaged
    model's name (:data:`textrl_envs.gguf.PACKAGED_MODELS`) loads the dequantized model from its converted folder
    (:func:`textrl_envs.gguf.gguf_folder`, converted on first use), in ``dtype`` (``None``: float32); its ``revision``,
    when given, is the ``"sha256:<hex>"`` of the file it must be. A spec whose ``"weights"`` is
    :data:`BASE_WEIGHTS` loads the model its ``"name_or_path"`` names, at its ``"revision"`` (a LoRA checkpoint's
    base); any other spec builds the model from its config, with random weights (the checkpoint's state dict then
    holds them). ``quantization`` (a :func:`~sb3_grpo.policies.quantization.quantization_spec`) loads a path or Hub id
    with bitsandbytes quantized weights, on :func:`~sb3_grpo.policies.quantization.quantized_device`.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

    if model is None:
        model = _default_model_path()
    if isinstance(model, PortableModel) and model.model is not None:
        model = model.model
    if isinstance(model, PreTrainedModel):
        if quantization is not None and not is_quantized(model):
            raise ValueError(
                "policy_kwargs['quantization'] is applied while the weights load, but the model was given as an "
                "object; pass its local directory or Hub id as policy_kwargs['model'], or a model already loaded "
                "with from_pretrained(..., quantization_config=BitsAndBytesConfig(...)) without 'quantization'"
            )
        return model.to(dtype) if dtype is not None and not is_quantized(model) else model
    if isinstance(model, dict):
        if "config" not in model:
            raise ValueError(f"model dict must be a model_spec with a 'config' key, got keys {sorted(model)}")
        cfg = dict(model["config"])
        dtype = dtype or as_dtype(cfg.get("dtype") or cfg.get("torch_dtype"))  # the saved model's own dtype
        if model.get("weights") == BASE_WEIGHTS:
            return _load_base(model, dtype, revision or model.get("revision"), quantization)
        if quantization is not None:
            raise ValueError(
                "policy_kwargs['quantization'] needs pretrained weights to quantize, but the model was given as a "
                "config-only model_spec; pass the model's local directory or Hub id as policy_kwargs['model']"
            )
        cfg.pop("quantization_config", None)
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        kwargs = {"dtype": dtype} if dtype is not None else {}
        return AutoModelForCausalLM.from_config(config, **kwargs)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        kwargs: dict[str, Any] = {"dtype": dtype} if dtype is not None else {}
        if quantization is not None:
            from sb3_grpo.policies.quantization import bnb_config, quantized_device

            kwargs.update(quantization_config=bnb_config(quantization), device_map={"": quantized_device()})
        if is_gguf_name(path):
            return _load_gguf(path, revision, kwargs)
        if not os.path.isdir(path) and looks_like_hub_id(path):
            return load_from_hub(AutoModelForCausalLM.from_pretrained, path, "CausalLMPolicy model", revision, **kwargs)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"CausalLMPolicy model directory {path!r} does not exist (or is not a directory); pass an existing "
                "local model directory, a Hugging Face Hub id such as 'org/name', a PreTrainedModel, or a model_spec "
                "dict (config only; weights then come from the SB3 checkpoint)"
            )
        try:
            with no_progress_bars():
                return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)
        except Exception as err:  # noqa: BLE001  (safetensors, torch and transformers raise many kinds; name the folder)
            files = ", ".join(
                f"{p.name} ({p.stat().st_size:,} bytes)" for p in sorted(Path(path).iterdir()) if p.is_file()
            )
            raise ValueError(
                f"CausalLMPolicy could not load the model in {path!r} ({type(err).__name__}: {err}); its files: "
                f"{files or 'none'}. A weights file may be truncated or corrupt (an interrupted copy or download): "
                "copy the folder again, or write it with model.save_pretrained(folder)"
            ) from err
    raise TypeError(
        "model must be None, a local path, a Hub id, a transformers PreTrainedModel or a model_spec dict; got "
        f"{type(model)}"
    )


def _load_gguf(name: str, revision: str | None, kwargs: dict[str, Any]) -> nn.Module:
    """The LM of a GGUF file or packaged model, from its converted folder, named by ``name`` (so that a spec or a LoRA
    checkpoint records the file, not the cache folder); refused when ``revision`` names another file's checksum."""
    from transformers import AutoModelForCausalLM

    if revision is not None and revision != gguf_revision(name):
        raise ValueError(
            f"the GGUF model {name!r} is now the file with {gguf_revision(name)}, but {revision} was asked for (the "
            "file the checkpoint was trained on): the file changed since. Put the original file back, or pass its "
            "path as base_model"
        )
    folder = gguf_folder(name)
    with no_progress_bars():
        lm = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, **kwargs)
    lm.config._name_or_path = gguf_name(name)
    return lm


def is_quantized(lm: nn.Module) -> bool:
    """Whether ``lm`` holds bitsandbytes-quantized (8-bit or 4-bit) weights."""
    return bool(getattr(lm, "is_loaded_in_8bit", False) or getattr(lm, "is_loaded_in_4bit", False))


def reloadable_base(name: str) -> bool:
    """Whether a model's ``name_or_path`` can be loaded again by that name: an existing local directory, a GGUF file
    or packaged model's name, or a string with a Hugging Face Hub id's shape (the Hub or its local cache is asked when
    it is loaded)."""
    return bool(name) and (os.path.isdir(name) or is_gguf_name(name) or looks_like_hub_id(name))


def adapters_only_checkpoint(model: Any, name_or_path: str) -> bool:
    """Whether a LoRA policy built from ``model`` (its ``policy_kwargs["model"]``) saves its adapters without the base
    weights: when the base loads again by its ``name_or_path`` (:func:`reloadable_base`) and what is saved in place
    of the model says to load it so: a path or Hub id, a model object (``GRPO`` saves its :func:`model_spec`), or a
    spec with ``"weights": BASE_WEIGHTS``. A config-only spec or a :class:`PortableModel` (whose saved spec builds
    random weights) keeps the base weights in the checkpoint."""
    if isinstance(model, dict) and model.get("weights") != BASE_WEIGHTS:
        return False
    return reloadable_base(name_or_path)


def base_missing_message(name: str, revision: str | None, cause: BaseException | None = None) -> str:
    """What to say when a LoRA checkpoint's base model cannot be loaded: which base, why, and the ways out."""
    at = "" if revision is None else f" at revision {revision!r}"
    why = "" if cause is None else f" ({type(cause).__name__}: {cause})"
    if is_gguf_name(name):
        where = f"make the GGUF model {name!r} loadable again (the file, or the package that ships it)"
    elif os.path.isabs(name) or not looks_like_hub_id(name):
        where = f"put the base model's directory back at {name!r}"
    else:
        flag = "" if revision is None else f" --revision {revision}"
        where = (
            f"make the Hub model {name!r}{at} available (online, or fetched once into the Hugging Face cache with "
            f"`hf download {name}{flag}`; HF_HUB_OFFLINE=1 reads only the cache)"
        )
    return (
        f"this LoRA checkpoint holds the adapters and the value head only, not its base model, which it names: "
        f"{name!r}{at}; that base could not be loaded{why}. To load the checkpoint, {where}, or pass where the same "
        "base model is now: GRPO.load(path, base_model='<directory or Hub id>')"
    )


def _load_base(spec: dict[str, Any], dtype: th.dtype | None, revision: str | None, quantization: Any) -> nn.Module:
    """The base model a LoRA spec names (``"weights": BASE_WEIGHTS``), or an error that names it and what to do."""
    name = str(spec.get("name_or_path") or "")
    if not reloadable_base(name):
        raise FileNotFoundError(base_missing_message(name, revision))
    try:
        return load_lm(name, dtype, revision, quantization)  # (a local directory has no revisions: ignored there)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(base_missing_message(name, revision, err)) from err


def base_fingerprint(tensors: list[th.Tensor]) -> th.Tensor:
    """A cheap fingerprint of a model's frozen base weights: per tensor, the float64 sum of all its entries and of
    every 97th (``[n, 2]``, on the CPU). A LoRA checkpoint stores it beside the adapters; on load it tells whether
    the base rebuilt from its name is the one the adapters were trained on (another revision, a changed folder)."""
    rows = []
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        rows.append(th.stack([flat.sum(dtype=th.float64), flat[::97].sum(dtype=th.float64)]).cpu())
    return th.stack(rows) if rows else th.zeros(0, 2, dtype=th.float64)


def export_pretrained(policy: Any, path: str | os.PathLike, merge_lora: bool = True) -> str:
    """Write ``policy``'s LM (a :class:`~sb3_grpo.policies.CausalLMPolicy`) as a Hugging Face model directory.

    ``transformers.AutoModelForCausalLM.from_pretrained(path)`` loads it, and its logits are the policy's LM
    logits (the value head, the sampling settings and the optimizer are not part of it). A LoRA policy writes its
    adapters merged into the base weights (``merge_lora=True``: a plain model, the policy itself left as it was) or
    as a peft adapter directory (``merge_lora=False``: ``adapter_config.json`` and the adapter weights, whose base is
    the model the policy was built from, by its name or path; peft loads it, and ``transformers`` does when peft is
    installed). Without LoRA ``merge_lora`` does nothing.

    :param policy: The trained policy.
    :param path: The directory to write (created if missing).
    :param merge_lora: LoRA only: merge the adapters into the weights (``True``) or keep them as an adapter.
    :return: ``path`` as a string.
    """
    import copy

    out = os.fspath(path)
    peft_model = policy.__dict__.get("_peft_model")
    if peft_model is None:
        policy.lm.save_pretrained(out)
        return out
    if not merge_lora:
        base = str(getattr(peft_model.peft_config["default"], "base_model_name_or_path", "") or "")
        if not base:
            raise ValueError(
                "export_pretrained(merge_lora=False) writes the LoRA adapters only, but the policy's base model has "
                "no name or path to load it from (it was built from a config or an object); use merge_lora=True "
                "for a self-contained model directory"
            )
        peft_model.save_pretrained(out)
        return out
    merged = copy.deepcopy(peft_model).merge_and_unload()  # a copy: the policy keeps its adapters
    merged.save_pretrained(out)
    return out


# --------------------------------------------------------------------------------------------------------------
# LoRA (peft, optional) and mixed precision
# --------------------------------------------------------------------------------------------------------------

LORA_INSTALL_HINT = 'pip install "textrl[lora]"  (or: pip install peft)'


def import_peft() -> Any:
    """peft, imported quietly: its import of bitsandbytes, where installed, reports optional CPU kernels missing
    from the cache even without quantization (:func:`~sb3_grpo.policies.quantization.quiet_bnb_import`)."""
    from sb3_grpo.policies.quantization import quiet_bnb_import

    try:
        with quiet_bnb_import():
            import peft
    except ImportError as err:
        raise ImportError(
            f"CausalLMPolicy(lora=...) needs the optional dependency peft, which is not installed ({err}); "
            f"install it with: {LORA_INSTALL_HINT}; or drop policy_kwargs['lora'] to train the full model"
        ) from err
    return peft


def lora_spec(lora: Any) -> dict[str, Any]:
    """The JSON-able spec of a LoRA configuration: the ``peft.LoraConfig`` fields that differ from their defaults.

    This is what ``CausalLMPolicy`` stores (and SB3 saves) instead of a pickled peft object; ``LoraConfig(**spec)``
    rebuilds the configuration. Sets become sorted lists and enums their values.

    :param lora: a ``peft.LoraConfig``, or a dict of its keyword arguments (e.g. ``{"r": 8, "lora_alpha": 16}``).
    :return: the spec (a plain dict of JSON types).
    """
    peft = import_peft()
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
    defaults = to_jsonable(peft.LoraConfig().to_dict())
    given = to_jsonable(config.to_dict())
    skip = {"peft_type", "peft_version"}
    return {k: v for k, v in given.items() if k not in skip and defaults.get(k, object()) != v}


def apply_lora(lm: nn.Module, spec: dict[str, Any]) -> Any:
    """Inject LoRA adapters into ``lm`` in place (its other weights are frozen); returns the ``PeftModel``."""
    import warnings

    peft = import_peft()
    try:
        with warnings.catch_warnings():
            # peft reads a quantized model's `is_gradient_checkpointing`, which transformers 5 renamed (peft's call)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return peft.get_peft_model(lm, peft.LoraConfig(**spec))
    except ValueError as err:
        raise ValueError(
            f"peft could not add LoRA adapters to this {type(lm).__name__} ({err}); name the layers to adapt, "
            "e.g. policy_kwargs['lora'] = {'r': 8, 'target_modules': ['q_proj', 'v_proj']} (module names from "
            "model.named_modules())"
        ) from err


AUTOCAST_DTYPES = ("bfloat16", "float16")


def check_autocast_dtype(value: th.dtype | str | None) -> th.dtype | None:
    dtype = as_dtype(value)
    if dtype is not None and dtype not in (th.bfloat16, th.float16):
        raise ValueError(
            f"autocast_dtype={value!r} is not supported; use one of {', '.join(AUTOCAST_DTYPES)} (mixed precision) "
            "or None (no autocast; to run the whole model in a lower precision use dtype=...)"
        )
    return dtype


class LoRAReferenceMixin:
    """The KL reference of a LoRA policy: the same LM with its adapters switched off (peft's ``disable_adapter()``).

    For a policy that keeps its ``PeftModel`` wrapper in ``self.__dict__["_peft_model"]`` (unregistered) and has
    ``evaluate_actions`` / ``evaluate_sequences``. ``GRPO(kl_coef > 0)`` uses ``reference_evaluate_actions`` /
    ``reference_evaluate_sequences`` instead of a frozen copy of the policy; without LoRA they do not exist
    (``hasattr`` is False).
    """

    @contextlib.contextmanager
    def adapters_disabled(self):
        """Context in which the LM runs without its LoRA adapters (the base model); needs ``lora``."""
        peft_model = self.__dict__.get("_peft_model")
        if peft_model is None:
            raise ValueError(
                "adapters_disabled() needs a LoRA policy; pass policy_kwargs={'lora': {...}} to CausalLMPolicy"
            )
        self.__dict__["_adapters_off"] = True  # a mixture of LoRA experts runs the base once, not once per expert
        try:
            with peft_model.disable_adapter():
                yield
        finally:
            self.__dict__["_adapters_off"] = False
            restore = getattr(self, "_activate_expert", None)
            if restore is not None and self.__dict__.get("_expert_layers") is not None:
                restore("default")  # peft re-enabling the adapters leaves only the active one trainable

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
