"""Rollout throughput of ``CausalLMPolicy`` in stock SB3 ``collect_rollouts`` vs ``model.generate``.

Measured side by side in one run, on the same model, batch and length:

1. tokens/s of SB3 ``PPO.collect_rollouts`` with ``CausalLMPolicy`` (KV cache on), ``n_envs`` envs x ``tokens`` steps;
2. tokens/s of ``model.generate(do_sample=True)`` on the same prompts, ``min_new_tokens = max_new_tokens = tokens``;
3. the same rollout loop with the cache off (``use_cache=False``: every step recomputes every prefix) against the
   cached loop, at ``long_tokens`` steps.

Models: the bundled LM (``textrl_envs.assets.lm_path()``; when it has not been built yet, a randomly initialised
model with its configuration, GPT-2 n_layer=4, n_embd=128, vocab 1600, labelled "stand-in") and a GPT-2-small-size
model built from config (n_layer=12, n_embd=768, vocab 50257, random weights). Episodes never hit EOS, so every row
generates exactly ``tokens`` tokens; the envs truncate at the budget and auto-reset, as the real vector env does, and
SB3 bootstraps each truncated env with ``predict_values(terminal_obs)`` inside the timed loop.

The env here is a minimal stand-in VecEnv with the observation contract of ``textrl_envs`` (right-aligned window,
append the action, EOS / truncation, same-step autoreset) and random prompts of one length, so that ``generate`` gets
exactly the same input; ``sb3-grpo perf`` times the same comparison on the real vector env (``TextGen-v0``).

Usage::

    HF_HUB_OFFLINE=1 python scripts/bench_rollout.py                  # both models, 16 envs, 32 / 64 tokens
    HF_HUB_OFFLINE=1 python scripts/bench_rollout.py --models bundled --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo.policies import CausalLMPolicy


class BenchTextVecEnv(VecEnv):
    """Stand-in for the text vector env: right-aligned window, one appended token per step, autoreset.

    :param n_envs: number of envs.
    :param vocab: action space size.
    :param prompt_len: tokens per prompt (random ids, fixed length so ``generate`` gets the same input).
    :param max_new: token budget per episode (truncation).
    :param eos_id: token that ends an episode (``None``: never).
    :param seed: prompt seed.
    """

    def __init__(
        self,
        n_envs: int,
        vocab: int,
        prompt_len: int,
        max_new: int,
        eos_id: int | None = None,
        seed=0,
    ):
        self.width, self.prompt_len, self.max_new, self.eos_id = (
            prompt_len + max_new,
            prompt_len,
            max_new,
            eos_id,
        )
        space = spaces.Dict(
            {
                "input_ids": spaces.Box(0, vocab - 1, (self.width,), np.int64),
                "attention_mask": spaces.Box(0, 1, (self.width,), np.int64),
            }
        )
        super().__init__(n_envs, space, spaces.Discrete(vocab))
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.ids = np.zeros((n_envs, self.width), np.int64)
        self.mask = np.zeros((n_envs, self.width), np.int64)
        self.generated = np.zeros(n_envs, np.int64)
        self._actions = None

    def prompts(self) -> np.ndarray:
        """The current prompts (``[n_envs, prompt_len]``), e.g. to feed ``generate``."""
        return self.ids[:, -self.prompt_len :].copy()

    def _reset_row(self, i: int) -> None:
        self.ids[i] = 0
        self.mask[i] = 0
        self.ids[i, -self.prompt_len :] = self.rng.integers(4, self.vocab, self.prompt_len)
        self.mask[i, -self.prompt_len :] = 1
        self.generated[i] = 0

    def _obs(self) -> dict:
        return {"input_ids": self.ids.copy(), "attention_mask": self.mask.copy()}

    def reset(self):
        for i in range(self.num_envs):
            self._reset_row(i)
        return self._obs()

    def step_async(self, actions):
        self._actions = np.asarray(actions).reshape(-1)

    def step_wait(self):
        self.ids = np.roll(self.ids, -1, axis=1)
        self.mask = np.roll(self.mask, -1, axis=1)
        self.ids[:, -1] = self._actions
        self.mask[:, -1] = 1
        self.generated += 1
        rewards = np.zeros(self.num_envs, np.float32)
        dones = np.zeros(self.num_envs, bool)
        infos = [{} for _ in range(self.num_envs)]
        for i in range(self.num_envs):
            eos = self.eos_id is not None and self._actions[i] == self.eos_id
            if eos or self.generated[i] >= self.max_new:
                dones[i] = True
                infos[i]["terminal_observation"] = {
                    "input_ids": self.ids[i].copy(),
                    "attention_mask": self.mask[i].copy(),
                }
                infos[i]["TimeLimit.truncated"] = not eos
                self._reset_row(i)
        return self._obs(), rewards, dones, infos

    def close(self):
        pass

    def get_attr(self, attr_name, indices=None):  # noqa: ARG002  (SB3 VecEnv's signature)
        return [getattr(self, attr_name, None)] * self.num_envs

    def set_attr(self, attr_name, value, indices=None):  # noqa: ARG002  (SB3 VecEnv's signature)
        setattr(self, attr_name, value)

    def env_method(self, method_name, *args, indices=None, **kwargs):  # noqa: ARG002  (SB3 VecEnv's signature)
        return [None] * self.num_envs

    def env_is_wrapped(self, wrapper_class, indices=None):  # noqa: ARG002  (SB3 VecEnv's signature)
        return [False] * self.num_envs


def load_models(names: list[str]) -> list[tuple[str, th.nn.Module]]:
    """Build the benchmark models (random weights unless the bundled LM exists)."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    models = []
    for name in names:
        th.manual_seed(0)
        if name == "bundled":
            try:
                from textrl_envs.assets import lm_path

                models.append(
                    (
                        "bundled LM",
                        AutoModelForCausalLM.from_pretrained(lm_path(), local_files_only=True),
                    )
                )
            except (ImportError, AttributeError, FileNotFoundError) as e:
                print(f"[bundled LM not available ({type(e).__name__}); using a random stand-in with its config]")
                cfg = GPT2Config(
                    vocab_size=1600,
                    n_positions=256,
                    n_embd=128,
                    n_layer=4,
                    n_head=4,
                    resid_pdrop=0.0,
                    embd_pdrop=0.0,
                    attn_pdrop=0.0,
                    bos_token_id=1,
                    eos_token_id=2,
                )
                models.append(("bundled-size stand-in (GPT-2 4x128)", GPT2LMHeadModel(cfg)))
        elif name == "gpt2-small":
            cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
            models.append(("GPT-2-small size (12x768)", GPT2LMHeadModel(cfg)))
        else:
            raise ValueError(f"unknown model {name!r}; known: bundled, gpt2-small")
    for _, lm in models:
        lm.eval()
    return models


