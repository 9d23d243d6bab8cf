"""
sb3_grpo: GRPO (and Dr. GRPO, DAPO, GSPO, CISPO, REINFORCE++) for stable-baselines3, and a policy that wraps Hugging
Face causal LMs.

``import sb3_grpo`` is light: the algorithms (torch + SB3: ``GRPO``, ``DrGRPO``, ``DAPO``, ``GSPO``, ``CISPO``,
``ReinforcePP``) and
``CausalLMPolicy`` (transformers) are imported on first access, e.g.
``from sb3_grpo import GRPO, DAPO, CausalLMPolicy``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sb3_grpo.cispo import CISPO
    from sb3_grpo.dapo import DAPO
    from sb3_grpo.dr_grpo import DrGRPO
    from sb3_grpo.grpo import GRPO
    from sb3_grpo.gspo import GSPO
    from sb3_grpo.policies import CausalLMPolicy
    from sb3_grpo.reinforce_pp import ReinforcePP

__all__ = ["CISPO", "DAPO", "GRPO", "GSPO", "CausalLMPolicy", "DrGRPO", "ReinforcePP"]

_LAZY = {
    "GRPO": "sb3_grpo.grpo",
    "CausalLMPolicy": "sb3_grpo.policies",
    "DrGRPO": "sb3_grpo.dr_grpo",
    "DAPO": "sb3_grpo.dapo",
    "GSPO": "sb3_grpo.gspo",
    "CISPO": "sb3_grpo.cispo",
    "ReinforcePP": "sb3_grpo.reinforce_pp",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sb3_grpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
