"""The update's rows: GRPO's sequence fast path against stock ``PPO.train`` on one rollout, the cost of the
gradient-variance penalty (bundled LM, a GPT-2-small-size model, an MLP), and ``GRPO("MlpPolicy", "CartPole-v1")``
against stock ``PPO``: the whole ``learn`` and the rollout loop alone.

Each update of a comparison starts from the same weights and optimizer state, on the same rollout, so every repeat
does the same work.
"""

from __future__ import annotations

import copy
from typing import Any

from benchmarks.timing import interleaved, make_row, synchronizer
from sb3_grpo.grpo.extras import EXTRAS_OFF

__all__ = ["LAST_BLOCK", "OFF", "cartpole_vs_ppo", "grad_var_cost", "per_transition_copy", "update_seq_vs_stock"]

#: Every GRPO extra off: GRPO then computes what stock PPO computes.
OFF = EXTRAS_OFF.switches()
#: The bundled LM's last block and final norm (a cheaper set of penalty parameters).
LAST_BLOCK = ["lm.transformer.h.3.", "lm.transformer.ln_f."]


def _collected(model: Any) -> Any:
    """Collect one rollout into ``model``; return ``model``."""
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(None, []))
    _, callback = model._setup_learn(model.n_steps * model.n_envs * 4, None, progress_bar=False)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
    return model


def per_transition_copy(model: Any, buf: Any) -> Any:
    """A ``DictRolloutBuffer`` holding exactly the data of a ``SequenceRolloutBuffer`` (for stock ``PPO.train``)."""
    from stable_baselines3.common.buffers import DictRolloutBuffer

    out = DictRolloutBuffer(
        buf.buffer_size,
        model.observation_space,
        model.action_space,
        model.device,
        buf.gae_lambda,
        buf.gamma,
        buf.n_envs,
    )
    out.observations = {
        "input_ids": buf.token_ids.cpu().numpy().copy(),
        "attention_mask": buf.token_mask.cpu().numpy().copy(),
    }
    for name in ("actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages"):
        setattr(out, name, getattr(buf, name).copy())
    out.full, out.pos = True, buf.pos
    return out


def _update_on(model: Any, make_buffer: Any) -> Any:
    """A callable running ``model.train()`` on a fresh ``make_buffer()``, always from the same weights and optimizer
    state (SB3's ``get`` reorders a ``DictRolloutBuffer`` in place)."""
    policy_state = copy.deepcopy(model.policy.state_dict())
    optim_state = copy.deepcopy(model.policy.optimizer.state_dict())

    def update() -> None:
        model.policy.load_state_dict(policy_state)
        model.policy.optimizer.load_state_dict(optim_state)
        model.rollout_buffer = make_buffer()
        model.train()

    return update


def _forward_positions(policy: Any, update: Any) -> int:
    """Positions (rows x columns) the LM body computes in one call of ``update``."""
    shapes: list[tuple[int, ...]] = []
    hook = policy.lm.base_model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        update()
    finally:
        hook.remove()
    return sum(rows * cols for rows, cols in shapes)


def _update_timers(env: Any, hp: dict, stock: bool, last_block: bool, penalty: bool = True) -> tuple[Any, dict]:
    """The models of :func:`update_seq_vs_stock`, all on the same rollout and weights, and an update of each to time:
    GRPO's sequence fast path (``"ours"``, the model returned), stock ``PPO.train`` (``"stock"``; ``"stock-rows"``:
    without shared prefixes), and the penalty on all LM parameters (``"all"``) and on the last block (``"last"``)."""
    from stable_baselines3 import PPO

    from sb3_grpo.grpo import GRPO
    from sb3_grpo.policies import CausalLMPolicy

    fast = _collected(GRPO("CausalLMPolicy", env, **hp, **OFF))
    seq_buffer = fast.rollout_buffer
    timers = {"ours": _update_on(fast, lambda: seq_buffer)}
    if stock:
        for name, share in (("stock", True), ("stock-rows", False)):
            kwargs = {**hp, "policy_kwargs": {**hp.get("policy_kwargs", {}), "share_prefixes": share}}
            baseline = PPO(CausalLMPolicy, env, **kwargs)
            baseline.set_logger(fast.logger)
            baseline.policy.load_state_dict(fast.policy.state_dict())
            timers[name] = _update_on(baseline, lambda b=baseline: per_transition_copy(b, seq_buffer))
    for name, params in (("all", None), ("last", LAST_BLOCK if last_block else None)):
        if not penalty or (name == "last" and not last_block):
            continue
        model = GRPO("CausalLMPolicy", env, **hp, **{**OFF, "grad_var_coef": 0.01, "grad_var_params": params})
        model.set_logger(fast.logger)
        model.policy.load_state_dict(fast.policy.state_dict())
        timers[name] = _update_on(model, lambda: seq_buffer)
    return fast, timers