def time_collect(
    lm,
    vocab: int,
    n_envs: int,
    prompt_len: int,
    tokens: int,
    use_cache: bool,
    repeats: int,
    warmup: bool = True,
    env_name: str = "stand-in",
) -> list[float]:
    """Seconds per ``collect_rollouts`` of ``tokens`` steps (each repeat starts from fresh prompts and no cache)."""
    if env_name == "textgen":
        from textrl_envs.sb3 import make_vec_env

        env = make_vec_env("TextGen-v0", n_envs=n_envs, device="cpu", seed=0, max_new_tokens=tokens)
    else:
        env = BenchTextVecEnv(n_envs, vocab, prompt_len, tokens)
    model = PPO(
        CausalLMPolicy,
        env,
        n_steps=tokens,
        batch_size=n_envs * tokens,
        n_epochs=1,
        seed=0,
        device="cpu",
        policy_kwargs={"model": lm, "use_cache": use_cache},
    )
    _, callback = model._setup_learn(n_envs * tokens * (repeats + 1), None, progress_bar=False)
    times = []
    for r in range(int(warmup), repeats + 1):  # run 0 warms up
        model._last_obs = env.reset()
        model._last_episode_starts = np.ones(n_envs, bool)
        model.policy.reset_cache()
        t0 = time.perf_counter()
        assert model.collect_rollouts(env, callback, model.rollout_buffer, n_rollout_steps=tokens)
        if r or not warmup:
            times.append(time.perf_counter() - t0)
    return times


