"""Reward redistribution for delayed rewards (``reward_redistribution=``): an episode's reward, paid at its last
token, is spread over the episode's tokens before returns and advantages are computed, its total kept.

Rule. For an episode that ends in the rollout, with ``S`` the sum of the env's rewards over its steps in this rollout
(for a text env: the end-of-episode score) and ``w_t >= 0`` one weight per such step, ``sum_t w_t = 1``, the reward
stored for step ``t`` becomes ``b_t + S * w_t``, ``b_t`` what the buffer holds beyond the env's reward (SB3's
``gamma * V(terminal obs)`` of a truncated episode, left where it is). So ``sum_t r_t`` over the episode's steps is
the same before and after (to float rounding): only *when* the reward arrives changes, which is what a critic and
GAE see (a group advantage, which sums the episode's rewards, is unchanged by it). The weights:

- ``"attention"``: the policy LM's own attention, last layer, averaged over heads, from the episode's final token (the
  query) over the episode's completion tokens (the keys), renormalised over them: the tokens the model looks at when
  it writes the end get the reward. This is the seed's "reward allocation based on attention weights", a return
  decomposition in the sense of Arjona-Medina et al. 2019 ("RUDDER: Return Decomposition for Delayed Rewards",
  NeurIPS, arXiv 1806.07857), which redistributes a delayed return over the steps by the contributions of a learned
  return predictor and keeps the episode's return (so the optimal policies are unchanged); here no extra model is
  trained: the policy's own attention stands in for the contributions. Needs a policy with an ``lm``
  (``CausalLMPolicy``) and a single-turn text env (the completion is the window's last tokens). The model runs once,
  batched, over the episodes that ended, with the eager attention kernel (the one that returns weights).
- ``"uniform"``: ``w_t = 1 / m`` over the episode's ``m`` steps in the rollout (the return decomposition that assumes
  nothing; any env).

An episode straddling two rollouts: its earlier steps were trained on in their own rollout; its reward is spread
over its steps in the rollout where it ends (attention weights of those tokens renormalised over them), so the
rollout's total is kept. Steps of episodes still running at the rollout's end are left as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th

__all__ = [
    "REDISTRIBUTIONS",
    "RewardRedistribution",
    "check_redistribution_env",
    "check_redistribution_policy",
    "final_token_attention",
    "redistribute_return",
]

#: The rules of ``reward_redistribution=`` (``None``: off).
REDISTRIBUTIONS = ("attention", "uniform")


def redistribute_return(total: float, weights: np.ndarray) -> np.ndarray:
    """``total * w / sum(w)``: a return spread over steps in proportion to non-negative weights (uniform when they
    sum to 0), so that the result sums to ``total``.

    :param total: The reward to spread.
    :param weights: ``(m,)`` non-negative weights, one per step.
    :return: ``(m,)`` float64 rewards.
    :raises ValueError: for an empty, negative or non-finite weight vector.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1 or weights.size == 0:
        raise ValueError(f"redistribute_return: weights must be a non-empty vector, got shape {weights.shape}")
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise ValueError("redistribute_return: weights must be finite and >= 0")
    norm = weights.sum()
    share = weights / norm if norm > 0 else np.full(weights.size, 1.0 / weights.size)
    return float(total) * share


def final_token_attention(lm: Any, input_ids: th.Tensor, attention_mask: th.Tensor, n_tokens: list[int]) -> list:
    """The last layer's attention (mean over heads) from each row's final position over its last ``n_tokens[b]``
    positions, computed with the eager kernel (the fused kernels return no weights), the model's kernel restored after.

    :param lm: A Hugging Face causal LM (``output_attentions`` supported).
    :param input_ids: ``(B, W)`` right-aligned windows (the final token at position ``W - 1``).
    :param attention_mask: ``(B, W)``.
    :param n_tokens: Per row, how many final positions are the completion (``1 <= n <= W``).
    :return: One ``(n_tokens[b],)`` float64 array per row (not renormalised).
    """
    from sb3_grpo.policies.windows import positions_from_mask

    kernel = getattr(lm.config, "_attn_implementation", None)
    switch = kernel not in (None, "eager")
    if switch:
        lm.set_attn_implementation("eager")
    try:
        with th.no_grad():
            out = lm.base_model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions_from_mask(attention_mask),
                output_attentions=True,
            )
    finally:
        if switch:
            lm.set_attn_implementation(kernel)
    if not out.attentions:
        raise ValueError(
            f"reward_redistribution='attention' needs the LM's attention weights, but {type(lm).__name__} returned "
            "none with output_attentions=True; use reward_redistribution='uniform'"
        )
    last = out.attentions[-1].double().mean(1)[:, -1, :]  # (B, W): from the final query over every key
    width = last.shape[1]
    return [last[b, width - n :].cpu().numpy() for b, n in enumerate(n_tokens)]