def update_seq_vs_stock(
    n_envs: int = 16,
    tokens: int = 32,
    n_steps: int = 64,
    repeats: int = 3,
    device: Any = "cpu",
    lm: Any = None,
    stock: bool = True,
    last_block: bool = True,
    label: str = "bundled LM",
    env_id: str = "TextGen-v0",
    penalty: bool = True,
) -> list[dict]:
    """Seconds per update on ONE rollout: GRPO's sequence fast path (every extra off) against stock ``PPO.train``, and
    the cost of the gradient-variance penalty on the same rollout (all LM parameters, and the last block).

    :param n_envs: Envs.
    :param tokens: The env's completion budget.
    :param n_steps: Steps per env per rollout.
    :param repeats: Timed ``train()`` calls of each (median, interleaved).
    :param device: The device.
    :param lm: The LM (``None``: the bundled one).
    :param stock: Include the stock ``PPO.train`` row.
    :param last_block: Include the last-block penalty row (bundled LM's layer names).
    :param label: The model's name in the rows.
    :param env_id: The text env.
    :param penalty: Include the penalty rows.
    :return: Rows.
    """
    from sb3_grpo.common.buffers import episode_segments
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env(env_id, n_envs=n_envs, seed=0, device=device, max_new_tokens=tokens)
    policy_kwargs = {} if lm is None else {"model": lm}
    hp = {
        "n_steps": n_steps,
        "batch_size": n_steps * n_envs // 4,
        "n_epochs": 1,
        "seed": 0,
        "device": device,
        "policy_kwargs": policy_kwargs,
    }
    fast, timers = _update_timers(env, hp, stock, last_block, penalty)
    seq_buffer = fast.rollout_buffer
    t, c = interleaved(timers, repeats, synchronizer(fast.device))
    n_seq = len(episode_segments(seq_buffer.episode_starts))
    notes = (
        f"{env_id}, {label}, one rollout of {n_envs} envs x {n_steps} steps = {n_envs * n_steps} tokens in {n_seq} "
        f"sequences, {tokens}-token budget, 1 epoch, minibatch {hp['batch_size']}, device {fast.device}"
    )
    rows = []
    where = "" if env_id == "TextGen-v0" else f" ({env_id})"
    if stock:
        packed = _forward_positions(fast.policy, timers["ours"])
        fast.policy.pack_sequences = False
        padded = _forward_positions(fast.policy, timers["ours"])
        fast.policy.pack_sequences = True
        rows.append(
            make_row(
                f"update: sequence fast path vs stock PPO.train{where}",
                t["ours"],
                t["stock"],
                "s/update",
                f"{notes}; packed forwards: {packed} positions (padded: {padded})",
                False,
                cpu=(c["ours"], c["stock"]),
                target=(">=", 10.0) if not where else None,
            )
        )
        rows.append(
            make_row(
                f"update: stock PPO.train, shared prefixes vs one forward row per window{where}",
                t["stock"],
                t["stock-rows"],
                "s/update",
                f"{notes}; CausalLMPolicy(share_prefixes=True) (the default) vs False",
                False,
                cpu=(c["stock"], c["stock-rows"]),
            )
        )
    for name, what, target in (("all", "all LM parameters", ("<=", 3.0)), ("last", "last block + final norm", None)):
        if name in t:
            rows.append(
                make_row(
                    f"grad-variance penalty cost ({label}, {what})",
                    t[name],
                    t["ours"],
                    "s/update",
                    f"{notes}; grad_var_coef=0.01 vs 0; ratio = slowdown",
                    False,
                    cpu=(c[name], c["ours"]),
                    target=target,
                    slowdown=True,
                )
            )
    return rows


