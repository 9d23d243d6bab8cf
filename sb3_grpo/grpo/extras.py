"""GRPO's mechanisms beyond PPO, as one frozen value: :class:`GRPOExtras`, and the one definition of "every extra off".

``GRPO`` keeps its arguments as attributes, as SB3's algorithms do (they are what ``save``, ``load(**kwargs)`` and a
user's ``model.kl_coef`` read and write); :attr:`sb3_grpo.GRPO.extras` is their snapshot. :data:`EXTRAS_OFF` is the
setting under which ``GRPO`` computes exactly what SB3's ``PPO`` computes, bit for bit; the rollout
(:meth:`~sb3_grpo.common.rollout.rollout_extras.RolloutExtras.start`'s ``exact_ppo``), the tests, ``compare``'s
algorithm table and the benchmarks all take it from here. A new mechanism is a new field: it joins the comparison of
:attr:`GRPOExtras.computes_as_ppo` by itself, so the bit-exact path can never miss it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["EXTRAS_OFF", "GRPOExtras"]


@dataclass(frozen=True)
class GRPOExtras:
    """GRPO's arguments beyond PPO's (their defaults are ``GRPO``'s); each is documented on :class:`~sb3_grpo.GRPO`.

    A field listed in :data:`DEPENDS_ON` only matters while its switch is on (``grad_var_slices`` without the
    penalty, ``explore_fraction`` without exploration, ...).
    """

    grad_var_coef: float = 0.01
    grad_var_slices: int = 4
    grad_var_params: tuple[str, ...] | None = None
    grad_var_normalize: bool = False
    adaptive_clip: tuple[float, float] | None = (1.1, 0.9)
    explore_alpha: float = 0.05
    explore_fraction: float = 0.5
    advantage: str = "gae"
    kl_coef: float = 0.0
    kl_target: float | None = None
    carry_over: bool | str = "auto"
    #: the rollout engine (``"step"``: SB3's loop, PPO's numbers; ``"hf"``: the built-in decoder, the same tokens with
    #: log-probs and values equal to float rounding), see :mod:`sb3_grpo.engines.turn_queues`
    engine: str = "step"
    #: spread each episode's reward over its steps (``"attention"``, ``"uniform"``; ``None``: off), see
    #: :mod:`sb3_grpo.common.rollout.redistribution`
    reward_redistribution: str | None = None

    def __post_init__(self) -> None:
        # lists (from a user, or a saved model's JSON) become tuples, so that the value is hashable and compares equal
        if self.grad_var_params is not None:
            object.__setattr__(self, "grad_var_params", tuple(self.grad_var_params))
        if self.adaptive_clip is not None:
            object.__setattr__(self, "adaptive_clip", (float(self.adaptive_clip[0]), float(self.adaptive_clip[1])))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The fields, in order: the names of ``GRPO``'s own arguments that this value holds."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def kwargs(self) -> dict[str, Any]:
        """The value as ``GRPO`` keyword arguments (``GRPO(policy, env, **extras.kwargs())``)."""
        out = dataclasses.asdict(self)
        if out["grad_var_params"] is not None:
            out["grad_var_params"] = list(out["grad_var_params"])
        return out

    def switches(self) -> dict[str, Any]:
        """The fields that turn a mechanism on or off (those not in :data:`DEPENDS_ON`), as keyword arguments."""
        dependent = {name for names in DEPENDS_ON.values() for name in names}
        return {name: value for name, value in self.kwargs().items() if name not in dependent}

    def effective(self) -> GRPOExtras:
        """The same mechanisms, with every field that its switch leaves unused set to :data:`EXTRAS_OFF`'s value."""
        unused: dict[str, Any] = {}
        for switch, names in DEPENDS_ON.items():
            if getattr(self, switch) == getattr(EXTRAS_OFF, switch):
                unused.update({name: getattr(EXTRAS_OFF, name) for name in names})
        return dataclasses.replace(self, **unused)

    @property
    def computes_as_ppo(self) -> bool:
        """Whether every extra is off, so that ``GRPO`` must compute exactly what SB3's PPO computes (bit for bit)."""
        return self.effective() == EXTRAS_OFF


#: Fields that only matter while their switch is on: switch -> the fields it governs.
DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "grad_var_coef": ("grad_var_slices", "grad_var_params", "grad_var_normalize"),
    "explore_alpha": ("explore_fraction",),
    "kl_coef": ("kl_target",),
    "advantage": ("carry_over",),
}

#: Every GRPO extra off: no penalty, PPO's symmetric clip, no exploration, GAE, no KL term. ``GRPO`` with these
#: arguments computes what SB3's ``PPO`` computes (same seed, same data, same parameters after ``learn()``).
EXTRAS_OFF = GRPOExtras(grad_var_coef=0.0, adaptive_clip=None, explore_alpha=0.0, advantage="gae", kl_coef=0.0)
