"""The vector env's rows: against ``SyncVectorEnv`` (a cheap reward, and the env's default reward), ``device="auto"``
against ``device="cpu"``, and random actions over the whole vocabulary (special tokens included) against word tokens.

Actions are drawn beforehand, so only the env is timed. The batched env's step has a fixed cost (tens of microseconds
of numpy calls) and ``SyncVectorEnv``'s grows with each env, so the ratio grows with the number of envs: the rows run
256 envs, the size at which a batched env pays; at 64 envs the fixed cost weighs about twice as much. Random word
tokens never end an episode early; random tokens over the whole vocabulary include EOS, which ends episodes at random
steps (and the pad token, which does not)."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.timing import interleaved, length_reward, rate_row, synchronizer

__all__ = ["vector_env_auto_vs_cpu", "vector_env_special_tokens", "vector_env_vs_sync"]


def _vector_env(env_id: str, num_envs: int, device: Any, **kwargs: Any) -> Any:
    import gymnasium as gym

    import textrl_envs  # noqa: F401  (registers the ids)

    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", device=device, **kwargs)


def _runner(env: Any, actions: np.ndarray) -> Any:
    def run() -> None:
        env.reset(seed=0)
        for a in actions:
            env.step(a)

    return run


def _word_ids(tokenizer: Any) -> np.ndarray:
    special = set(tokenizer.all_special_ids)
    return np.array([i for i in range(len(tokenizer)) if i not in special])


def vector_env_vs_sync(
    num_envs: int = 256,
    steps: int = 320,
    repeats: int = 3,
    env_id: str = "TextGen-v0",
    max_new_tokens: int = 32,
    default_reward: bool = False,
    device: Any = "cpu",
) -> dict:
    """Median env steps/s of the batched text env and of ``SyncVectorEnv`` over the same random word tokens.

    :param num_envs: Envs per vector env.
    :param steps: Vector steps per timed repeat.
    :param repeats: Timed repeats (median).
    :param env_id: A text env id.
    :param max_new_tokens: Tokens per episode.
    :param default_reward: Score with the env's own reward (VADER for TextGen-v0) instead of a cheap length reward.
    :param device: The vector env's device.
    :return: A row.
    """
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if not default_reward:
        kwargs["reward"] = length_reward
    vec = _vector_env(env_id, num_envs, device, **kwargs)
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    words = _word_ids(vec.unwrapped.text_spec.tokenizer)
    actions = words[np.random.default_rng(0).integers(0, len(words), (steps, num_envs))]
    t, c = interleaved({"vec": _runner(vec, actions), "sync": _runner(sync, actions)}, repeats, synchronizer(device))
    vec.close()
    sync.close()
    n = actions.size
    reward = "its default reward" if default_reward else "a length reward"
    return rate_row(
        f"env: TextGenVectorEnv vs SyncVectorEnv ({'default' if default_reward else 'cheap'} reward)",
        n,
        (t, c),
        ("vec", "sync"),
        "env steps/s",
        f"{env_id}, {num_envs} envs on {device}, {max_new_tokens}-token episodes, {steps} random-token steps x "
        f"{repeats} (median), {reward}",
        target=None if default_reward else (">=", 20.0),
    )


def vector_env_auto_vs_cpu(
    num_envs: int = 256, steps: int = 320, repeats: int = 5, env_id: str = "TextGen-v0", max_new_tokens: int = 32
) -> dict:
    """Env steps/s with ``device="auto"`` (the default) against ``device="cpu"``, cheap reward, calls interleaved.

    On a machine without CUDA both must take the same path; on a GPU machine ``"auto"`` is the GPU (the row then
    compares the two devices).

    :return: A row (target: at least 0.95x).
    """
    envs = {
        d: _vector_env(env_id, num_envs, d, reward=length_reward, max_new_tokens=max_new_tokens)
        for d in ("auto", "cpu")
    }
    words = _word_ids(envs["cpu"].unwrapped.text_spec.tokenizer)
    actions = words[np.random.default_rng(0).integers(0, len(words), (steps, num_envs))]
    t, c = interleaved({d: _runner(e, actions) for d, e in envs.items()}, repeats, synchronizer("auto"))
    resolved = envs["auto"].unwrapped.device
    for e in envs.values():
        e.close()
    n = actions.size
    return rate_row(
        'env: device="auto" vs device="cpu"',
        n,
        (t, c),
        ("auto", "cpu"),
        "env steps/s",
        f"{env_id}, {num_envs} envs, {max_new_tokens}-token episodes, random word tokens, length reward; "
        f'"auto" resolved to {resolved}',
        target=(">=", 0.95),
    )


def vector_env_special_tokens(
    num_envs: int = 256,
    steps: int = 320,
    repeats: int = 5,
    env_id: str = "TextGen-v0",
    max_new_tokens: int = 32,
    device: Any = "cpu",
) -> list[dict]:
    """Env steps/s with random actions over the whole vocabulary (special tokens included) against random word
    tokens; and with only the pad token added (no EOS), which separates the decoding of special tokens from the cost
    of episodes that end at random steps.

    :return: Two rows (target: within 20%, at least 0.8x).
    """
    vec = _vector_env(env_id, num_envs, device, reward=length_reward, max_new_tokens=max_new_tokens)
    tokenizer = vec.unwrapped.text_spec.tokenizer
    words = _word_ids(tokenizer)
    rng = np.random.default_rng(0)
    plain = words[rng.integers(0, len(words), (steps, num_envs))]
    everything = rng.integers(0, len(tokenizer), (steps, num_envs))
    eos = tokenizer.eos_token_id
    no_eos = np.where(everything == eos, plain, everything) if eos is not None else everything
    t, c = interleaved(
        {"words": _runner(vec, plain), "all": _runner(vec, everything), "no-eos": _runner(vec, no_eos)},
        repeats,
        synchronizer(device),
    )
    vec.close()
    n = plain.size
    ends = int((everything == eos).sum()) if eos is not None else 0
    common = f"{env_id}, {num_envs} envs on {device}, {max_new_tokens}-token budget, length reward"
    return [
        rate_row(
            "env: random tokens incl. special (pad, EOS) vs word tokens",
            n,
            (t, c),
            ("all", "words"),
            "env steps/s",
            f"{common}; uniform over all {len(tokenizer)} ids: {ends} EOS end episodes at random steps",
            target=(">=", 0.8),
        ),
        rate_row(
            "env: random tokens incl. special except EOS vs word tokens",
            n,
            (t, c),
            ("no-eos", "words"),
            "env steps/s",
            f"{common}; uniform over all ids, EOS replaced by a word (pad and other special tokens decoded)",
            target=(">=", 0.8),
        ),
    ]
