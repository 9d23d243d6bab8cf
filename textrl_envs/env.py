"""TextGenEnv: one text-generation episode as a Gymnasium environment (the reference semantics)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from textrl_envs.core import EpisodeSpec, TextSpecAccess, build_spec, check_kwargs, encode_prompt
from textrl_envs.groups import draw_weighted, prompt_draw_cdf
from textrl_envs.interaction import TASK_SEED_BOUND, answer_turns, episode_infos, episode_messages, start_episode
from textrl_envs.rendering import transcript_frame
from textrl_envs.turns import (
    ReplyEncoder,
    check_opening,
    turn_episode_ends,
    turns_over,
    who,
    written_opening,
    written_reply,
)
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
    "interaction",
    "max_turns",
    "turn_end",
    "max_turn_tokens",
    "chat_template",
    "system_prompt",
    "instruct",
    "tools",
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


def resolve_prompt(
    spec: EpisodeSpec,
    options: dict[str, Any] | None,
    rng: np.random.Generator,
    truncation: str,
    cdf: np.ndarray | None = None,
):
    """Pick the episode's prompt: ``options["prompt"]`` (a text), ``options["prompt_index"]``, or a random one
    (uniform, or by the prompt-draw weights whose cumulative sums are ``cdf``).

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
        if not isinstance(text, str) and not (spec.chat_template is not None and isinstance(text, list)):
            raise TypeError(f"options['prompt'] must be a str, got {type(text).__name__}")
        text = spec.render(text)  # a user message (or messages) rendered like the prompts, with a chat template
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
    i = int(rng.integers(len(spec.prompt_texts))) if cdf is None else draw_weighted(rng, cdf)
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

    ## Interactive episodes
    With an ``interaction`` (:class:`~textrl_envs.interaction.Interaction`; the interactive ids such as
    ``GuessNumber-v0`` bring their own) the environment answers: an agent turn ends at a ``turn_end`` token (EOS
    by default), after ``max_turn_tokens`` tokens, or when the budget is spent; the interaction's reply (text,
    reward, done) is appended to the observation in the same step and its reward paid on that step. The episode
    is terminated when a reply says so, truncated after ``max_turns`` turns or when ``max_new_tokens`` tokens
    (every token after the prompt, the replies' included) are spent. Each episode starts the interaction with
    its prompt and a generator seeded by one draw of ``np_random`` (after the prompt's). The final ``info``
    adds ``turns`` (agent turns taken) and ``transcript`` (``[{"role": "env" | "agent", "text": str}, ...]``,
    from the prompt on); ``completion_ids`` are every token after the prompt (agent's and env's) and
    ``completion`` their text. Every step's ``info`` holds ``turn``: the index of the agent turn the action
    belonged to (0 for the first), which turn-level credit (``advantage="group_turn"``) reads.

    ## Arguments
    ``gym.make(id, prompts=..., reward=..., tokenizer=..., max_new_tokens=..., max_prompt_tokens=...,
    prompt_truncation="left", reward_kwargs=None, nonfinite_reward="raise", reward_timeout=600.0,
    interaction=None, max_turns=None, turn_end=None, max_turn_tokens=None, chat_template=None, system_prompt=None,
    instruct=None, tools=None)``; see :func:`textrl_envs.core.build_spec`. ``prompts`` may also be a ``.jsonl``,
    ``.json``, ``.csv`` or ``.txt`` path or a ``datasets.Dataset`` (:mod:`textrl_envs.data`); ``chat_template=True``
    renders prompts with the tokenizer's chat template (:mod:`textrl_envs.chat`), under ``system_prompt`` when given;
    ``instruct=True`` asks a task with a checkable answer the way an instruct model is asked
    (:mod:`textrl_envs.instruct`); ``tools=[...]`` lets the model call Python functions (:mod:`textrl_envs.tools`).
    :meth:`set_max_new_tokens` lowers the episode budget
    (a curriculum).

    ## Vectorized environment
    ``gym.make_vec(id, num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`, which keeps N episodes as tensors on a device.

    ## Version History
    * v0: Initial version.
    """

    metadata = {"render_modes": ["ansi", "human", "rgb_array"], "render_fps": 30}
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
        self._opened = 0  # tokens of the episode's opening at the start of _generated
        self._prompt_index = -1
        self._prompt_text = ""
        self._prompt_weights: np.ndarray | None = None
        self._prompt_cdf: np.ndarray | None = None
        self._done = True
        self._started = False
        if self.text_spec.interactive:
            self._replies = ReplyEncoder(self.text_spec.tokenizer, w, who(self.text_spec))
            self._turn: list[int] = []
            self._turns = 0
            self._transcript: list[dict[str, str]] = []
            self._task_state: Any = None
            self._nonfinite = False
        self._warned_cut = False

    def _obs(self) -> dict[str, np.ndarray]:
        return {"input_ids": self._ids.copy(), "attention_mask": self._mask.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        spec = self.text_spec
        index, text, ids = resolve_prompt(spec, options, self.np_random, self.prompt_truncation, self._prompt_cdf)
        acted = len(self._generated) > self._opened  # the agent wrote a token (an opening is not its doing)
        if self._started and not self._done and acted and not self._warned_cut:
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
        self._generated, self._opened = [], 0
        if spec.interactive:
            self._start_interaction(index, text)
        self._done = False
        self._started = True
        return self._obs(), {"prompt": text, "prompt_index": index}

    def _start_interaction(self, index: int, text: str) -> None:
        spec = self.text_spec
        seed = int(self.np_random.integers(TASK_SEED_BOUND))
        meta = {k: v[index] for k, v in spec.metadata.items()} if index >= 0 else {}
        self._task_state, opening = start_episode(spec.interaction, text, meta, seed, spec.task_id)
        self._transcript = [{"role": "env", "text": text}]
        self._turn, self._turns, self._nonfinite = [], 0, False
        written = written_opening(spec, opening)
        if written:
            ids = self._replies.whole(written)
            check_opening(spec, len(ids))  # its whole length: one past the window is refused, never cut
            self._append(ids)
            self._generated.extend(ids)
            self._opened = len(ids)
            self._transcript.append({"role": "env", "text": opening})

    def _append(self, tokens: Sequence[int]) -> None:
        """Append tokens to the window, dropping the oldest on the left when it is full."""
        k, w = len(tokens), len(self._ids)
        if k >= w:
            self._ids[:], self._mask[:] = tokens[-w:], 1
            return
        self._ids[:-k], self._mask[:-k] = self._ids[k:].copy(), self._mask[k:].copy()
        self._ids[-k:], self._mask[-k:] = tokens, 1

    def step(self, action):
        if not self._started:
            raise RuntimeError("step() called before reset(); call env.reset() first")
        if self._done:
            raise RuntimeError("step() called after the episode ended; call env.reset() to start a new episode")
        token = self._check_action(action)
        if self.text_spec.interactive:
            return self._step_turn(token)
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
            rewards, nonfinite, parts = spec.score_detailed(
                [self._prompt_index], [completion], prompt_texts=[self._prompt_text], completion_ids=[ids]
            )
            reward = float(rewards[0])
            info = {
                "prompt": self._prompt_text,
                "completion": completion,
                "completion_ids": tuple(ids),
                "prompt_index": self._prompt_index,
                "reward": reward,
            }
            if parts is not None:
                info["reward_components"] = parts[0]
            if spec.nonfinite_reward == "skip":
                info["reward_nonfinite"] = bool(nonfinite[0])
        if self.render_mode == "human":
            self.render()
        return self._obs(), reward, terminated, truncated, info

    def _step_turn(self, token: int):
        """One agent token of an interactive episode; answers the turn it ends (the reference semantics)."""
        spec = self.text_spec
        turn_index = self._turns  # the agent turn this token belongs to (0 for the first)
        self._append([token])
        self._generated.append(token)
        self._turn.append(token)
        reward, terminated, truncated = 0.0, False, False
        used = np.array([len(self._generated)])
        if turns_over(np.array([token]), np.array([len(self._turn)]), used, spec.turn_end_ids,
                      spec.max_turn_tokens, spec.budget)[0]:  # fmt: skip
            text = spec.decode(self._turn)
            self._turns += 1
            self._transcript.append({"role": "agent", "text": text})
            replies, rewards, done, bad = answer_turns(
                spec.interaction, [self._task_state], [text], [self._turns], task=spec.task_id,
                timeout=spec.reward_timeout, nonfinite=spec.nonfinite_reward,
            )  # fmt: skip
            reward, self._nonfinite = float(rewards[0]), self._nonfinite or bool(bad[0])
            if replies[0] is not None:
                ids = self._replies(written_reply(spec, replies[0], token, bool(done[0])))
                self._append(ids)
                self._generated.extend(ids)
                self._transcript.append({"role": "env", "text": replies[0]})
            self._turn = []
            used = np.array([len(self._generated)])
            ends = turn_episode_ends(done, np.array([self._turns]), used, spec.max_turns, spec.budget)
            terminated, truncated = bool(ends[0][0]), bool(ends[1][0])
        info: dict[str, Any] = {}
        if terminated or truncated:
            self._done = True
            reward, info = self._final_turn_info(reward)
        info["turn"] = turn_index
        if self.render_mode == "human":
            self.render()
        return self._obs(), reward, terminated, truncated, info

    def _final_turn_info(self, reward: float) -> tuple[float, dict[str, Any]]:
        """The last step's reward (plus the end-of-episode reward, if any) and the final info."""
        spec = self.text_spec
        completion = spec.decode(self._generated)
        nonfinite, parts = self._nonfinite, None
        if spec.reward is not None:
            end, bad, parts = spec.score_detailed(
                [self._prompt_index], [completion], prompt_texts=[self._prompt_text], completion_ids=[self._generated],
                completion_messages=episode_messages(spec.interaction, [self._task_state]),
            )  # fmt: skip
            reward, nonfinite = reward + float(end[0]), nonfinite or bool(bad[0])
        info = {
            "prompt": self._prompt_text,
            "completion": completion,
            "completion_ids": tuple(self._generated),
            "prompt_index": self._prompt_index,
            "reward": reward,
            "turns": self._turns,
            "transcript": [dict(m) for m in self._transcript],
        }
        if parts is not None:  # the end-of-episode reward's components
            info["reward_components"] = parts[0]
        if spec.interaction is not None:  # the task's own entries (a game: the side the learner played)
            info.update(episode_infos(spec.interaction, [self._task_state])[0])
        if spec.nonfinite_reward == "skip":
            info["reward_nonfinite"] = nonfinite
        return reward, info

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

    def render(self) -> str | np.ndarray | None:
        """``"ansi"``: the prompt and the completion so far, as text (``prompt|completion``); ``"human"``: print
        that text and return ``None`` (Gymnasium's convention); ``"rgb_array"``: the same drawn as an image
        (:func:`textrl_envs.rendering.transcript_frame`, a fixed-size ``uint8`` array ``(H, W, 3)``), which
        Gymnasium's ``RecordVideo`` records."""
        if self.render_mode is None:
            return None
        completion = self.text_spec.decode(self._generated)
        if self.render_mode == "rgb_array":
            return transcript_frame([("prompt", self._prompt_text), ("agent", completion)])
        text = f"{self._prompt_text}|{completion}"
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def decode(self, ids: Sequence[int]) -> str:
        """Decode token ids with the env's tokenizer (special tokens removed)."""
        return self.text_spec.decode(ids)

    @property
    def prompt_weights(self) -> np.ndarray | None:
        """The prompt-draw weights :meth:`set_prompt_weights` set (``None``: uniform draws)."""
        return None if self._prompt_weights is None else self._prompt_weights.copy()

    def set_prompt_weights(self, weights: Sequence[float] | np.ndarray | None) -> None:
        """Draw later episodes' prompts with probabilities proportional to ``weights`` (``None``: uniform, as built).

        For a curriculum (:class:`sb3_grpo.callbacks.PassRateCurriculum`); a prompt of weight 0 is never drawn. A
        weighted draw takes one ``np_random.random()`` (:func:`textrl_envs.groups.draw_weighted`) where a uniform one
        takes ``np_random.integers(len(prompts))``. Through SB3: ``venv.env_method("set_prompt_weights", w)``.

        :param weights: One finite weight ``>= 0`` per prompt, not all 0; or ``None``.
        """
        self._prompt_cdf = prompt_draw_cdf(weights, len(self.text_spec.prompt_texts))
        self._prompt_weights = None if weights is None else np.asarray(weights, dtype=np.float64).copy()
