"""The named algorithms of ``sb3-grpo compare``: one row per name, a class and its keyword arguments.

Every name maps to stock SB3 ``PPO`` or to one of the package's algorithms (``sb3_grpo.<class>``: GRPO, Dr. GRPO,
DAPO, GSPO, CISPO, REINFORCE++) with a fixed set of arguments, so a row of a report can always be reproduced in three
lines of Python::

    from sb3_grpo.compare.algos import ALGOS
    spec = ALGOS["grpo-group"]
    model = spec.make("CausalLMPolicy", env, seed=0)   # GRPO(..., advantage="group", ...)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from sb3_grpo.grpo.extras import EXTRAS_OFF

#: Group size the comparison gives the envs of group-advantage algorithms when none is given.
DEFAULT_GROUP_SIZE = 4

#: GRPO with every extra switched off (:data:`sb3_grpo.grpo.extras.EXTRAS_OFF`'s switches): computes what SB3's
#: ``PPO`` computes.
OFF: dict[str, Any] = EXTRAS_OFF.switches()


@dataclass(frozen=True)
class AlgoSpec:
    """One named algorithm of the comparison.

    :param name: The name used on the command line (``ppo``, ``grpo``, ...).
    :param cls_name: ``"PPO"`` (stock ``stable_baselines3.PPO``) or the name of one of the package's algorithms
        (``sb3_grpo.<name>``: ``"GRPO"``, ``"DrGRPO"``, ...).
    :param kwargs: Constructor arguments that define it (user overrides go on top).
    :param summary: One line for ``--help`` and the report.
    """

    name: str
    cls_name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    summary: str = ""

    @property
    def grouped(self) -> bool:
        """Whether it needs envs in prompt groups (a group-relative advantage, given or the class's default)."""
        advantage = self.kwargs.get("advantage")
        if advantage is None:
            advantage = constructor_defaults(self).get("advantage", "gae")
        return needs_groups(advantage)

    def algo_class(self) -> type:
        """The SB3 algorithm class (imported on demand): stock ``PPO``, or the package's class of that name."""
        if self.cls_name == "PPO":
            from stable_baselines3 import PPO

            return PPO
        import sb3_grpo

        return getattr(sb3_grpo, self.cls_name)

    def make(self, policy: Any, env: Any, **overrides: Any) -> Any:
        """Build the model.

        :param policy: Policy name or class (``"MlpPolicy"``, ``"CausalLMPolicy"``, ``CausalLMPolicy``...).
        :param env: The (vec) env.
        :param overrides: Constructor arguments on top of :attr:`kwargs` (seed, device, hyperparameters).
        :return: The algorithm instance.
        """
        return self.algo_class()(policy, env, **{**self.kwargs, **overrides})


ALGOS: dict[str, AlgoSpec] = {
    spec.name: spec
    for spec in [
        AlgoSpec("ppo", "PPO", {}, "stock stable_baselines3.PPO (GAE, clipped surrogate)"),
        AlgoSpec(
            "ppo-seq",
            "GRPO",
            dict(OFF),
            "GRPO with every extra off (grad_var_coef=0, adaptive_clip=None, explore_alpha=0, "
            'advantage="gae", kl_coef=0): PPO through our code path',
        ),
        AlgoSpec(
            "grpo",
            "GRPO",
            {},
            "GRPO defaults: grad-variance penalty 0.01, adaptive clip (1.1, 0.9), "
            "uniform-mixture exploration 0.05, GAE",
        ),
        AlgoSpec(
            "grpo-nogradvar",
            "GRPO",
            {"grad_var_coef": 0.0},
            "GRPO defaults without the grad-variance penalty (isolates its effect and cost)",
        ),
        AlgoSpec(
            "grpo-normvar",
            "GRPO",
            {"grad_var_normalize": True},
            "GRPO defaults with the scale-free penalty Var / sg(mean ||g_k||^2) (grad_var_normalize=True): "
            "the option the ablation offers as a fix",
        ),
        # the ablation of GRPO's three mechanisms (penalty, adaptive clip, exploration): each alone on top of PPO,
        # and all but one (grpo-nogradvar above is "all but the penalty")
        AlgoSpec("ppo-gradvar", "GRPO", {**OFF, "grad_var_coef": 0.01}, "PPO + the grad-variance penalty only"),
        AlgoSpec("ppo-adaptclip", "GRPO", {**OFF, "adaptive_clip": (1.1, 0.9)}, "PPO + the adaptive clip only"),
        AlgoSpec("ppo-explore", "GRPO", {**OFF, "explore_alpha": 0.05}, "PPO + mixed exploration only"),
        AlgoSpec("grpo-noadaptclip", "GRPO", {"adaptive_clip": None}, "GRPO defaults without the adaptive clip"),
        AlgoSpec("grpo-noexplore", "GRPO", {"explore_alpha": 0.0}, "GRPO defaults without mixed exploration"),
        AlgoSpec(
            "grpo-group",
            "GRPO",
            {"advantage": "group"},
            "GRPO defaults with group-relative advantages (DeepSeekMath), no critic; "
            f"envs in prompt groups (group size {DEFAULT_GROUP_SIZE} unless --group-size)",
        ),
        AlgoSpec(
            "grpo-rloo",
            "GRPO",
            {"advantage": "rloo"},
            "GRPO defaults with leave-one-out (RLOO) group advantages; grouped envs",
        ),
        AlgoSpec(
            "grpo-turn",
            "GRPO",
            {"advantage": "group_turn"},
            "GRPO defaults with turn-level leave-one-out credit (each turn's return-to-go minus the mean of the "
            "group's other members at that turn); interactive envs, grouped",
        ),
        AlgoSpec(
            "ppo-rloo",
            "GRPO",
            {**OFF, "advantage": "rloo"},
            "episode-level leave-one-out (RLOO) group advantages, no other extra, no critic; grouped envs",
        ),
        AlgoSpec(
            "ppo-turn",
            "GRPO",
            {**OFF, "advantage": "group_turn"},
            "turn-level leave-one-out credit (ppo-rloo per turn), no other extra, no critic; interactive envs, grouped",
        ),
        AlgoSpec(
            "ppo-redistribute",
            "GRPO",
            {**OFF, "reward_redistribution": "attention"},
            "PPO (GAE) with the episode's reward spread over its tokens by the policy LM's last-layer attention "
            "from the final token (total kept); single-turn text envs",
        ),
        AlgoSpec(
            "ppo-redistribute-uniform",
            "GRPO",
            {**OFF, "reward_redistribution": "uniform"},
            "PPO (GAE) with the episode's reward spread evenly over its tokens (total kept)",
        ),
        AlgoSpec(
            "ppo-group",
            "GRPO",
            {**OFF, "advantage": "group"},
            "group-relative advantages (DeepSeekMath), no other extra, no critic; grouped envs",
        ),
        AlgoSpec(
            "grpo-role",
            "GRPO",
            {"advantage": "role"},
            "GRPO defaults with role-conditioned advantages (SPIRAL, Liu et al. 2025: a running baseline per game "
            "and role), no critic; two-player game envs (TicTacToe-v0, Nim-v0, KuhnPoker-v0), no groups needed",
        ),
        AlgoSpec(
            "ppo-role",
            "GRPO",
            {**OFF, "advantage": "role"},
            "role-conditioned advantages (SPIRAL), no other extra, no critic; two-player game envs",
        ),
        AlgoSpec(
            "ppo-selfcritical",
            "GRPO",
            {**OFF, "advantage": "self_critical"},
            "self-critical baseline (the greedy member's reward; Rennie et al. 2017), no other extra; grouped envs",
        ),
        AlgoSpec(
            "grpo-deepseek",
            "GRPO",
            {**OFF, "advantage": "group", "kl_coef": 0.04},
            "DeepSeekMath GRPO as published: group advantages + k3 KL to the frozen reference "
            "(kl_coef=0.04), no other extra; grouped envs",
        ),
        AlgoSpec(
            "dr-grpo",
            "DrGRPO",
            {"advantage": "group_mean"},
            "Dr. GRPO (Liu et al. 2025): group-mean advantages without the std division, the clipped surrogate "
            "summed over tokens / (sequences * completion budget), no critic, no KL; grouped envs",
        ),
        AlgoSpec(
            "dapo",
            "DAPO",
            {"advantage": "group"},
            "DAPO (Yu et al. 2025): clip-higher (0.2, 0.28), token-level loss, soft overlong penalty; grouped envs",
        ),
        AlgoSpec(
            "dapo-ds",
            "DAPO",
            {"advantage": "group", "min_informative_groups": 4, "max_sampling_rollouts": 3},
            "DAPO plus dynamic sampling (drops groups without signal, resamples up to 3 rollouts); text envs",
        ),
        AlgoSpec(
            "gspo",
            "GSPO",
            {"advantage": "group"},
            "GSPO (Zheng et al. 2025): length-normalised sequence ratio clipped per sequence (3e-4, 4e-4); "
            "grouped envs",
        ),
        AlgoSpec(
            "cispo",
            "CISPO",
            {"advantage": "group"},
            "CISPO (MiniMax-M1): clipped, detached IS weight (cap 1.28, no floor), every token's gradient kept; "
            "grouped envs",
        ),
        AlgoSpec(
            "reinforce-pp",
            "ReinforcePP",
            {},
            "REINFORCE++ (Hu 2025): token-level KL to the initial policy in the reward (0.01), returns-to-go "
            "normalised over the whole batch, PPO's clip, no critic; no groups needed",
        ),
    ]
}


#: The prefix of the rows that are presets (:data:`sb3_grpo.presets.PRESETS`): ``preset-<name>``.
PRESET_PREFIX = "preset-"


def _preset_specs() -> dict[str, AlgoSpec]:
    """One row per preset, ``preset-<name>``: the preset's class and arguments, so that ``compare`` runs what
    :func:`~sb3_grpo.presets.make_preset` builds."""
    from sb3_grpo.presets import PRESETS

    return {
        f"{PRESET_PREFIX}{preset.name}": AlgoSpec(
            f"{PRESET_PREFIX}{preset.name}",
            preset.cls_name,
            dict(preset.kwargs),
            f"the {preset.name!r} preset (sb3_grpo.presets): {preset.summary}",
        )
        for preset in PRESETS.values()
    }


ALGOS.update(_preset_specs())


def needs_groups(advantage: str) -> bool:
    """Whether the advantage form ``advantage`` needs envs in prompt groups (its registration in
    :mod:`sb3_grpo.common.advantages.forms`, imported here on demand: it pulls in torch)."""
    from sb3_grpo.common.advantages.forms import advantage_form

    return advantage_form(advantage).grouped


def algo_table() -> str:
    """The table of names for ``--help`` (one line per algorithm)."""
    width = max(len(name) for name in ALGOS)
    return "\n".join(f"  {name:<{width}}  {spec.summary}" for name, spec in ALGOS.items())


def parse_algos(text: str) -> list[str]:
    """Split ``"ppo,grpo"`` into known names.

    :param text: Comma-separated names.
    :return: The names, in order, without duplicates.
    :raises ValueError: naming the unknown ones and listing the known ones.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"no algorithm given; known: {', '.join(ALGOS)}")
    unknown = [n for n in names if n not in ALGOS]
    if unknown:
        raise ValueError(f"unknown algorithm(s) {', '.join(repr(n) for n in unknown)}; known: {', '.join(ALGOS)}")
    return list(dict.fromkeys(names))


def constructor_defaults(spec: AlgoSpec) -> dict[str, Any]:
    """The default of every constructor argument that has one (what an override goes on top of).

    :param spec: The algorithm.
    :return: Argument name -> default value.
    """
    params = inspect.signature(spec.algo_class().__init__).parameters
    return {name: p.default for name, p in params.items() if p.default is not inspect.Parameter.empty}


def constructor_parameters(spec: AlgoSpec) -> set[str]:
    """Names an override may set for this algorithm (its class's constructor arguments).

    :param spec: The algorithm.
    :return: The parameter names, without ``policy`` and ``env``.
    """
    params = inspect.signature(spec.algo_class().__init__).parameters
    return {name for name in params if name not in ("self", "policy", "env", "_init_setup_model")}
