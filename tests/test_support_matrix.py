"""Every shared option of every algorithm, against what the algorithm declares (``supports``): each option value it
supports trains a rollout, and each one it does not is refused with a ``ValueError`` that names the algorithm, the
option and what to use instead (never a ``TypeError``). The data-parallel modes are run for real on two gloo ranks
(GRPO's in ``tests/test_fsdp.py``)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch as th
from helpers import quiet

import sb3_grpo
from sb3_grpo.common.advantages.forms import ADVANTAGE_FORMS
from textrl_envs.sb3 import make_vec_env

ALGORITHMS = ["GRPO", "DrGRPO", "DAPO", "GSPO", "CISPO", "ReinforcePP"]
HP = {"n_steps": 8, "batch_size": 16, "n_epochs": 1, "seed": 0, "device": "cpu"}
#: the shared options and their values (the advantage forms: every registered one)
OPTIONS = [
    *(("advantage", name) for name in ADVANTAGE_FORMS),
    ("micro_batch_size", 4),
    ("data_parallel", "ddp"),
    ("data_parallel", "fsdp"),
    ("engine", "step"),
    ("engine", "hf"),
    ("engine", "vllm"),
    ("reward_redistribution", "attention"),
    ("reward_redistribution", "uniform"),
]


def _env(option, value):
    """An env the option's value can train on: a game for ``"role"``, an interactive task for ``"group_turn"``, prompt
    groups for the group forms, and otherwise a text env in groups (every algorithm's default form can use it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if option == "advantage" and value == "role":
            return make_vec_env("Nim-v0", n_envs=2, seed=0, device="cpu")
        if option == "advantage" and value == "group_turn":
            return make_vec_env("GuessNumber-v0", n_envs=4, group_size=2, seed=0, device="cpu")
        grouped = not (option == "advantage" and not ADVANTAGE_FORMS[value].grouped)
        return make_vec_env("TextGen-v0", n_envs=4, group_size=2 if grouped else 1, seed=0, device="cpu",
                            max_new_tokens=6)  # fmt: skip


@pytest.mark.parametrize("option, value", OPTIONS, ids=[f"{o}={v}" for o, v in OPTIONS])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_option_value_trains_or_is_refused_by_name(name, option, value):
    cls = getattr(sb3_grpo, name)
    kwargs = {**HP, option: value, **({"grad_var_coef": 0.0} if name == "GRPO" else {})}
    env = _env(option, value)
    if not cls.supports.supported(option, value):
        with pytest.raises(ValueError) as refused:
            cls("CausalLMPolicy", env, **kwargs)
        message = str(refused.value)
        assert name in message and option.replace("micro_batch_size", "micro_batch") in message
        assert "use " in message or "pass " in message, message
        return
    if value == "vllm":
        pytest.importorskip("vllm", reason="the vllm extra is not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = quiet(cls("CausalLMPolicy", env, **kwargs))
    assert getattr(model, option) == value
    model.learn(model.n_steps * model.n_envs)
    assert model.num_timesteps == model.n_steps * model.n_envs and model._n_updates == 1


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_declared_refusal_is_a_clear_error_for_micro_batches_too(name):
    """An algorithm that declares no micro-batches (none of the package's: each loss takes a micro-batch's share) is
    refused by name: shown on a subclass that declares so."""
    from dataclasses import replace

    cls = getattr(sb3_grpo, name)
    strict = type(f"Strict{name}", (cls,), {"supports": replace(cls.supports, micro_batches=False)})
    with pytest.raises(ValueError, match=rf"Strict{name} does not split a minibatch into micro-batches.*None"):
        extra = {"grad_var_coef": 0.0} if name == "GRPO" else {}
        strict("CausalLMPolicy", _env("engine", "step"), **{**HP, "micro_batch_size": 4, **extra})


# -- data parallel on two ranks ---------------------------------------------------------------------------------
WORKER = Path(__file__).with_name("_algorithms_worker.py")
CRITIC_FREE = ["DrGRPO", "DAPO", "GSPO", "CISPO", "ReinforcePP"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("algorithms")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(_free_port()), str(WORKER), str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return out


@pytest.mark.parametrize("name", CRITIC_FREE)
def test_ddp_and_fsdp_train_every_rank_alike(two_ranks, name):
    """Under torchrun both modes end with the same parameters on every rank, and FSDP's equal DDP's."""

    def load(mode, rank):
        return th.load(two_ranks / f"{name}_{mode}_rank{rank}.pt", weights_only=True)["params"]

    ddp0, ddp1, fsdp0 = load("ddp", 0), load("ddp", 1), load("fsdp", 0)
    assert ddp0.keys() == ddp1.keys() == fsdp0.keys()
    for key, value in ddp0.items():
        assert th.equal(value, ddp1[key]), key
        th.testing.assert_close(fsdp0[key], value, atol=1e-5, rtol=1e-5, msg=key)


def test_ppos_positional_arguments_still_reach_the_skeleton():
    """The algorithms pass PPO's arguments on through ``*args``: positional ones keep working, as with SB3's PPO."""
    model = sb3_grpo.GRPO("MlpPolicy", "CartPole-v1", 1e-3, 128, 64, device="cpu")
    assert (model.learning_rate, model.n_steps, model.batch_size) == (1e-3, 128, 64)
    gspo = sb3_grpo.GSPO("CausalLMPolicy", _env("engine", "step"), 1e-3, 8, 16, device="cpu")
    assert (gspo.n_steps, gspo.batch_size, gspo.clip_range(1.0)) == (8, 16, 3e-4)  # its own default clip_range
