"""FSDP2 data parallelism (``data_parallel="fsdp"``): two gloo processes on CPU, launched with torchrun, against
``data_parallel="ddp"`` from the same seeds."""

import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch as th

from sb3_grpo import GRPO

WORKER = Path(__file__).with_name("_fsdp_worker.py")
ENVS = ["CartPole-v1", "Pendulum-v1", "TextGen-v0", "TextGen-v0-lora"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
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


def _load(out: Path, env_id: str, mode: str, rank: int) -> dict:
    return th.load(out / f"{env_id}_{mode}_rank{rank}.pt", weights_only=True)


@pytest.mark.parametrize("env_id", ENVS)
def test_fsdp_parameters_after_learn_equal_ddp(two_ranks, env_id):
    ddp, fsdp = _load(two_ranks, env_id, "ddp", 0), _load(two_ranks, env_id, "fsdp", 1)
    assert ddp["params"].keys() == fsdp["params"].keys()
    for key, value in ddp["params"].items():
        th.testing.assert_close(fsdp["params"][key], value, atol=1e-5, rtol=1e-5, msg=key)
    initial = _load(two_ranks, env_id, "ddp", 0)["initial"]
    assert any(not th.allclose(initial[k], v) for k, v in ddp["params"].items()), "training must move the weights"


@pytest.mark.parametrize("env_id", ENVS)
def test_each_rank_holds_about_half_of_the_parameters_and_optimizer_state(two_ranks, env_id):
    for rank in (0, 1):
        ddp, fsdp = _load(two_ranks, env_id, "ddp", rank), _load(two_ranks, env_id, "fsdp", rank)
        assert ddp["sharded"] == 0 and ddp["local_params"] == ddp["total_params"]
        assert fsdp["sharded"] > 0 and fsdp["total_params"] == ddp["total_params"]
        # the sharded part: everything for an MLP policy but Pendulum's log_std; an LM's blocks (its embeddings,
        # final norm, tied head and critic stay whole)
        whole, total = fsdp["whole_params"], fsdp["total_params"]
        assert whole < 0.5 * total
        share = (fsdp["local_params"] - whole) / (total - whole)
        assert 0.45 < share < 0.55, f"rank {rank} holds {share:.1%} of the sharded parameters"
        # Adam: 2 values per trainable parameter (with LoRA: the adapters, sharded with their blocks, and the critic)
        whole_trainable = fsdp["whole_trainable"]
        optim_share = (fsdp["local_optim"] - 2 * whole_trainable) / (ddp["local_optim"] - 2 * whole_trainable)
        assert 0.45 < optim_share < 0.55, f"rank {rank} holds {optim_share:.1%} of Adam's sharded state"


@pytest.mark.parametrize("env_id", ENVS)
def test_each_unit_is_resharded_after_its_forward_in_the_update(two_ranks, env_id):
    # FSDP2 keeps a root's gathered parameters from its forward to its backward: with every block a root of its own
    # (or with the blocks still gathered from the rollout), a rank would hold the whole model here
    for rank in (0, 1):
        seen = _load(two_ranks, env_id, "fsdp", rank)["gathered"]
        assert seen["units"] >= (4 if env_id.startswith("TextGen") else 2) and seen["forwards"] > 0, seen
        assert seen["at_start"] == 0, f"rank {rank}: other units still gathered when a unit's forward starts: {seen}"
        assert seen["at_end"] == 0, f"rank {rank}: units still gathered after a unit's forward: {seen}"


@pytest.mark.parametrize("env_id", ENVS)
def test_the_full_state_save_loads_on_one_process(two_ranks, env_id):
    fsdp = _load(two_ranks, env_id, "fsdp", 0)
    loaded = GRPO.load(two_ranks / f"{env_id}_fsdp.zip", device="cpu")
    for key, value in loaded.policy.state_dict().items():
        th.testing.assert_close(value, fsdp["params"][key], atol=0, rtol=0, msg=key)
    assert loaded.policy.optimizer.state, "Adam's moments are saved too"
    assert loaded.data_parallel == "fsdp"


def test_a_lora_checkpoint_saved_under_fsdp_holds_the_adapters_not_the_base(two_ranks):
    def policy_bytes(name: str) -> int:
        with zipfile.ZipFile(two_ranks / name) as archive:
            return archive.getinfo("policy.pth").file_size

    full, lora = policy_bytes("TextGen-v0_fsdp.zip"), policy_bytes("TextGen-v0-lora_fsdp.zip")
    assert lora < 0.05 * full, f"the LoRA checkpoint's policy holds {lora} bytes, the full model's {full}"


def test_a_bad_data_parallel_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="data_parallel"):
        GRPO("MlpPolicy", "CartPole-v1", data_parallel="zero3", device="cpu")
