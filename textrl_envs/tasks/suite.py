"""Importing this module registers every task of the suite (``textrl_envs.tasks.get_task`` imports it lazily)."""

from textrl_envs.tasks import arithmetic, constraints, reference, sentiment, sequence  # noqa: F401
