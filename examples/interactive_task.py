"""Write your own interactive task: the environment answers each turn, and the agent may try again.

An :class:`~textrl_envs.interaction.Interaction` starts an episode (its state, here a sum drawn with the episode's
generator), may speak first (``opening``), and replies to every agent turn with text, a reward and whether the
episode is over. Any text env takes it as ``interaction=``; GRPO and PPO train on it unchanged::

    python examples/interactive_task.py
    python examples/interactive_task.py --timesteps 256
"""

from __future__ import annotations

import argparse

from stable_baselines3.common.evaluation import evaluate_policy

from sb3_grpo import GRPO
from textrl_envs.interaction import Interaction, Reply
from textrl_envs.sb3 import make_vec_env


class AddWithRetries(Interaction):
    """Answer ``a+b=``; a wrong answer gets ``"No. a+b="`` and another try. Reward 1 / (turns taken)."""

    def start(self, prompt, metadata, rng):  # noqa: ARG002  (the protocol's signature; this task needs only rng)
        a, b = (int(x) for x in rng.integers(0, 10, size=2))
        return {"a": a, "b": b}

    def opening(self, state):
        return f" {state['a']}+{state['b']}="

    def reply(self, state, text, turn):
        if text.strip() == str(state["a"] + state["b"]):
            return Reply("Yes!", reward=1.0 / turn, done=True)
        return Reply(f"No. {state['a']}+{state['b']}=")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=2048, help="env steps (agent tokens) to train for")
    args = parser.parse_args()
    task = {"prompts": ["Add:"], "interaction": AddWithRetries(), "max_turns": 3, "max_new_tokens": 30}
    env = make_vec_env("TextGen-v0", n_envs=8, group_size=4, seed=0, **task)
    # settings for a pretrained LM (SB3's 10 epochs at 3e-4 move it far from where it started): two passes over each
    # rollout, a small step, and a KL penalty to the initial model (logged as train/kl_ref)
    model = GRPO(
        "CausalLMPolicy",
        env,
        advantage="group",
        n_steps=32,
        batch_size=128,
        n_epochs=2,
        learning_rate=1e-4,
        kl_coef=0.05,
        seed=0,
        device="cpu",
    )
    eval_env = make_vec_env("TextGen-v0", n_envs=8, seed=100, **task)
    before, _ = evaluate_policy(model, eval_env, n_eval_episodes=32, deterministic=False)
    model.learn(total_timesteps=args.timesteps)
    after, _ = evaluate_policy(model, eval_env, n_eval_episodes=32, deterministic=False)
    print(f"mean reward: before {before:.3f}, after {after:.3f} ({args.timesteps} agent tokens of training)")


if __name__ == "__main__":
    main()
