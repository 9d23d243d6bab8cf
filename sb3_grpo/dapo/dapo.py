"""
DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476): GRPO
with four changes that the paper finds keep long-completion RL stable and efficient.

- **Decoupled clip** ("clip-higher", section 3.1): the ratio's floor ``1 - eps_low`` and ceiling ``1 + eps_high``
  are set apart (``clip_range_low``, ``clip_range_high``: 0.2 and 0.28), so unlikely tokens may grow more
  (:func:`~sb3_grpo.objectives.decoupled_clipped_surrogate`).
- **Token-level policy-gradient loss** (section 3.3): the surrogate is summed over all tokens of the minibatch and
  divided by their number, so a long completion weighs by its tokens, not as one sequence.
- **Soft overlong punishment** (section 3.4): a linear penalty over the last ``overlong_buffer`` tokens before
  ``max_completion_tokens``, added to the completion's return before the group advantage
  (:func:`~sb3_grpo.objectives.overlong_penalty`, :mod:`sb3_grpo.dapo.shaping`).
- **Dynamic sampling** (section 3.2): groups whose rewards are all equal have zero advantage and no signal; they are
  dropped and more rollouts are collected until the update holds ``min_informative_groups`` informative groups (at
  most ``max_sampling_rollouts`` rollouts), on the text fast path.

No critic, no KL term; the skeleton is :class:`~sb3_grpo.common.critic_free.CriticFreeAlgorithm`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import GymEnv
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo.common.advantages.forms import make_group_tracker
from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker, env_episode_limit
from sb3_grpo.common.buffers import SequenceRolloutBuffer
from sb3_grpo.common.critic_free import CriticFreeAlgorithm
from sb3_grpo.common.options.checks import check_clip_bounds
from sb3_grpo.common.options.support import Supports
from sb3_grpo.common.type_aliases import Minibatch, SequenceSamples
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.dapo.shaping import ShapedGroupTracker
from sb3_grpo.objectives import decoupled_clipped_surrogate, decoupled_eps
from textrl_envs.validation import check_float, check_int

__all__ = ["DAPO"]


class DAPO(CriticFreeAlgorithm):
    """
    DAPO: decoupled clip, token-level loss, soft overlong punishment and dynamic sampling, no critic.

    The loss of a minibatch of tokens ``t`` (``T`` of them)::

        L = -(1 / T) * sum_t min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)  -  ent_coef * mean_t H_t

    with ``r_t = pi(a_t|s_t) / pi_old(a_t|s_t)`` and ``A_t`` the group advantage of ``t``'s episode, computed from
    returns with the overlong penalty added. It needs an env with groups (``group_size > 1``).

    PPO's arguments and the shared options are the skeleton's
    (:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`; ``clip_range`` and its schedule are ``eps_low`` unless
    ``clip_range_low`` is given; ``vf_coef``, ``clip_range_vf`` and ``normalize_advantage`` have no effect); what it
    supports of the shared options is :attr:`supports`. Its own:

    :param clip_range_low: ``eps_low``, the ratio's floor is ``1 - eps_low`` (``None``: ``clip_range``'s value)
    :param clip_range_high: ``eps_high``, the ratio's ceiling is ``1 + eps_high`` (the paper's 0.28)
    :param advantage: ``"group"`` (the paper's, the default), ``"group_mean"``, ``"rloo"`` or ``"self_critical"``
        (one return per episode of a group: the overlong penalty and dynamic sampling work on those)
    :param max_completion_tokens: ``L_max`` of the overlong penalty; ``None``: the env's episode budget
    :param overlong_buffer: ``L_cache``, the tokens before ``L_max`` over which the penalty grows linearly to
        ``-overlong_penalty_factor``; ``None``: a fifth of ``L_max`` (the paper's 4096 of 20480); ``0``: off
    :param overlong_penalty_factor: the penalty at ``L_max`` (the paper's 1.0)
    :param min_informative_groups: dynamic sampling: the informative groups (rewards not all equal) an update needs;
        groups without signal are dropped and rollouts are collected until there are this many. ``None``: off
    :param max_sampling_rollouts: dynamic sampling's bound: at most this many rollouts per update (the update trains
        on what it has then)
    """

    supports = Supports(
        advantages=("group", "group_mean", "rloo", "self_critical"),
        reward_redistribution=(),
        advantage_note=(
            "DAPO's overlong penalty and dynamic sampling act on each episode's return within its group, so it takes a "
            "group advantage with one return per episode"
        ),
    )

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        *args: Any,
        clip_range_low: float | None = None,
        clip_range_high: float = 0.28,
        advantage: str = "group",
        max_completion_tokens: int | None = None,
        overlong_buffer: int | None = None,
        overlong_penalty_factor: float = 1.0,
        min_informative_groups: int | None = None,
        max_sampling_rollouts: int = 4,
        _init_setup_model: bool = True,
        **kwargs: Any,
    ):
        check_clip_bounds(clip_range_low, clip_range_high, low_example=0.2, high_example=0.28)
        if max_completion_tokens is not None:
            check_int("max_completion_tokens", max_completion_tokens, low=1, example=64)
        if overlong_buffer is not None:
            check_int("overlong_buffer", overlong_buffer, low=0, example=16)
        check_float("overlong_penalty_factor", overlong_penalty_factor, low=0, example=1.0)
        if min_informative_groups is not None:
            check_int("min_informative_groups", min_informative_groups, low=1, example=8)
        check_int("max_sampling_rollouts", max_sampling_rollouts, low=1, example=4)
        super().__init__(policy, env, *args, advantage=advantage, _init_setup_model=_init_setup_model, **kwargs)
        self.clip_range_low = clip_range_low
        self.clip_range_high = clip_range_high
        if max_completion_tokens is None and self.env is not None:
            max_completion_tokens = env_episode_limit(self.env)
        if max_completion_tokens is None and self.env is not None and overlong_buffer != 0:
            raise ValueError(
                "DAPO's overlong penalty needs the completion budget, and this env does not say how long its episodes "
                "may be; pass max_completion_tokens= (e.g. max_new_tokens), or overlong_buffer=0 to turn it off"
            )
        if overlong_buffer is None and max_completion_tokens is not None:
            overlong_buffer = max(1, max_completion_tokens // 5)
        if overlong_buffer and max_completion_tokens is not None and overlong_buffer > max_completion_tokens:
            raise ValueError(
                f"overlong_buffer={overlong_buffer} is longer than the completion budget max_completion_tokens="
                f"{max_completion_tokens}; pass at most {max_completion_tokens} (e.g. a fifth of it), or 0 to turn it "
                "off"
            )
        self.max_completion_tokens = max_completion_tokens
        self.overlong_buffer = overlong_buffer
        self.overlong_penalty_factor = overlong_penalty_factor
        self.min_informative_groups = min_informative_groups
        self.max_sampling_rollouts = max_sampling_rollouts
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------------------------------------------
    # Setup and rollout
    # ------------------------------------------------------------------------------------------------------
    def _check_buffer_class(self, buffer_class: type[RolloutBuffer]) -> None:
        super()._check_buffer_class(buffer_class)
        if self.min_informative_groups is not None and not issubclass(buffer_class, SequenceRolloutBuffer):
            raise ValueError(
                "DAPO's dynamic sampling (min_informative_groups) holds the informative groups' whole sequences "
                "across rollouts, which the text fast path's buffer does; the rollout buffer here is "
                f"{buffer_class.__name__}. "
                "Use a CausalLMPolicy on a text env with rollout_buffer_class=None (the default), or "
                "min_informative_groups=None"
            )

    def _overlong(self) -> tuple[int, int, float] | None:
        """``(L_max, L_cache, factor)`` of the overlong penalty, or ``None`` when it is off."""
        if not self.overlong_buffer or self.max_completion_tokens is None:
            return None
        return self.max_completion_tokens, self.overlong_buffer, self.overlong_penalty_factor

    def _rollout_group_tracker(self, env: VecEnv) -> EpisodeGroupTracker | None:
        """The shaped tracker (:class:`~sb3_grpo.dapo.shaping.ShapedGroupTracker`), kept across rollouts."""
        if self._group_tracker is None or self._group_tracker.n_envs != env.num_envs:
            self._group_tracker = ShapedGroupTracker.like(
                make_group_tracker(env, self.advantage),
                overlong=self._overlong(),
                drop_uninformative=self.min_informative_groups is not None,
            )
        return self._group_tracker

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """
        The skeleton's rollout (SB3's ``collect_rollouts``), repeated for dynamic sampling: after each, the groups
        whose returns are all equal are dropped (their sequences left out of the update) and, while fewer than
        ``min_informative_groups`` informative groups have completed and fewer than ``max_sampling_rollouts``
        rollouts ran, the informative sequences are held and another rollout is collected into the buffer. The update
        then trains on the last rollout and the held sequences (``carry_over``'s way of adding sequences to a buffer).

        :return: ``False`` when a callback stopped a rollout (SB3's contract).
        """
        if self.min_informative_groups is None:
            ok = super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
            self._record_shaping(self.logger)
            return ok
        held: list[SequenceSamples] = []
        informative = dropped = 0
        for attempt in range(self.max_sampling_rollouts):
            if not super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps):
                return False
            tracker = self._group_tracker
            assert isinstance(tracker, ShapedGroupTracker) and isinstance(rollout_buffer, SequenceRolloutBuffer)
            informative += tracker.n_informative
            dropped += tracker.n_uninformative
            rollout_buffer.leave_out(tracker.dropped_segments())
            self._record_shaping(self.logger)
            if informative >= self.min_informative_groups or attempt == self.max_sampling_rollouts - 1:
                break
            held.extend(_kept_sequences(rollout_buffer, tracker))
        if held:
            carried = [*held, rollout_buffer.carried_in] if rollout_buffer.carried_in is not None else held
            rollout_buffer.carried_in = SequenceSamples(*(th.cat(f) for f in zip(*carried, strict=True)))
        extra = attempt * n_rollout_steps * env.num_envs
        self.logger.record("rollout/groups_dropped", dropped)
        self.logger.record("rollout/informative_groups", informative)
        self.logger.record("rollout/sampling_rollouts", attempt + 1)
        self.logger.record("rollout/dynamic_sampling_extra_steps", extra)
        return True

    def _record_shaping(self, logger: Logger) -> None:
        tracker = self._group_tracker
        if isinstance(tracker, ShapedGroupTracker) and tracker.overlong is not None and tracker.penalties:
            logger.record("rollout/overlong_penalty_mean", float(np.mean(tracker.penalties)))
            logger.record("rollout/overlong_frac", float(np.mean(np.array(tracker.penalties) < 0)))

    # ------------------------------------------------------------------------------------------------------
    # Update
    # ------------------------------------------------------------------------------------------------------
    def _clip_bounds(self, clip_range: float) -> tuple[float, float]:
        """``(eps_low, eps_high)`` of this update (``eps_low`` follows ``clip_range`` unless given)."""
        low = clip_range if self.clip_range_low is None else self.clip_range_low
        return low, self.clip_range_high

    def _policy_loss(
        self, minibatch: Minibatch, log_prob: th.Tensor, clip_range: float, stats: TrainStats
    ) -> th.Tensor:
        """DAPO's policy term (see the class); ``clip_range`` is ``eps_low`` unless ``clip_range_low`` is given."""
        advantages = minibatch.advantages
        low, high = self._clip_bounds(clip_range)
        ratio = th.exp(log_prob - minibatch.old_log_prob)
        surrogate = decoupled_clipped_surrogate(ratio, advantages, low, high)
        stats.add_clip_fractions(ratio, decoupled_eps(ratio.detach(), low, high), advantages)
        # token-level: the sum over every token of the minibatch divided by their number (DAPO, section 3.3); a
        # micro-batch's mean weighted by its share of the minibatch's tokens
        return -surrogate.mean() * (1.0 if minibatch.share is None else minibatch.share.fraction)

    def _record_own(self, logger: Logger, clip_range: float) -> None:
        low, high = self._clip_bounds(clip_range)
        logger.record("train/clip_range_low", low)
        logger.record("train/clip_range_high", high)


def _kept_sequences(buffer: SequenceRolloutBuffer, tracker: ShapedGroupTracker) -> list[SequenceSamples]:
    """The sequences of a rollout that a later update of dynamic sampling trains on: its segments with a known, valid
    group advantage, and the sequences ``carry_over`` handed it; no longer rows of the buffer (``index`` ``-1``)."""
    kept = []
    segments = tracker.kept_segments()
    if len(segments):
        samples = buffer.sequence_samples(segments)
        kept.append(samples._replace(index=th.full_like(samples.index, -1)))
    if buffer.carried_in is not None:
        kept.append(buffer.carried_in)
    return kept
