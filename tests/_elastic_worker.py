"""Worker of ``tests/test_elastic.py``: run under ``torchrun --nproc_per_node 2 --max-restarts 1``.

    _elastic_worker.py OUT [--kill]

Trains GRPO on CartPole for 8 updates with :class:`~sb3_grpo.callbacks.ElasticCheckpointCallback` (a checkpoint
after every update) into ``OUT/ckpt``. With ``--kill``, rank 1 SIGKILLs itself in the sixth rollout of the first
attempt; torchrun then restarts both ranks, which resume from the newest checkpoint. Each rank writes what it ended
with to ``OUT/rank<r>.pt``.
"""

import os
import signal
import sys

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_grpo import GRPO, distributed
from sb3_grpo.callbacks import ElasticCheckpointCallback

out, kill = sys.argv[1], "--kill" in sys.argv[2:]
th.set_num_threads(1)
rank = distributed.get_rank()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
N_STEPS, UPDATES = 32, 8


class DieOnce(BaseCallback):
    def _on_step(self) -> bool:
        if kill and attempt == 0 and rank == 1 and self.model.num_timesteps >= 5 * N_STEPS + 8:
            os.kill(os.getpid(), signal.SIGKILL)
        return True


env = make_vec_env("CartPole-v1", n_envs=1, seed=distributed.rank_seed(0))
model = GRPO("MlpPolicy", env, n_steps=N_STEPS, batch_size=N_STEPS, n_epochs=1, seed=0, grad_var_coef=0.0, device="cpu")
checkpoints = ElasticCheckpointCallback(1, os.path.join(out, "ckpt"))
model.learn(UPDATES * N_STEPS, callback=[checkpoints, DieOnce()])
th.save(
    {
        "attempt": attempt,
        "resumed_from": None if checkpoints.resumed_from is None else checkpoints.resumed_from.name,
        "num_timesteps": model.num_timesteps,
        "n_updates": model._n_updates,
        "params": th.cat([p.detach().flatten() for p in model.policy.parameters()]),
    },
    os.path.join(out, f"rank{rank}.pt"),
)