def check_redistribution_env(env: Any, rule: str) -> None:
    """Refuse ``reward_redistribution="attention"`` on an interactive text env (its completion interleaves the env's
    replies, so the window's last tokens are not the agent's).

    :raises ValueError: naming the fix.
    """
    from sb3_grpo.common.advantages.group_trackers import env_is_interactive

    if rule == "attention" and env_is_interactive(env):
        raise ValueError(
            "reward_redistribution='attention' weights the completion's tokens, the window's last ones, but this env "
            "is interactive (replies are interleaved with the agent's turns); use reward_redistribution='uniform', or "
            "None (per-turn rewards already arrive at each turn)"
        )


def check_redistribution_policy(rule: str | None, policy: Any) -> None:
    """Refuse ``reward_redistribution="attention"`` for a policy without a language model to read the attention of.

    :raises ValueError: naming the fix.
    """
    if rule == "attention" and not hasattr(policy, "lm"):
        raise ValueError(
            f"reward_redistribution='attention' reads the attention of the policy's language model, but "
            f"{type(policy).__name__} has none; use a CausalLMPolicy, or reward_redistribution='uniform'"
        )


class RewardRedistribution:
    """One rollout's bookkeeping for ``reward_redistribution``: the env's raw rewards per step, where each env's
    episode began, and the final window of each episode that ended (for ``"attention"``).

    :param rule: ``"attention"`` or ``"uniform"``.
    :param n_envs: Envs of the VecEnv.
    :param n_steps: Steps per env in the rollout.
    :param episode_steps: Per env, steps its running episode took in earlier rollouts (kept across rollouts; updated
        in place).
    """

    def __init__(self, rule: str, n_envs: int, n_steps: int, episode_steps: np.ndarray) -> None:
        self.rule = rule
        self.raw_rewards = np.zeros((n_steps, n_envs), dtype=np.float64)
        self.episode_steps = episode_steps
        self.start = np.zeros(n_envs, dtype=np.int64)  # first row of each env's running episode in this rollout
        self.ended: list[tuple[int, int, int, int, Any]] = []  # (env, first row, last row, steps, final window)

    def record(self, row: int, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]) -> None:
        """Record one step (the env's rewards, before any bootstrap value is added)."""
        self.raw_rewards[row] = rewards
        self.episode_steps += 1
        for env in np.flatnonzero(dones).tolist():
            final = infos[env].get("terminal_observation") if self.rule == "attention" else None
            self.ended.append((env, int(self.start[env]), row, int(self.episode_steps[env]), final))
            self.episode_steps[env] = 0
            self.start[env] = row + 1

    def apply(self, rewards: np.ndarray, policy: Any = None) -> int:
        """Spread each ended episode's reward over its steps of this rollout, in place in ``rewards`` (the buffer's
        ``(n_steps, n_envs)`` rewards, the deferred ones landed, in :attr:`raw_rewards` too).

        :param rewards: The buffer's rewards.
        :param policy: The acting policy (``"attention"``: a ``CausalLMPolicy``, whose ``lm`` gives the weights).
        :return: How many episodes were redistributed.
        """
        if not self.ended:
            return 0
        weights = self._weights(policy)
        for (env, first, last, _, _), w in zip(self.ended, weights, strict=True):
            raw = self.raw_rewards[first : last + 1, env]
            spread = redistribute_return(float(raw.sum()), w)
            rewards[first : last + 1, env] += (spread - raw).astype(rewards.dtype)
        return len(self.ended)

    def _weights(self, policy: Any) -> list[np.ndarray]:
        """One weight vector per ended episode, over its rows of this rollout."""
        rows = [last - first + 1 for _, first, last, _, _ in self.ended]
        if self.rule == "uniform":
            return [np.ones(m) for m in rows]
        ids = th.as_tensor(np.stack([np.asarray(e[4]["input_ids"]) for e in self.ended]), device=policy.device)
        mask = th.as_tensor(np.stack([np.asarray(e[4]["attention_mask"]) for e in self.ended]), device=policy.device)
        width = ids.shape[1]
        steps = [min(e[3], width) for e in self.ended]
        attn = final_token_attention(policy.lm, ids, mask, steps)
        # the rows of this rollout are the episode's last `m` steps (its earlier ones were in earlier rollouts)
        return [a[len(a) - min(m, len(a)) :] if m <= len(a) else np.ones(m) for a, m in zip(attn, rows, strict=True)]
