"""The gradient-variance penalty's state: which parameters it covers, and how the slice gradients are computed.

The quantity itself, ``Var = (1/K) sum_k ||g_k - mean_j g_j||^2`` over the gradients ``g_k`` of ``K`` minibatch
slices, is :func:`~sb3_grpo.objectives.gradient_variance`; ``Var`` is differentiated by double backprop.

Where the cost goes. The slices are ``torch.tensor_split``'s ``K`` contiguous runs of the minibatch's transitions
(:func:`slice_sizes`). GRPO evaluates each slice in its own forward (the batch sources' ``evaluate_slices``: always
for an LM's sequences, for transitions from :data:`~sb3_grpo.common.update.batch_sources.SEPARATE_SLICES_MIN_PARAMS`
parameters; a sequence that a slice boundary cuts is evaluated in both slices, each keeping its own tokens), so slice
``k``'s surrogate depends on its own graph only: its gradient is one backward over about ``1/K`` of the minibatch, and
the ``K`` of them together cost about one backward, instead of ``K`` backwards over the whole minibatch's graph (what
a shared forward costs, vectorized or not). The double backward then costs about two backwards. For every linear map
that is 9 matrix products (forward 1, slice gradients 2, double backward and the loss's own backward 6) against a
plain update's 3, so about 3x is the floor of an exact penalty; ``textrl-bench perf`` prints the measured factor. A
small MLP is cheaper with one forward and the ``K`` gradients as one vectorized backward (fewer, larger calls).
Dropout is off in :class:`~sb3_grpo.policies.CausalLMPolicy`, so separate forwards give the values one forward
gives, up to float rounding; a policy with dropout draws different masks per slice (the same distribution).

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

from sb3_grpo.objectives import gradient_variance_terms

__all__ = ["GradVarPenalty", "select_parameters", "slice_sizes"]


def slice_sizes(n: int, n_slices: int) -> list[int]:
    """The sizes of ``torch.tensor_split``'s ``n_slices`` contiguous slices of ``n`` items (the first ``n % n_slices``
    one longer).

    :param n: Items.
    :param n_slices: Slices, ``1 <= n_slices <= n``.
    """
    base, extra = divmod(n, n_slices)
    return [base + 1 if k < extra else base for k in range(n_slices)]


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

    Slice objectives from separate forwards get one backward pass each (each walks its own slice's graph). Slice
    objectives that share a forward get one vectorized backward pass; if the policy has an op without a batching
    rule, it falls back (once, with a warning) to ``K`` separate passes: same value.

    :param params: The parameters the variance is measured over.
    :param normalize: Divide by the slice gradients' mean squared norm (held constant): the relative variance.
    """

    def __init__(self, params: list[th.nn.Parameter], normalize: bool = False) -> None:
        self.params = params
        self.batched = True
        self.normalize = normalize

    def __call__(self, slice_objectives: list[th.Tensor], separate_graphs: bool = False) -> th.Tensor:
        """The variance of the gradients of ``slice_objectives`` (one scalar per slice).

        :param slice_objectives: ``K`` scalar objectives, one per slice of the minibatch.
        :param separate_graphs: Whether each objective comes from its own forward (no shared graph).
        """
        terms = None
        if self.batched and not separate_graphs:
            try:
                terms = gradient_variance_terms(slice_objectives, self.params, create_graph=True, batched=True)
            except RuntimeError as err:
                self.batched = False
                warnings.warn(
                    f"GRPO: vectorized slice gradients are not supported by this policy ({err}); computing the "
                    f"{len(slice_objectives)} slice gradients of the grad-variance penalty one by one",
                    stacklevel=4,
                )
        if terms is None:
            terms = gradient_variance_terms(slice_objectives, self.params, create_graph=True, batched=False)
        var, energy = terms
        return var / (energy + 1e-12) if self.normalize else var
