"""GRPO, in sb3-contrib's layout: :mod:`.grpo` holds the class and its loss (read like SB3's ``PPO.train``; the skeleton
it runs on is :mod:`sb3_grpo.common.on_policy`), the modules beside it what is GRPO's own (:mod:`.arguments`,
:mod:`.exploration`, :mod:`.penalty`, :mod:`.kl`, :mod:`.extras`), and :mod:`.policies` the policy aliases."""

from sb3_grpo.grpo.grpo import GRPO

__all__ = ["GRPO"]
