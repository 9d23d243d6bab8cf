"""The ``"step"`` engine (:class:`StepEngine`, the reference): SB3's loop as it is, each step's tokens drawn in its own
policy call, with the greedy members of self-critical groups and, optionally, uniform-mixture exploration.

:func:`sample_actions` returns both the behaviour log-prob (the mixture's while ``alpha > 0``, which the PPO ratio
divides by) and the policy's own (the KL estimate's importance weight). With ``alpha == 0`` and no greedy members it
is exactly the policy's call that SB3's ``collect_rollouts`` makes, so any on-policy algorithm of the package draws
through it. The mixture is GRPO's mechanism (:mod:`sb3_grpo.grpo.exploration` says why and how ``alpha`` decays);
its densities are in :mod:`sb3_grpo.objectives` (:func:`~sb3_grpo.objectives.uniform_log_prob`,
:func:`~sb3_grpo.objectives.mixture_log_prob`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy

from sb3_grpo.objectives import mixture_log_prob, uniform_log_prob, uniform_sample

__all__ = ["StepEngine", "sample_actions"]


_UNCHECKED_LOCK = threading.Lock()
_unchecked_depth = 0
_checked_before = True


@contextlib.contextmanager
def unchecked_distributions() -> Iterator[None]:
    """Run the block without ``torch.distributions``' argument checks, restoring the setting after it.

    Re-entrant and thread-safe: the setting is a class attribute shared by every thread, so the first block to
    enter saves it and the last to leave restores it (two rollouts drawing in two threads, an opponent drawing inside
    a rollout); a plain save-and-restore per block could leave the checks off for good.
    """
    global _unchecked_depth, _checked_before
    with _UNCHECKED_LOCK:
        if _unchecked_depth == 0:
            _checked_before = th.distributions.Distribution._validate_args
            th.distributions.Distribution.set_default_validate_args(False)
        _unchecked_depth += 1
    try:
        yield
    finally:
        with _UNCHECKED_LOCK:
            _unchecked_depth -= 1
            if _unchecked_depth == 0:
                th.distributions.Distribution.set_default_validate_args(_checked_before)


class StepEngine:
    """``engine="step"``: no tokens are computed ahead; the rollout draws each step's in its policy call
    (:func:`sample_actions`). With every extra off it is bit for bit the call SB3's PPO makes."""

    name = "step"
    #: no importance correction: the tokens are the policy's own draws
    importance_cap = None

    def before_rollout(self, policy: BasePolicy, n_updates: int) -> None:
        """Nothing to prepare: the policy draws each step itself."""

    def weights_changed(self) -> None:
        """Nothing holds a copy of the weights."""

    def start(self, *args: Any, **kwargs: Any) -> None:
        """No per-rollout queues (``None``): the rollout calls :func:`sample_actions` each step."""
        return None


def sample_actions(
    policy: BasePolicy,
    obs_tensor: th.Tensor | dict[str, th.Tensor],
    action_space: spaces.Space,
    alpha: float,
    greedy_envs: np.ndarray | None,
    rng: np.random.Generator,
    look_ahead: bool = True,
) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
    """
    Actions, values, *behaviour* log-probs (``log mu(a|s)``, the mixture's where it explores) and the
    policy's own log-probs (``log pi(a|s)``) for one step. With ``alpha == 0`` and no greedy envs this is
    exactly ``policy(obs_tensor)`` (PPO's call, same random draws), with its log-probs twice. A policy with
    ``accepts_action_filter`` (:class:`~sb3_grpo.policies.CausalLMPolicy`) gets one call that draws and replaces the
    actions (:func:`_filtered`); any other gets the draw, a deterministic call for greedy members and a
    ``get_distribution`` for the explored envs (:func:`_replaced`): the same random draws, in the same order, and
    the same actions and log-probs either way.

    The draw runs without ``torch.distributions``' argument checks (``Distribution.set_default_validate_args(False)``
    for the call, the previous default restored after it). The draw builds a distribution per step and scores the
    actions it has just drawn from it, and torch checks both by default (parameters not NaN, each action in the
    support): on CartPole's MLP that is about a fifth of the policy's call, and on a GPU each check is a host sync.
    A drawn action is in its distribution's support, and NaN parameters show as a non-finite log-prob, which the
    caller checks in one reduction instead (:func:`~sb3_grpo.common.rollout.nonfinite.check_log_probs`). PyTorch's
    advice for speed is to turn these checks off (pytorch/pytorch#48743); here only for the draw, not globally.

    :param policy: The acting policy.
    :param obs_tensor: The step's observations, as tensors.
    :param action_space: The env's action space.
    :param alpha: The mixture weight of this rollout.
    :param greedy_envs: Boolean mask of the envs that act greedily (self-critical baseline), or ``None``.
    :param rng: The exploration RNG (which envs explore, and the uniform draws).
    :param look_ahead: ``False``: a policy with ``accepts_look_ahead`` (:class:`~sb3_grpo.policies.CausalLMPolicy`)
        does not extend its rollout cache by the tokens drawn (the rollout's last step, when nothing reads the next
        outputs).
    """
    with unchecked_distributions():
        call = {} if look_ahead or not getattr(policy, "accepts_look_ahead", False) else {"look_ahead": False}
        if alpha <= 0 and greedy_envs is None:
            actions, values, log_probs = policy(obs_tensor, **call)
            return actions, values, log_probs, log_probs
        greedy = np.zeros(_rows(obs_tensor).shape[0], dtype=bool) if greedy_envs is None else greedy_envs
        squashed = bool(getattr(policy, "squash_output", False))
        if getattr(policy, "accepts_action_filter", False):
            actions, values, log_probs = _filtered(policy, obs_tensor, action_space, alpha, greedy, rng, squashed, call)
        else:
            actions, values, log_probs = _replaced(policy, obs_tensor, action_space, alpha, greedy, rng, squashed)
    if alpha <= 0:
        return actions, values, log_probs, log_probs
    log_u = uniform_log_prob(action_space, actions, squashed)
    mixed = mixture_log_prob(log_probs, log_u, alpha)
    policy_log_probs = log_probs  # log pi of every action, explored or not
    log_probs = th.where(th.as_tensor(~greedy, device=log_probs.device), mixed, log_probs)
    return actions, values, log_probs, policy_log_probs


