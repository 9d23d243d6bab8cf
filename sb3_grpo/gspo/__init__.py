"""GSPO (Zheng et al. 2025, arXiv 2507.18071) on the package's shared on-policy skeleton: :mod:`.gspo`."""

from sb3_grpo.gspo.gspo import GSPO

__all__ = ["GSPO"]
