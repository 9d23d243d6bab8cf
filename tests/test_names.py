"""One name, one thing: no two public classes of the library packages share a name (two classes of one name, in
different places, read as one in docs, errors and imports)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("textrl_envs", "sb3_grpo")


def test_public_class_names_are_unique_across_the_packages():
    where = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    where[node.name].append(str(path.relative_to(ROOT)))
    assert where, "no classes found: the package paths are wrong"
    repeated = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not repeated, f"classes defined under one name in several places: {repeated}"


def test_the_vector_env_side_of_deferred_rewards_is_reward_deferral():
    from textrl_envs import reward_worker
    from textrl_envs.vector import TextGenVectorEnv

    assert reward_worker.RewardDeferral in TextGenVectorEnv.__mro__
    assert "RewardDeferral" in reward_worker.__all__ and not hasattr(reward_worker, "DeferredRewards")
