"""
Group advantages (``advantage="group" | "rloo" | "self_critical" | "group_turn"``) and role-conditioned ones
(``"role"``): the per-step bookkeeping that turns an env's stream of steps into one return per finished episode (per
turn, for ``"group_turn"``), and the advantages of :mod:`sb3_grpo.objectives` back into one advantage per stored
step.

:class:`EpisodeGroupTracker` keeps what it needs across rollouts (running returns of unfinished episodes,
returns of group members that finished earlier), so a group whose members finish in different rollouts still
gets its baseline. :class:`RoleBaselineTracker` keeps a running baseline per game and role instead (SPIRAL).
Which tracker an advantage form uses is the form's registration (:mod:`.forms`).
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo.objectives import role_ema_advantages, turn_rloo_advantages

__all__ = [
    "GROUPED_ENV_HINT",
    "ROLE_ENV_HINT",
    "EpisodeGroupTracker",
    "RoleBaselineTracker",
    "TurnGroupTracker",
    "check_grouped_env",
    "env_group_size",
    "env_is_interactive",
    "warn_if_episodes_straddle",
]

GroupAdvantageFn = Callable[[th.Tensor, th.Tensor, th.Tensor], tuple[th.Tensor, th.Tensor]]

GROUPED_ENV_HINT = "e.g. textrl_envs.sb3.make_vec_env(..., group_size=4)"
ROLE_ENV_HINT = "a two-player game env, e.g. textrl_envs.sb3.make_vec_env('TicTacToe-v0', n_envs=8)"

#: SPIRAL's decay of the running baseline per game and role (Liu et al. 2025, arXiv 2506.24119, alpha = 0.95).
ROLE_BASELINE_DECAY = 0.95


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
    finish first (short completions). The steps an episode took in earlier rollouts were trained on with
    advantage 0 (each rollout is trained on once, when it ends, before later returns are known): keep
    ``n_steps`` well above the episode length so few episodes straddle two rollouts, or let GRPO's ``carry_over``
    (:mod:`sb3_grpo.common.advantages.carry_over`) train them later, by the episode keys below. GRPO warns at
    construction when ``n_steps`` is shorter than the env's episodes (:func:`warn_if_episodes_straddle`); the share of
    steps that get an advantage is logged as ``rollout/frac_steps_nonzero_advantage``.

    Every episode has a key (an int, given when it starts and kept across rollouts). After :meth:`compute`,
    :attr:`segments` gives the key of each run of steps of the rollout and :attr:`resolved` the advantage of every
    member of the groups completed in it, earlier rollouts' members included; :meth:`live_keys` are the episodes
    whose advantage may still come.

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
        # group id -> list of (return, is_greedy, episode key) of members that finished in earlier rollouts
        self.pending: OrderedDict[int, list[tuple[float, bool, int]]] = OrderedDict()
        # every episode has a key, given when it starts (the running episode of env i has running_keys[i])
        self.running_keys = np.arange(n_envs, dtype=np.int64)
        self._next_key = n_envs
        #: after :meth:`compute`: the episode key of every member of the groups completed in that rollout, with its
        #: advantage (``None`` where it is not valid, e.g. a greedy member)
        self.resolved: dict[int, float | None] = {}
        #: after :meth:`compute`: ``(env, t0, t1, key)`` for each run of steps ``t0 .. t1 - 1`` of one episode in that
        #: rollout (the rows of :func:`~sb3_grpo.common.buffers.episode_segments`, same order)
        self.segments: list[tuple[int, int, int, int]] = []
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

    def _segment_episodes(self) -> list[tuple[int, int, int, float, int, bool, int]]:
        """The episodes that ended in the recorded rollout, ``(env, start, end_inclusive, return, group_id,
        is_greedy, key)`` env by env, their returns including the steps of earlier rollouts; fills
        :attr:`segments` and moves the running returns and keys on."""
        n_steps = self.pos
        episodes = []
        self.segments = []
        for env in range(self.n_envs):
            start = 0
            for t in range(n_steps):
                if self.dones[t, env]:
                    ret = self.running_returns[env] + self.rewards[start : t + 1, env].sum()
                    key = int(self.running_keys[env])
                    episodes.append((env, start, t, ret, int(self.group_ids[t, env]), bool(self.greedy_envs[env]), key))
                    self.segments.append((env, start, t + 1, key))
                    self.running_returns[env] = 0.0
                    self.running_keys[env], self._next_key = self._next_key, self._next_key + 1
                    start = t + 1
            self.running_returns[env] += self.rewards[start:n_steps, env].sum()
            if start < n_steps:
                self.segments.append((env, start, n_steps, int(self.running_keys[env])))
        return episodes

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
        episodes = self._segment_episodes()

        # 2. gather members per group: earlier rollouts (baseline only) + this rollout
        members: dict[int, list[tuple[float, bool, int, int]]] = {}  # group -> (return, greedy, episode index, key)
        for i, (_, _, _, ret, gid, greedy, key) in enumerate(episodes):
            if gid not in members:
                members[gid] = [(r, g, -1, k) for r, g, k in self.pending.get(gid, [])]
            members[gid].append((ret, greedy, i, key))

        advantages = np.zeros((n_steps, self.n_envs), dtype=np.float32)
        returns, gids, greedies, owners, keys = [], [], [], [], []
        group_means, group_stds = [], []
        for gid, group in members.items():
            if len(group) >= self.group_size:
                self.pending.pop(gid, None)
                rets = np.array([m[0] for m in group])
                group_means.append(rets.mean())
                group_stds.append(rets.std(ddof=1) if len(rets) > 1 else 0.0)
                for ret, greedy, owner, key in group:
                    returns.append(ret)
                    gids.append(gid)
                    greedies.append(greedy)
                    owners.append(owner)
                    keys.append(key)
            else:
                self.pending[gid] = [(m[0], m[1], m[3]) for m in group]
                self.pending.move_to_end(gid)
        while len(self.pending) > self.max_pending_groups:
            self.pending.popitem(last=False)

        self.resolved = {}
        if returns:
            adv, valid = self.advantage_fn(
                th.as_tensor(np.array(returns)), th.as_tensor(np.array(gids)), th.as_tensor(np.array(greedies))
            )
            adv = adv.cpu().numpy()
            valid = valid.cpu().numpy()
            self.resolved = {key: float(adv[k]) if valid[k] else None for k, key in enumerate(keys)}
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

    def live_keys(self) -> set[int]:
        """Keys of the episodes whose advantage may still come: the running ones and the finished members of the
        groups still pending."""
        return {int(k) for k in self.running_keys} | {m[2] for group in self.pending.values() for m in group}


class TurnGroupTracker(EpisodeGroupTracker):
    """
    Per-step bookkeeping for turn-level group credit (``advantage="group_turn"``) on interactive episodes.

    As :class:`EpisodeGroupTracker` (the same ``group_id`` convention, the same rule that a group is credited once
    all its ``group_size`` members have finished, members of earlier rollouts serving as baseline), but each step
    also carries ``info["turn"]``, the index of the agent turn its action belongs to (the interactive envs put it
    in every step's info). An episode's rewards are summed per turn, its returns-to-go per turn compared with those
    of the group's members that reached the same turn (:func:`~sb3_grpo.objectives.turn_rloo_advantages`), and
    every step of turn ``k`` gets ``A_{i,k}``. Turn rewards earned in earlier rollouts are remembered per env.

    ``carry_over`` is not offered with it (a held sequence gets one advantage); :attr:`resolved` stays empty.

    :param n_envs: number of envs of the VecEnv
    :param group_size: number of episodes per group round (``G``)
    :param max_pending_groups: how many incomplete groups to remember across rollouts (oldest dropped)
    """

    def __init__(self, n_envs: int, group_size: int, max_pending_groups: int = 100_000):
        super().__init__(n_envs, group_size, _no_episode_advantage, None, max_pending_groups)
        # env -> rewards per turn of its running episode earned in earlier rollouts
        self.running_turns: list[dict[int, float]] = [{} for _ in range(n_envs)]
        # group id -> per-turn rewards of members that finished in earlier rollouts
        self.pending_turns: OrderedDict[int, list[dict[int, float]]] = OrderedDict()

    def reset_rollout(self, n_steps: int) -> None:
        super().reset_rollout(n_steps)
        self.turns = np.full((n_steps, self.n_envs), -1, dtype=np.int64)

    def add(self, rewards: np.ndarray, dones: np.ndarray, infos: Sequence[dict[str, Any]]) -> None:
        """Record one step (see :meth:`EpisodeGroupTracker.add`), with each env's ``info["turn"]``.

        :raises ValueError: when a step's info has no ``turn`` (not an interactive env).
        """
        for idx, info in enumerate(infos):
            turn = info.get("turn")
            if turn is None:
                raise ValueError(
                    f"advantage='group_turn' needs info['turn'] (the agent turn of the action) on every step; env "
                    f"{idx} has none. Use an interactive env (e.g. GuessNumber-v0, ToolArithmetic-v0) with "
                    f"group_size > 1, or a per-episode group advantage (advantage='rloo' or 'group')"
                )
            self.turns[self.pos, idx] = int(turn)
        super().add(rewards, dones, infos)

    def _turn_rewards(self, env: int, start: int, stop: int, carried: dict[int, float]) -> dict[int, float]:
        """Rewards per turn of env ``env``'s steps ``start .. stop - 1``, on top of ``carried``."""
        out = dict(carried)
        for turn, reward in zip(self.turns[start:stop, env].tolist(), self.rewards[start:stop, env].tolist()):
            out[turn] = out.get(turn, 0.0) + reward
        return out

    def compute(self) -> tuple[np.ndarray, dict[str, float]]:
        """
        Advantages per stored step for the recorded rollout: step ``t`` of turn ``k`` of a credited episode gets
        ``A_{i,k}``; steps of episodes without a complete group, and of turns no other member reached, get 0.

        :return: ``(advantages, stats)`` as :meth:`EpisodeGroupTracker.compute`
        """
        n_steps = self.pos
        episodes = []  # (env, start, stop, group id, turn rewards)
        self.segments, self.resolved = [], {}
        for env in range(self.n_envs):
            start = 0
            for t in np.flatnonzero(self.dones[:n_steps, env]).tolist():
                turns = self._turn_rewards(env, start, t + 1, self.running_turns[env])
                episodes.append((env, start, t + 1, int(self.group_ids[t, env]), turns))
                key = int(self.running_keys[env])
                self.segments.append((env, start, t + 1, key))
                self.running_turns[env] = {}
                self.running_keys[env], self._next_key = self._next_key, self._next_key + 1
                start = t + 1
            self.running_turns[env] = self._turn_rewards(env, start, n_steps, self.running_turns[env])
            if start < n_steps:
                self.segments.append((env, start, n_steps, int(self.running_keys[env])))

        members: dict[int, list[tuple[dict[int, float], int]]] = {}  # group -> (turn rewards, episode or -1)
        for i, (_, _, _, gid, turns) in enumerate(episodes):
            if gid not in members:
                members[gid] = [(m, -1) for m in self.pending_turns.get(gid, [])]
            members[gid].append((turns, i))
        complete = []
        for gid, group in members.items():
            if len(group) >= self.group_size:
                self.pending_turns.pop(gid, None)
                complete.extend((gid, turns, owner) for turns, owner in group)
            else:
                self.pending_turns[gid] = [turns for turns, _ in group]
                self.pending_turns.move_to_end(gid)
        while len(self.pending_turns) > self.max_pending_groups:
            self.pending_turns.popitem(last=False)

        advantages = np.zeros((n_steps, self.n_envs), dtype=np.float32)
        group_means, group_stds = [], []
        if complete:
            n_turns = 1 + max(max(turns, default=0) for _, turns, _ in complete)
            rewards = th.zeros((len(complete), n_turns), dtype=th.float64)
            mask = th.zeros((len(complete), n_turns), dtype=th.bool)
            for row, (_, turns, _) in enumerate(complete):
                taken = 1 + max(turns, default=0)  # turns 0 .. taken - 1 (a turn without a reward counts)
                mask[row, :taken] = True
                for turn, reward in turns.items():
                    rewards[row, turn] = reward
            gids = th.as_tensor([gid for gid, _, _ in complete])
            adv, _ = turn_rloo_advantages(rewards, mask, gids)
            adv_np = adv.numpy()
            for row, (_, _, owner) in enumerate(complete):
                if owner < 0:
                    continue
                env, start, stop = episodes[owner][:3]
                step_turns = self.turns[start:stop, env]
                advantages[start:stop, env] = adv_np[row, step_turns]
            totals = rewards.sum(1).numpy()
            for gid in dict.fromkeys(gid for gid, _, _ in complete):
                rets = totals[(gids == gid).numpy()]
                group_means.append(rets.mean())
                group_stds.append(rets.std(ddof=1) if len(rets) > 1 else 0.0)

        stats = {
            "group_reward_mean": float(np.mean(group_means)) if group_means else float("nan"),
            "group_reward_std": float(np.mean(group_stds)) if group_stds else float("nan"),
            "n_groups": float(len(group_means)),
            "frac_steps_nonzero_advantage": float(np.mean(advantages != 0)) if advantages.size else 0.0,
        }
        return advantages, stats

    def live_keys(self) -> set[int]:
        """Keys of the running episodes (finished members of pending groups are not tracked by key here)."""
        return {int(k) for k in self.running_keys}


def _no_episode_advantage(_returns: th.Tensor, _group_ids: th.Tensor, _is_greedy: th.Tensor):
    """Placeholder of :class:`TurnGroupTracker`'s base: it computes per turn, never per episode."""
    raise RuntimeError("TurnGroupTracker computes advantages per turn (turn_rloo_advantages), not per episode")


class RoleBaselineTracker(EpisodeGroupTracker):
    """
    Per-step bookkeeping for role-conditioned advantages (``advantage="role"``): SPIRAL's role-conditioned
    advantage estimation (Liu et al. 2025, arXiv 2506.24119, section 3), a running baseline per game and role.

    In a zero-sum game the roles have different expected returns (tic-tac-toe's first mover wins more often), so
    one baseline for both would credit the first mover's tokens with the role's advantage. Each episode that ends
    is compared with the baseline of its game and the side the learner played, an exponential moving average of
    the returns of those episodes so far (:func:`~sb3_grpo.objectives.role_ema_advantages`, decay
    :data:`ROLE_BASELINE_DECAY`), updated in the order the episodes end (step by step, env by env within a
    step), and every step of the episode gets ``A = r - b``. No group is needed: an episode's advantage is known
    when it ends, so :meth:`compute` resolves every episode that ended in the rollout; episodes still running at
    its end get advantage 0 in it (or, with ``carry_over``, their advantage in the update after they end).

    The env's side of the contract: the info of an episode's last step holds ``learner_player`` (the side the
    learner played) and ``game`` (its name), as the two-player game envs of :mod:`textrl_envs.games` write them
    (:meth:`~textrl_envs.games.SelfPlay.episode_info`). The baselines live in :attr:`baselines` (``(game id,
    role) -> float``, game ids numbered in the order games are first seen, named by :attr:`game_ids`); they
    are part of a saved model (:meth:`state_dict`), so a model saved, loaded and trained on keeps them.

    :param n_envs: number of envs of the VecEnv
    :param decay: the running baseline's decay, in ``[0, 1)``
    """

    def __init__(self, n_envs: int, decay: float = ROLE_BASELINE_DECAY) -> None:
        super().__init__(n_envs, 1, _no_group_fn)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay!r}")
        self.decay = decay
        self.baselines: dict[tuple[int, int], float] = {}
        self.game_ids: dict[str, int] = {}

    def reset_rollout(self, n_steps: int) -> None:
        super().reset_rollout(n_steps)
        self.roles = np.full((n_steps, self.n_envs), -1, dtype=np.int64)
        self.games = np.full((n_steps, self.n_envs), -1, dtype=np.int64)

    def add(self, rewards: np.ndarray, dones: np.ndarray, infos: Sequence[dict[str, Any]]) -> None:
        """Record one step of the VecEnv; the info of every episode that ends must name its role and game.

        :raises ValueError: for an episode whose last info has no ``learner_player``.
        """
        self.rewards[self.pos] = rewards
        self.dones[self.pos] = dones
        for idx in np.flatnonzero(dones):
            info = infos[idx]
            if "learner_player" not in info:
                raise ValueError(
                    f"advantage='role' needs the side the learner played in the final info of every episode "
                    f"(info['learner_player']); env {idx} finished an episode without one. Use {ROLE_ENV_HINT}, "
                    "or an Interaction whose episode_info(state) returns learner_player and game"
                )
            game = str(info.get("game", ""))
            self.roles[self.pos, idx] = int(info["learner_player"])
            self.games[self.pos, idx] = self.game_ids.setdefault(game, len(self.game_ids))
        self.pos += 1

    def compute(self) -> tuple[np.ndarray, dict[str, float]]:
        """
        Advantages per stored step for the recorded rollout: ``r - b(game, role)`` for the steps of every episode
        that ended in it, 0 elsewhere.

        :return: ``(advantages, stats)``: ``advantages`` of shape ``(n_steps, n_envs)`` (float32), and the
            statistics of :meth:`EpisodeGroupTracker.compute` (``n_groups`` counts the episodes resolved) plus
            ``role_baseline_<game>_<role>`` for every baseline.
        """
        n_steps = self.pos
        episodes = sorted(self._segment_episodes(), key=lambda e: (e[2], e[0]))  # the order they ended in
        advantages = np.zeros((n_steps, self.n_envs), dtype=np.float32)
        self.resolved = {}
        returns = np.array([e[3] for e in episodes], dtype=np.float64)
        if episodes:
            games = th.as_tensor(np.array([self.games[e[2], e[0]] for e in episodes]))
            roles = th.as_tensor(np.array([self.roles[e[2], e[0]] for e in episodes]))
            adv, self.baselines = role_ema_advantages(
                th.as_tensor(returns), games, roles, self.baselines, decay=self.decay
            )
            for (env, start, end, _, _, _, key), a in zip(episodes, adv.tolist()):
                advantages[start : end + 1, env] = a
                self.resolved[key] = float(a)
        names = {v: k for k, v in self.game_ids.items()}
        stats = {
            "group_reward_mean": float(returns.mean()) if episodes else float("nan"),
            "group_reward_std": float(returns.std(ddof=1)) if len(episodes) > 1 else float("nan"),
            "n_groups": float(len(episodes)),
            "frac_steps_nonzero_advantage": float(np.mean(advantages != 0)) if advantages.size else 0.0,
        }
        for (game, role), b in sorted(self.baselines.items()):
            stats[f"role_baseline_{names.get(game, game) or 'game'}_{role}"] = float(b)
        return advantages, stats

    def live_keys(self) -> set[int]:
        """Keys of the episodes whose advantage may still come: the running ones (no group waits)."""
        return {int(k) for k in self.running_keys}

    def state_dict(self) -> dict[str, Any]:
        """What outlives the rollouts: the baselines by game name and role (plain lists, for a saved model)."""
        names = {v: k for k, v in self.game_ids.items()}
        return {"baselines": [[names[g], int(r), float(b)] for (g, r), b in sorted(self.baselines.items())]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start from the baselines of :meth:`state_dict` (games keep the names they had)."""
        self.baselines, self.game_ids = {}, {}
        for game, role, b in state.get("baselines", []):
            self.baselines[(self.game_ids.setdefault(str(game), len(self.game_ids)), int(role))] = float(b)


def _no_group_fn(returns: th.Tensor, group_ids: th.Tensor, is_greedy: th.Tensor):  # noqa: ARG001
    raise AssertionError("RoleBaselineTracker computes its own advantages")


def _ignore_greedy(fn: Callable[[th.Tensor, th.Tensor], tuple[th.Tensor, th.Tensor]]) -> GroupAdvantageFn:
    """Adapt ``f(returns, group_ids)`` to the tracker's ``f(returns, group_ids, is_greedy)``."""

    def advantage_fn(returns: th.Tensor, group_ids: th.Tensor, _is_greedy: th.Tensor):
        return fn(returns, group_ids)

    return advantage_fn


def env_group_size(env: VecEnv) -> int | None:
    """``group_size`` the VecEnv reports through ``get_attr`` (``None`` if it has none)."""
    try:
        sizes = env.get_attr("group_size")
    except (AttributeError, NotImplementedError, KeyError):
        return None
    values = {int(s) for s in sizes if s is not None}
    if len(values) != 1:
        return None
    return values.pop()


def env_episode_limit(env: VecEnv) -> int | None:
    """Steps a text env's episode may take now (its budget; an interactive env's replies take none), or ``None`` for an
    env that does not say."""
    try:
        specs = env.get_attr("text_spec")
    except (AttributeError, NotImplementedError, KeyError):
        return None
    budgets = {getattr(s, "max_agent_steps", getattr(s, "budget", None)) for s in specs}  # interactive: agent steps
    return budgets.pop() if len(budgets) == 1 and None not in budgets else None


def warn_if_episodes_straddle(env: VecEnv, advantage: str, n_steps: int) -> None:
    """Warn when ``n_steps`` is shorter than the env's episodes: then no full-length episode fits in one rollout, and
    its steps collected before the rollout in which it ends are trained on with advantage 0 (see
    :class:`EpisodeGroupTracker`)."""
    limit = env_episode_limit(env)
    if limit is None or n_steps >= limit:
        return
    warnings.warn(
        f"GRPO(advantage={advantage!r}): n_steps={n_steps} is shorter than the env's episodes (up to {limit} tokens). "
        "A group advantage is known only once the episode's whole group has finished, so the steps an episode takes "
        f"in rollouts before the one in which it ends get advantage 0 and teach nothing (at least {limit - n_steps} "
        f"of the {limit} steps of a full-length episode). Use n_steps >= {limit}, better a few episode lengths "
        f"(e.g. n_steps={4 * limit}), or carry_over=True to train those steps once their group has finished; "
        "rollout/frac_steps_nonzero_advantage logs the share of steps learned from",
        stacklevel=4,
    )


def check_grouped_env(env: VecEnv, advantage: str) -> int:
    """The env's ``group_size``, after checking that it has groups, as the group advantage form ``advantage`` needs.

    :param env: The VecEnv.
    :param advantage: The form's name (for the message).
    :return: ``group_size`` (> 1).
    :raises ValueError: for an env without groups.
    """
    group_size = env_group_size(env)
    if group_size is None or group_size <= 1:
        raise ValueError(
            f"advantage={advantage!r} needs an env with group_size > 1, {GROUPED_ENV_HINT}; "
            f"this env reports group_size={group_size}. An ungrouped env needs an advantage without groups: "
            "GRPO(advantage='gae') or SB3's PPO (DAPO, DrGRPO, GSPO and CISPO train no critic and need groups), or "
            "ReinforcePP, whose advantage is normalised over the batch"
        )
    return group_size


def env_is_interactive(env: VecEnv) -> bool | None:
    """Whether a text env's episodes are interactive (it has an interaction), or ``None`` for an env that does not
    say (not a text env)."""
    try:
        specs = env.get_attr("text_spec")
    except (AttributeError, NotImplementedError, KeyError):
        return None
    kinds = {getattr(s, "interaction", None) is not None for s in specs}
    return kinds.pop() if len(kinds) == 1 else None