def time_generate(lm, vocab: int, n_envs: int, prompt_len: int, tokens: int, repeats: int) -> list[float]:
    """Seconds per ``generate(do_sample=True)`` of ``tokens`` new tokens for ``n_envs`` prompts."""
    env = BenchTextVecEnv(n_envs, vocab, prompt_len, tokens, seed=1)
    env.reset()
    ids = th.as_tensor(env.prompts())
    mask = th.ones_like(ids)
    times = []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        with th.no_grad():
            out = lm.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=0,
            )
        assert out.shape[1] == prompt_len + tokens
        if r:
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["bundled", "gpt2-small"])
    p.add_argument("--n-envs", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument(
        "--tokens",
        type=int,
        default=32,
        help="tokens per env for the generate comparison",
    )
    p.add_argument(
        "--long-tokens",
        type=int,
        default=64,
        help="tokens per env for the cache-off comparison",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--uncached-repeats",
        type=int,
        default=1,
        help="repeats of the slow cache-off loop",
    )
    p.add_argument(
        "--env",
        choices=["stand-in", "textgen"],
        default="stand-in",
        help="stand-in: this script's VecEnv (fixed prompt length, no EOS); textgen: textrl_envs.sb3.make_vec_env"
        "('TextGen-v0') with its bundled tokenizer, prompts and EOS (episodes may end early: more prefills)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for every measurement (1 is fastest on a small, shared CPU)",
    )
    args = p.parse_args()
    th.set_num_threads(args.threads)
    print(
        f"torch {th.__version__}, {th.get_num_threads()} threads; {args.n_envs} envs, prompt {args.prompt_len} "
        f"tokens; env {args.env}; medians of {args.repeats} repeats (cache-off: {args.uncached_repeats}, no warm-up) "
        "after one warm-up"
    )
    rows = []
    for label, lm in load_models(args.models):
        vocab = lm.config.vocab_size
        n_tok = args.n_envs * args.tokens
        gen = statistics.median(time_generate(lm, vocab, args.n_envs, args.prompt_len, args.tokens, args.repeats))
        col = statistics.median(
            time_collect(
                lm,
                vocab,
                args.n_envs,
                args.prompt_len,
                args.tokens,
                True,
                args.repeats,
                env_name=args.env,
            )
        )
        n_long = args.n_envs * args.long_tokens
        cached = statistics.median(
            time_collect(
                lm,
                vocab,
                args.n_envs,
                args.prompt_len,
                args.long_tokens,
                True,
                args.repeats,
                env_name=args.env,
            )
        )
        uncached = statistics.median(
            time_collect(
                lm,
                vocab,
                args.n_envs,
                args.prompt_len,
                args.long_tokens,
                False,
                args.uncached_repeats,
                warmup=False,
                env_name=args.env,
            )
        )
        rows.append(
            (
                label,
                n_tok / col,
                n_tok / gen,
                gen / col,
                n_long / cached,
                n_long / uncached,
                uncached / cached,
            )
        )
        print(f"\n{label}")
        print(
            f"  {args.tokens} tokens: collect_rollouts {n_tok / col:8.0f} tok/s | generate {n_tok / gen:8.0f} tok/s"
            f" | ratio {gen / col:.2f}x"
        )
        print(
            f"  {args.long_tokens} tokens: cached {n_long / cached:8.0f} tok/s | cache off {n_long / uncached:8.0f} "
            f"tok/s | speed-up {uncached / cached:.1f}x"
        )
    print(
        "\n| model | collect_rollouts tok/s | generate tok/s | ratio | cached tok/s (long) | cache-off tok/s "
        "| speed-up |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, c, g, ratio, lc, lu, speed in rows:
        print(f"| {label} | {c:.0f} | {g:.0f} | {ratio:.2f}x | {lc:.0f} | {lu:.0f} | {speed:.1f}x |")


if __name__ == "__main__":
    main()
