"""
What GRPO stores about a rollout beyond SB3's :class:`~stable_baselines3.common.buffers.RolloutBuffer`.

- :class:`EpisodeGroupTracker`: turns the per-step stream of a grouped env (rewards, dones and
  ``info["group_id"]``) into one return per finished episode, and the group advantages of
  :mod:`sb3_grpo.objectives` back into one advantage per stored step. It keeps what it needs across
  rollouts (running returns of unfinished episodes, returns of group members that finished earlier), so a
  group whose members finish in different rollouts still gets its baseline.

- :class:`SequenceRolloutBuffer`: the text fast path. It keeps a text env's rollout (right-aligned token
  windows, see :mod:`textrl_envs.core`) on the policy's device and serves the update whole sequences, so
  that the policy computes every generated token's log-prob, entropy and value in one forward per
  sequence (``CausalLMPolicy.evaluate_sequences``) instead of one forward per transition.

- :class:`GRPORolloutBuffer` / :class:`GRPODictRolloutBuffer`: the per-transition path, SB3's
  ``RolloutBuffer`` / ``DictRolloutBuffer`` plus one field, ``policy_log_probs``: the acting policy's own
  ``log pi_old(a|s)`` beside SB3's ``log_probs``, which under mixed exploration hold the behaviour mixture's
  ``log mu(a|s)``. Their ratio is the importance weight of GRPO's KL-to-reference estimate
  (:func:`~sb3_grpo.objectives.kl_k3_weighted_mean`). Everything else (storage, GAE, the random minibatch
  order) is SB3's; GRPO also overwrites ``advantages`` for the group forms. The sequence buffer inherits
  the same fields.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.vec_env import VecNormalize

GroupAdvantageFn = Callable[[th.Tensor, th.Tensor, th.Tensor], tuple[th.Tensor, th.Tensor]]

GROUPED_ENV_HINT = "e.g. textrl_envs.sb3.make_vec_env(..., group_size=4)"


class EpisodeGroupTracker:
    """
    Per-step bookkeeping for group advantages (``advantage="group" | "rloo" | "self_critical"``).

    Conventions (the env's side of the contract):

    - each step's info dict carries ``info["group_id"]`` (an int shared by the ``group_size`` episodes of
      one group round, i.e. the completions of one prompt); on a ``done`` step the info describes the
      episode that just ended (as SB3's ``info["episode"]`` does). ``info["episode_id"]`` is not needed:
      episodes are delimited by ``dones`` per env.
    - an episode's return is the undiscounted sum of its rewards (text envs pay at the end), including
      rewards earned in earlier rollouts.

    Which steps get an advantage: the steps (in this rollout) of every episode whose *whole group* has
    finished by the end of this rollout, ``group_size`` members, counting members that finished in earlier
    rollouts (their returns are remembered, they serve as baseline only). All other steps get advantage
    0: episodes still running at the end of the rollout, and episodes whose group is not complete yet.
    Requiring the whole group avoids the bias of baselines computed from the members that happen to
    finish first (short completions). Keep ``n_steps`` well above the episode length so few groups
    straddle two rollouts.

    :param n_envs: number of envs of the VecEnv
    :param group_size: number of episodes per group round (``G``)
    :param advantage_fn: ``f(returns, group_ids, is_greedy) -> (advantages, valid)`` per episode,
        one of the functions of :mod:`sb3_grpo.objectives` (wrapped)
    :param greedy_envs: boolean mask of envs that act greedily (self-critical baseline), or ``None``
    :param max_pending_groups: how many incomplete groups to remember across rollouts (oldest dropped)
    """

    def __init__(
        self,
        n_envs: int,
        group_size: int,
        advantage_fn: GroupAdvantageFn,
        greedy_envs: np.ndarray | None = None,
        max_pending_groups: int = 100_000,
    ):
        self.n_envs = n_envs
        self.group_size = group_size
        self.advantage_fn = advantage_fn
        self.greedy_envs = np.zeros(n_envs, dtype=bool) if greedy_envs is None else np.asarray(greedy_envs, bool)
        self.max_pending_groups = max_pending_groups
        self.running_returns = np.zeros(n_envs, dtype=np.float64)
        # group id -> list of (return, is_greedy) of members that finished in earlier rollouts
        self.pending: OrderedDict[int, list[tuple[float, bool]]] = OrderedDict()
        self.reset_rollout(0)

    def reset_rollout(self, n_steps: int) -> None:
        """Start recording a new rollout of ``n_steps`` steps."""
        self.rewards = np.zeros((n_steps, self.n_envs), dtype=np.float64)
        self.dones = np.zeros((n_steps, self.n_envs), dtype=bool)
        self.group_ids = np.full((n_steps, self.n_envs), -1, dtype=np.int64)
        self.pos = 0

    def add(self, rewards: np.ndarray, dones: np.ndarray, infos: Sequence[dict[str, Any]]) -> None:
        """
        Record one step of the VecEnv (raw rewards, before any value bootstrapping).

        :param rewards: rewards of the step, shape ``(n_envs,)``
        :param dones: dones of the step, shape ``(n_envs,)``
        :param infos: the VecEnv's list of info dicts
        """
        self.rewards[self.pos] = rewards
        self.dones[self.pos] = dones
        for idx, info in enumerate(infos):
            group_id = info.get("group_id")
            if group_id is None:
                if dones[idx]:
                    raise ValueError(
                        f"a grouped advantage needs info['group_id'] on every step; env {idx} finished an "
                        f"episode without one. Use an env with group_size > 1, {GROUPED_ENV_HINT}"
                    )
                continue
            self.group_ids[self.pos, idx] = int(group_id)
        self.pos += 1

    def compute(self) -> tuple[np.ndarray, dict[str, float]]:
        """
        Advantages per stored step for the recorded rollout.

        :return: ``(advantages, stats)``: ``advantages`` of shape ``(n_steps, n_envs)`` (float32, zeros for
            steps without a complete group), and logging statistics ``group_reward_mean`` (mean of the
            complete groups' mean returns), ``group_reward_std`` (mean within-group std), ``n_groups``,
            ``frac_steps_nonzero_advantage``
        """
        n_steps = self.pos
        # 1. segment each env's stream into episodes using dones
        episodes = []  # (env, start, end_inclusive, return, group_id, is_greedy)
        for env in range(self.n_envs):
            start = 0
            for t in range(n_steps):
                if self.dones[t, env]:
                    ret = self.running_returns[env] + self.rewards[start : t + 1, env].sum()
                    episodes.append((env, start, t, ret, int(self.group_ids[t, env]), bool(self.greedy_envs[env])))
                    self.running_returns[env] = 0.0
                    start = t + 1
            self.running_returns[env] += self.rewards[start:n_steps, env].sum()

        # 2. gather members per group: earlier rollouts (baseline only) + this rollout
        members: dict[int, list[tuple[float, bool, int]]] = {}  # group -> (return, greedy, episode index or -1)
        for i, (_, _, _, ret, gid, greedy) in enumerate(episodes):
            if gid not in members:
                members[gid] = [(r, g, -1) for r, g in self.pending.get(gid, [])]
            members[gid].append((ret, greedy, i))

        advantages = np.zeros((n_steps, self.n_envs), dtype=np.float32)
        returns, gids, greedies, owners = [], [], [], []
        group_means, group_stds = [], []
        for gid, group in members.items():
            if len(group) >= self.group_size:
                self.pending.pop(gid, None)
                rets = np.array([m[0] for m in group])
                group_means.append(rets.mean())
                group_stds.append(rets.std(ddof=1) if len(rets) > 1 else 0.0)
                for ret, greedy, owner in group:
                    returns.append(ret)
                    gids.append(gid)
                    greedies.append(greedy)
                    owners.append(owner)
            else:
                self.pending[gid] = [(m[0], m[1]) for m in group]
                self.pending.move_to_end(gid)
        while len(self.pending) > self.max_pending_groups:
            self.pending.popitem(last=False)

        if returns:
            adv, valid = self.advantage_fn(
                th.as_tensor(np.array(returns)), th.as_tensor(np.array(gids)), th.as_tensor(np.array(greedies))
            )
            adv = adv.cpu().numpy()
            valid = valid.cpu().numpy()
            for k, owner in enumerate(owners):
                if owner >= 0 and valid[k]:
                    env, start, end = episodes[owner][:3]
                    advantages[start : end + 1, env] = adv[k]

        stats = {
            "group_reward_mean": float(np.mean(group_means)) if group_means else float("nan"),
            "group_reward_std": float(np.mean(group_stds)) if group_stds else float("nan"),
            "n_groups": float(len(group_means)),
            "frac_steps_nonzero_advantage": float(np.mean(advantages != 0)) if advantages.size else 0.0,
        }
        return advantages, stats


# ----------------------------------------------------------------------------------------------------------
# The per-transition path: SB3's buffers plus the policy's own log-prob
# ----------------------------------------------------------------------------------------------------------
class GRPORolloutBufferSamples(NamedTuple):
    """SB3's ``RolloutBufferSamples`` / ``DictRolloutBufferSamples`` fields, same order, plus
    ``old_policy_log_prob``: the acting policy's ``log pi_old(a|s)`` (``old_log_prob`` is the behaviour
    distribution's, the exploration mixture's while ``explore_alpha > 0``)."""

    observations: Any
    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    old_policy_log_prob: th.Tensor


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
        log_prob = kwargs["log_prob"] if "log_prob" in kwargs else args[5]
        own = log_prob if policy_log_prob is None else policy_log_prob
        if len(own.shape) == 0:  # as SB3 does for log_prob
            own = own.reshape(-1, 1)
        self.policy_log_probs[self.pos] = own.clone().cpu().numpy()  # type: ignore[attr-defined]
        super().add(*args, **kwargs)  # type: ignore[misc]

    def get(self, batch_size: int | None = None) -> Generator[GRPORolloutBufferSamples, None, None]:
        """SB3's ``get`` (same random minibatches), with ``old_policy_log_prob`` in every sample."""
        if not self.generator_ready:  # type: ignore[attr-defined]  # SB3 flattens its own fields in get()
            self.policy_log_probs = self.swap_and_flatten(self.policy_log_probs)  # type: ignore[attr-defined]
        yield from super().get(batch_size)  # type: ignore[misc]

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> GRPORolloutBufferSamples:
        samples = super()._get_samples(batch_inds, env)  # type: ignore[misc]
        own = self.to_torch(self.policy_log_probs[batch_inds].flatten())  # type: ignore[attr-defined]
        return GRPORolloutBufferSamples(*samples, old_policy_log_prob=own)


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


class SequenceSamples(NamedTuple):
    """
    A minibatch of whole sequences for the text fast path.

    Every tensor is ``[S, W]``: ``S`` sequences (the steps of one episode within the rollout), each in its
    final window of width ``W``. At a position ``j`` where ``action_mask[s, j]`` is true, ``input_ids[s, j]``
    is the action taken in the state whose newest token is at ``j - 1``, and the per-transition fields are
    stored there (zero elsewhere). ``index`` is the transition's flat index in ``RolloutBuffer`` order
    (``env * n_steps + step``), ``-1`` elsewhere. ``x[action_mask]`` lists the transitions sequence by
    sequence, step by step, the same order for every field. ``old_log_prob`` is the behaviour distribution's
    log-prob (the exploration mixture's while ``explore_alpha > 0``), ``old_policy_log_prob`` the acting
    policy's own.
    """

    input_ids: th.Tensor
    attention_mask: th.Tensor
    action_mask: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    index: th.Tensor
    old_policy_log_prob: th.Tensor


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
        lengths = segments[:, 2] - segments[:, 1]
        order = np.random.permutation(len(segments))
        for batch in pack_segments(lengths, batch_size or self.buffer_size * self.n_envs, order):
            yield self.sequence_samples(segments[batch])

    def sequence_samples(self, segments: np.ndarray) -> SequenceSamples:
        """
        The :class:`SequenceSamples` of the given segments (rows of :func:`episode_segments`).
        """
        width = self.token_ids.shape[-1]
        env = th.as_tensor(segments[:, 0], device=self.device)
        first = th.as_tensor(segments[:, 1], device=self.device)
        last = th.as_tensor(segments[:, 2] - 1, device=self.device)
        length = last - first + 1
        actions = th.as_tensor(self.actions[..., 0], device=self.device).long()  # [n_steps, n_envs]
        # the episode's window after its last step in the rollout
        ids = th.cat([self.token_ids[last, env, 1:], actions[last, env].unsqueeze(1)], dim=1)
        mask = th.cat([self.token_mask[last, env, 1:], th.ones_like(length).unsqueeze(1)], dim=1)
        # step first + k sits at column W - length + k
        k = th.arange(width, device=self.device).unsqueeze(0) - (width - length).unsqueeze(1)
        action_mask = k >= 0
        step = th.where(action_mask, first.unsqueeze(1) + k, th.zeros_like(k))
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
