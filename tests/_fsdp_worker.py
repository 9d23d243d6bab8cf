"""Worker of ``tests/test_fsdp.py``: run under ``torchrun --nproc_per_node 2``.

Each rank trains GRPO twice from the same seeds, with ``data_parallel="ddp"`` and ``"fsdp"``, on CartPole (Discrete
actions) and Pendulum (a Gaussian policy: its ``log_std`` stays whole), and writes the final full parameters, the
numbers of parameter and optimizer-state elements it holds itself, to ``OUT/<env>_<mode>_rank<r>.pt``; the FSDP
models are saved to ``OUT/<env>_fsdp.zip`` (every rank calls ``save``, rank 0 writes).
"""

import os
import sys

import torch as th
from stable_baselines3.common.env_util import make_vec_env
from torch.distributed.tensor import DTensor

from sb3_grpo import GRPO, distributed

out = sys.argv[1]
th.set_num_threads(1)
rank = distributed.get_rank()
HP = {"n_steps": 32, "batch_size": 32, "n_epochs": 2, "seed": 0, "grad_var_coef": 0.0, "device": "cpu"}


def local_numel(tensors) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() for t in tensors)


for env_id in ("CartPole-v1", "Pendulum-v1"):
    for mode in ("ddp", "fsdp"):
        env = make_vec_env(env_id, n_envs=2, seed=distributed.rank_seed(0))
        model = GRPO("MlpPolicy", env, data_parallel=mode, **HP)
        model.learn(2 * 32 * 2)
        state = model.policy.state_dict()
        full = model.get_parameters() if mode == "ddp" else None
        optim_state = [v for s in model.policy.optimizer.state.values() for v in s.values() if v.dim() > 0]
        record = {
            "local_params": local_numel(model.policy.parameters()),
            "total_params": sum(p.numel() for p in model.policy.parameters()),
            "local_optim": local_numel(optim_state),
            "sharded": sum(isinstance(p, DTensor) for p in model.policy.parameters()),
        }
        if mode == "fsdp":
            model.save(os.path.join(out, f"{env_id}_fsdp.zip"))
            params = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in state.items()}
        else:
            params = {k: v.detach().clone() for k, v in state.items()}
        record["params"] = params
        th.save(record, os.path.join(out, f"{env_id}_{mode}_rank{rank}.pt"))
