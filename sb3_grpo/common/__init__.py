"""What any on-policy algorithm of the package reuses (sb3-contrib's ``common/``), room by room.

- :mod:`~sb3_grpo.common.on_policy`: the skeleton, SB3's ``OnPolicyAlgorithm`` with PPO's arguments.
- :mod:`~sb3_grpo.common.buffers` and :mod:`~sb3_grpo.common.type_aliases`: the rollout buffers and the sample
  tuples they and the update exchange.
- :mod:`~sb3_grpo.common.advantages`: advantage forms beyond GAE and ``carry_over``.
- :mod:`~sb3_grpo.common.rollout`: what a rollout adds to SB3's ``collect_rollouts``.
- :mod:`~sb3_grpo.common.update`: the update paths and statistics.
- :mod:`~sb3_grpo.common.checkpoints`: saved models on disk: saving, loading with no code run from the file,
  checkpoint files and the run that wrote them.
- :mod:`~sb3_grpo.common.options`: the checks of the algorithms' arguments, and what each algorithm supports.
- :mod:`~sb3_grpo.common.data_parallel`: the one seam between the update and ``torch.distributed``.
"""
