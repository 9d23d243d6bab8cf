"""Rollout engines: who computes a text rollout's tokens (``engine=``).

- ``"step"`` (:mod:`.step`, the reference): SB3's loop as it is, one policy call per env step.
- ``"hf"`` (:mod:`.turn_queues`): the policy's built-in decoder decodes whole turns ahead into per-row queues.
- ``"vllm"`` (:mod:`.vllm_engine`, an optional extra): vLLM, in the training process, generates the turns.

The env is stepped token by token with every engine, so the MDP, the callbacks and the buffers are the same. The
algorithm makes its engine once, when the model is set up (:func:`make_engine`), and its rollout calls it: before each
rollout (``before_rollout``: vLLM takes the new weights), at the rollout's start (``start``: the per-row queues
of the rollout, ``None`` for ``"step"``), and when weights are loaded (``weights_changed``).
"""

from __future__ import annotations

from typing import Any

from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy

from sb3_grpo.engines.step import StepEngine
from sb3_grpo.engines.turn_queues import DecoderEngine, check_decoder_policy
from sb3_grpo.engines.vllm_engine import VLLMEngine, VLLMOptions, check_vllm_policy, vllm_options

__all__ = ["ENGINES", "RolloutEngine", "check_engine", "engine_importance_cap", "engine_name", "make_engine"]

#: The rollout engines: ``"step"`` (SB3's loop, one token per policy call), ``"hf"`` (the built-in decoder) and
#: ``"vllm"`` (vLLM in the training process, an optional extra: :mod:`sb3_grpo.engines.vllm_engine`).
ENGINES = ("step", "hf", "vllm")

#: One of the engines: :class:`~.step.StepEngine`, :class:`~.turn_queues.DecoderEngine` or
#: :class:`~.vllm_engine.VLLMEngine`.
RolloutEngine = StepEngine | DecoderEngine | VLLMEngine


def check_engine(engine: Any) -> Any:
    """``engine`` if it names a rollout engine (or is a :class:`~.vllm_engine.VLLMOptions`), else a ``ValueError`` that
    lists them."""
    if isinstance(engine, VLLMOptions):
        return engine
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(
            f"engine must be one of {', '.join(repr(e) for e in ENGINES)}, got {engine!r}; 'step' computes one token "
            "per env step (SB3's loop), 'hf' decodes a whole turn per row with the policy's built-in decoder, 'vllm' "
            "with vLLM (an optional extra; VLLMOptions(...) sets its options)"
        )
    return engine


def engine_name(engine: Any) -> str:
    """The engine's name: ``"vllm"`` for :class:`~.vllm_engine.VLLMOptions`, else the string."""
    return engine if isinstance(engine, str) else "vllm"


def engine_importance_cap(engine: Any) -> float | None:
    """The truncated importance weights' cap the engine applies (only ``VLLMOptions(importance_cap=...)``)."""
    options = vllm_options(engine)
    return None if options is None else options.importance_cap


def make_engine(
    engine: Any,
    policy: BasePolicy,
    action_space: spaces.Space,
    n_envs: int,
    seed: int | None,
    *,
    explore_alpha: float = 0.0,
    greedy_members: bool = False,
    carry_over: bool | str = False,
) -> RolloutEngine:
    """The engine ``engine`` names, for a model whose policy is built: made once, when the model is set up.

    :param engine: ``"step"``, ``"hf"``, ``"vllm"`` or :class:`~.vllm_engine.VLLMOptions` (checked by
        :func:`check_engine`).
    :param policy: The policy that acts.
    :param action_space: The env's action space.
    :param n_envs: The rollout's rows.
    :param seed: The model's seed (vLLM's).
    :param explore_alpha: The exploration mixture's weight at the start of training (vLLM cannot draw from it).
    :param greedy_members: Whether one member of each group acts greedily (vLLM does not decode those rows).
    :param carry_over: The ``carry_over`` argument (vLLM's importance cap weights each rollout's own steps).
    :raises ValueError: for an engine the policy or the settings cannot use, naming the engine that can.
    """
    name = engine_name(check_engine(engine))
    if name == "step":
        return StepEngine()
    if name == "hf":
        check_decoder_policy(policy, action_space)
        return DecoderEngine()
    options = vllm_options(engine)
    assert options is not None  # a vLLM engine has its options
    check_vllm_policy(policy, options, explore_alpha, greedy_members, carry_over)
    return VLLMEngine(policy, options, n_envs, seed=seed)
