"""Data-parallel GRPO with torch.distributed: every process steps its own envs, gradients are averaged.

The same script runs on one process (``python examples/distributed_train.py``) or many, launched with torchrun::

    # one machine, 2 processes (gloo on CPU, NCCL with one GPU per process when CUDA is available)
    torchrun --nproc_per_node 2 examples/distributed_train.py

    # two machines with 8 GPUs each: run on both, with --node_rank 0 on the first and --node_rank 1 on the second
    torchrun --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 --nproc_per_node 8 \\
        examples/distributed_train.py --timesteps 100000

``GRPO`` starts the process group from torchrun's environment variables, broadcasts rank 0's weights, seeds rank
``r`` with ``seed + 1000 * r``, averages gradients after each backward pass, and logs and saves on rank 0 only
(see ``sb3_grpo.distributed``). ``--timesteps`` counts each rank's own env steps (``num_timesteps``), so the run
sees ``world_size`` times as many in total.
"""

from __future__ import annotations

import argparse

from sb3_grpo import GRPO, distributed
from textrl_envs.sb3 import make_vec_env

PROMPTS = [
    "The movie was",
    "My day at the beach",
    "The food at the new place",
    "Our trip to the mountains",
    "The concert last night",
    "This book is",
    "The weather today",
    "My new job",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=1024, help="env steps (tokens) per rank")
    parser.add_argument("--n-envs", type=int, default=8, help="envs per rank (the same on every rank)")
    parser.add_argument("--seed", type=int, default=0, help="rank r uses seed + 1000 * r")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (needs peft)")
    parser.add_argument("--save", default=None, help="save the model here (rank 0 writes it)")
    args = parser.parse_args()

    distributed.setup()  # optional: GRPO would start the process group itself; here we need the rank first
    device = distributed.local_device("auto")  # cuda:LOCAL_RANK on a GPU machine, else cpu
    env = make_vec_env(
        "TextGen-v0",
        n_envs=args.n_envs,
        group_size=4,
        device=device,
        seed=distributed.rank_seed(args.seed),
        prompts=distributed.shard(PROMPTS),  # each rank its own prompts
        max_new_tokens=16,
    )
    policy_kwargs = {"lora": {"r": 8, "target_modules": ["c_attn"], "fan_in_fan_out": True}} if args.lora else {}
    model = GRPO(
        "CausalLMPolicy",
        env,
        n_steps=16,
        batch_size=64,
        n_epochs=2,  # settings for a pretrained LM: few epochs, a small step, a KL penalty (below)
        learning_rate=1e-4,
        gamma=1.0,
        advantage="group",
        kl_coef=0.02,
        grad_var_coef=0.0,
        seed=args.seed,
        device=device,
        policy_kwargs=policy_kwargs,
        verbose=1,
    )
    model.learn(total_timesteps=args.timesteps)
    if args.save:
        model.save(args.save)  # a no-op on ranks > 0
    if distributed.is_main_process():
        print(
            f"world_size={distributed.get_world_size()}: {model.num_timesteps} steps per rank, "
            f"{model.num_timesteps * distributed.get_world_size()} in total"
        )


if __name__ == "__main__":
    main()
