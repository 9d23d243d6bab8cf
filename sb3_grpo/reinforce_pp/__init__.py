"""REINFORCE++ (Hu 2025, arXiv 2501.03262) on the package's shared on-policy skeleton: :mod:`.reinforce_pp`, its
advantage form (:mod:`.token_returns`) and the KL penalty in its reward (:mod:`.kl_reward`)."""

from sb3_grpo.reinforce_pp.reinforce_pp import ReinforcePP

__all__ = ["ReinforcePP"]
