"""
What GRPO stores about a rollout beyond SB3's :class:`~stable_baselines3.common.buffers.RolloutBuffer`.

- :class:`SequenceRolloutBuffer`: the text fast path. It keeps a text env's rollout (right-aligned token
  windows, see :mod:`textrl_envs.core`) on the policy's device and serves the update whole sequences, so
  that the policy computes every generated token's log-prob, entropy and value in one forward per
  sequence (``CausalLMPolicy.evaluate_sequences``) instead of one forward per transition.

- :class:`GRPORolloutBuffer` / :class:`GRPODictRolloutBuffer`: the per-transition path, SB3's
  ``RolloutBuffer`` / ``DictRolloutBuffer`` plus one field, ``policy_log_probs``: the acting policy's own
  ``log pi_old(a|s)`` beside SB3's ``log_probs``, which under mixed exploration hold the behaviour mixture's
  ``log mu(a|s)``. Their ratio is the importance weight of GRPO's KL-to-reference estimate
  (:func:`~sb3_grpo.objectives.kl_k3_weighted_mean`). Everything else (storage, GAE, the random minibatch
  order) is SB3's; GRPO also overwrites ``advantages`` for the group forms
  (:mod:`sb3_grpo.common.advantages.group_trackers`). The sequence buffer inherits
  the same fields.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.vec_env import VecNormalize

from sb3_grpo.common.type_aliases import GRPORolloutBufferSamples, SequenceSamples

__all__ = [
    "GRPO_BUFFERS",
    "GRPODictRolloutBuffer",
    "GRPORolloutBuffer",
    "PolicyLogProbMixin",
    "SequenceRolloutBuffer",
    "episode_segments",
    "is_text_space",
    "pack_segments",
    "segment_ids",
]


# ----------------------------------------------------------------------------------------------------------
# The per-transition path: SB3's buffers plus the policy's own log-prob
# ----------------------------------------------------------------------------------------------------------
class PolicyLogProbMixin:
    """
    Adds ``policy_log_probs`` (``[buffer_size, n_envs]``, float32) to an SB3 rollout buffer: the log-prob of
    each stored action under the policy that acted, next to SB3's ``log_probs`` (the log-prob under the
    distribution the action was actually drawn from). The two are equal, bit for bit, unless GRPO explores
    with a uniform mixture; :meth:`add` stores ``log_prob`` in both when ``policy_log_prob`` is not given.
    """

    policy_log_probs: np.ndarray

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self.policy_log_probs = np.zeros((self.buffer_size, self.n_envs), dtype=np.float32)  # type: ignore[attr-defined]

    def add(self, *args: Any, policy_log_prob: th.Tensor | None = None, **kwargs: Any) -> None:
        """
        Record one step: SB3's ``add(obs, action, reward, episode_start, value, log_prob)``, plus

        :param policy_log_prob: ``log pi_old(a|s)`` of the acting policy, shape ``(n_envs,)``; ``None``: the
            action was sampled from the policy itself, ``log_prob`` is stored
        """
        row = self.pos  # type: ignore[attr-defined]
        if policy_log_prob is None:  # the action was drawn from the policy: its log-prob is the one SB3 stores
            super().add(*args, **kwargs)  # type: ignore[misc]
            self.policy_log_probs[row] = self.log_probs[row]  # type: ignore[attr-defined]  (the same float32s)
            return
        if len(policy_log_prob.shape) == 0:  # as SB3 does for log_prob
            policy_log_prob = policy_log_prob.reshape(-1, 1)
        self.policy_log_probs[row] = policy_log_prob.cpu().numpy()  # type: ignore[attr-defined]  (a copy)
        super().add(*args, **kwargs)  # type: ignore[misc]

    def get(self, batch_size: int | None = None) -> Generator[GRPORolloutBufferSamples, None, None]:
        """SB3's ``get`` (same random minibatches), with ``old_policy_log_prob`` and ``segment_id`` in every sample."""
        if not self.generator_ready:  # type: ignore[attr-defined]  # SB3 flattens its own fields in get()
            self.policy_log_probs = self.swap_and_flatten(self.policy_log_probs)  # type: ignore[attr-defined]
            self.segment_ids = self.swap_and_flatten(segment_ids(self.episode_starts))  # type: ignore[attr-defined]
        yield from super().get(batch_size)  # type: ignore[misc]

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> GRPORolloutBufferSamples:
        samples = super()._get_samples(batch_inds, env)  # type: ignore[misc]
        policy_log_prob = self.to_torch(self.policy_log_probs[batch_inds].flatten())  # type: ignore[attr-defined]
        segment_id = th.as_tensor(self.segment_ids[batch_inds].flatten(), device=self.device)  # type: ignore[attr-defined]
        return GRPORolloutBufferSamples(*samples, old_policy_log_prob=policy_log_prob, segment_id=segment_id)


