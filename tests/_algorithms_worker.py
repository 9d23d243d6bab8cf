"""Worker of ``tests/test_support_matrix.py``: run under ``torchrun --nproc_per_node 2``.

Each rank trains every algorithm without a critic (Dr. GRPO, DAPO, GSPO, CISPO, REINFORCE++) twice from the same
seeds, with ``data_parallel="ddp"`` and ``"fsdp"``, on TextGen-v0 (``CausalLMPolicy``, per-transition minibatches,
micro-batches where the algorithm splits them there), and writes its final full parameters to
``OUT/<algo>_<mode>_rank<r>.pt``. GRPO's runs are ``tests/_fsdp_worker.py``'s.
"""

import os
import sys

import torch as th
from torch.distributed.tensor import DTensor

import sb3_grpo
from sb3_grpo import distributed
from sb3_grpo.common.buffers import GRPODictRolloutBuffer
from textrl_envs.sb3 import make_vec_env

out = sys.argv[1]
th.set_num_threads(1)
rank = distributed.get_rank()
HP = {
    "n_steps": 8,
    "batch_size": 16,
    "n_epochs": 2,
    "seed": 0,
    "learning_rate": 1e-3,
    "device": "cpu",
    "rollout_buffer_class": GRPODictRolloutBuffer,
}
#: micro-batches on the per-transition path (GSPO splits only whole sequences: the text fast path's)
MICRO = {"DrGRPO": 5, "DAPO": 5, "GSPO": None, "CISPO": 5, "ReinforcePP": 5}

for name, micro in MICRO.items():
    for mode in ("ddp", "fsdp"):
        env = make_vec_env(
            "TextGen-v0", n_envs=4, group_size=2, seed=distributed.rank_seed(0), device="cpu", max_new_tokens=6
        )
        model = getattr(sb3_grpo, name)("CausalLMPolicy", env, data_parallel=mode, micro_batch_size=micro, **HP)
        model.learn(2 * model.n_steps * model.n_envs)
        state = model.policy.state_dict()
        params = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in state.items()}
        th.save({"params": params}, os.path.join(out, f"{name}_{mode}_rank{rank}.pt"))
