"""The gradient-variance penalty's state: which parameters it covers, and how the slice gradients are computed.

The quantity itself, ``Var = (1/K) sum_k ||g_k - mean_j g_j||^2`` over the gradients ``g_k`` of ``K`` minibatch
slices, is :func:`~sb3_grpo.objectives.gradient_variance`. The ``K`` slice gradients come from one vectorized backward
pass with ``create_graph=True`` and ``Var`` is differentiated by double backprop; on CartPole's MLP an update
costs about 2-3x a plain one (``scripts/bench_cartpole.py --cost-only 5``).

``grad_var_normalize=True`` (an option; the design's formula stays the default) divides ``Var`` by the slice
gradients' mean squared norm, held constant (``Var / sg((1/K) sum_k ||g_k||^2)``, in ``[0, 1]``): the penalty then
measures the *fraction* of the gradient that is noise, so it keeps its size when the rewards, the advantages or the
gradient norm grow, instead of scaling with the square of the gradient (the default's ``Var`` grew from 4.6 to 72
in three updates of a run on ``TextGen-v0`` while the surrogate was about 0.02, so its own gradient, not the
surrogate's, set the direction of the clipped update; see the README's ablation).
"""

from __future__ import annotations

import warnings

import torch as th

from sb3_grpo.objectives import slice_gradients, stacked_variance

__all__ = ["GradVarPenalty", "select_parameters"]


def select_parameters(policy: th.nn.Module, prefixes: list[str] | None) -> list[th.nn.Parameter]:
    """The trainable parameters of ``policy`` whose names start with one of ``prefixes`` (``None``: all).

    :raises ValueError: when the prefixes match no trainable parameter (the message lists the top-level names).
    """
    named = [(name, p) for name, p in policy.named_parameters() if p.requires_grad]
    if prefixes is None:
        return [p for _, p in named]
    chosen = [p for name, p in named if any(name.startswith(prefix) for prefix in prefixes)]
    if not chosen:
        tops = sorted({name.split(".")[0] for name, _ in named})
        raise ValueError(
            f"grad_var_params={prefixes} matches no trainable parameter; names start with: {', '.join(tops)}"
        )
    return chosen


class GradVarPenalty:
    """``Var[grad L_CLIP]`` over a fixed set of parameters, as a differentiable tensor.

    The ``K`` slice gradients are computed in one vectorized backward pass; if the policy has an op without a
    batching rule, it falls back (once, with a warning) to ``K`` separate passes: same value.

    :param params: The parameters the variance is measured over.
    :param normalize: Divide by the slice gradients' mean squared norm (held constant): the relative variance.
    """

    def __init__(self, params: list[th.nn.Parameter], normalize: bool = False) -> None:
        self.params = params
        self.batched = True
        self.normalize = normalize

    def __call__(self, slice_objectives: list[th.Tensor]) -> th.Tensor:
        """The variance of the gradients of ``slice_objectives`` (one scalar per slice).

        :param slice_objectives: ``K`` scalar objectives, one per slice of the minibatch.
        """
        stacked = None
        if self.batched:
            try:
                stacked = slice_gradients(slice_objectives, self.params, create_graph=True, batched=True)
            except RuntimeError as err:
                self.batched = False
                warnings.warn(
                    f"GRPO: vectorized slice gradients are not supported by this policy ({err}); computing the "
                    f"{len(slice_objectives)} slice gradients of the grad-variance penalty one by one",
                    stacklevel=4,
                )
        if stacked is None:
            stacked = slice_gradients(slice_objectives, self.params, create_graph=True, batched=False)
        var = stacked_variance(stacked)
        if self.normalize:
            var = var / (stacked.detach().pow(2).sum(dim=1).mean() + 1e-12)
        return var
