"""The router load-balancing term of a mixture-of-experts LM, added to the update's loss.

A policy whose LM routes tokens to experts (Mixtral, Qwen2-MoE, OLMoE, ...) and was built with
``policy_kwargs["router_aux_loss_coef"] > 0`` (TRL's name) reports its routers' load-balancing loss (Fedus et al. 2021;
:func:`~sb3_grpo.policies.moe.load_balancing_loss`) through its ``router_aux_losses()`` context; the update adds
``router_aux_loss_coef * aux`` to each minibatch's loss, ``aux`` the mean over the minibatch's forwards, a micro-batch's
weighted by its share. With the coefficient 0 (the default, and every policy without routers) the loss is untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch as th

from sb3_grpo.common.type_aliases import MicroBatchShare
from sb3_grpo.common.update.train_stats import LossTerms

__all__ = ["with_router_aux"]


def with_router_aux(
    policy: Any, loss: Callable[[], LossTerms], share: MicroBatchShare | None, values: list[float]
) -> LossTerms:
    """``loss()``, plus ``router_aux_loss_coef * aux`` for a policy whose coefficient is positive (see the module).

    :param policy: The policy (its ``router_aux_loss_coef`` and ``router_aux_losses()``, when it has them).
    :param loss: Computes the minibatch's loss (its forwards are the ones whose routers count).
    :param share: The micro-batch's share of its minibatch (``None``: a whole minibatch).
    :param values: Where each minibatch's ``aux`` is appended (the update logs their mean as
        ``train/router_aux_loss``).
    """
    coef = float(getattr(policy, "router_aux_loss_coef", 0.0) or 0.0)  # a policy without routers has no coefficient
    if coef == 0.0:
        return loss()
    with policy.router_aux_losses() as losses:
        terms = loss()
    if not losses:  # e.g. evaluated without gradients (a non-finite micro-batch's log)
        return terms
    aux = th.stack(losses).mean()
    values.append(float(aux.detach()))
    term = coef * aux * (1.0 if share is None else share.fraction)
    details = {**terms.details, "router_aux_loss": float(term.detach())}
    return LossTerms(terms.loss + term, terms.approx_kl, details, terms.value + float(term.detach()))
