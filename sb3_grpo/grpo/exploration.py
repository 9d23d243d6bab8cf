"""Mixed exploration: act with ``(1 - alpha) * pi + alpha * uniform``, ``alpha`` decaying linearly to 0.

The rollout stores the mixture's log-density, so the PPO ratio ``pi_new / mu_old`` is an honest importance weight
(so ``approx_kl`` and the clip fraction are nonzero from the first epoch while ``alpha > 0``; keep ``target_kl``
loose then). Since ``mu >= (1 - alpha) * pi_old``, a likely token's first ratio is about ``1 / (1 - alpha)``; above
``alpha = eps_pos / (1 + eps_pos)`` that is outside the clip range and positive advantages get no gradient, so
GRPO warns at construction (:func:`~sb3_grpo.grpo.arguments.warn_if_exploration_clips`). Box actions: the uniform
density is ``1 / volume`` of the box the policy samples in (SB3 clips Gaussian samples only when passing them to
the env, so densities are compared before clipping).

:func:`explore_alpha_at` is the schedule; the draw itself is :func:`sb3_grpo.engines.step.sample_actions`.
"""

from __future__ import annotations

__all__ = ["explore_alpha_at"]


def explore_alpha_at(explore_alpha: float, explore_fraction: float, progress_remaining: float) -> float:
    """``alpha = explore_alpha * max(0, 1 - progress / explore_fraction)``, ``progress = 1 - progress_remaining``
    (0 at the start of ``learn``, 1 at the end).

    :param explore_alpha: The initial mixture weight (0: no exploration).
    :param explore_fraction: The fraction of training over which ``alpha`` decays to 0.
    :param progress_remaining: SB3's ``_current_progress_remaining`` (1 to 0).
    """
    if explore_alpha <= 0:
        return 0.0
    progress = 1.0 - progress_remaining
    return explore_alpha * max(0.0, 1.0 - progress / explore_fraction)