def _rows(obs_tensor: th.Tensor | dict[str, th.Tensor]) -> th.Tensor:
    """The observations' first tensor (its length is the number of envs)."""
    return next(iter(obs_tensor.values())) if isinstance(obs_tensor, dict) else obs_tensor


def _filtered(
    policy: BasePolicy,
    obs_tensor: th.Tensor | dict[str, th.Tensor],
    action_space: spaces.Space,
    alpha: float,
    greedy: np.ndarray,
    rng: np.random.Generator,
    squashed: bool,
    call: dict[str, Any],
) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """One policy call (with the keyword arguments ``call``) that draws, then replaces the greedy members' actions by
    the mode and the explored envs' by uniform draws (the policy's ``action_filter``): actions, values and ``log pi``
    of the actions taken."""

    def choose(actions: th.Tensor, dist: Any) -> th.Tensor:
        if greedy.any():
            actions = th.where(th.as_tensor(greedy, device=actions.device), dist.mode(), actions)
        if alpha > 0:
            actions, _ = _explore(actions, action_space, alpha, greedy, rng, squashed)
        return actions

    return policy(obs_tensor, action_filter=choose, **call)


def _replaced(
    policy: BasePolicy,
    obs_tensor: th.Tensor | dict[str, th.Tensor],
    action_space: spaces.Space,
    alpha: float,
    greedy: np.ndarray,
    rng: np.random.Generator,
    squashed: bool,
) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """Any SB3 policy: draw, a second (deterministic) call for the greedy members, the explored envs' uniform draws
    scored by ``get_distribution``: the same actions and log-probs as :func:`_filtered`, in more calls."""
    actions, values, log_probs = policy(obs_tensor)
    if greedy.any():
        greedy_actions, _, greedy_log_probs = policy(obs_tensor, deterministic=True)
        rows = th.as_tensor(greedy, device=actions.device)
        actions[rows] = greedy_actions[rows]
        log_probs[rows] = greedy_log_probs[rows]
    if alpha <= 0:
        return actions, values, log_probs
    actions, explore = _explore(actions, action_space, alpha, greedy, rng, squashed)
    if explore.any():
        rows = th.as_tensor(explore, device=actions.device)
        # the distribution's shape: Discrete takes (B,), the others (B, action_dim), a Box of any shape flattened
        # (SB3's policies emit (B, *shape) actions but their distributions live on the flat action_dim)
        if isinstance(action_space, spaces.Discrete):
            eval_actions = actions.long().flatten()
        else:
            eval_actions = actions.reshape(actions.shape[0], -1)
        # log pi of the uniform draws, from the distribution the policy already computed for this
        # step (get_distribution, not evaluate_actions: a CausalLMPolicy serves it from its cache)
        explore_log_probs = policy.get_distribution(obs_tensor).log_prob(eval_actions)
        log_probs[rows] = explore_log_probs.reshape(log_probs.shape)[rows]
    return actions, values, log_probs


def _explore(
    actions: th.Tensor,
    action_space: spaces.Space,
    alpha: float,
    greedy: np.ndarray,
    rng: np.random.Generator,
    squashed: bool,
) -> tuple[th.Tensor, np.ndarray]:
    """Draw which non-greedy envs explore (probability ``alpha``) and replace their actions by uniform draws (a copy
    of ``actions`` when any does): ``(actions, explore mask)``. Both call paths draw from ``rng`` through here, in
    the same order."""
    explore = (rng.random(len(greedy)) < alpha) & ~greedy
    if explore.any():
        uniform = uniform_sample(action_space, int(explore.sum()), rng, squashed)
        actions = actions.clone()
        rows = th.as_tensor(explore, device=actions.device)
        actions[rows] = th.as_tensor(uniform, dtype=actions.dtype, device=actions.device).reshape(actions[rows].shape)
    return actions, explore
