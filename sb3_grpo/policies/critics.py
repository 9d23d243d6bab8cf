"""Critics of :class:`~sb3_grpo.policies.CausalLMPolicy` other than the value head on the LM's last hidden state."""

from __future__ import annotations

import torch as th
from torch import nn

__all__ = ["EmbeddingCritic"]


class EmbeddingCritic(nn.Module):
    """A small critic that shares no trainable weights with the LM.

    Features of the state ending at position ``j``: the mean of the (detached, frozen) LM input embeddings of the
    valid tokens up to ``j``, concatenated with the embedding of token ``j``; a two-layer MLP maps them to a scalar.
    Gradients of the value loss never reach the LM, and the critic costs an embedding lookup, so it needs no KV
    cache. Its prefix version (:meth:`values_per_position`) is what both the per-transition and the sequence paths
    use, so they agree exactly.

    :param embedding: the LM's input embedding module (read, detached).
    :param hidden: width of the MLP.
    """

    def __init__(self, embedding: nn.Module, hidden: int = 256):
        super().__init__()
        self._embedding = [embedding]  # a list keeps it out of this module's parameters / state dict
        dim = embedding.weight.shape[1]
        self.mlp = nn.Sequential(nn.Linear(2 * dim, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, 1)

    def values_per_position(self, input_ids: th.Tensor, attention_mask: th.Tensor) -> th.Tensor:
        """Value of every prefix: ``[B, L]``, entry ``j`` for the state whose last token is ``j``."""
        with th.no_grad():
            emb = self._embedding[0](input_ids).float()
        m = attention_mask.float().unsqueeze(-1)
        mean = (emb * m).cumsum(1) / m.cumsum(1).clamp(min=1.0)
        return self.head(self.mlp(th.cat([mean, emb], dim=-1))).squeeze(-1)