class GRPORolloutBuffer(PolicyLogProbMixin, RolloutBuffer):
    """
    SB3's :class:`~stable_baselines3.common.buffers.RolloutBuffer` that also stores the acting policy's own
    log-probs (``policy_log_probs``, see :class:`PolicyLogProbMixin`); its samples are
    :class:`GRPORolloutBufferSamples`. Same arguments as ``RolloutBuffer``.
    """


class GRPODictRolloutBuffer(PolicyLogProbMixin, DictRolloutBuffer):
    """
    SB3's :class:`~stable_baselines3.common.buffers.DictRolloutBuffer` that also stores the acting policy's own
    log-probs (``policy_log_probs``, see :class:`PolicyLogProbMixin`); its samples are
    :class:`GRPORolloutBufferSamples`. Same arguments as ``DictRolloutBuffer``.
    """


#: SB3's stock buffers and the GRPO subclass GRPO builds in their place
GRPO_BUFFERS: dict[type[RolloutBuffer], type[RolloutBuffer]] = {
    RolloutBuffer: GRPORolloutBuffer,
    DictRolloutBuffer: GRPODictRolloutBuffer,
}


# ----------------------------------------------------------------------------------------------------------
# The text fast path
# ----------------------------------------------------------------------------------------------------------


def episode_segments(episode_starts: np.ndarray) -> np.ndarray:
    """
    Split a rollout into per-env runs of consecutive steps that belong to one episode.

    :param episode_starts: ``[n_steps, n_envs]``, 1 where the observation starts a new episode
    :return: ``int64`` array ``[n_segments, 3]`` of ``(env, t0, t1)``: steps ``t0 .. t1 - 1`` of ``env``
    """
    n_steps, n_envs = episode_starts.shape
    rows = []
    for env in range(n_envs):
        cuts = [0, *(np.flatnonzero(episode_starts[1:, env] > 0.5) + 1).tolist(), n_steps]
        rows.extend((env, t0, t1) for t0, t1 in zip(cuts[:-1], cuts[1:]))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def segment_ids(episode_starts: np.ndarray) -> np.ndarray:
    """The id of each step's sequence: the run of one episode's steps of one env in the rollout
    (:func:`episode_segments`' rows), numbered env by env, unique in the rollout.

    :param episode_starts: ``[n_steps, n_envs]``, 1 where the observation starts a new episode
    :return: ``int64`` array ``[n_steps, n_envs]``
    """
    n_steps, n_envs = episode_starts.shape
    starts = episode_starts > 0.5
    starts[0] = True  # every env's first step of the rollout opens a sequence
    per_env = np.cumsum(starts, axis=0) - 1  # 0, 1, ... within each env
    offsets = np.concatenate([[0], np.cumsum(per_env[-1] + 1)[:-1]]) if n_steps else np.zeros(n_envs, np.int64)
    return (per_env + offsets[None, :]).astype(np.int64)


