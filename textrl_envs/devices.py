"""Where tensors live: one checked resolution of a ``device`` argument for the whole project.

Everything that takes ``device=`` (the vector env's state, the classifier reward, perplexity, the policy in
``sb3_grpo``) resolves it with :func:`resolve_device`, so ``"auto"`` means the same everywhere and a device
this machine does not have fails early, with a message that says what to pass instead.
"""

from __future__ import annotations

from typing import Any

import torch

#: What a ``device`` argument accepts besides a ``torch.device``.
DEVICE_HINT = "'auto' (CUDA when there is one, else CPU), 'cpu', 'cuda', 'cuda:<n>' or 'mps'"


def available_devices() -> list[str]:
    """The devices this machine has, as strings ``torch.device`` accepts: ``"cpu"``, then ``"cuda:<n>"``, ``"mps"``."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def resolve_device(device: Any = "auto") -> torch.device:
    """The ``torch.device`` that ``device`` names on this machine.

    :param device: ``"auto"`` or ``None`` (CUDA when available, else the CPU), or anything ``torch.device``
        accepts (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, a ``torch.device``).
    :return: The device; ``"auto"`` on a machine without CUDA gives exactly ``torch.device("cpu")``.
    :raises ValueError: for a device string torch does not know, a CUDA device when CUDA is not available
        (or an index past the device count), or ``"mps"`` when MPS is not available; the message names what
        was asked, what this machine has and what to pass instead.
    """
    if device is None or (isinstance(device, str) and device == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device={device!r} is not a torch device; pass {DEVICE_HINT} (this machine has "
            f"{', '.join(available_devices())})"
        ) from exc
    has = ", ".join(available_devices())
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} was requested (this machine has {has}) but CUDA is not available on this machine; "
            "use device='auto' (CUDA when there is one, else CPU) or device='cpu'"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"device={device!r} does not exist; this machine has {torch.cuda.device_count()} CUDA device(s) "
            f"({has}); use device='auto', device='cuda' (the current one) or one of those"
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            f"device={device!r} was requested (this machine has {has}) but MPS (Apple GPU) is not available on this "
            "machine; use device='auto' (CUDA when there is one, else CPU) or device='cpu'"
        )
    return dev
