"""The rewards' ``trainer_state`` for any SB3 algorithm: :class:`TrainerStateCallback`."""

from __future__ import annotations

from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo.common.rollout.trainer_state_push import push_trainer_state

__all__ = ["TrainerStateCallback"]


class TrainerStateCallback(BaseCallback):
    """Tell a text env's rewards how far training has come, at the start of every rollout
    (:func:`~sb3_grpo.common.rollout.trainer_state_push.push_trainer_state`): the ``trainer_state=`` TRL's reward
    functions read.

    The algorithms of :mod:`sb3_grpo` do this by themselves; add this callback to stock SB3 algorithms::

        PPO(CausalLMPolicy, venv).learn(8192, callback=TrainerStateCallback())
    """

    def _on_rollout_start(self) -> None:
        push_trainer_state(self.model, self.training_env)

    def _on_step(self) -> bool:
        return True
