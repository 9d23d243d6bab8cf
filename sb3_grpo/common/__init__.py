"""Pieces that GRPO shares with the policy, the callbacks and the benchmarks (sb3-contrib's ``common/``).

- :mod:`~sb3_grpo.common.buffers`: rollout buffers (SB3's plus the policy's own log-probs; the text fast path's
  sequence buffer).
- :mod:`~sb3_grpo.common.type_aliases`: the sample tuples those buffers and the update exchange.
- :mod:`~sb3_grpo.common.batch_sources`: the two update paths behind one interface (per transition, per sequence).
- :mod:`~sb3_grpo.common.packing`: packing short sequences into shared rows of the update's forward.
- :mod:`~sb3_grpo.common.data_parallel`: the one seam between the update and ``torch.distributed``.
- :mod:`~sb3_grpo.common.io`: atomic file writes (with ``fsync``) and JSON conversion.
"""
