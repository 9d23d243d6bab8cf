"""
What GRPO stores about a rollout beyond SB3's :class:`~stable_baselines3.common.buffers.RolloutBuffer`.

- :class:`EpisodeGroupTracker`: turns the per-step stream of a grouped env (rewards, dones and
  ``info["group_id"]``) into one return per finished episode, and the group advantages of
  :mod:`sb3_grpo.objectives` back into one advantage per stored step. It keeps what it needs across
  rollouts (running returns of unfinished episodes, returns of group members that finished earlier), so a
  group whose members finish in different rollouts still gets its baseline.

The per-transition path reuses SB3's ``RolloutBuffer`` / ``DictRolloutBuffer`` unchanged; GRPO only
overwrites their ``advantages`` for the group forms. The text fast path's ``SequenceRolloutBuffer``
(whole episodes, one forward per sequence at train time) belongs in this module as well.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch as th

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
