"""Data-parallel GRPO on torch.distributed: two gloo processes on CPU, launched with torchrun."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch as th

from sb3_grpo import distributed

WORKER = Path(__file__).with_name("_distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(_free_port()), str(WORKER), str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return out


def _load(out: Path, name: str, rank: int) -> dict:
    return th.load(out / f"{name}_rank{rank}.pt", weights_only=True)


@pytest.mark.parametrize("name", ["cartpole", "textgen", "textgen_lora"])
def test_parameters_identical_on_every_rank(two_ranks, name):
    if name == "textgen_lora" and not (two_ranks / "textgen_lora_rank0.pt").exists():
        pytest.skip("peft is not installed")
    r0, r1 = _load(two_ranks, name, 0), _load(two_ranks, name, 1)
    assert r0["world_size"] == r1["world_size"] == 2
    assert th.equal(r0["initial"], r1["initial"])  # both ranks start from rank 0's weights
    assert not th.equal(r0["params"], r0["initial"])  # training moved them (two runs that do nothing would be equal)
    assert th.equal(r0["params"], r1["params"])
    # each rank stepped its own envs with its own seed
    assert r0["seed"] == 0 and r1["seed"] == distributed.SEED_STRIDE
    assert not th.equal(r0["rollout"], r1["rollout"])
    # num_timesteps counts the rank's own steps
    assert r0["num_timesteps"] == r1["num_timesteps"]


def test_only_rank0_logs_and_saves(two_ranks):
    for name in ("cartpole", "textgen"):
        assert (two_ranks / f"{name}_rank0.zip").exists()
        assert not (two_ranks / f"{name}_rank1.zip").exists()
        assert _load(two_ranks, name, 1)["n_log_outputs"] == 0
    assert _load(two_ranks, "cartpole", 0)["n_log_outputs"] >= 1
    assert sorted(p.name for p in (two_ranks / "tb").iterdir()) == ["GRPO_1"]


def test_rank0_alone_loads_the_checkpoint(two_ranks):
    loaded = th.load(two_ranks / "rank0_loaded.pt", weights_only=True)["params"]
    assert th.equal(loaded, _load(two_ranks, "cartpole", 0)["params"])


def test_helpers_single_process():
    assert not distributed.is_active()
    assert distributed.rank_seed(7, rank=3) == 7 + 3 * distributed.SEED_STRIDE
    assert distributed.rank_seed(None) is None
    assert distributed.shard(list(range(5)), rank=1, world_size=2) == [1, 3]
    with pytest.raises(ValueError, match="cannot shard"):
        distributed.shard([1], rank=0, world_size=2)
    assert list(distributed.pad_to_max(iter([1, 2]))) == [1, 2]
    assert distributed.mean_across_ranks(3.0, 2.0) == 1.5
    assert distributed.all_equal(5)
    p = th.nn.Parameter(th.ones(3))
    p.grad = th.full((3,), 2.0)
    distributed.average_gradients([p])  # no-op on one process
    assert th.equal(p.grad, th.full((3,), 2.0))
