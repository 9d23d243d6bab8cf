"""DAPO (Yu et al. 2025, arXiv 2503.14476) on the package's shared on-policy skeleton: :mod:`.dapo`."""

from sb3_grpo.dapo.dapo import DAPO

__all__ = ["DAPO"]