def pack_segments(lengths: np.ndarray, tokens_per_batch: int, order: np.ndarray) -> list[np.ndarray]:
    """
    Group segments, taken in ``order``, into minibatches of about ``tokens_per_batch`` transitions.

    A segment is never split: a minibatch closes as soon as it holds ``tokens_per_batch`` transitions or
    more, so it holds fewer than ``tokens_per_batch + max(lengths)`` (the last one may hold fewer).

    :param lengths: transitions per segment
    :param tokens_per_batch: target transitions per minibatch (>= 1)
    :param order: permutation of the segment indices
    :return: arrays of segment indices, one per minibatch
    """
    batches, current, count = [], [], 0
    for i in order:
        current.append(int(i))
        count += int(lengths[i])
        if count >= tokens_per_batch:
            batches.append(np.asarray(current, dtype=np.int64))
            current, count = [], 0
    if current:
        batches.append(np.asarray(current, dtype=np.int64))
    return batches


class SequenceRolloutBuffer(GRPODictRolloutBuffer):
    """
    Rollout buffer of a text env that serves whole sequences to the update (the text fast path).

    It records what :class:`GRPODictRolloutBuffer` records (SB3's fields plus ``policy_log_probs``), so returns and
    advantages (GAE, or GRPO's group forms written into ``advantages``) come from the same code; the token
    windows are kept as ``int64`` tensors on the buffer's device instead of per-step numpy copies.
    :meth:`get_sequences` then yields :class:`SequenceSamples`: the steps of each episode within the rollout
    become one sequence, the episode's window after its last step (the last observation shifted left by
    one, the last action appended).

    The observation window holds the whole prompt and completion (``W = P + T``), so a sequence whose
    episode began in an earlier rollout is still complete in context; only its earlier actions are not
    trained on again.

    Interactive episodes (the env writes its replies into the window between the agent's steps) work the same
    way: the buffer knows whose tokens are whose from the windows themselves. Step ``t``'s action is the token
    right after its observation's ``n_t`` valid tokens, so in the final window of ``N`` valid tokens it sits at
    column ``W - N + n_t``; the env's tokens are the columns in between, context that is neither an action nor a
    transition. Log-probs, entropies and values are computed only at the agent's positions, and returns and
    advantages (SB3's GAE, or the group forms) run over the agent's steps, exactly the transitions the
    per-transition path stores. A rollout whose windows do not nest (a step's observation is not the beginning
    of its episode's final window, e.g. an env that dropped tokens on the left while the agent acted) is refused
    with an error (:meth:`check_windows`) rather than trained on wrong contexts.

    ``carry_over`` (:mod:`sb3_grpo.common.advantages.carry_over`) changes what an update gets through :meth:`carry`:
    sequences held from earlier rollouts join the minibatches, and this rollout's segments held for later are left out.

    Minibatches are made of whole sequences in random order, about ``batch_size`` transitions each
    (:func:`pack_segments`), so they differ from PPO's random transitions; the loss of any set of
    transitions is the same either way (tested), and with one minibatch per epoch the update matches
    PPO's to float rounding.

    :param buffer_size: steps per env in a rollout (``n_steps``)
    :param observation_space: ``Dict`` with ``input_ids`` and ``attention_mask``
    :param action_space: the ``Discrete`` token space
    :param device: where the token windows and minibatches live (the policy's device)
    :param gae_lambda: GAE's lambda
    :param gamma: discount factor
    :param n_envs: number of envs
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Dict,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        gae_lambda: float = 1,
        gamma: float = 0.99,
        n_envs: int = 1,
    ):
        if not is_text_space(observation_space, action_space):
            raise ValueError(
                "SequenceRolloutBuffer needs a text env: Dict observations with 'input_ids' and 'attention_mask' "
                f"and a Discrete action space; got {observation_space} and {action_space}"
            )
        super().__init__(buffer_size, observation_space, action_space, device, gae_lambda, gamma, n_envs)

    def reset(self) -> None:
        super().reset()
        width = self.obs_shape["input_ids"][0]
        self.observations = {}  # the windows live on the device instead
        self.token_ids = th.zeros((self.buffer_size, self.n_envs, width), dtype=th.long, device=self.device)
        self.token_mask = th.zeros((self.buffer_size, self.n_envs, width), dtype=th.long, device=self.device)
        self._checked = False
        self.carried_in: SequenceSamples | None = None
        self._deferred: set[tuple[int, int]] = set()

    def carry(self, carried_in: SequenceSamples | None, deferred: set[tuple[int, int]]) -> None:
        """Change what :meth:`get_sequences` serves (GRPO's ``carry_over``): add the sequences ``carried_in`` (from
        earlier rollouts), and leave out this rollout's segments ``deferred``, given as ``(env, t0)`` (they are
        trained on in a later update, once their advantage is known)."""
        self.carried_in = carried_in
        self._deferred = set(deferred)

    def leave_out(self, starts: set[tuple[int, int]]) -> None:
        """Leave this rollout's segments that start at ``(env, t0)`` out of what :meth:`get_sequences` serves, beside
        those :meth:`carry` defers (DAPO's dynamic sampling drops the sequences of groups without signal)."""
        self._deferred |= set(starts)

    def add(self, obs, action, reward, episode_start, value, log_prob, policy_log_prob=None) -> None:  # type: ignore[override]
        """Record one step (same arguments as :meth:`GRPODictRolloutBuffer.add`)."""
        self.token_ids[self.pos] = th.as_tensor(obs["input_ids"], device=self.device).long()
        self.token_mask[self.pos] = th.as_tensor(obs["attention_mask"], device=self.device).long()
        super().add({}, action, reward, episode_start, value, log_prob, policy_log_prob=policy_log_prob)

    def get(self, batch_size: int | None = None):  # type: ignore[override]
        raise NotImplementedError(
            "SequenceRolloutBuffer serves whole sequences: use get_sequences(); pass "
            "rollout_buffer_class=DictRolloutBuffer to GRPO for the per-transition path"
        )

    def get_sequences(self, batch_size: int | None = None) -> Generator[SequenceSamples, None, None]:
        """
        Yield the rollout as minibatches of whole sequences, in random order.

        :param batch_size: transitions per minibatch, approximately (sequences are never split);
            ``None``: the whole rollout at once
        """
        assert self.full, "the rollout is not complete"
        segments = episode_segments(self.episode_starts)
        if not self._checked:
            self.check_windows(segments)
            self._checked = True
        if self._deferred:
            segments = segments[[(int(e), int(t0)) not in self._deferred for e, t0, _ in segments]].reshape(-1, 3)
        lengths = segments[:, 2] - segments[:, 1]
        carried = self.carried_in
        if carried is not None:
            lengths = np.concatenate([lengths, carried.action_mask.sum(dim=1).cpu().numpy()])
        order = np.random.permutation(len(lengths))
        own = len(segments)
        for batch in pack_segments(lengths, batch_size or self.buffer_size * self.n_envs, order):
            parts = [self.sequence_samples(segments[batch[batch < own]])] if (batch < own).any() else []
            if (batch >= own).any():
                rows = th.as_tensor(batch[batch >= own] - own, device=self.device)
                parts.append(SequenceSamples(*(field.index_select(0, rows) for field in carried)))
            yield parts[0] if len(parts) == 1 else SequenceSamples(*(th.cat(f) for f in zip(*parts, strict=True)))

    def _final_windows(self, segments: np.ndarray) -> tuple[th.Tensor, ...]:
        """``(env, first, last, ids, mask)`` of the segments: the episode's window after its last step in the rollout
        (the last observation shifted left by one, the last action appended)."""
        env = th.as_tensor(segments[:, 0], device=self.device)
        first = th.as_tensor(segments[:, 1], device=self.device)
        last = th.as_tensor(segments[:, 2] - 1, device=self.device)
        actions = th.as_tensor(self.actions[..., 0], device=self.device).long()  # [n_steps, n_envs]
        ids = th.cat([self.token_ids[last, env, 1:], actions[last, env].unsqueeze(1)], dim=1)
        mask = th.cat([self.token_mask[last, env, 1:], th.ones_like(last).unsqueeze(1)], dim=1)
        return env, first, last, ids, mask

    def check_windows(self, segments: np.ndarray) -> None:
        """Check that every step's observation is the beginning of its segment's final window, right before the
        step's action (what :meth:`sequence_samples` relies on), for every stored step at once.

        :raises ValueError: naming the first env and step whose window does not nest, and what to do.
        """
        width = self.token_ids.shape[-1]
        _, _, _, ids, mask = self._final_windows(segments)
        owner = th.empty(self.buffer_size, self.n_envs, dtype=th.long, device=self.device)  # step -> its segment
        for s, (e, t0, t1) in enumerate(segments.tolist()):
            owner[t0:t1, e] = s
        n_valid = self.token_mask.sum(dim=-1)
        shift = mask.sum(dim=1)[owner] - n_valid  # final window column = observation column - shift
        col = th.arange(width, device=self.device)
        src = (col - shift.unsqueeze(-1)).clamp(min=0)
        final_ids, final_mask = ids[owner].gather(-1, src), mask[owner].gather(-1, src)
        valid = self.token_mask != 0
        nested = ((final_ids == self.token_ids) & (final_mask == 1)) | ~valid
        action_col = (width - shift).clamp(max=width - 1)
        acted = ids[owner].gather(-1, action_col.unsqueeze(-1)).squeeze(-1)
        actions = th.as_tensor(self.actions[..., 0], device=self.device).long()
        ok = nested.all(dim=-1) & (shift >= 1) & (acted == actions)
        if not bool(ok.all()):
            t, e = (int(i) for i in (~ok).nonzero()[0])
            raise ValueError(
                f"the text fast path needs every step's observation to be the beginning of its episode's final window "
                f"(the env appends tokens and never drops any while the agent acts); env {e}'s observation at step "
                f"{t} is not (e.g. the env shifted tokens out on the left). Pass rollout_buffer_class="
                "DictRolloutBuffer to train on the per-transition path, or widen the env's window"
            )

    def sequence_samples(self, segments: np.ndarray) -> SequenceSamples:
        """
        The :class:`SequenceSamples` of the given segments (rows of :func:`episode_segments`).
        """
        width = self.token_ids.shape[-1]
        env, first, last, ids, mask = self._final_windows(segments)
        length = last - first + 1
        # step first + k (k < length) acted right after its observation's n valid tokens: column W - N + n, N being
        # the final window's valid count (single-turn episodes: W - length + k; interactive ones skip the replies)
        k = th.arange(int(length.max()), device=self.device).unsqueeze(0)
        has = k < length.unsqueeze(1)
        steps = th.where(has, first.unsqueeze(1) + k, first.unsqueeze(1))
        n_valid = self.token_mask.sum(dim=-1)  # [n_steps, n_envs]
        cols = width - mask.sum(dim=1, keepdim=True) + n_valid[steps, env.unsqueeze(1)]
        cols = th.where(has, cols, th.full_like(cols, width))  # padding of short segments: a spare column
        action_mask = th.zeros(len(env), width + 1, dtype=th.bool, device=self.device)
        action_mask = action_mask.scatter(1, cols, has)[:, :width]
        step = th.zeros(len(env), width + 1, dtype=th.long, device=self.device).scatter(1, cols, steps)[:, :width]
        env_col = env.unsqueeze(1).expand_as(step)

        def per_step(values: np.ndarray) -> th.Tensor:
            gathered = th.as_tensor(values, dtype=th.float32, device=self.device)[step, env_col]
            return th.where(action_mask, gathered, th.zeros_like(gathered))

        return SequenceSamples(
            input_ids=ids,
            attention_mask=mask,
            action_mask=action_mask,
            old_values=per_step(self.values),
            old_log_prob=per_step(self.log_probs),
            advantages=per_step(self.advantages),
            returns=per_step(self.returns),
            index=th.where(action_mask, env_col * self.buffer_size + step, th.full_like(step, -1)),
            old_policy_log_prob=per_step(self.policy_log_probs),
        )


def is_text_space(observation_space: spaces.Space, action_space: spaces.Space) -> bool:
    """True for a text env's spaces: ``Dict`` with ``input_ids`` and ``attention_mask``, ``Discrete`` actions."""
    keys = set(getattr(observation_space, "spaces", {}) or {})
    return isinstance(action_space, spaces.Discrete) and {"input_ids", "attention_mask"} <= keys
