"""fp16 loss scaling (``torch.amp.GradScaler``) for a policy that computes in float16 (``autocast_dtype="float16"``).

float16 has a narrow range, so small gradients underflow to 0: the loss is multiplied by a large scale before the
backward, the gradients divided by it before they are clipped and applied, and a step whose gradient overflowed is
skipped with the scale halved (PyTorch's dynamic loss scaling, Micikevicius et al. 2018, arXiv 1710.03740). bfloat16
has float32's range and needs none. The update calls these functions with the model's scaler, ``None`` when no scaling
is needed, in which case each is the plain call (``loss.backward()``, ``optimizer.step()``).
"""

from __future__ import annotations

from typing import Any

import torch as th

__all__ = ["grad_scaler_for", "scaled_backward", "skip_overflowed_step", "step_optimizer", "unscale_gradients"]


def grad_scaler_for(policy: Any, device: th.device, data_parallel: str) -> th.amp.GradScaler | None:
    """The loss scaler of a policy that autocasts to float16, else ``None``.

    :param policy: The policy (its ``autocast_dtype``, when it has one).
    :param device: The device it trains on.
    :param data_parallel: ``"ddp"`` or ``"fsdp"``.
    :raises ValueError: for fp16 under FSDP, whose sharded gradients this scaler cannot unscale.
    """
    if getattr(policy, "autocast_dtype", None) != "float16":
        return None
    if data_parallel == "fsdp":
        raise ValueError(
            "fp16 loss scaling is not supported with data_parallel='fsdp' (its gradients are sharded); use "
            "autocast_dtype='bfloat16' (no scaling needed) or data_parallel='ddp'"
        )
    return th.amp.GradScaler(device.type)


def scaled_backward(loss: th.Tensor, scaler: th.amp.GradScaler | None) -> None:
    """``loss.backward()``, of the scaled loss under fp16 loss scaling."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def unscale_gradients(scaler: th.amp.GradScaler | None, optimizer: th.optim.Optimizer) -> None:
    """Divide the gradients by the scale (before they are clipped): the true gradient. An overflow anywhere is in every
    data-parallel rank's average, so all ranks skip together."""
    if scaler is not None:
        scaler.unscale_(optimizer)


def skip_overflowed_step(scaler: th.amp.GradScaler | None, optimizer: th.optim.Optimizer) -> bool:
    """After a non-finite gradient norm: under fp16 loss scaling an overflow is expected, so no step is taken, the
    scale halves and ``True`` is returned (the caller counts it); without scaling ``False`` (a real non-finite)."""
    if scaler is None:
        return False
    scaler.update()
    optimizer.zero_grad()
    return True


def step_optimizer(scaler: th.amp.GradScaler | None, optimizer: th.optim.Optimizer) -> None:
    """The optimizer step on the unscaled gradient (checked finite), and the scale's update."""
    if scaler is None:
        optimizer.step()
        return
    scaler.step(optimizer)
    scaler.update()