def grad_var_cost(quick: bool = False, n_steps: int | None = None) -> list[dict]:
    """Seconds per update of GRPO defaults with the gradient-variance penalty against ``grad_var_coef=0`` on an MLP.

    :param quick: Smaller rollouts.
    :param n_steps: Steps per rollout (default 2048, 512 when ``quick``).
    :return: One row for an MLP on CartPole-v1; ``ratio`` is the slowdown factor.
    """
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_grpo.grpo import GRPO

    if n_steps is None:
        n_steps = 512 if quick else 2048
    timers = {}
    for coef in (0.01, 0.0):
        model = GRPO(
            "MlpPolicy",
            make_vec_env("CartPole-v1", n_envs=1, seed=0),
            n_steps=n_steps,
            batch_size=64,
            n_epochs=1,
            seed=0,
            device="cpu",
            grad_var_coef=coef,
        )
        timers[coef] = _collected(model).train
    t, c = interleaved(timers, 1 if quick else 3)
    return [
        make_row(
            "grad-variance penalty cost (MLP)",
            t[0.01],
            t[0.0],
            "s/update",
            f"CartPole-v1, GRPO defaults vs grad_var_coef=0, {n_steps} steps, 1 epoch, minibatch 64; ratio = slowdown",
            False,
            cpu=(c[0.01], c[0.0]),
            slowdown=True,
        )
    ]


def cartpole_vs_ppo(steps: int = 16384, repeats: int = 3, n_steps: int | None = None) -> list[dict]:
    """Wall time of ``learn(steps)`` on CartPole-v1 (MLP, SB3 defaults): GRPO with every extra off, GRPO's defaults and
    GRPO with ``grad_var_coef=0`` against stock ``PPO``; and one rollout of 2,048 steps, GRPO (every extra off)
    against PPO.

    :param steps: Env steps of each ``learn``.
    :param repeats: Timed calls of each (median, interleaved).
    :param n_steps: Steps per rollout of every variant (default: SB3's 2048).
    :return: Rows (``ratio``: slowdown against PPO; targets: 1.1x for every extra off, 1.0x for the rollout loop).
    """
    from stable_baselines3 import PPO

    from sb3_grpo.grpo import GRPO

    def learner(cls: Any, kwargs: dict) -> Any:
        return lambda: cls("MlpPolicy", "CartPole-v1", seed=0, device="cpu", **kwargs).learn(steps)

    variants = {"ppo": (PPO, {}), "off": (GRPO, OFF), "defaults": (GRPO, {}), "no-gv": (GRPO, {"grad_var_coef": 0.0})}
    if n_steps is not None:
        variants = {name: (cls, {**kwargs, "n_steps": n_steps}) for name, (cls, kwargs) in variants.items()}
    t, c = interleaved({name: learner(*v) for name, v in variants.items()}, repeats)
    rollouts = {name: _rollout_loop(*variants[name]) for name in ("ppo", "off")}
    rt, rc = interleaved(rollouts, repeats * 3)
    rollout_steps = 2048 if n_steps is None else n_steps
    setup = f"CartPole-v1, MlpPolicy, SB3 defaults (n_steps {rollout_steps}, 10 epochs, minibatch 64), learn({steps})"
    rows = [
        make_row(
            f"CartPole: GRPO {label} vs stock PPO, wall time",
            t[name],
            t["ppo"],
            "s",
            f"{setup}; ratio = slowdown",
            False,
            cpu=(c[name], c["ppo"]),
            target=target,
            slowdown=True,
        )
        for name, label, target in (
            ("off", "every extra off", ("<=", 1.1)),
            ("defaults", "defaults", None),
            ("no-gv", "grad_var_coef=0", None),
        )
    ]
    rows.append(
        make_row(
            "CartPole: GRPO's rollout loop vs SB3's (every extra off)",
            rt["off"],
            rt["ppo"],
            "s/rollout",
            f"CartPole-v1, MlpPolicy, one collect_rollouts of {rollout_steps:,} steps; ratio = slowdown",
            False,
            cpu=(rc["off"], rc["ppo"]),
            target=("<=", 1.0),
            slowdown=True,
        )
    )
    return rows


def _rollout_loop(cls: Any, kwargs: dict) -> Any:
    from stable_baselines3.common.logger import configure

    model = cls("MlpPolicy", "CartPole-v1", seed=0, device="cpu", **kwargs)
    model.set_logger(configure(None, []))
    _, callback = model._setup_learn(10**9, None, progress_bar=False)
    return lambda: model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
