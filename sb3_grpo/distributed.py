"""Data-parallel training on ``torch.distributed``, launched with ``torchrun``.

Every rank (process) holds a full copy of the policy and steps its own shard of environments. ``GRPO`` uses the
helpers of this module so that one script runs unchanged on one process or on many::

    torchrun --nproc_per_node 2 examples/distributed_train.py                      # one machine, 2 processes
    torchrun --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 \\
             --nproc_per_node 8 examples/distributed_train.py                    # on node 0 (node_rank 1 on node 1)

What ``GRPO`` does when a process group is active (:func:`setup` found or started one with ``world_size > 1``):

- **Setup.** Rank 0's parameters (and buffers) are broadcast to every rank right after the policy is built
  (:func:`broadcast_module`), so every rank starts from the same weights whatever its seed.
- **Seeds.** ``GRPO(seed=s)`` seeds rank ``r`` with :func:`rank_seed` ``(s) = s + 1000 * r`` (torch, numpy, the
  action space, the env's ``seed()`` and the exploration draws), so the ranks sample different episodes. The envs
  are the user's to build: build each rank's with ``seed=rank_seed(seed)`` and, for a fixed prompt set, its
  :func:`shard` of the prompts.
- **Gradients.** After ``loss.backward()`` and before clipping and the optimizer step, the gradients of the
  trainable parameters are averaged over the ranks in one flattened all-reduce (:func:`average_gradients`), so the
  optimizer takes the same step everywhere and the parameters stay identical on every rank.
- **Lockstep.** Every collective call must be made by every rank. The text fast path packs whole episodes into
  minibatches, so ranks may have different numbers of minibatches in an epoch: :func:`pad_to_max` pads the shorter
  epochs with idle steps (no loss; they join the all-reduce with no gradient, and the average is taken over the
  ranks that contributed). ``target_kl`` early stopping uses the ``approx_kl`` averaged over the ranks, so all ranks
  stop at the same minibatch; the adaptive KL controller (``kl_target``) uses the KL averaged over the ranks.
  Every rank must run the same ``n_envs``, ``n_steps`` and ``total_timesteps`` (checked at setup for ``n_envs``);
  a callback that stops training on one rank only would leave the others waiting.
- **Advantages.** Group advantages are computed within each rank's groups (a group's envs live on one rank);
  PPO's per-minibatch advantage normalisation uses the rank's own minibatch, as in CleanRL's multi-GPU PPO.
- **Logging and saving.** Rank 0 logs and saves; ranks > 0 get an SB3 logger with no outputs (and
  ``verbose=0``), and their ``save()`` does nothing. ``GRPO.load`` makes no collective call (rank 0 alone may load a
  model to evaluate it); to continue training on every rank, every rank loads the same file.
- **Timesteps.** ``num_timesteps`` (and therefore ``learn(total_timesteps)`` and SB3's ``time/total_timesteps``)
  count *this rank's* env steps, as on one process; the global count is ``world_size`` times that and is logged as
  ``time/global_timesteps``, next to ``dist/world_size``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch as th
import torch.distributed as dist
from torch import nn

from textrl_envs.devices import resolve_device
from textrl_envs.validation import check_int, check_seed

__all__ = [
    "PG_TIMEOUT_S",
    "SEED_STRIDE",
    "all_equal",
    "all_reduce_sum_",
    "average_gradients",
    "broadcast_module",
    "get_rank",
    "get_world_size",
    "is_active",
    "is_main_process",
    "launched",
    "local_device",
    "mean_across_ranks",
    "null_logger",
    "pad_to_max",
    "peer_errors",
    "process_group_timeout",
    "rank_seed",
    "setup",
    "shard",
]

SEED_STRIDE = 1000
"""Rank ``r`` is seeded with ``seed + SEED_STRIDE * r`` (see :func:`rank_seed`)."""

T = TypeVar("T")

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def is_active() -> bool:
    """True when a ``torch.distributed`` process group is initialised with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    """This process's rank: the process group's, else ``torchrun``'s ``RANK`` variable, else 0.

    Reading ``RANK`` lets a script build its env shard (:func:`rank_seed`, :func:`shard`) before ``GRPO`` starts
    the process group.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def get_world_size() -> int:
    """The number of processes: the process group's, else ``torchrun``'s ``WORLD_SIZE`` variable, else 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0 (and on a single process): the rank that logs and saves."""
    return get_rank() == 0


def _launched_by_torchrun() -> bool:
    return all(v in os.environ for v in _TORCHRUN_VARS) and int(os.environ["WORLD_SIZE"]) > 1


def launched() -> bool:
    """True when this process takes part in data-parallel training: launched by ``torchrun`` with
    ``WORLD_SIZE > 1``, or inside a process group the user initialised. Starts nothing."""
    return _launched_by_torchrun() or (dist.is_available() and dist.is_initialized())


def setup(backend: str | None = None) -> bool:
    """Use the active process group, or start one from ``torchrun``'s environment variables.

    If a process group is already initialised (the user called ``torch.distributed.init_process_group``), it is
    used as it is. Otherwise, if ``RANK``, ``WORLD_SIZE`` (> 1), ``MASTER_ADDR`` and ``MASTER_PORT`` are set (as
    ``torchrun`` sets them), one is initialised with ``backend``: by default NCCL when CUDA is available (and each
    process is pinned to GPU ``LOCAL_RANK``), gloo otherwise. Without either, training is single-process.

    :param backend: ``"nccl"``, ``"gloo"`` or ``None`` (choose by device).
    :return: True when more than one process takes part (:func:`is_active`).
    """
    if not dist.is_available():
        return False
    if not dist.is_initialized() and _launched_by_torchrun():
        if backend is None:
            backend = "nccl" if th.cuda.is_available() else "gloo"
        if backend == "nccl":
            th.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        from datetime import timedelta

        pg_timeout = process_group_timeout()  # checked before any rank waits for another
        store = _rendezvous(rendezvous_timeout())
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timedelta(seconds=pg_timeout),
        )
    return is_active()


#: Seconds a collective call (an all-reduce, a broadcast, a barrier) waits for the other ranks once training runs
#: (``SB3_GRPO_PG_TIMEOUT`` overrides it): a rank that stalls (a stuck reward, a hung device) then stops the others
#: with an error (:func:`peer_errors`) instead of torch's 30 minutes of silence. Raise it when rank 0 alone runs long
#: work between updates (a long evaluation, a large checkpoint).
PG_TIMEOUT_S = 600.0


def _seconds_from_env(name: str, default: float, example: str) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a number of seconds > 0, got {text!r}; e.g. {example}")
    return value


def process_group_timeout() -> float:
    """How long a collective call waits for a peer, in seconds: ``SB3_GRPO_PG_TIMEOUT`` or :data:`PG_TIMEOUT_S`.

    :raises ValueError: for a value that is not a positive number.
    """
    return _seconds_from_env("SB3_GRPO_PG_TIMEOUT", PG_TIMEOUT_S, "600")


@contextlib.contextmanager
def peer_errors() -> Iterator[None]:
    """Turn torch's errors of a collective call whose peer stalled (timed out) or died (closed the connection) into
    one clear ``RuntimeError`` on the ranks that are alive, naming the rank, the timeout and what to do.
    ``GRPO.learn`` runs inside it."""
    try:
        yield
    except RuntimeError as err:
        if not (dist.is_available() and dist.is_initialized()) or get_world_size() < 2:
            raise
        text, rank = str(err).lower(), get_rank()
        from_torch = type(err).__module__.startswith("torch") or "gloo" in text or "nccl" in text
        if from_torch and ("timed out" in text or "timeout" in text):
            raise RuntimeError(
                f"torch.distributed: rank {rank} waited SB3_GRPO_PG_TIMEOUT={process_group_timeout():g} s for the "
                "other ranks at a collective call (an all-reduce of the update) and one never came: a rank is "
                "stalled (a reward that hangs, a hung device, a rank doing long work alone). Check the other ranks' "
                "logs; raise SB3_GRPO_PG_TIMEOUT if the wait is expected; training resumes from the last checkpoint "
                "(ElasticCheckpointCallback)"
            ) from err
        if from_torch and ("connection closed" in text or "connection reset" in text):
            raise RuntimeError(
                f"torch.distributed: rank {rank} lost a peer at a collective call (its connection closed): another "
                "rank died. Check its log; with torchrun --max-restarts and ElasticCheckpointCallback the job "
                "restarts from the last checkpoint"
            ) from err
        raise


#: Seconds every rank waits for the others to join at start-up (``SB3_GRPO_RENDEZVOUS_TIMEOUT`` overrides it).
RENDEZVOUS_TIMEOUT_S = 300.0


def rendezvous_timeout() -> float:
    """The start-up wait, in seconds: ``SB3_GRPO_RENDEZVOUS_TIMEOUT`` or :data:`RENDEZVOUS_TIMEOUT_S`.

    :raises ValueError: for a value that is not a positive number.
    """
    return _seconds_from_env("SB3_GRPO_RENDEZVOUS_TIMEOUT", RENDEZVOUS_TIMEOUT_S, "300")


def _rendezvous(timeout_s: float) -> Any:
    """The process group's store, once every rank has joined (or a clear error after ``timeout_s`` seconds, not
    torch's default 30 minutes of silence). Under torchrun's agent (``TORCHELASTIC_USE_AGENT_STORE``) the agent
    hosts the store and every rank is a client; otherwise rank 0 hosts it and waits for the others."""
    from datetime import timedelta

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    try:
        store = dist.TCPStore(
            host,
            port,
            world_size,
            is_master=rank == 0 and not agent,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=not agent,
        )
    except (RuntimeError, OSError) as err:  # torch's DistStoreError is a RuntimeError
        raise RuntimeError(
            f"torch.distributed start-up: rank {rank} of WORLD_SIZE={world_size} found no peers at "
            f"MASTER_ADDR={host}:MASTER_PORT={port} within {timeout_s:g} s ({type(err).__name__}: {err}). Start every "
            "rank (e.g. with torchrun --nproc_per_node N), check MASTER_ADDR/MASTER_PORT, or unset RANK, WORLD_SIZE, "
            "MASTER_ADDR and MASTER_PORT to train in one process; SB3_GRPO_RENDEZVOUS_TIMEOUT sets the wait"
        ) from err
    if agent:
        # the agent's store outlives a restart (torchrun --max-restarts): each attempt keeps its keys apart, as
        # torch's own env:// rendezvous does, or the restarted ranks would read the dead attempt's addresses
        return dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    return store


def local_device(device: th.device | str = "auto") -> th.device:
    """The device this rank should use: on CUDA, GPU ``LOCAL_RANK`` of its machine (one GPU per process).

    ``"auto"`` and ``"cuda"`` (without an index) become ``cuda:LOCAL_RANK`` when CUDA is available, ``"auto"``
    becomes ``cpu`` otherwise; anything else is checked (:func:`textrl_envs.devices.resolve_device`) and returned.
    Use it for the env's ``device`` too.

    :param device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:3"`` or a ``th.device``.
    :return: the resolved device.
    """
    device = resolve_device(device)
    if device.type == "cuda" and device.index is None:
        device = th.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def rank_seed(seed: int | None, rank: int | None = None) -> int | None:
    """The seed of rank ``rank``: ``seed + 1000 * rank`` (``None`` stays ``None``).

    Distinct seeds give the ranks distinct episodes (prompts drawn, tokens sampled); the stride of 1000 keeps the
    per-env seeds ``seed + i`` that envs derive from it apart for up to 1000 envs per rank.

    :param seed: the run's seed (what rank 0 uses).
    :param rank: the rank (default: this process's).
    :return: the rank's seed.
    :raises TypeError: for a seed or rank that is not an int.
    :raises ValueError: for a negative (or too large) seed or a negative rank.
    """
    if seed is None:
        return None
    seed = check_seed("rank_seed: seed", seed)
    rank = get_rank() if rank is None else check_int("rank_seed: rank", rank, low=0, example=0)
    return seed + SEED_STRIDE * rank


def shard(items: Sequence[T], rank: int | None = None, world_size: int | None = None) -> list[T]:
    """This rank's share of ``items`` (e.g. a prompt list): every ``world_size``-th item from ``rank`` on.

    :param items: the full list, the same on every rank.
    :param rank: the rank (default: this process's).
    :param world_size: the number of ranks (default: the process group's).
    :return: ``items[rank::world_size]``.
    :raises ValueError: when some rank would get no item, or ``rank`` is not in ``[0, world_size - 1]``.
    """
    world_size = (
        get_world_size() if world_size is None else check_int("shard: world_size", world_size, low=1, example=2)
    )
    rank = (
        get_rank()
        if rank is None
        else check_int("shard: rank", rank, low=0, high=world_size - 1, hint=f"ranks are 0 to {world_size - 1}")
    )
    if len(items) < world_size:
        raise ValueError(
            f"cannot shard {len(items)} items over {world_size} ranks (every rank needs at least one); "
            "pass more items or use the full list on every rank with a distinct seed (rank_seed)"
        )
    return list(items[rank::world_size])


def null_logger():
    """An SB3 ``Logger`` that writes nothing (for ranks > 0)."""
    from stable_baselines3.common.logger import Logger

    return Logger(folder=None, output_formats=[])


def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and floating-point buffers into ``module`` on every rank (in place).

    :param module: the module, built identically on every rank.
    :param src: the rank whose values win.
    """
    if not is_active():
        return
    with th.no_grad():
        # floating-point buffers only (integer / bool buffers such as causal masks are constants of the config)
        for tensor in [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]:
            dist.broadcast(tensor.data, src=src)


def average_gradients(params: Iterable[nn.Parameter], contributed: bool = True) -> None:
    """Average the gradients of ``params`` over the ranks, in place: one flattened all-reduce (SUM) bucket.

    Each rank adds its gradients (zeros where a parameter has none), a per-parameter "has a gradient" flag and
    whether it ``contributed`` at all; the sum is divided by the number of contributing ranks (``world_size`` when
    every rank had a minibatch). A parameter no rank has a gradient for keeps ``grad = None`` everywhere (so the
    optimizer skips it as it would on one process); every other parameter gets the same averaged gradient on every
    rank. Call it after ``loss.backward()`` and before gradient clipping and ``optimizer.step()``.

    :param params: the trainable parameters, in the same order on every rank.
    :param contributed: False on a rank that ran no minibatch this step (an idle step, see :func:`pad_to_max`).
    """
    if not is_active():
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    device = params[0].device
    pieces = []
    for p in params:
        if p.grad is not None and contributed:
            pieces.append(p.grad.detach().reshape(-1).to(device=device, dtype=th.float32))
        else:
            pieces.append(th.zeros(p.numel(), device=device, dtype=th.float32))
    flags = [1.0 if (p.grad is not None and contributed) else 0.0 for p in params]
    pieces.append(th.tensor([*flags, 1.0 if contributed else 0.0], device=device, dtype=th.float32))
    bucket = th.cat(pieces)
    dist.all_reduce(bucket, op=dist.ReduceOp.SUM)
    n_contributors = max(float(bucket[-1].item()), 1.0)
    has_grad = bucket[-1 - len(params) : -1].tolist()
    bucket[: -1 - len(params)].div_(n_contributors)  # in place: no second copy of a large gradient
    offset = 0
    for p, flag in zip(params, has_grad):
        n = p.numel()
        if flag > 0:
            grad = bucket[offset : offset + n].view_as(p)
            if p.grad is None:
                p.grad = grad.to(device=p.device, dtype=p.dtype, copy=True)
            else:
                p.grad.copy_(grad)
        else:
            p.grad = None
        offset += n


def mean_across_ranks(total: float, count: float = 1.0) -> float:
    """``sum(total) / sum(count)`` over the ranks (``total / count`` on one process); NaN when every count is 0.

    :param total: this rank's sum of the quantity (0 on a rank with nothing to add).
    :param count: how many values ``total`` sums (its weight).
    :return: the global weighted mean, the same on every rank.
    """
    if is_active():
        t = th.tensor([float(total), float(count)], dtype=th.float64, device=_collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        total, count = float(t[0]), float(t[1])
    return total / count if count > 0 else float("nan")


def all_reduce_sum_(tensor: th.Tensor) -> None:
    """Sum ``tensor`` over the ranks, in place (nothing on one process)."""
    if is_active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def _collective_device() -> th.device:
    """Where small tensors for collectives live: this rank's GPU with NCCL, the CPU otherwise."""
    return local_device("cuda") if dist.get_backend() == "nccl" else th.device("cpu")


def _all_reduce_int(value: int, op: Any) -> int:
    t = th.tensor([int(value)], dtype=th.int64, device=_collective_device())
    dist.all_reduce(t, op=op)
    return int(t.item())


def all_equal(value: int) -> bool:
    """True when every rank passed the same integer (True on one process).

    :param value: this rank's value.
    """
    if not is_active():
        return True
    return _all_reduce_int(value, dist.ReduceOp.MIN) == _all_reduce_int(value, dist.ReduceOp.MAX)


def pad_to_max(items: Iterable[T]) -> Iterator[T | None]:
    """Yield ``items``, then ``None`` until every rank has yielded as many as the rank with the most.

    On one process it yields ``items`` lazily and nothing else. With a process group it materialises the list first
    (to count it), agrees on the maximum count with one all-reduce, and pads with ``None`` (an idle step).

    :param items: this rank's minibatches of one epoch.
    """
    if not is_active():
        yield from items
        return
    items = list(items)
    n_max = _all_reduce_int(len(items), dist.ReduceOp.MAX)
    yield from items
    for _ in range(n_max - len(items)):
        yield None
