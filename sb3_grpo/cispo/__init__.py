"""CISPO (MiniMax-M1, arXiv 2506.13585) on the package's shared on-policy skeleton: :mod:`.cispo`."""

from sb3_grpo.cispo.cispo import CISPO

__all__ = ["CISPO"]
