"""
Named configurations of the package's algorithms for language models: :data:`PRESETS` and :func:`make_preset`.

``GRPO("CausalLMPolicy", env, advantage="group")`` is *this package's* GRPO: PPO's arguments (SB3's 10 epochs, its
learning rate) plus the gradient-variance penalty, the adaptive clip and the exploration mixture, all on by default.
Someone who wants DeepSeek's GRPO, TRL's default GRPO, DAPO or plain PPO for an LM names it instead::

    from sb3_grpo.presets import make_preset
    model = make_preset("deepseek-grpo", "CausalLMPolicy", env, n_steps=64, batch_size=256)

Each preset is a class and keyword arguments, with where its numbers come from (:attr:`Preset.source`): a paper's
section, or "ours, untuned" where the number is this package's choice. The papers trained 7B-32B models with 1e-6;
a small model (the bundled ones, GPT-2 sized) learns little at that rate, so pass ``learning_rate=`` for those. The
group size is the env's (``make_vec_env(..., group_size=G)``); each source says the paper's. Arguments given to
:func:`make_preset` go on top of the preset's. The drop-in ``GRPO(...)`` with PPO's arguments is unchanged by all of
this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sb3_grpo.grpo.extras import EXTRAS_OFF

__all__ = ["PRESETS", "Preset", "make_preset"]

#: GRPO's three own mechanisms off (penalty, adaptive clip, exploration), as :data:`~sb3_grpo.grpo.extras.EXTRAS_OFF`
#: defines them; each preset sets its own advantage and KL.
_EXTRAS_OFF = {name: EXTRAS_OFF.switches()[name] for name in ("grad_var_coef", "adaptive_clip", "explore_alpha")}
#: The gradient clip of LM RL recipes (verl's and TRL's default ``max_grad_norm``), where SB3's is 0.5.
_LM_GRAD_CLIP = {"max_grad_norm": 1.0}


@dataclass(frozen=True)
class Preset:
    """One named configuration.

    :param name: The name (``PRESETS[name]``).
    :param cls_name: The algorithm of :mod:`sb3_grpo`: ``"GRPO"``, ``"DrGRPO"``, ``"DAPO"``, ``"GSPO"`` or
        ``"CISPO"``.
    :param kwargs: Its constructor arguments.
    :param summary: One line: what it is.
    :param source: Where each number comes from.
    """

    name: str
    cls_name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    source: str = ""

    def algo_class(self) -> type:
        """The algorithm class (imported on demand)."""
        import sb3_grpo

        return getattr(sb3_grpo, self.cls_name)

    def make(self, policy: Any, env: Any, **overrides: Any) -> Any:
        """Build the model: ``cls(policy, env, **{**kwargs, **overrides})``.

        :param policy: Policy name or class (``"CausalLMPolicy"``).
        :param env: The env (grouped, ``group_size > 1``, for every preset but ``"ppo-lm"``).
        :param overrides: Constructor arguments on top of the preset's (``n_steps``, ``batch_size``, ``seed``, ...).
        """
        return self.algo_class()(policy, env, **{**self.kwargs, **overrides})


#: The presets by name (see the docs page "Presets" for the table of their arguments and sources).
PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in [
        Preset(
            "deepseek-grpo",
            "GRPO",
            {**_EXTRAS_OFF, "advantage": "group", "kl_coef": 0.04, "n_epochs": 1, "learning_rate": 1e-6},
            "DeepSeekMath's GRPO: group-normalised advantages, k3 KL to the initial policy, one update per rollout",
            "Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, section 4.2: learning rate 1e-6, KL coefficient 0.04, "
            "a single update after each rollout (n_epochs=1), 64 outputs per question (group_size=64); PPO's clip "
            "0.2 and SB3's max_grad_norm 0.5 as they are",
        ),
        Preset(
            "dr-grpo",
            "DrGRPO",
            {"advantage": "group_mean", "n_epochs": 1, "learning_rate": 1e-6, **_LM_GRAD_CLIP},
            "Dr. GRPO: group-mean advantages, a constant length normaliser, no KL",
            "Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv 2503.20783, section 3.1 (the two "
            "normalisations removed, no KL term); learning rate 1e-6 and n_epochs=1 as DeepSeekMath's; max_grad_norm "
            "1.0: ours, untuned",
        ),
        Preset(
            "dapo",
            "DAPO",
            {
                "clip_range": 0.2,
                "clip_range_high": 0.28,
                "n_epochs": 1,
                "learning_rate": 1e-6,
                "overlong_penalty_factor": 1.0,
                "min_informative_groups": 8,
                "max_sampling_rollouts": 3,
                **_LM_GRAD_CLIP,
            },
            "DAPO: clip-higher (0.2, 0.28), token-level loss, soft overlong punishment, dynamic sampling",
            "Yu et al. 2025, DAPO, arXiv 2503.14476, section 4.1: eps_low 0.2, eps_high 0.28, learning rate 1e-6, "
            "no KL, overlong buffer 4096 of 20480 tokens (here a fifth of max_completion_tokens) with penalty "
            "factor 1, 16 samples per prompt (group_size=16), 16 gradient steps per rollout of one pass "
            "(n_epochs=1); min_informative_groups=8 and max_sampling_rollouts=3: ours, untuned (the paper fills a "
            "batch of 512 prompts); max_grad_norm 1.0: ours (the paper's is 1.0 in its verl recipe)",
        ),
        Preset(
            "gspo",
            "GSPO",
            {"clip_range": 3e-4, "clip_range_high": 4e-4, "n_epochs": 1, "learning_rate": 1e-6, **_LM_GRAD_CLIP},
            "GSPO: the length-normalised sequence ratio, clipped per sequence (3e-4, 4e-4)",
            "Zheng et al. 2025, GSPO, arXiv 2507.18071, section 5.1: clip ranges 3e-4 and 4e-4, each rollout "
            "split into four minibatches for one pass (n_epochs=1; batch_size = n_steps * n_envs / 4); learning "
            "rate 1e-6 and max_grad_norm 1.0: ours, untuned (the paper does not give them)",
        ),
        Preset(
            "cispo",
            "CISPO",
            {"clip_range_low": None, "clip_range_high": 0.28, "n_epochs": 1, "learning_rate": 1e-6, **_LM_GRAD_CLIP},
            "CISPO: REINFORCE weighted by a clipped, detached importance ratio (no floor), every token's gradient kept",
            "MiniMax 2025, MiniMax-M1, arXiv 2506.13585, section 3.1: no lower bound on the weight, only eps_high "
            "tuned (its value is not given); eps_high 0.28 (DAPO's), learning rate 1e-6, n_epochs=1 and "
            "max_grad_norm 1.0: ours, untuned",
        ),
        Preset(
            "ppo-lm",
            "GRPO",
            {**_EXTRAS_OFF, "advantage": "gae", "kl_coef": 0.05, "n_epochs": 2, "learning_rate": 1e-5, **_LM_GRAD_CLIP},
            "PPO for LMs: GAE with a critic, k3 KL to the initial policy, 2 epochs",
            "PPO's clipped objective (Schulman et al. 2017) with a KL penalty to the initial policy as in RLHF "
            "(Ziegler et al. 2019, arXiv 1909.08593); kl_coef 0.05, n_epochs 2, learning rate 1e-5 and "
            "max_grad_norm 1.0: ours, checked by textrl-bench tune-presets (docs/results/preset_tuning.md): on the "
            "bundled LM the best trials differ mainly by a learning rate near 2e-4, 20x this one; the preset keeps "
            "1e-5, meant for larger models and not checked at their size",
        ),
        Preset(
            "grad-reg-grpo",
            "GRPO",
            {
                "grad_var_coef": 0.01,
                "adaptive_clip": (1.1, 0.9),
                "explore_alpha": 0.05,
                "advantage": "group",
                "n_epochs": 2,
                "learning_rate": 1e-5,
                **_LM_GRAD_CLIP,
            },
            "the gradient-regularized GRPO: variance penalty, adaptive clip, mixed exploration, group advantages",
            "the package's own GRPO design (its defaults: grad_var_coef 0.01, adaptive_clip (1.1, 0.9), "
            "explore_alpha 0.05, docs/algorithms/grpo.md) with DeepSeekMath's group advantage; n_epochs 2, learning "
            "rate 1e-5 and max_grad_norm 1.0: ours, checked by textrl-bench tune-presets "
            "(docs/results/preset_tuning.md): on the bundled LM the best trials differ mainly by a learning rate near "
            "2e-4, 20x this one; the preset keeps 1e-5, meant for larger models and not checked at their size",
        ),
        Preset(
            "trl-grpo",
            "GRPO",
            {
                **_EXTRAS_OFF,
                "advantage": "group",
                "kl_coef": 0.0,
                "clip_range": 0.2,
                "n_epochs": 1,
                "learning_rate": 1e-6,
                **_LM_GRAD_CLIP,
            },
            "TRL's GRPOTrainer with its defaults: the token-level mean loss (loss_type='dapo'), group-scaled "
            "advantages, no KL",
            "TRL 1.16's GRPOConfig defaults: loss_type='dapo' (the clipped surrogate summed over every completion "
            "token of the batch and divided by their count: this loss when one minibatch is the whole rollout, "
            "batch_size = n_steps * n_envs), scale_rewards='group' (the group's unbiased std + 1e-4, advantage="
            "'group'), beta 0.0 (kl_coef=0), epsilon 0.2 (clip_range), num_iterations 1 (n_epochs=1), learning rate "
            "1e-6, max_grad_norm 1.0 (transformers' TrainingArguments), num_generations 8 (group_size=8); checked "
            "against GRPOTrainer's own loss on one batch (tests/test_trl_preset.py)",
        ),
    ]
}


def make_preset(name: str, policy: Any, env: Any, **overrides: Any) -> Any:
    """The model of preset ``name`` (:data:`PRESETS`), with ``overrides`` on top of its arguments.

    :param name: A key of :data:`PRESETS` (e.g. ``"deepseek-grpo"``, ``"dapo"``).
    :param policy: Policy name or class (``"CausalLMPolicy"``).
    :param env: The env (grouped, ``group_size > 1``, for every preset but ``"ppo-lm"``).
    :param overrides: Constructor arguments that replace the preset's (``learning_rate``, ``n_steps``, ``seed``...).
    :raises ValueError: for an unknown name, listing the known ones.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name].make(policy, env, **overrides)
