"""Worker of ``tests/test_fsdp.py``: run under ``torchrun --nproc_per_node 2``.

Each rank trains GRPO twice from the same seeds, with ``data_parallel="ddp"`` and ``"fsdp"``, on CartPole (Discrete
actions), Pendulum (a Gaussian policy: its ``log_std`` stays whole) and TextGen-v0 (``CausalLMPolicy``: its GPT-2
blocks are sharded; per-transition minibatches, in micro-batches, with group advantages and the KL term) and
TextGen-v0 with LoRA (``TextGen-v0-lora``: rank-4 adapters on ``c_attn``, the base frozen and sharded with them), and
writes
the final full parameters, the numbers of parameter and optimizer-state elements it holds itself, and (FSDP) how many
sharded units held their gathered parameters around each unit's forward in the updates, to
``OUT/<env>_<mode>_rank<r>.pt``; the FSDP models are saved to ``OUT/<env>_fsdp.zip`` (every rank calls ``save``,
rank 0 writes).
"""

import os
import sys

import torch as th
from stable_baselines3.common.env_util import make_vec_env
from torch.distributed.tensor import DTensor

from sb3_grpo import GRPO, distributed
from sb3_grpo.common.buffers import GRPODictRolloutBuffer
from textrl_envs.sb3 import make_vec_env as make_text_env

out = sys.argv[1]
th.set_num_threads(1)
rank = distributed.get_rank()
HP = {"n_steps": 32, "batch_size": 32, "n_epochs": 2, "seed": 0, "grad_var_coef": 0.0, "device": "cpu"}
TEXT_HP = {
    **HP,
    "n_steps": 8,
    "batch_size": 16,
    "learning_rate": 1e-3,
    "advantage": "group",
    "kl_coef": 0.05,
    "micro_batch_size": 5,
    "rollout_buffer_class": GRPODictRolloutBuffer,
}


def local_numel(tensors) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() for t in tensors)


LORA = {"lora": {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]}}


def watch_units(policy) -> dict:
    """Hooks on the sharded units (an LM's blocks, not their root; an MLP policy's children): in the forwards with
    gradients (the updates'), the most units other than the running one that hold their gathered (unsharded)
    parameters when a unit's forward starts (after FSDP's gather), and the most units that hold them when a unit's
    forward has ended (after FSDP's reshard). A unit's registered parameters are its sharded DTensors while it is
    sharded and plain tensors while gathered."""
    from torch.distributed.fsdp import FSDPModule

    root = getattr(getattr(policy, "lm", None), "base_model", None)
    units = [m for m in policy.modules() if isinstance(m, FSDPModule) and m is not root]
    seen = {"units": len(units), "forwards": 0, "at_start": 0, "at_end": 0}

    def gathered() -> int:
        return sum(any(not isinstance(p, DTensor) for p in unit.parameters()) for unit in units)

    def pre(module, args):
        if th.is_grad_enabled():
            seen["forwards"] += 1
            seen["at_start"] = max(seen["at_start"], gathered() - 1)

    def post(module, args, output):
        if th.is_grad_enabled():
            seen["at_end"] = max(seen["at_end"], gathered())

    for unit in units:  # registered after FSDP's hooks: its gather runs before pre, its reshard before post
        unit.register_forward_pre_hook(pre)
        unit.register_forward_hook(post)
    return seen


def build(env_id: str, mode: str) -> GRPO:
    if env_id.startswith("TextGen-v0"):
        env = make_text_env(
            "TextGen-v0", n_envs=4, group_size=2, seed=distributed.rank_seed(0), device="cpu", max_new_tokens=6
        )
        kwargs = {"policy_kwargs": LORA} if env_id.endswith("-lora") else {}
        return GRPO("CausalLMPolicy", env, data_parallel=mode, **TEXT_HP, **kwargs)
    env = make_vec_env(env_id, n_envs=2, seed=distributed.rank_seed(0))
    return GRPO("MlpPolicy", env, data_parallel=mode, **HP)


for env_id in ("CartPole-v1", "Pendulum-v1", "TextGen-v0", "TextGen-v0-lora"):
    for mode in ("ddp", "fsdp"):
        model = build(env_id, mode)
        initial = {k: v.detach().clone() for k, v in model.policy.state_dict().items()} if mode == "ddp" else None
        watched = watch_units(model.policy) if mode == "fsdp" else None
        model.learn(2 * model.n_steps * model.n_envs)
        state = model.policy.state_dict()
        full = model.get_parameters() if mode == "ddp" else None
        optim_state = [v for s in model.policy.optimizer.state.values() for v in s.values() if v.dim() > 0]
        record = {
            "local_params": local_numel(model.policy.parameters()),
            "whole_params": sum(p.numel() for p in model.policy.parameters() if not isinstance(p, DTensor)),
            "whole_trainable": sum(
                p.numel() for p in model.policy.parameters() if p.requires_grad and not isinstance(p, DTensor)
            ),
            "total_params": sum(p.numel() for p in model.policy.parameters()),
            "local_optim": local_numel(optim_state),
            "sharded": sum(isinstance(p, DTensor) for p in model.policy.parameters()),
        }
        if mode == "fsdp":
            model.save(os.path.join(out, f"{env_id}_fsdp.zip"))
            params = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in state.items()}
        else:
            params = {k: v.detach().clone() for k, v in state.items()}
        record["params"], record["initial"], record["gathered"] = params, initial, watched
        th.save(record, os.path.join(out, f"{env_id}_{mode}_rank{rank}.pt"))
