"""Importing this module registers every built-in reward name (the registry imports it lazily)."""

from textrl_envs.rewards import composite, constraints, match, reference, sentiment  # noqa: F401
