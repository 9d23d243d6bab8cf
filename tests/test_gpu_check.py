"""The GPU check script's parts that run without a GPU: what it skips without CUDA, and its FSDP check on 2 gloo
ranks with CPU tensors (the mode it falls back to on one GPU)."""

import pytest
import torch as th

from benchmarks import gpu_check


@pytest.mark.skipif(th.cuda.is_available(), reason="this machine has CUDA: the script would run the checks")
def test_without_cuda_it_says_which_checks_it_skips(capsys):
    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out
    assert "CUDA is not available" in out
    assert "micro-batch, FSDP and 4-bit LoRA" in out


@pytest.mark.parametrize(
    ("device", "n_gpus", "expected"),
    [("cpu", 0, ["gloo-cpu"]), ("cuda", 1, ["gloo-cuda", "gloo-cpu"]), ("cuda", 2, ["nccl"]), ("cuda", 8, ["nccl"])],
)
def test_fsdp_modes_follow_the_number_of_gpus(device, n_gpus, expected):
    assert gpu_check.fsdp_modes(th.device(device), n_gpus) == expected
    for mode in expected:
        backend, where = gpu_check.FSDP_MODES[mode]
        assert backend in ("nccl", "gloo") and (where == "cpu") == (mode == "gloo-cpu")


def test_the_fsdp_check_on_two_cpu_ranks_equals_ddp_with_half_the_shards_each(tmp_path, capsys):
    result = gpu_check.fsdp_check(th.device("cpu"), tmp_path)
    assert result["mode"] == "gloo-cpu" and result["errors"] == []
    assert result["max_param_diff"] < 1e-5
    assert len(result["shares"]) == 2 and all(0.45 < share < 0.55 for share in result["shares"])
    assert gpu_check.print_fsdp_check(result)
    assert "gloo with tensors on cpu" in capsys.readouterr().out


def test_a_failed_fsdp_check_is_reported_as_failed(capsys):
    failed = {"mode": None, "errors": [("nccl", "RuntimeError: no GPU")], "max_param_diff": float("nan")}
    assert not gpu_check.print_fsdp_check({**failed, "shares": [], "peak_mb": {}})
    out = capsys.readouterr().out
    assert "could not run (RuntimeError: no GPU)" in out and "FAILED" in out
