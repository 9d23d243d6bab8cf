"""Dr. GRPO (Liu et al. 2025, arXiv 2503.20783) on the package's shared on-policy skeleton: :mod:`.dr_grpo`."""

from sb3_grpo.dr_grpo.dr_grpo import DrGRPO

__all__ = ["DrGRPO"]
