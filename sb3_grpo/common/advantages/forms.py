"""The advantage forms (``advantage=``): one registry, each form a pure function of :mod:`sb3_grpo.objectives` and what
it asks of the env.

A form is an :class:`AdvantageForm`: its name, the per-step bookkeeping that turns finished episodes into advantages
(:mod:`.group_trackers`; ``None`` for GAE, whose advantages SB3's buffer computes from the critic), and what the rest of
the package reads off it (whether it needs prompt groups, whether its advantage varies within an episode, whether a
member of each group acts greedily). A new per-episode form is one pure function ``f(returns, group_ids) ->
(advantages, valid)`` and one registration::

    register_advantage(AdvantageForm("my_form", episode_tracker(my_advantages), summary="..."))

Each algorithm says which forms it takes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo.common.advantages.group_trackers import (
    EpisodeGroupTracker,
    RoleBaselineTracker,
    TurnGroupTracker,
    _ignore_greedy,
    check_grouped_env,
    env_is_interactive,
    warn_if_episodes_straddle,
)
from sb3_grpo.objectives import group_advantages, group_mean_advantages, rloo_advantages, self_critical_advantages

__all__ = [
    "ADVANTAGE_FORMS",
    "BUILT_IN_FORMS",
    "CRITIC_FREE_FORMS",
    "AdvantageForm",
    "advantage_form",
    "check_advantage_env",
    "episode_tracker",
    "make_group_tracker",
    "register_advantage",
]

#: ``(n_envs, group_size or None) -> tracker``: a form's per-step bookkeeping for a VecEnv.
TrackerFactory = Callable[[int, "int | None"], EpisodeGroupTracker]


@dataclass(frozen=True)
class AdvantageForm:
    """One advantage form.

    :param name: Its value of ``advantage=``.
    :param tracker: Builds its per-step bookkeeping for ``n_envs`` envs in groups of ``group_size`` (``None``: GAE,
        the critic's advantages as SB3 computes them).
    :param grouped: It needs an env in prompt groups (``group_size > 1`` and ``info["group_id"]``).
    :param per_token: Its advantage varies within an episode (per turn, per token): ``carry_over`` cannot hold its
        sequences with one advantage, and a per-sequence loss takes its token-level form.
    :param greedy_member: Env ``i`` with ``i % group_size == 0`` acts greedily and serves as the baseline.
    :param check_env: Refuses an env the form cannot use, given the env and its group size (beyond the groups).
    :param summary: One line: what it computes, and where it comes from.
    :param owner: The algorithm that takes it whatever else does (the alternative an error names): ``GRPO`` for the
        package's own forms, the algorithm that registers a form of its own.
    """

    name: str
    tracker: TrackerFactory | None
    grouped: bool = True
    per_token: bool = False
    greedy_member: bool = False
    check_env: Callable[[VecEnv, int | None], None] | None = None
    summary: str = ""
    owner: str = "GRPO"

    @property
    def critic(self) -> bool:
        """Whether the form trains a critic (GAE): every other form's advantages come from returns alone."""
        return self.tracker is None


#: The registered forms by name, in the order they were registered.
ADVANTAGE_FORMS: dict[str, AdvantageForm] = {}


def register_advantage(form: AdvantageForm) -> AdvantageForm:
    """Add ``form`` to :data:`ADVANTAGE_FORMS` (an algorithm then lists it among the forms it supports).

    :raises ValueError: when a form of that name is registered already.
    """
    if form.name in ADVANTAGE_FORMS:
        raise ValueError(f"an advantage form named {form.name!r} is registered already; pick another name")
    ADVANTAGE_FORMS[form.name] = form
    return form


def advantage_form(name: str) -> AdvantageForm:
    """The registered form ``name``.

    :raises ValueError: naming the registered forms, for a name that is not one of them.
    """
    form = ADVANTAGE_FORMS.get(name) if isinstance(name, str) else None
    if form is None:
        raise ValueError(f"advantage must be one of {', '.join(repr(n) for n in ADVANTAGE_FORMS)}, got {name!r}")
    return form


def episode_tracker(fn: Callable, greedy: bool = False) -> TrackerFactory:
    """The tracker of a per-episode form: one advantage per episode of a complete group, from the pure function
    ``fn(returns, group_ids) -> (advantages, valid)`` (``greedy``: ``fn(returns, group_ids, is_greedy)``, the greedy
    member of each group being env ``i`` with ``i % group_size == 0``)."""

    def make(n_envs: int, group_size: int | None) -> EpisodeGroupTracker:
        assert group_size is not None, "a per-episode form needs the env's group size"
        greedy_envs = np.arange(n_envs) % group_size == 0 if greedy else None
        return EpisodeGroupTracker(n_envs, group_size, fn if greedy else _ignore_greedy(fn), greedy_envs=greedy_envs)

    return make


def check_advantage_env(env: VecEnv, advantage: str, n_steps: int | None = None) -> int | None:
    """The env's ``group_size`` (``None`` for a form without groups), after checking that the env suits the form.

    :param env: The VecEnv.
    :param advantage: The form's name.
    :param n_steps: Steps per env per rollout; a grouped form warns when it is shorter than the env's episodes
        (:func:`~.group_trackers.warn_if_episodes_straddle`). ``None``: no such check.
    :raises ValueError: for an env the form cannot use, naming what it needs.
    """
    form = advantage_form(advantage)
    group_size = check_grouped_env(env, advantage) if form.grouped else None
    if form.check_env is not None:
        form.check_env(env, group_size)
    if form.grouped and n_steps is not None:
        warn_if_episodes_straddle(env, advantage, n_steps)
    return group_size


def make_group_tracker(env: VecEnv, advantage: str) -> EpisodeGroupTracker | None:
    """The per-step bookkeeping of the form ``advantage`` for ``env`` (``None`` for GAE), after
    :func:`check_advantage_env`."""
    form = advantage_form(advantage)
    if form.tracker is None:
        return None
    return form.tracker(env.num_envs, check_advantage_env(env, advantage))


def _greedy_rows_fit(env: VecEnv, group_size: int | None) -> None:
    if group_size is not None and env.num_envs % group_size != 0:
        raise ValueError(
            f"advantage='self_critical' makes env i with i % group_size == 0 act greedily, so n_envs "
            f"({env.num_envs}) must be a multiple of group_size ({group_size})"
        )


def _interactive(env: VecEnv, _group_size: int | None) -> None:
    if env_is_interactive(env) is False:
        raise ValueError(
            "advantage='group_turn' credits each turn of an interactive episode, but this text env has no "
            "interaction (its episodes are one turn). Use an interactive env (GuessNumber-v0, ToolArithmetic-v0, or "
            "interaction=...), or advantage='rloo', which is what 'group_turn' computes for one-turn episodes"
        )


def _turn_tracker(n_envs: int, group_size: int | None) -> EpisodeGroupTracker:
    assert group_size is not None, "advantage='group_turn' needs the env's group size"
    return TurnGroupTracker(n_envs, group_size)


def _role_tracker(n_envs: int, _group_size: int | None) -> EpisodeGroupTracker:
    return RoleBaselineTracker(n_envs)


register_advantage(AdvantageForm("gae", None, grouped=False, summary="PPO's GAE from the critic"))
register_advantage(
    AdvantageForm(
        "group",
        episode_tracker(group_advantages),
        summary="(r - mean_g) / (std_g + eps) per group (DeepSeekMath, arXiv 2402.03300)",
    )
)
register_advantage(
    AdvantageForm(
        "group_mean",
        episode_tracker(group_mean_advantages),
        summary="r - mean_g, no std division (Dr. GRPO, arXiv 2503.20783)",
    )
)
register_advantage(
    AdvantageForm(
        "rloo",
        episode_tracker(rloo_advantages),
        summary="the leave-one-out mean of the group as baseline (Ahmadian et al. 2024, arXiv 2402.14740)",
    )
)
register_advantage(
    AdvantageForm(
        "self_critical",
        episode_tracker(self_critical_advantages, greedy=True),
        greedy_member=True,
        check_env=_greedy_rows_fit,
        summary="the greedy member's reward as baseline (Rennie et al. 2017)",
    )
)
register_advantage(
    AdvantageForm(
        "group_turn",
        _turn_tracker,
        per_token=True,
        check_env=_interactive,
        summary="each turn's return-to-go minus the group's leave-one-out mean at that turn (interactive episodes)",
    )
)
register_advantage(
    AdvantageForm(
        "role",
        _role_tracker,
        grouped=False,
        summary="a running baseline per game and role (SPIRAL, arXiv 2506.24119); two-player games, no groups",
    )
)

#: The package's own forms, in their order (forms registered elsewhere, by an algorithm of their own, come after).
BUILT_IN_FORMS = tuple(ADVANTAGE_FORMS)
#: The package's own forms that train no critic (every one but GAE): what an algorithm without a critic takes.
CRITIC_FREE_FORMS = tuple(name for name in BUILT_IN_FORMS if not ADVANTAGE_FORMS[name].critic)
