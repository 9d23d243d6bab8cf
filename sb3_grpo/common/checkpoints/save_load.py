"""Saving and loading the package's algorithms: :class:`CheckpointMixin`, SB3's ``save`` / ``load`` with what they add.

- ``save`` writes atomically (a crash never leaves a torn file at the path), only on rank 0 under
  ``torch.distributed`` (under FSDP after gathering the full state), and stores ``rollout_buffer_class`` as the user
  gave it, so SB3's stock ``PPO`` can load the file; a ``.safetensors`` path is written in the format that cannot run
  code (:mod:`.safetensors_format`).
- ``load`` refuses a missing path or an incomplete file with a clear error, runs no code from the file unless it is
  trusted (:mod:`.safe_loading`), checks the arguments it sets as the constructor does, loads on the CPU when CUDA is
  absent (as SB3 does), and finds a LoRA checkpoint's base model at a new place (``base_model=``) or rebuilds a model
  whose folder has moved from the config saved with it.
- ``set_parameters`` loads parameters saved without a KL reference into a model that has one.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch as th
from stable_baselines3.common.base_class import maybe_make_env
from stable_baselines3.common.type_aliases import GymEnv

from sb3_grpo.common.checkpoints.files import existing_checkpoint
from sb3_grpo.common.checkpoints.safe_loading import checkpoint_source
from sb3_grpo.common.checkpoints.safetensors_format import is_safetensors_path, save_safetensors
from sb3_grpo.file_io import atomic_write, is_atomic_temp
from sb3_grpo.policies.models import BASE_WEIGHTS, base_missing_message, portable_policy_kwargs
from textrl_envs.gguf import gguf_available

__all__ = ["CheckpointMixin", "available_device", "moved_model_folder", "relocated_base"]

SelfCheckpointed = TypeVar("SelfCheckpointed", bound="CheckpointMixin")


class CheckpointMixin:
    """What :class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm` adds to SB3's saving and loading (see the
    module), mixed in before SB3's ``OnPolicyAlgorithm``. It reads the algorithm's data-parallel seam
    (``_data_parallel``), its KL reference (``ref_policy``), its rollout engine (``_rollout_engine``) and what its
    advantage tracker keeps (``_group_tracker_state()``)."""

    def save(
        self,
        path: str | os.PathLike | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
    ) -> None:
        """SB3's ``save`` (same signature), written atomically: to a temporary file in the same folder, flushed to
        disk, then renamed over ``path`` (:func:`~sb3_grpo.file_io.atomic_write`), so a save that fails (a full disk,
        Ctrl-C, a killed process) leaves the previous file at ``path`` intact. As in SB3, ``.zip`` is appended to a
        name without a suffix; a file object is written directly. Under ``torch.distributed`` only rank 0 writes (the
        weights are the same everywhere; under ``data_parallel="fsdp"`` every rank must call it: the full state is
        gathered to rank 0 first). ``rollout_buffer_class`` is saved as given (``None`` when the algorithm chose it),
        so SB3's stock ``PPO`` can load the file and train on. A path ending in ``.safetensors`` is written in the
        format that cannot run code when loaded (:mod:`sb3_grpo.common.checkpoints.safetensors_format`).

        :param path: The file (or a writable binary file object).
        :param exclude: Names of parameters not to save (SB3's).
        :param include: Names of parameters to save that are excluded by default (SB3's).
        :raises ValueError: for an empty path or a folder.
        :raises OSError: naming ``path`` when the file cannot be written (the previous one is kept).
        """
        self._full_state = self._data_parallel.full_state(self)  # FSDP: gathered from every rank's shards
        self._tracker_state = self._group_tracker_state()
        try:
            if not self._data_parallel.is_main:
                return
            resolved = self.rollout_buffer_class
            self.rollout_buffer_class = self._given_buffer_class
            try:
                self._save_atomically(path, exclude, include)
            finally:
                self.rollout_buffer_class = resolved
        finally:
            self._full_state = None

    def _save_atomically(
        self, path: str | os.PathLike | io.BufferedIOBase, exclude: Iterable[str] | None, include: Iterable[str] | None
    ) -> None:
        if is_safetensors_path(path):  # the format that cannot run code: weights in safetensors, the rest JSON
            save_safetensors(self, path, exclude, include)
            return
        if not isinstance(path, (str, os.PathLike)) or is_atomic_temp(path):  # a file object, or atomic_save's temp
            super().save(path, exclude=exclude, include=include)
            return
        target = Path(os.path.expanduser(os.fspath(path)))
        if os.fspath(path) == "" or target.is_dir():
            raise ValueError(
                f"save: path {os.fspath(path)!r} is {'empty' if os.fspath(path) == '' else 'a folder'}; give a file "
                "path, e.g. model.save('runs/model.zip')"
            )
        if target.suffix == "":
            target = target.with_suffix(".zip")
        atomic_write(target, lambda tmp: super(CheckpointMixin, self).save(tmp, exclude=exclude, include=include))

    def get_parameters(self) -> dict[str, dict]:
        """SB3's ``get_parameters`` (the state dicts ``save`` writes); under ``data_parallel="fsdp"``, while saving,
        the full state gathered from the shards."""
        return super().get_parameters() if self._full_state is None else self._full_state

    def set_parameters(
        self, load_path_or_dict: str | dict[str, Any], exact_match: bool = True, device: th.device | str = "auto"
    ) -> None:
        """SB3's ``set_parameters``; parameters saved without a KL reference (the model was trained with
        ``kl_coef=0``) load into a model that has one (``load(path, kl_coef=0.1)``): the reference then starts as the
        loaded policy, as a fresh model's starts as its initial policy."""
        ref = self.ref_policy
        if isinstance(load_path_or_dict, dict) and ref is not None and "ref_policy" not in load_path_or_dict:
            if exact_match:
                missing = set(self._get_torch_save_params()[0]) - set(load_path_or_dict) - {"ref_policy"}
                if missing:
                    raise ValueError(f"the parameters to load lack {sorted(missing)}; give a complete saved model")
            super().set_parameters(load_path_or_dict, exact_match=False, device=device)
            ref.load_state_dict(self.policy.state_dict())
        else:
            super().set_parameters(load_path_or_dict, exact_match=exact_match, device=device)
        self._rollout_engine.weights_changed()  # vLLM: the new weights are pushed before the next rollout

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_full_state", "_given_buffer_class"]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts, tensors = super()._get_torch_save_params()
        if self.ref_policy is not None:
            state_dicts = [*state_dicts, "ref_policy"]
        return state_dicts, tensors

    def _policy_kwargs_to_build(self) -> Any:
        """``policy_kwargs`` as the policy is built from them now: after ``load(path, base_model=...)``, a LoRA
        checkpoint's base model at its new place (:func:`relocated_base`); a model folder that no longer exists
        replaced by the config saved with the model (:func:`moved_model_folder`)."""
        # base_model is a keyword of load() only: SB3's load sets it on the model just before _setup_model
        kwargs = relocated_base(self.policy_kwargs, self.__dict__.pop("base_model", None))
        return moved_model_folder(kwargs, self._lm_spec)

    def _keep_portable_policy_kwargs(self) -> None:
        """After the policy is built: a model object in ``policy_kwargs`` is saved as its config (the weights are in
        the state dict), not pickled; ``_lm_spec`` keeps the LM's spec for a later :meth:`_policy_kwargs_to_build`."""
        self._lm_spec = getattr(self.policy, "lm_spec", None)  # an MLP policy has none
        self.policy_kwargs = portable_policy_kwargs(
            self.policy_kwargs, self._lm_spec, getattr(self.policy, "quantization", None)
        )

    @classmethod
    def load(  # noqa: PYI019 (SB3's convention)
        cls: type[SelfCheckpointed],
        path: Any,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trusted: bool = False,
        **kwargs: Any,
    ) -> SelfCheckpointed:
        """
        SB3's ``load``, with clear errors for a path that does not exist or a file that is not a complete saved
        model (a torn write); see :func:`sb3_grpo.callbacks.latest_checkpoint` to find the newest complete one.

        The arguments set on load (``kwargs`` and the values of ``custom_objects``, e.g. ``kl_coef=0.1``) run the same
        checks as the constructor's (``_check_load_arguments``): a NaN, an out-of-range value or an option the algorithm
        does not support is refused, naming it. As in SB3,
        ``device="cuda"`` on a machine without CUDA loads on the CPU (with a warning).

        A LoRA model's checkpoint holds its adapters, not its base model, which loads again by its name or path (Hub
        ids at the saved revision, from the Hugging Face cache with ``HF_HUB_OFFLINE=1``). A base that has moved is
        given with ``base_model="<directory or Hub id>"`` (one more keyword argument); a base that cannot be found
        is an error naming it and these ways out, and one whose weights differ from those the adapters were trained on
        is refused.

        Nothing in the file runs code unless ``trusted=True``: a ``.zip``'s pickled entries are decoded through an
        allow-list of the classes SB3 and this package store (:mod:`sb3_grpo.common.checkpoints.unpickling`), and a
        ``.safetensors`` file (``model.save("model.safetensors")``) is read as tensors and JSON
        (:mod:`sb3_grpo.common.checkpoints.safetensors_format`). An entry outside the allow-list is refused, naming it.
        """
        # callables in custom_objects stand in for schedules that cannot be unpickled (rl-zoo's
        # {"clip_range": lambda _: 0.0}): placeholders, not settings, so only the other values are checked
        placed = {k: v for k, v in (custom_objects or {}).items() if not callable(v)}
        cls._check_load_arguments({**placed, **kwargs})
        device = available_device(device)
        if isinstance(path, (str, os.PathLike)):
            path = existing_checkpoint(path)
        path, custom_objects = checkpoint_source(path, custom_objects, trusted=trusted)
        if isinstance(env, str):  # an env id, as the constructor takes it (SB3's load wants an env object)
            env = maybe_make_env(env, 0)
        return super().load(
            path,
            env=env,
            device=device,
            custom_objects=custom_objects,
            print_system_info=print_system_info,
            force_reset=force_reset,
            **kwargs,
        )


def relocated_base(policy_kwargs: Any, base_model: Any) -> Any:
    """On ``load(path, base_model=...)``: ``policy_kwargs["model"]`` pointed at ``base_model`` (a directory or Hub id),
    where a LoRA checkpoint's base model is now; the checkpoint's fingerprint of the base checks it is the same."""
    if base_model is None:
        return policy_kwargs
    if not isinstance(base_model, (str, os.PathLike)) or not os.fspath(base_model):
        raise TypeError(f"load(base_model=...) must be a model directory or a Hub id (str), got {base_model!r}")
    model = policy_kwargs.get("model") if isinstance(policy_kwargs, dict) else None
    if isinstance(model, dict) and model.get("weights") == BASE_WEIGHTS:
        return {**policy_kwargs, "model": {**model, "name_or_path": os.fspath(base_model)}}
    if isinstance(model, (str, os.PathLike)):
        return {**policy_kwargs, "model": os.fspath(base_model)}
    raise ValueError(
        "load(base_model=...) names where a LoRA checkpoint's base model is, but this checkpoint holds its full model "
        "weights (it needs no base); load it without base_model"
    )


def moved_model_folder(policy_kwargs: Any, lm_spec: Any) -> Any:
    """On ``load``: a ``policy_kwargs["model"]`` folder that no longer exists (moved, deleted) is replaced by the LM's
    config saved with the model (``_lm_spec``), with a warning; the weights come from the checkpoint, so the model
    loads the same. A LoRA checkpoint without its base weights cannot: that is an error naming the base."""
    model = policy_kwargs.get("model") if isinstance(policy_kwargs, dict) else None
    if not isinstance(model, (str, os.PathLike)) or os.path.isdir(model) or not isinstance(lm_spec, dict):
        return policy_kwargs
    if gguf_available(model):  # a GGUF file or packaged model loads by its name (its checksum is checked then)
        return policy_kwargs
    if lm_spec.get("weights") == BASE_WEIGHTS:
        raise FileNotFoundError(base_missing_message(os.fspath(model), lm_spec.get("revision")))
    warnings.warn(
        f"the model folder {os.fspath(model)!r} this model was built from no longer exists; building the LM from the "
        "config saved in the checkpoint (the weights are the checkpoint's, so the model is the same)",
        UserWarning,
        stacklevel=5,
    )
    return {**policy_kwargs, "model": lm_spec}


def available_device(device: th.device | str) -> th.device | str:
    """``device``, or the CPU (with a warning) for a CUDA device on a machine without CUDA, as SB3's ``load`` does."""
    try:
        wanted = th.device(device)
    except (RuntimeError, TypeError):
        return device  # the constructor's check names it
    if wanted.type == "cuda" and not th.cuda.is_available():
        warnings.warn(
            f"load(device={str(device)!r}): CUDA is not available here, loading on the CPU (as SB3 does); pass "
            "device='cpu' to silence this",
            stacklevel=3,
        )
        return "cpu"
    return device
