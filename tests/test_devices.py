"""resolve_device: "auto" picks CUDA when there is one, and a device this machine lacks is a clear ValueError.

The CUDA and MPS paths are checked on any machine by patching what torch reports.
"""

from __future__ import annotations

import pytest
import torch

from textrl_envs.devices import available_devices, resolve_device


def fake_cuda(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("auto", ["auto", None])
def test_auto_without_cuda_is_exactly_the_cpu(monkeypatch, auto):
    fake_cuda(monkeypatch, 0)
    dev = resolve_device(auto)
    assert dev == torch.device("cpu") and dev.index is None and str(dev) == "cpu"


def test_auto_with_cuda_is_cuda(monkeypatch):
    fake_cuda(monkeypatch, 2)
    assert resolve_device() == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    assert available_devices()[:3] == ["cpu", "cuda:0", "cuda:1"]


def test_devices_torch_accepts_pass_through():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_cuda_without_cuda(monkeypatch):
    fake_cuda(monkeypatch, 0)
    for asked in ("cuda", "cuda:0", torch.device("cuda", 1)):
        with pytest.raises(
            ValueError,
            match=r"\(this machine has cpu\) but CUDA is not available on this machine; use device='auto'.*'cpu'",
        ):
            resolve_device(asked)


def test_cuda_index_past_the_device_count(monkeypatch):
    fake_cuda(monkeypatch, 2)
    with pytest.raises(ValueError, match=r"'cuda:2' does not exist; this machine has 2 CUDA device\(s\) \(cpu, cuda:0"):
        resolve_device("cuda:2")


def test_mps_without_mps(monkeypatch):
    fake_cuda(monkeypatch, 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(
        ValueError, match=r"'mps' was requested \(this machine has cpu\) but MPS .* not available.*device='cpu'"
    ):
        resolve_device("mps")


@pytest.mark.parametrize("asked", ["tpu-ish", "gpu", 1.5])
def test_unknown_device(asked):
    with pytest.raises(ValueError, match=rf"device={asked!r} is not a torch device; pass 'auto'.*this machine has cpu"):
        resolve_device(asked)
