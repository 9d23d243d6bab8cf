"""Worker of ``tests/test_distributed.py``: run under ``torchrun --nproc_per_node 2``.

Each rank trains GRPO for two updates on CartPole (MlpPolicy) and on TextGen-v0 (CausalLMPolicy, the text fast
path), then writes its final parameters and a fingerprint of its rollout to ``OUT/<name>_rank<r>.pt`` and tries to
save the model to ``OUT/<name>_rank<r>.zip`` (only rank 0 may write it).
"""

import importlib.util
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch as th
from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

from sb3_grpo import GRPO, distributed

out = sys.argv[1]
th.set_num_threads(1)
rank = distributed.get_rank()  # RANK, before GRPO starts the process group


def flat_params(model: GRPO) -> th.Tensor:
    return th.cat([p.detach().flatten().float() for p in model.policy.parameters()])


def report(name: str, model: GRPO, rollout_fingerprint: th.Tensor, initial: th.Tensor) -> None:
    th.save(
        {
            "params": flat_params(model),
            "initial": initial,
            "rollout": rollout_fingerprint,
            "seed": model.seed,
            "num_timesteps": model.num_timesteps,
            "n_log_outputs": len(model.logger.output_formats),
            "world_size": distributed.get_world_size(),
        },
        os.path.join(out, f"{name}_rank{rank}.pt"),
    )
    model.save(os.path.join(out, f"{name}_rank{rank}.zip"))


# CartPole, MlpPolicy: SB3's per-transition path
env = sb3_make_vec_env("CartPole-v1", n_envs=2, seed=distributed.rank_seed(0))
model = GRPO(
    "MlpPolicy",
    env,
    n_steps=32,
    batch_size=32,
    n_epochs=2,
    seed=0,
    target_kl=1.0,
    tensorboard_log=os.path.join(out, "tb"),
    verbose=1,
)
initial = flat_params(model)  # after the broadcast of rank 0's weights
model.learn(2 * 32 * 2)
report("cartpole", model, th.as_tensor(model.rollout_buffer.observations).flatten(), initial)

# TextGen-v0, CausalLMPolicy: whole-sequence minibatches (ranks may have different numbers per epoch)
from textrl_envs.sb3 import make_vec_env

env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=distributed.rank_seed(0), device="cpu", max_new_tokens=6)
TEXT_HP = dict(n_steps=8, batch_size=6, n_epochs=2, seed=0, advantage="group", kl_coef=0.05, grad_var_coef=0.0)
model = GRPO("CausalLMPolicy", env, learning_rate=1e-3, kl_target=0.01, target_kl=10.0, **TEXT_HP)
initial = flat_params(model)
model.learn(2 * 8 * 4)
report("textgen", model, model.rollout_buffer.token_ids.flatten().float(), initial)

# TextGen-v0 with LoRA: only the adapters and the value head are averaged; the KL reference is the adapter-off model
if importlib.util.find_spec("peft") is not None:
    lora = {"r": 4, "target_modules": ["c_attn"], "fan_in_fan_out": True}
    model = GRPO("CausalLMPolicy", env, learning_rate=1e-2, policy_kwargs={"lora": lora}, **TEXT_HP)
    initial = flat_params(model)
    model.learn(2 * 8 * 4)
    report("textgen_lora", model, model.rollout_buffer.token_ids.flatten().float(), initial)

# rank 0 alone loads a checkpoint (e.g. to evaluate it): GRPO.load makes no collective call, so it must not hang
if rank == 0:
    loaded = GRPO.load(os.path.join(out, "cartpole_rank0.zip"), device="cpu")
    th.save({"params": th.cat([p.detach().flatten().float() for p in loaded.policy.parameters()])},
            os.path.join(out, "rank0_loaded.pt"))  # fmt: skip
