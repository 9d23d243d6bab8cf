"""The one seam between GRPO's update and ``torch.distributed``.

``train`` calls the same methods whether it runs on one process or on many; :class:`SingleProcess` makes each of
them a no-op (or plain arithmetic), :class:`DataParallel` makes them the collective calls of
:mod:`sb3_grpo.distributed`. :func:`make_data_parallel` chooses once, when the model is set up, and it never
touches ``torch.distributed`` unless the process was launched by ``torchrun`` or a process group is already
initialised.

The fixed points of an update where the ranks meet:

- :meth:`~SingleProcess.epoch`: the ranks may have different numbers of minibatches in an epoch (the text fast path
  packs whole episodes); the shorter epochs are padded with idle steps (``None``).
- :meth:`~SingleProcess.average_gradients`: after ``loss.backward()``, before clipping and the optimizer step.
- :meth:`~SingleProcess.idle_step`: a rank without a minibatch joins the gradient average with no gradient of its
  own and takes the same optimizer step.
- :meth:`~SingleProcess.mean`: ``target_kl`` early stopping and the KL controller use cross-rank means, so every
  rank decides the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch as th
from stable_baselines3.common.logger import Logger

from sb3_grpo import distributed

__all__ = ["DataParallel", "SingleProcess", "make_data_parallel"]

T = TypeVar("T")


class SingleProcess:
    """The seam on one process: every meeting point is a no-op."""

    world_size = 1
    rank = 0

    def epoch(self, minibatches: Iterable[T]) -> Iterator[T | None]:
        """This rank's minibatches of one epoch (on many processes, padded with ``None`` idle steps).

        :param minibatches: The minibatches of the epoch.
        """
        return iter(minibatches)

    def average_gradients(self, params: Iterable[th.nn.Parameter]) -> None:
        """Average the gradients of ``params`` over the ranks, in place (after ``backward``)."""

    def idle_step(self, policy: Any, max_grad_norm: float, scaler: Any = None) -> None:
        """Join the other ranks' gradient step without a gradient of this rank's (after a skipped minibatch).

        :param policy: The policy (its ``optimizer``).
        :param max_grad_norm: The gradient clip.
        :param scaler: The fp16 loss scaler (``torch.amp.GradScaler``), or ``None``.
        """

    is_main = True

    def device(self, device: th.device | str) -> th.device | str:
        """The device this rank trains on (on CUDA, one GPU per rank: :func:`sb3_grpo.distributed.local_device`)."""
        return device

    def seed(self, seed: int | None) -> int | None:
        """This rank's seed (see :func:`sb3_grpo.distributed.rank_seed`)."""
        return seed

    def start(self, policy: th.nn.Module, n_envs: int) -> None:
        """Start every rank from the same weights (rank 0's) and check that the ranks can step in lockstep."""

    def mean(self, total: float, count: float = 1.0) -> float:
        """``sum(total) / sum(count)`` over the ranks; NaN when every count is 0.

        :param total: This rank's sum of the quantity.
        :param count: How many values ``total`` sums.
        """
        return total / count if count > 0 else float("nan")

    def record(self, logger: Logger, num_timesteps: int) -> None:
        """Log the data-parallel figures (nothing on one process)."""


class DataParallel(SingleProcess):
    """The seam under ``torch.distributed`` with ``world_size > 1`` (see :mod:`sb3_grpo.distributed`).

    :param world_size: The number of ranks.
    :param rank: This process's rank.
    """

    def __init__(self, world_size: int, rank: int) -> None:
        self.world_size = world_size
        self.rank = rank
        self.is_main = rank == 0

    def device(self, device: th.device | str) -> th.device | str:
        return distributed.local_device(device)

    def seed(self, seed: int | None) -> int | None:
        return distributed.rank_seed(seed, self.rank)

    def start(self, policy: th.nn.Module, n_envs: int) -> None:
        """Broadcast rank 0's weights; check that every rank has as many envs (collective calls: every rank must
        build the model)."""
        distributed.broadcast_module(policy, src=0)
        if not distributed.all_equal(n_envs):
            raise ValueError(
                f"GRPO under torch.distributed needs the same number of envs on every rank (this rank, "
                f"{self.rank}, has {n_envs}); every rank must run the same n_envs, n_steps and total_timesteps, "
                "or the ranks fall out of lockstep and wait for each other forever"
            )

    def epoch(self, minibatches: Iterable[T]) -> Iterator[T | None]:
        return distributed.pad_to_max(minibatches)

    def average_gradients(self, params: Iterable[th.nn.Parameter]) -> None:
        distributed.average_gradients(params)

    def idle_step(self, policy: Any, max_grad_norm: float, scaler: Any = None) -> None:
        """Join the gradient average with no gradient of this rank's and take the optimizer step the other ranks
        take (none when the averaged gradient is non-finite: the contributing ranks raise or skip that step; under
        fp16 loss scaling the scale follows theirs)."""
        policy.optimizer.zero_grad()
        distributed.average_gradients(policy.parameters(), contributed=False)
        if scaler is not None:
            scaler.unscale_(policy.optimizer)
        grad_norm = th.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
        if th.isfinite(grad_norm):
            if scaler is not None:
                scaler.step(policy.optimizer)
            else:
                policy.optimizer.step()
        else:
            policy.optimizer.zero_grad()
        if scaler is not None:
            scaler.update()

    def mean(self, total: float, count: float = 1.0) -> float:
        return distributed.mean_across_ranks(total, count)

    def record(self, logger: Logger, num_timesteps: int) -> None:
        """``num_timesteps`` counts this rank's steps; every rank steps as many."""
        logger.record("time/global_timesteps", num_timesteps * self.world_size)
        logger.record("dist/world_size", self.world_size)


def make_data_parallel(backend: str | None = None) -> SingleProcess:
    """The seam for this process: :class:`DataParallel` under ``torchrun`` (or an initialised process group with
    more than one process), else :class:`SingleProcess`, without touching ``torch.distributed``.

    :param backend: Passed to :func:`sb3_grpo.distributed.setup` when a process group must be started.
    """
    if not distributed.launched():
        return SingleProcess()
    if not distributed.setup(backend=backend):
        return SingleProcess()
    return DataParallel(distributed.get_world_size(), distributed.get_rank())
