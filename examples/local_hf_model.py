"""Train a Hugging Face model from a local directory: here a tiny GPT-2 built from a config.

Any causal LM directory works the same way (``save_pretrained`` output, or a downloaded checkpoint), as long as
its vocabulary covers the env's tokenizer. The env gets the tokenizer, the policy gets the model::

    python examples/local_hf_model.py
    python examples/local_hf_model.py --timesteps 96
"""

from __future__ import annotations

import argparse
import tempfile

import gymnasium as gym
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

import textrl_envs  # noqa: F401  (registers the ids)
from sb3_grpo import GRPO
from textrl_envs.assets import tokenizer_path


def build_model_dir(path: str) -> None:
    """Save a randomly initialised 2-layer GPT-2 and the bundled tokenizer into ``path``.

    :param path: An empty folder.
    """
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=480, help="env steps (tokens) to train for")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as model_dir:
        build_model_dir(model_dir)
        env = gym.make("TextGen-v0", tokenizer=model_dir, max_new_tokens=16)
        model = GRPO(
            "CausalLMPolicy",
            env,
            policy_kwargs={"model": model_dir},  # a local directory (or a PreTrainedModel object)
            n_steps=32,
            batch_size=32,
            n_epochs=1,  # settings for a pretrained LM: one pass over each rollout, a small step
            learning_rate=1e-4,
            gamma=1.0,
            seed=0,
            device="cpu",
        )
        model.learn(total_timesteps=args.timesteps)
        print(f"trained {sum(p.numel() for p in model.policy.parameters()):,} parameters from {model_dir}")
        print(f"last episodes' mean reward: {model.ep_info_buffer[-1]['r'] if model.ep_info_buffer else 'n/a'}")


if __name__ == "__main__":
    main()
