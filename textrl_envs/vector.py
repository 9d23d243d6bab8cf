"""TextGenVectorEnv: N text-generation episodes stepped as torch tensor ops on one device.

The batched counterpart of :class:`textrl_envs.env.TextGenEnv`, registered as the
``vector_entry_point`` of every id of the suite, so ``gym.make_vec("TextGen-v0", num_envs=N)``
returns it. The per-step work is a handful of tensor ops over the whole batch (shift the window left,
write the action in the last column, compare with EOS and with the budget); text is decoded only
for the episodes that finish, and the reward model is called once per step for all of them.

The bookkeeping is split into small pure functions in :mod:`textrl_envs.bookkeeping` (append a token,
detect episode ends, start windows from the packed prompt table, number episodes and groups, decode
completions) that the tests pin down; :class:`TextGenVectorEnv` is the thin stateful shell around them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from textrl_envs.bookkeeping import (
    append_tokens_,
    completion_bounds,
    completion_tuples,
    decode_completions,
    episode_ends,
    episode_ids,
    flag_array,
    group_ids,
    inject_tokens_,
    int_array,
    object_array,
    pack_prompts,
    start_windows_,
)
from textrl_envs.core import EpisodeSpec, TextSpecAccess, build_spec, check_kwargs
from textrl_envs.decoding import fast_decoder
from textrl_envs.devices import resolve_device
from textrl_envs.env import SPEC_KWARGS, make_spaces, resolve_prompt
from textrl_envs.groups import GroupPrompts, prompt_draw_cdf
from textrl_envs.interaction import episode_infos, episode_messages
from textrl_envs.rendering import transcript_frame
from textrl_envs.reward_worker import RewardDeferral, RewardWorker
from textrl_envs.turns import TurnBook
from textrl_envs.validation import check_bool, check_choice, check_int, check_seed

OBS_BACKENDS = ("numpy", "torch")
VECTOR_KWARGS = (
    "num_envs", "device", "group_size", "obs_backend", "render_mode", "max_episode_steps", "reward_worker",
)  # fmt: skip
#: Largest prompt table (prompts x window elements) kept at full window width (2 x 8 bytes each).
FULL_WIDTH_TABLE_MAX = 1 << 22


# -- the environment --------------------------------------------------------------------------------


class TextGenVectorEnv(TextSpecAccess, RewardDeferral, gym.vector.VectorEnv):
    """N text-generation episodes as torch tensors on one device, with prompt groups.

    ## Description
    The batched form of :class:`~textrl_envs.env.TextGenEnv` (same MDP, same arguments): each of the
    ``num_envs`` sub-envs generates a completion of a prompt, one token per step. The token state
    (ids, attention mask, generated counts) lives in ``torch`` tensors on ``device``; a step is a few
    tensor ops over the batch; prompts are pre-packed in one right-aligned padded table, so a reset
    is an index gather. Text is decoded only for episodes that finish, and the reward model is called
    once per step with all of them (:meth:`textrl_envs.core.EpisodeSpec.score`).

    With ``group_size=1``, ``reset(seed=s)`` and the same actions, observations, rewards,
    terminations and truncations equal those of ``gym.vector.SyncVectorEnv`` over ``num_envs``
    ``gym.make`` envs with ``autoreset_mode=SAME_STEP`` (env ``i`` seeded ``s + i``).

    ## Action Space
    ``MultiDiscrete([V] * N)`` with ``V = len(tokenizer)``: one next-token id per env. Integer arrays
    (numpy, list or torch, any device) of shape ``(N,)``; floats are accepted only if integral.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (N, W), int64), attention_mask=Box(0, 1, (N, W), int64))``,
    ``W = max_prompt_tokens + max_new_tokens``, each row right-aligned (left padding) as in the
    single env. numpy arrays by default; with ``obs_backend="torch"``, ``torch.int64`` tensors on
    ``device`` (rewards, terminations and truncations stay numpy arrays in both backends).

    Memory: the device state is two ``(N, W)`` ``int64`` tensors plus one ``int64`` counter per env,
    ``16 * W + 8`` bytes per env (4,104 bytes for ``W = 256``; 4.2 MB for ``N = 1024``), plus the packed
    prompt table: ids and mask, ``16 * W`` bytes per prompt while prompts x ``W`` <= 4M (at most 64 MB;
    a reset then copies whole rows), else ``16 * max_prompt_tokens``. :meth:`state_nbytes` reports the
    per-env state; each returned numpy observation batch is another ``16 * W * N`` bytes.

    ## Rewards
    0 on every step but the last of an episode; then the reward model's score of the completion.

    ## Starting State
    Each group draws its prompt for every round with its own RNG (``np_random`` semantics of the
    single env: ``rng.integers(len(prompts))``), seeded ``seed + k * G`` for group ``k`` by
    ``reset(seed=seed)`` (or by ``seed[k * G]`` for a list of per-env seeds). The draws are taken
    :data:`~textrl_envs.groups.DRAW_BLOCK` at a time (numpy yields the same values as one at a time), so the prompt
    sequence is exactly the single env's, also across ``reset()`` without a seed.
    ``reset(options={"prompt": str})`` or ``{"prompt_index": int}`` sets the prompt of every env's
    episode begun by that reset; later episodes draw from ``prompts`` again (as ``SyncVectorEnv``,
    which passes the options only to ``reset``, does).

    ## Episode End and autoreset
    Terminated on EOS, truncated after ``max_new_tokens`` tokens without EOS. Same-step autoreset
    (``metadata["autoreset_mode"] == AutoresetMode.SAME_STEP``), the convention of gymnasium's
    ``SyncVectorEnv``: a finished env's returned observation is the first one of its next episode; its
    last observation is ``infos["final_obs"][i]`` (an object array of per-env observation dicts) and
    its last step's info is ``infos["final_info"]`` (dict of arrays), each with a ``_key`` mask. The
    new episode's reset info (``prompt``, ``prompt_index``) sits at the top level of ``infos``, masked
    by ``infos["_prompt"]``.

    ## Infos
    * every step and every ``reset``: ``group_id`` and ``episode_id`` (``int64``, all envs). In a
      ``reset`` info they are the ids of the episodes just begun; in a ``step`` info they are the ids
      of the episode each env's action belonged to, so on a same-step autoreset the *finished*
      episode's ids (the new episode's ids appear from the next step on, and in :meth:`episode_ids`).
    * every step of an interactive env: ``turn`` (``int64``, all envs), the index of the agent turn each env's
      action belonged to (0 for the first turn), as in the single env's step info.
    * ``final_info`` (envs whose episode ended this step): ``prompt`` (str), ``completion`` (str),
      ``completion_ids`` (tuple of ints, without EOS, as :class:`~textrl_envs.env.TextGenEnv`),
      ``prompt_index`` (``-1`` for a prompt given as text), ``reward`` (float), ``group_id``,
      ``episode_id``; object arrays for str and arrays; with ``nonfinite_reward="skip"`` also
      ``reward_nonfinite`` (bool: the reward was NaN/inf and is scored 0); with ``render_mode="rgb_array"``
      also ``frame``, the episode's last frame as :meth:`render` draws it (the returned observation, and
      ``render()`` after the step, are already the next episode's).
    * top level on ``reset`` and for envs autoreset this step: ``prompt`` and ``prompt_index`` of
      the episode begun.

    ## Groups
    ``group_size=G`` splits the envs into ``num_envs / G`` groups of consecutive envs (group ``k`` is
    envs ``kG .. kG + G - 1``). Every env counts its episodes in *rounds*; env ``j``'s ``r``-th
    episode uses its group's ``r``-th prompt, drawn from the group's RNG when the first member starts
    round ``r``. Members do not wait for each other: a member that finishes early starts its next
    round at once (drawing that round's prompt if it is the first there), so no step is wasted,
    members may be out of step in time, and every completed group round has exactly G completions
    of one prompt. Ids: ``episode_id = round * N + j`` (unique per episode) and
    ``group_id = round * num_groups + k = episode_id // G`` (unique per group round). ``reset()``
    abandons episodes in progress (their group rounds stay incomplete) and moves every env to round
    ``max(rounds) + 1``, so ids never repeat over the env's lifetime.

    ## Arguments
    ``TextGenVectorEnv(num_envs=1, device="auto", group_size=1, obs_backend="numpy",
    render_mode=None, reward_worker=True, **spec_kwargs)`` where ``spec_kwargs`` are the single env's (``task``,
    ``prompts``, ``reward``, ``reward_kwargs``, ``tokenizer``, ``max_new_tokens``,
    ``max_prompt_tokens``, ``prompt_truncation``; see :func:`textrl_envs.core.build_spec`).

    :param num_envs: Number of sub-envs ``N``.
    :param device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
    :param group_size: Envs per prompt group ``G``; must divide ``num_envs``.
    :param obs_backend: ``"numpy"`` (default) or ``"torch"`` (tensors on ``device``).
    :param render_mode: ``None``, ``"ansi"`` (``render()`` returns one string per env) or
        ``"human"`` (prints them after every step).
    :param reward_worker: Allow :meth:`defer_rewards` (rewards scored in a background thread, what GRPO asks for
        during its rollouts); ``False`` keeps every reward in ``step``.

    ## Version History
    * v0: Initial version.
    """

    metadata = {
        "render_modes": ["ansi", "human", "rgb_array"],
        "render_fps": 30,
        "autoreset_mode": AutoresetMode.SAME_STEP,
    }

    def __init__(
        self,
        num_envs: int = 1,
        device: str | torch.device = "auto",
        group_size: int = 1,
        obs_backend: str = "numpy",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        spec_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in SPEC_KWARGS}
        max_episode_steps = kwargs.pop("max_episode_steps", None)
        self.reward_worker = check_bool("reward_worker", kwargs.pop("reward_worker", True))
        self._worker: RewardWorker | None = None
        self._deferred = False
        check_kwargs(kwargs, type(self).__name__, SPEC_KWARGS + VECTOR_KWARGS)
        num_envs, group_size, max_episode_steps = self._check_args(
            num_envs, group_size, max_episode_steps, obs_backend, render_mode
        )

        self.device = resolve_device(device)
        self.num_envs = int(num_envs)
        self.group_size = int(group_size)
        self.num_groups = self.num_envs // self.group_size
        self.obs_backend = obs_backend
        self.render_mode = render_mode

        spec_kwargs.setdefault("task", None)
        self.prompt_truncation = spec_kwargs.get("prompt_truncation", "left")
        self.text_spec: EpisodeSpec = build_spec(**spec_kwargs)
        spec = self.text_spec
        if max_episode_steps is not None:  # a step is a token: the time limit is the episode budget (scored)
            spec.set_budget(min(max_episode_steps, spec.max_new_tokens))
        self.single_observation_space, self.single_action_space = make_spaces(spec)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        self._build_prompt_table(spec)

        # Token state on the device.
        n, w = self.num_envs, spec.window
        self._ids = torch.full((n, w), spec.pad_token_id, dtype=torch.int64, device=self.device)
        self._mask = torch.zeros((n, w), dtype=torch.int64, device=self.device)
        self._on_cpu = self.device.type == "cpu"
        # what the in-place bookkeeping works on: numpy views of the state on CPU (no conversion per step)
        self._state = (self._ids.numpy(), self._mask.numpy()) if self._on_cpu else (self._ids, self._mask)
        self._table = self._prompt_table()
        # Episode bookkeeping on the host (it drives the per-episode Python work anyway).
        self._generated = np.zeros(n, dtype=np.int64)
        self._row = np.zeros(n, dtype=np.int64)
        self._round = np.zeros(n, dtype=np.int64)
        self._prompts = GroupPrompts(
            self.num_groups, self.group_size, len(spec.prompt_texts), task_seeds=spec.interactive
        )
        self._num_prompts = len(spec.prompt_texts)
        self._prompt_weights: np.ndarray | None = None
        self._decoder = fast_decoder(spec.tokenizer)
        # interactive tasks: each episode's Python-side state (the interaction's, the conversation, the transcript)
        self._turn_book = TurnBook(spec, n, w, self._decoder or spec.decode) if spec.interactive else None
        self._pad = spec.pad_token_id
        self._everyone = np.ones(n, dtype=np.bool_)
        self._episode_ids = episode_ids(self._round, n)
        self._group_ids = group_ids(self._round, self.group_size)
        self._started = False

    def _check_args(
        self, num_envs: Any, group_size: Any, max_episode_steps: Any, obs_backend: Any, render_mode: Any
    ) -> tuple[int, int, int | None]:
        """The constructor's own arguments checked (a clear error for a bad one); the numbers as ints."""
        num_envs = check_int("num_envs", num_envs, low=1, example=8)
        group_size = check_int(
            "group_size", group_size, low=1, hint="1 (no groups) or the completions per prompt, e.g. 4"
        )
        if max_episode_steps is not None:
            max_episode_steps = check_int("max_episode_steps", max_episode_steps, low=1, hint="or None; e.g. 8")
        if num_envs % group_size:
            multiple = group_size * max(1, num_envs // group_size)
            raise ValueError(
                f"num_envs={num_envs} is not divisible by group_size={group_size}; every group needs "
                f"{group_size} envs, so use a multiple of it (e.g. num_envs={multiple})"
            )
        check_choice("obs_backend", obs_backend, OBS_BACKENDS)
        if render_mode is not None:
            check_choice("render_mode", render_mode, self.metadata["render_modes"], hint="or None")
        return num_envs, group_size, max_episode_steps

    def _build_prompt_table(self, spec: EpisodeSpec) -> None:
        """The prompt table on the device: rows 0..P-1 are spec's prompts; prompts given as text are appended once
        (:meth:`_row_for`)."""
        self._row_text: list[str] = list(spec.prompt_texts)
        self._row_index: list[int] = list(range(len(spec.prompt_texts)))
        self._extra_rows: dict[str, int] = {}
        # Full-width rows make a reset two contiguous copies; a large prompt set keeps only P columns.
        self._table_width = (
            spec.window if len(spec.prompt_ids) * spec.window <= FULL_WIDTH_TABLE_MAX else spec.max_prompt_tokens
        )
        packed, packed_mask = pack_prompts(spec.prompt_ids, self._table_width, spec.pad_token_id)
        self._packed_ids = torch.as_tensor(packed, device=self.device)
        self._packed_mask = torch.as_tensor(packed_mask, device=self.device)

    def episode_ids(self) -> np.ndarray:
        """Ids of the episodes in progress (those the next actions belong to), ``(N,)`` ``int64``."""
        return self._episode_ids.copy()

    def group_ids(self) -> np.ndarray:
        """Group-round ids of the episodes in progress, ``(N,)`` ``int64``."""
        return self._group_ids.copy()

    def prompt_indices(self) -> np.ndarray:
        """Prompt index of each env's current episode (``-1`` for a prompt given as text)."""
        return self._prompt_index_of(np.arange(self.num_envs))

    @property
    def prompt_weights(self) -> np.ndarray | None:
        """The prompt-draw weights :meth:`set_prompt_weights` set (``None``: uniform draws)."""
        return None if self._prompt_weights is None else self._prompt_weights.copy()

    def set_prompt_weights(self, weights: Sequence[float] | np.ndarray | None) -> None:
        """Draw the prompts of later group rounds with probabilities proportional to ``weights`` (``None``: uniform).

        For a curriculum (:class:`sb3_grpo.callbacks.PassRateCurriculum`); call it between rollouts. The weights
        choose which prompt a group round draws; every member of the round still gets that round's prompt, and rounds
        already begun keep theirs. Each group draws as the single env does with the same weights (one
        ``rng.random()`` per round, :func:`textrl_envs.groups.draw_weighted`). Weights set before the first
        ``reset`` keep a group's draws equal to its single env's; set later, the uniform draws the group took ahead
        are discarded, so its stream moves on from there (the distribution is the same). Through SB3:
        ``venv.env_method("set_prompt_weights", w)``.

        :param weights: One finite weight ``>= 0`` per prompt, not all 0; or ``None``.
        """
        cdf = prompt_draw_cdf(weights, self._num_prompts)
        self._prompt_weights = None if weights is None else np.asarray(weights, dtype=np.float64).copy()
        self._prompts.set_cdf(cdf)

    def state_nbytes(self) -> int:
        """Bytes of per-env state (ids and mask on the device, generated counts on the host), all envs."""
        return sum(t.element_size() * t.numel() for t in (self._ids, self._mask)) + self._generated.nbytes

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        """Start a new episode in every env.

        :param seed: ``None`` (keep the RNGs; random ones on the first reset), an int ``s`` (env ``i``
            seeded ``s + i``; group ``k`` uses its first member's seed ``s + kG``), or a list of
            ``num_envs`` ints/None (group ``k`` uses ``seed[kG]``).
        :param options: ``{"prompt": str}`` or ``{"prompt_index": int}`` for every env's episode begun
            now; ``None`` draws prompts.
        :return: ``(observations, infos)``; infos hold ``prompt``, ``prompt_index``, ``group_id``,
            ``episode_id`` per env.
        """
        # validate everything before changing any state
        seeds = self._per_group_seeds(seed)
        if options is not None and "reset_mask" in options:
            raise ValueError(
                "options['reset_mask'] is not supported: TextGenVectorEnv autoresets in the same step "
                "(AutoresetMode.SAME_STEP), so every env is always running; call reset() to restart all"
            )
        given = resolve_prompt(self.text_spec, options, None, self.prompt_truncation) if options else None  # type: ignore[arg-type]

        super().reset(seed=int(seed) if isinstance(seed, (int, np.integer)) else None)
        self._prompts.seed(seeds)  # unseeded groups keep consuming their streams
        self._round[:] = int(self._round.max()) + 1 if self._started else 0
        self._prompts.new_round(int(self._round[0]), None if given is None else self._row_for(*given))
        everyone = np.arange(self.num_envs)
        self._start_episodes(everyone)
        self._started = True
        infos = self._reset_info(everyone, {})
        infos["group_id"], infos["_group_id"] = self.group_ids(), np.ones(self.num_envs, dtype=np.bool_)
        infos["episode_id"], infos["_episode_id"] = self.episode_ids(), np.ones(self.num_envs, dtype=np.bool_)
        return self._observations(), infos

    def step(self, actions):
        """Append one token to every env's sequence; finished envs autoreset in the same step.

        :param actions: ``(num_envs,)`` token ids (numpy, list or torch tensor).
        :return: ``(observations, rewards, terminations, truncations, infos)``; rewards ``float64``,
            flags ``bool`` numpy arrays; infos as in the class docstring.
        """
        if not self._started:
            raise RuntimeError("step() called before reset(); call envs.reset() first")
        spec = self.text_spec
        tokens, host_tokens = self._check_actions(actions)
        append_tokens_(*self._state, tokens, host_tokens)
        self._generated += 1
        if self._turn_book is None:
            terminated, truncated = episode_ends(host_tokens, self._generated, spec.eos_token_id, spec.budget)
            rewards = np.zeros(self.num_envs, dtype=np.float64)
        else:  # interactive: answer the turns that ended (one batched call) and write the replies in
            turn_index = self._turn_book.turns.copy()  # the agent turn each action belongs to (0 for the first)
            turn = self._turn_book.step(host_tokens, self._generated)
            inject_tokens_(self._ids, self._mask, turn.inject_rows, turn.inject_ids)
            rewards, terminated, truncated = turn.rewards, turn.terminated, turn.truncated

        step_episode_ids, step_group_ids = self._episode_ids, self._group_ids
        infos: dict[str, Any] = {
            "group_id": step_group_ids.copy(),
            "_group_id": self._everyone.copy(),
            "episode_id": step_episode_ids.copy(),
            "_episode_id": self._everyone.copy(),
        }
        if self._turn_book is not None:
            infos["turn"], infos["_turn"] = turn_index, self._everyone.copy()
        done = np.flatnonzero(terminated | truncated)
        if done.size:
            self._end_episodes(done, terminated, rewards, infos)
        observations = self._observations()
        if self.render_mode == "human":
            self.render()
        return observations, rewards, terminated, truncated, infos

    def _end_episodes(self, done: np.ndarray, terminated: np.ndarray, rewards: np.ndarray, infos: dict) -> None:
        """Score the episodes ``done`` (rewards in place, or a ticket when deferred), fill ``final_obs`` /
        ``final_info`` and autoreset them."""
        spec, n = self.text_spec, self.num_envs
        step_episode_ids, step_group_ids = self._episode_ids, self._group_ids
        finals, host_ids = self._final_windows(done)
        if self._turn_book is None:
            starts, stops = completion_bounds(spec.window, self._generated[done], terminated[done])
            completion_ids = completion_tuples(host_ids, starts, stops)
            completions = decode_completions(spec, host_ids, starts, stops, completion_ids, self._decoder)
        else:  # every token after the prompt, the replies' included (the window may have dropped the oldest)
            completion_ids = [tuple(self._turn_book.conversation[e]) for e in done.tolist()]
            completions = [self._turn_book.decode(ids) for ids in completion_ids]
        rows = self._row[done].tolist()
        prompt_index = [self._row_index[r] for r in rows]
        prompt_text = [self._row_text[r] for r in rows]
        nonfinite, ticket, parts = np.zeros(len(done), dtype=bool), None, None
        if spec.reward is not None:  # an interactive episode without an end-of-episode reward has none
            messages = None
            if self._turn_book is not None:  # the transcript as chat messages, for TRL-style rewards
                messages = episode_messages(spec.interaction, [self._turn_book.states[e] for e in done.tolist()])
            scores, nonfinite, ticket, parts = self._score(
                done, step_episode_ids, prompt_index, completions, prompt_text, completion_ids, messages
            )
            rewards[done] += scores
        done_mask = flag_array(n, done)
        final_info = {
            "prompt": object_array(n, done, prompt_text),
            "completion": object_array(n, done, completions),
            "completion_ids": object_array(n, done, completion_ids),
            "prompt_index": int_array(n, done, prompt_index),
            "reward": np.where(done_mask, rewards, 0.0),
            "group_id": np.where(done_mask, step_group_ids, 0),
            "episode_id": np.where(done_mask, step_episode_ids, 0),
        }
        if self._turn_book is not None:
            final_info["turns"] = int_array(n, done, self._turn_book.turns[done])
            final_info["transcript"] = object_array(n, done, [self._turn_book.transcripts[e] for e in done.tolist()])
            extras = episode_infos(spec.interaction, [self._turn_book.states[e] for e in done.tolist()])
            for key in extras[0] if extras else ():
                values = [extra[key] for extra in extras]
                ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
                final_info[key] = int_array(n, done, values) if ints else object_array(n, done, values)
            nonfinite = nonfinite | self._turn_book.nonfinite[done]
        if spec.nonfinite_reward == "skip":  # the flag of episodes whose NaN/inf reward was scored 0
            final_info["reward_nonfinite"] = flag_array(n, done[nonfinite])
        if parts is not None:  # a composite reward's components, per episode
            final_info["reward_components"] = object_array(n, done, parts)
        if ticket is not None:  # scored in the background: the reward (and its components) from collect_rewards()
            final_info["reward_ticket"] = int_array(n, done, [ticket] * len(done))
        if self.render_mode == "rgb_array":  # the finished episodes' last frames, drawn before they reset
            shown = self._prompts_and_completions()
            final_info["frame"] = object_array(
                n, done, [transcript_frame([("prompt", shown[e][0]), ("agent", shown[e][1])]) for e in done.tolist()]
            )
        for key in list(final_info):
            final_info[f"_{key}"] = done_mask.copy()
        infos["final_obs"] = object_array(
            n, done, [{"input_ids": i, "attention_mask": m} for i, m in zip(finals[0], finals[1])]
        )
        infos["_final_obs"] = done_mask.copy()
        infos["final_info"], infos["_final_info"] = final_info, done_mask.copy()
        self._round[done] += 1
        self._start_episodes(done)
        self._reset_info(done, infos)

    def prompt_windows(self, max_rows: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The first observation of every prompt (the prompt table at the window's width), for a policy that wants
        to prefill them all at once; ``None`` when the table has more than ``max_rows`` rows.

        :param max_rows: The most rows worth returning.
        :return: ``(input_ids, attention_mask)``, ``int64`` arrays ``(R, W)``.
        """
        rows = self._packed_ids.shape[0]
        if rows > max_rows:
            return None
        return self._first_windows(self._packed_ids.cpu().numpy(), self._packed_mask.cpu().numpy())

    def upcoming_prompt_windows(self, rounds: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
        """The first observations of the episodes the groups will begin next: the distinct prompts of each group's
        next ``rounds`` rounds, those no member has begun yet (:meth:`~textrl_envs.groups.GroupPrompts.upcoming`; the
        draws will give them unless the prompt weights change or the env is reseeded), for a policy that prefills
        them ahead of the resets that start them.

        :param rounds: How many rounds ahead of each group.
        :return: ``(input_ids, attention_mask)``, ``int64`` arrays ``(R, W)`` with ``R`` at most ``groups * rounds``,
            in the order the rounds come (every group's next round first); ``None`` for an interactive task, whose
            episodes may begin with the environment's opening message after the prompt.
        """
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        if self.text_spec.interactive:
            return None
        ahead = self._prompts.upcoming(rounds).T.ravel()  # the next round of every group first
        _, first = np.unique(ahead, return_index=True)
        rows = torch.as_tensor(ahead[np.sort(first)], device=self._packed_ids.device)
        return self._first_windows(self._packed_ids[rows].cpu().numpy(), self._packed_mask[rows].cpu().numpy())

    def _first_windows(self, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prompt-table rows (``ids``, ``mask``) as the window-wide first observations of their episodes."""
        width = self.text_spec.window
        windows = np.full((len(ids), width), self.text_spec.pad_token_id, dtype=np.int64)
        window_mask = np.zeros((len(ids), width), dtype=np.int64)
        windows[:, width - self._table_width :] = ids
        window_mask[:, width - self._table_width :] = mask
        return windows, window_mask

    def render(self) -> tuple[str, ...] | tuple[np.ndarray, ...] | None:
        """``"ansi"``/``"human"``: one ``prompt|completion so far`` string per env; ``"rgb_array"``: one frame per
        env, as the single env draws it."""
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode; pass render_mode='ansi' to the constructor")
            return None
        if self.render_mode == "rgb_array":
            return tuple(transcript_frame([("prompt", p), ("agent", c)]) for p, c in self._prompts_and_completions())
        frames = self.render_text()
        if self.render_mode == "human":
            print("\n".join(frames))
            return None
        return frames

    def render_text(self) -> tuple[str, ...]:
        """One ``prompt|completion so far`` string per env, whatever the render mode."""
        if not self._started:
            return tuple("" for _ in range(self.num_envs))
        return tuple(f"{prompt}|{completion}" for prompt, completion in self._prompts_and_completions())

    def _prompts_and_completions(self) -> list[tuple[str, str]]:
        """``(prompt, completion so far)`` of every env (empty strings before the first reset)."""
        if not self._started:
            return [("", "")] * self.num_envs
        ids = self._ids.cpu().numpy()
        gen = self._generated
        w = self.text_spec.window
        return [
            (self._row_text[self._row[j]], self.text_spec.decode(ids[j, w - gen[j] :] if gen[j] else []))
            for j in range(self.num_envs)
        ]

    def decode(self, ids: Sequence[int]) -> str:
        """Decode token ids with the env's tokenizer (special tokens removed)."""
        return self.text_spec.decode(ids)

    # -- internals -------------------------------------------------------------------------------
    def _per_group_seeds(self, seed) -> list[int | None]:
        if seed is None:
            return [None] * self.num_groups
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seed = check_seed("seed", seed)
            return [seed + k * self.group_size for k in range(self.num_groups)]
        if isinstance(seed, Sequence) and not isinstance(seed, str):
            if len(seed) != self.num_envs:
                raise ValueError(f"a list of seeds must have num_envs={self.num_envs} entries, got {len(seed)}")
            seeds = [check_seed(f"seed[{i}]", s) for i, s in enumerate(seed)]
            return [seeds[k * self.group_size] for k in range(self.num_groups)]
        check_seed("seed", seed)  # raises for anything else (a str, a float, a negative int)
        raise TypeError(f"seed must be None, an int or a list of num_envs ints; got {type(seed).__name__}")

    def _row_for(self, index: int, text: str, ids: np.ndarray) -> int:
        """Row of the prompt table holding a resolved prompt (appending a prompt given as text)."""
        if index >= 0:
            return index
        if text not in self._extra_rows:
            packed, packed_mask = pack_prompts([ids], self._table_width, self.text_spec.pad_token_id)
            self._packed_ids = torch.cat((self._packed_ids, torch.as_tensor(packed, device=self.device)))
            self._packed_mask = torch.cat((self._packed_mask, torch.as_tensor(packed_mask, device=self.device)))
            self._table = self._prompt_table()
            self._extra_rows[text] = len(self._row_text)
            self._row_text.append(text)
            self._row_index.append(-1)
        return self._extra_rows[text]

    def _start_episodes(self, envs: np.ndarray) -> None:
        """Begin the current round's episode in ``envs`` (their ``_round`` already set)."""
        host_envs = envs
        host_rows = rows = self._prompts.rows(envs, self._round)
        self._row[envs] = rows
        if not self._on_cpu:
            envs, rows = torch.as_tensor(envs, device=self.device), torch.as_tensor(rows, device=self.device)
        start_windows_(*self._state, envs, rows, *self._table, self._pad)
        self._generated[host_envs] = 0
        if self._turn_book is not None:
            self._start_interactions(host_envs, host_rows)
        # new arrays: step infos keep the old
        if len(host_envs) == self.num_envs:
            self._episode_ids = episode_ids(self._round, self.num_envs)
            self._group_ids = group_ids(self._round, self.group_size)
        else:
            self._episode_ids, self._group_ids = self._episode_ids.copy(), self._group_ids.copy()
            self._episode_ids[host_envs] = episode_ids(self._round, self.num_envs)[host_envs]
            self._group_ids[host_envs] = group_ids(self._round, self.group_size)[host_envs]

    def _start_interactions(self, envs: np.ndarray, rows: np.ndarray) -> None:
        """Start the interaction of the episodes ``envs`` begin (their group round's task seed) and write the
        openings, if any, after the prompts."""
        spec = self.text_spec
        seeds = self._prompts.seeds(envs, self._round)
        index = [self._row_index[r] for r in rows.tolist()]
        meta = [{k: v[i] for k, v in spec.metadata.items()} if i >= 0 else {} for i in index]
        openings = self._turn_book.start(envs.tolist(), [self._row_text[r] for r in rows.tolist()], meta, seeds)
        opened = [j for j, ids in enumerate(openings) if ids]
        if opened:
            inject_tokens_(self._ids, self._mask, [int(envs[j]) for j in opened], [openings[j] for j in opened])
            self._generated[envs[opened]] = [len(openings[j]) for j in opened]

    def _prompt_index_of(self, envs: np.ndarray) -> np.ndarray:
        """Public prompt index of ``envs``' current episodes: the row, or -1 for rows of prompts given as text."""
        rows = self._row[envs]
        return np.where(rows < self._num_prompts, rows, -1)

    def _reset_info(self, envs: np.ndarray, infos: dict[str, Any]) -> dict[str, Any]:
        n = self.num_envs
        mask = flag_array(n, envs)
        infos["prompt"] = object_array(n, envs, [self._row_text[r] for r in self._row[envs]])
        infos["_prompt"] = mask
        infos["prompt_index"] = int_array(n, envs, self._prompt_index_of(envs))
        infos["_prompt_index"] = mask.copy()
        return infos

    def _prompt_table(self) -> tuple[Any, Any]:
        """The prompt table as the in-place bookkeeping takes it (numpy views on CPU)."""
        if self._on_cpu:
            return self._packed_ids.numpy(), self._packed_mask.numpy()
        return self._packed_ids, self._packed_mask

    def _final_windows(self, done: np.ndarray) -> tuple[tuple[Any, Any], np.ndarray]:
        """The final windows of envs ``done`` in the observation backend, and their ids on the host."""
        if self._on_cpu:  # numpy fancy indexing copies the rows, at less cost per call than torch's
            host_ids, host_mask = self._state[0][done], self._state[1][done]
            if self.obs_backend == "numpy":
                return (host_ids, host_mask), host_ids
            return (torch.from_numpy(host_ids), torch.from_numpy(host_mask)), host_ids
        done_t = torch.as_tensor(done, device=self.device)
        final_ids, final_mask = self._ids.index_select(0, done_t), self._mask.index_select(0, done_t)
        finals = self._backend(final_ids), self._backend(final_mask)
        return finals, finals[0] if self.obs_backend == "numpy" else final_ids.cpu().numpy()

    def _backend(self, t: torch.Tensor):
        if self.obs_backend == "torch":
            return t.clone()
        if t.device.type == "cpu":
            return t.numpy().copy()
        return t.cpu().numpy()

    def _observations(self):
        if self._on_cpu and self.obs_backend == "numpy":
            return {"input_ids": self._state[0].copy(), "attention_mask": self._state[1].copy()}
        return {"input_ids": self._backend(self._ids), "attention_mask": self._backend(self._mask)}

    def _check_actions(self, actions) -> tuple[torch.Tensor | None, np.ndarray]:
        """Validated actions on the device (``None`` for numpy actions on CPU, where the host copy is what the
        bookkeeping takes), and a host copy (one transfer when they come from the device)."""
        n, v = self.num_envs, self.text_spec.vocab_size
        expected = f"expected {n} integer token ids in [0, {v}) with shape ({n},)"
        if isinstance(actions, torch.Tensor):
            t = actions.detach()
            if tuple(t.shape) != (n,):
                raise ValueError(f"actions have shape {tuple(t.shape)}; {expected} (one per env)")
            if t.dtype == torch.bool or t.is_complex():
                raise ValueError(f"actions have dtype {t.dtype}; {expected}")
            if t.is_floating_point() and not bool((torch.isfinite(t) & (t == torch.round(t))).all()):
                raise ValueError(f"actions are floats that are not all integral ({t.tolist()[:8]}); {expected}")
            t = t.to(device=self.device, dtype=torch.int64)
            low, high = torch.aminmax(t)
            if int(low) < 0 or int(high) >= v:
                return self._range_error(t.cpu().numpy(), expected)
            return t, t.cpu().numpy()
        a = np.asarray(actions)
        if a.shape != (n,):
            raise ValueError(f"actions have shape {a.shape}; {expected} (one per env)")
        if a.dtype.kind == "f":
            if not (np.isfinite(a).all() and (a == np.round(a)).all()):
                raise ValueError(f"actions are floats that are not all integral ({a.tolist()[:8]}); {expected}")
        elif a.dtype.kind not in "iu":
            raise ValueError(f"actions have dtype {a.dtype}; {expected}")
        if a.min() < 0 or a.max() >= v:
            return self._range_error(a, expected)
        host = a.astype(np.int64, copy=False)
        if self._on_cpu:  # the CPU bookkeeping takes the numpy actions
            return None, host
        return torch.as_tensor(host).to(self.device), host

    def _range_error(self, a: np.ndarray, expected: str):
        v = self.text_spec.vocab_size
        i = int(np.flatnonzero((a < 0) | (a >= v))[0])
        raise ValueError(f"action {int(a[i])} of env {i} is outside the action space Discrete({v}); {expected}")
