"""GRPO, in sb3-contrib's layout: :mod:`.grpo` holds the algorithm (the PPO skeleton), the modules beside it what
is GRPO's own (:mod:`.validation`, :mod:`.exploration`, :mod:`.groups`, :mod:`.kl`, :mod:`.nonfinite`, :mod:`.stats`),
and :mod:`.policies` the policy aliases."""

from sb3_grpo.grpo.grpo import GRPO

__all__ = ["GRPO"]
