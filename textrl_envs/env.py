"""TextGenEnv: one text-generation episode as a Gymnasium environment (the reference semantics)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from textrl_envs.core import EpisodeSpec, TextSpecAccess, build_spec, check_kwargs, encode_prompt
from textrl_envs.validation import check_choice, check_int, check_mapping

SPEC_KWARGS = (
    "task",
    "prompts",
    "reward",
    "reward_kwargs",
    "tokenizer",
    "max_new_tokens",
    "max_prompt_tokens",
    "prompt_truncation",
    "nonfinite_reward",
    "reward_timeout",
)


def make_spaces(spec: EpisodeSpec) -> tuple[spaces.Dict, spaces.Discrete]:
    """Observation and action spaces of one episode under ``spec``."""
    w = spec.window
    obs = spaces.Dict(
        {
            "input_ids": spaces.Box(0, spec.vocab_size - 1, shape=(w,), dtype=np.int64),
            "attention_mask": spaces.Box(0, 1, shape=(w,), dtype=np.int64),
        }
    )
    return obs, spaces.Discrete(spec.vocab_size)


def resolve_prompt(spec: EpisodeSpec, options: dict[str, Any] | None, rng: np.random.Generator, truncation: str):
    """Pick the episode's prompt: ``options["prompt"]`` (a text), ``options["prompt_index"]``, or a random one.

    :return: ``(index, text, ids)``; ``index`` is ``-1`` for a prompt given as text.
    """
    options = check_mapping("options", options, hint="e.g. options={'prompt': 'The movie was'} or {'prompt_index': 0}")
    options = options or {}
    unknown = set(options) - {"prompt", "prompt_index"}
    if unknown:
        raise ValueError(f"unknown reset option(s) {sorted(unknown)}; known: 'prompt' (str), 'prompt_index' (int)")
    if "prompt" in options and "prompt_index" in options:
        raise ValueError("give either options['prompt'] or options['prompt_index'], not both")
    if "prompt" in options:
        text = options["prompt"]
        if not isinstance(text, str):
            raise TypeError(f"options['prompt'] must be a str, got {type(text).__name__}")
        if text in spec.prompt_texts:
            i = spec.prompt_texts.index(text)
            return i, text, spec.prompt_ids[i]
        return -1, text, encode_prompt(spec.tokenizer, text, spec.max_prompt_tokens, truncation, "options['prompt']")
    if "prompt_index" in options:
        n = len(spec.prompt_texts)
        i = check_int(
            "options['prompt_index']", options["prompt_index"], low=0, high=n - 1, hint=f"the env has {n} prompt(s)"
        )
        return i, spec.prompt_texts[i], spec.prompt_ids[i]
    i = int(rng.integers(len(spec.prompt_texts)))
    return i, spec.prompt_texts[i], spec.prompt_ids[i]


class TextGenEnv(TextSpecAccess, gym.Env):
    """Text generation as an MDP: the state is the prompt plus the tokens so far, an action is the next token.

    ## Description
    Each episode samples a prompt, then the agent emits one token per step. The episode ends when the
    agent emits EOS or after ``max_new_tokens`` tokens, and the reward model scores the completion.
    Registered ids (``TextGen-v0`` and the rest of the suite) are subclasses with their own defaults;
    this class with ``prompts`` and ``reward`` builds any other task.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens``. The sequence so far is right-aligned (left padding):
    the newest token is at index ``W - 1``, padded slots on the left hold ``pad_token_id`` with mask 0.

    ## Rewards
    0 on every step but the last; on the last step, the reward model's score of the completion
    (the generated text without the prompt and without EOS), called with the prompt's metadata.

    ## Starting State
    A prompt drawn uniformly from ``prompts`` with the env's ``np_random``; ``reset(options=...)``
    picks one with ``{"prompt": str}`` or ``{"prompt_index": int}``.

    ## Episode End
    Terminated when the action is the EOS token; truncated when ``max_new_tokens`` tokens have been
    generated without EOS. The final ``info`` holds ``prompt``, ``completion``, ``completion_ids``
    (a tuple of ints, without EOS, so that vector envs can batch infos of different lengths),
    ``prompt_index`` and ``reward``.

    Outside time limits: a step is a token, so a text episode's length limit is ``max_new_tokens`` (or
    :meth:`set_max_new_tokens`), and an episode that ends by it is scored. A ``TimeLimit`` wrapper (also the one
    ``gym.make(id, max_episode_steps=k)`` adds) cuts the episode outside the env, which never sees the cut: that
    episode ends with reward 0, an empty ``info`` and no call to the reward model. The env notices at the next
    ``reset()`` (an episode still running, tokens generated) and warns once; pass ``max_new_tokens=k`` instead.
    The vector env takes ``max_episode_steps=k`` itself and ends and scores episodes at ``k`` tokens.

    ## Arguments
    ``gym.make(id, prompts=..., reward=..., tokenizer=..., max_new_tokens=..., max_prompt_tokens=...,
    prompt_truncation="left", reward_kwargs=None, nonfinite_reward="raise", reward_timeout=None)``; see
    :func:`textrl_envs.core.build_spec`. :meth:`set_max_new_tokens` lowers the episode budget (a curriculum).

    ## Vectorized environment
    ``gym.make_vec(id, num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`, which keeps N episodes as tensors on a device.

    ## Version History
    * v0: Initial version.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 30}
    #: The registered env id whose defaults this class uses (``None``: no defaults).
    default_task: str | None = None

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        spec_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in SPEC_KWARGS}
        check_kwargs(kwargs, type(self).__name__, SPEC_KWARGS + ("render_mode",))
        if render_mode is not None:
            check_choice("render_mode", render_mode, self.metadata["render_modes"], hint="or None")
        spec_kwargs.setdefault("task", self.default_task)
        self.prompt_truncation = spec_kwargs.get("prompt_truncation", "left")
        self.text_spec = build_spec(**spec_kwargs)
        self.render_mode = render_mode
        self.observation_space, self.action_space = make_spaces(self.text_spec)
        w = self.text_spec.window
        self._ids = np.full(w, self.text_spec.pad_token_id, dtype=np.int64)
        self._mask = np.zeros(w, dtype=np.int64)
        self._generated: list[int] = []
        self._prompt_index = -1
        self._prompt_text = ""
        self._done = True
        self._started = False
        self._warned_cut = False

    def _obs(self) -> dict[str, np.ndarray]:
        return {"input_ids": self._ids.copy(), "attention_mask": self._mask.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        spec = self.text_spec
        index, text, ids = resolve_prompt(spec, options, self.np_random, self.prompt_truncation)
        if self._started and not self._done and self._generated and not self._warned_cut:
            self._warned_cut = True
            warnings.warn(
                f"{type(self).__name__}: reset() while an episode was running ({len(self._generated)} of "
                f"{spec.budget} tokens generated). If an outside time limit cut it (a TimeLimit wrapper, or "
                "gym.make(..., max_episode_steps=k)), that episode got reward 0 and was never scored: limit text "
                "episodes with max_new_tokens=k instead, which ends and scores them. (Warned once per env; ignore it "
                "if you reset mid-episode on purpose.)",
                stacklevel=2,
            )
        self._prompt_index, self._prompt_text = index, text
        self._ids[:] = spec.pad_token_id
        self._mask[:] = 0
        n = len(ids)
        self._ids[-n:] = ids
        self._mask[-n:] = 1
        self._generated = []
        self._done = False
        self._started = True
        return self._obs(), {"prompt": text, "prompt_index": index}

    def step(self, action):
        if not self._started:
            raise RuntimeError("step() called before reset(); call env.reset() first")
        if self._done:
            raise RuntimeError("step() called after the episode ended; call env.reset() to start a new episode")
        token = self._check_action(action)
        spec = self.text_spec
        self._ids[:-1] = self._ids[1:]
        self._mask[:-1] = self._mask[1:]
        self._ids[-1] = token
        self._mask[-1] = 1
        self._generated.append(token)
        terminated = spec.eos_token_id is not None and token == spec.eos_token_id
        truncated = not terminated and len(self._generated) >= spec.budget
        reward = 0.0
        info: dict[str, Any] = {}
        if terminated or truncated:
            self._done = True
            ids = self._generated[:-1] if terminated else self._generated
            completion = spec.decode(ids)
            rewards, nonfinite = spec.score_flagged(
                [self._prompt_index], [completion], prompt_texts=[self._prompt_text]
            )
            reward = float(rewards[0])
            info = {
                "prompt": self._prompt_text,
                "completion": completion,
                "completion_ids": tuple(ids),
                "prompt_index": self._prompt_index,
                "reward": reward,
            }
            if spec.nonfinite_reward == "skip":
                info["reward_nonfinite"] = bool(nonfinite[0])
        if self.render_mode == "human":
            self.render()
        return self._obs(), reward, terminated, truncated, info

    def _check_action(self, action) -> int:
        a = np.asarray(action)
        if a.size != 1 or not (
            np.issubdtype(a.dtype, np.integer)
            or (np.issubdtype(a.dtype, np.floating) and float(a.reshape(-1)[0]).is_integer())
        ):
            raise ValueError(f"action must be one integer token id in [0, {self.text_spec.vocab_size}), got {action!r}")
        token = int(a.reshape(-1)[0])
        if not 0 <= token < self.text_spec.vocab_size:
            raise ValueError(
                f"action {token} is outside the action space Discrete({self.text_spec.vocab_size}); "
                "token ids must be in [0, len(tokenizer))"
            )
        return token

    def render(self) -> str | None:
        """``"ansi"``: the prompt and the completion so far, as text (``prompt|completion``); ``"human"``: print
        that text and return ``None`` (Gymnasium's convention)."""
        if self.render_mode is None:
            return None
        text = f"{self._prompt_text}|{self.text_spec.decode(self._generated)}"
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def decode(self, ids: Sequence[int]) -> str:
        """Decode token ids with the env's tokenizer (special tokens removed)."""
        return self.text_spec.decode(ids)
