"""``textrl-bench perf``'s interactive row: rollout throughput on an interactive env, with the KV cache extended by each
reply in one forward against the same cache recomputing a row after every reply.

In an interactive episode the step that ends the agent's turn appends the action *and* the environment's reply to
the observation. :class:`~sb3_grpo.policies.kv_cache.RolloutCache` extends the row's cache by those ``k`` tokens in
one forward over ``k`` positions; the baseline (``RolloutCache.max_extend = 1``) recomputes the row's whole window
instead, which is what a cache that only knows one-token steps must do. Both run stock SB3 ``collect_rollouts``
with :class:`~sb3_grpo.policies.CausalLMPolicy` and the bundled LM on the real vector env, from the same seeds.
"""

from __future__ import annotations

from typing import Any

from benchmarks.timing import interleaved, rate_row

__all__ = ["interactive_rollout"]


def _turn_collector(n_envs: int, steps: int, max_extend: int | None, env_id: str) -> tuple[Any, Any]:
    """``(collect, policy)``: ``collect()`` runs one ``PPO.collect_rollouts`` of ``steps`` agent steps from the same
    seeds every call, starting without cache as a rollout after an update does."""
    import torch as th
    from stable_baselines3 import PPO

    from sb3_grpo.policies import CausalLMPolicy
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env(env_id, n_envs=n_envs, device="cpu", seed=0)
    model = PPO(CausalLMPolicy, env, n_steps=steps, batch_size=n_envs * steps, n_epochs=1, seed=0, device="cpu")
    model.policy._rollout_cache.max_extend = max_extend
    _, callback = model._setup_learn(10**9, None, progress_bar=False)

    def collect() -> None:
        th.manual_seed(0)
        env.seed(0)
        model._last_obs = env.reset()
        model.policy.reset_cache()
        model.collect_rollouts(env, callback, model.rollout_buffer, n_rollout_steps=steps)

    return collect, model.policy


def _positions(collect: Any, policy: Any) -> tuple[int, int]:
    """LM positions (rows x columns) computed in one ``collect()``, and the number of forwards."""
    shapes: list[tuple[int, ...]] = []
    hook = policy.lm.base_model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        collect()
    finally:
        hook.remove()
    return sum(r * c for r, c in shapes), len(shapes)


def interactive_rollout(
    n_envs: int = 16, steps: int = 96, repeats: int = 3, env_id: str = "GuessNumber-v0"
) -> list[dict]:
    """Agent tokens/s of ``collect_rollouts`` on an interactive env: the cache extended by each reply (ours) against
    a full recompute of the row after each reply (baseline), calls interleaved.

    :param n_envs: Envs.
    :param steps: Agent steps per env per rollout.
    :param repeats: Timed rollouts of each (median).
    :param env_id: An interactive env id.
    :return: One row; its notes give the LM positions each side computed (a noise-free measure of the work).
    """
    ours, ours_policy = _turn_collector(n_envs, steps, None, env_id)
    base, base_policy = _turn_collector(n_envs, steps, 1, env_id)
    base_policy.load_state_dict(ours_policy.state_dict())
    t, c = interleaved({"ours": ours, "base": base}, repeats)
    (pos_ours, calls_ours), (pos_base, calls_base) = (
        _positions(ours, ours_policy),
        _positions(base, base_policy),
    )
    n = n_envs * steps
    notes = (
        f"{env_id} vector env (replies of up to 7 tokens after every turn), bundled LM, {n_envs} envs x {steps} "
        f"agent steps, SB3 collect_rollouts with CausalLMPolicy; baseline: the same cache recomputing a row after "
        f"each reply (RolloutCache.max_extend=1); LM positions computed per rollout: {pos_ours:,} in {calls_ours} "
        f"forwards vs {pos_base:,} in {calls_base}"
    )
    return [
        rate_row(
            "rollout interactive: cache extended by replies vs recompute after each reply",
            n,
            (t, c),
            ("ours", "base"),
            "tokens/s",
            notes,
            target=(">=", 1.0),
        )
    ]
