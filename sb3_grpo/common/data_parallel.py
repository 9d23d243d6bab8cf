"""The one seam between GRPO's update and ``torch.distributed``.

``train`` calls the same methods whether it runs on one process or on many; :class:`SingleProcess` makes each of
them a no-op (or plain arithmetic), :class:`DataParallel` makes them the collective calls of
:mod:`sb3_grpo.distributed` (every rank holds the whole policy: ``data_parallel="ddp"``), and
:class:`FullyShardedDataParallel` shards the policy's parameters, gradients and optimizer state over the ranks with
PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``: ``data_parallel="fsdp"``). :func:`make_data_parallel`
chooses once, when the model is set up, and it never touches ``torch.distributed`` unless the process was launched
by ``torchrun`` or a process group is already initialised.

The fixed points of an update where the ranks meet:

- :meth:`~SingleProcess.epoch`: the ranks may have different numbers of minibatches in an epoch (the text fast path
  packs whole episodes); the shorter epochs are padded with idle steps (``None``).
- :meth:`~SingleProcess.average_gradients`: after ``loss.backward()``, before clipping and the optimizer step.
- :meth:`~SingleProcess.idle_step`: a rank without a minibatch joins the gradient average with no gradient of its
  own and takes the same optimizer step.
- :meth:`~SingleProcess.mean`: ``target_kl`` early stopping and the KL controller use cross-rank means, so every
  rank decides the same.
- :meth:`~SingleProcess.clip_grad_norm`: the gradient norm over the whole policy (under FSDP, over every rank's
  shard) and the clip.
- :meth:`~SingleProcess.full_state`: what ``save`` writes (under FSDP, the full state gathered to rank 0, so that
  the file loads on one process).

Two more calls mark the phases under FSDP (see :class:`FullyShardedDataParallel`), without a collective call of
their own: :meth:`~SingleProcess.release` at the end of a rollout (each rank frees the blocks it gathered), and the
span :meth:`~SingleProcess.updating` around ``train``'s update, whose forwards and backwards every rank runs alike
(the blocks are resharded after each of them there).
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch as th
from stable_baselines3.common.logger import Logger

from sb3_grpo import distributed

__all__ = [
    "DATA_PARALLEL",
    "DataParallel",
    "FullyShardedDataParallel",
    "SingleProcess",
    "fsdp_root",
    "fsdp_units",
    "make_data_parallel",
]

#: The data-parallel modes (``data_parallel=``): a whole policy per rank, or FSDP2's sharding.
DATA_PARALLEL = ("ddp", "fsdp")

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

    def shard(self, policy: th.nn.Module) -> None:
        """Shard the policy over the ranks (only under FSDP), after :meth:`start` and the KL reference's copy."""

    def release(self, policy: th.nn.Module) -> None:
        """Free what the rollout's forwards gathered, after its last one (only under FSDP; a local call)."""

    def updating(self, policy: th.nn.Module) -> contextlib.AbstractContextManager[None]:  # noqa: ARG002 (the seam's)
        """The context of one update (``train``), in which every rank runs the same forwards and backwards (under
        FSDP the blocks are resharded after each of them; nothing on one process or under DDP).

        :param policy: The policy.
        """
        return contextlib.nullcontext()

    def mean(self, total: float, count: float = 1.0) -> float:
        """``sum(total) / sum(count)`` over the ranks; NaN when every count is 0.

        :param total: This rank's sum of the quantity.
        :param count: How many values ``total`` sums.
        """
        return total / count if count > 0 else float("nan")

    def record(self, logger: Logger, num_timesteps: int) -> None:
        """Log the data-parallel figures (nothing on one process)."""

    def clip_grad_norm(self, params: Iterable[th.nn.Parameter], max_norm: float) -> float:
        """Clip the gradients of ``params`` to a total norm of ``max_norm`` (in place); return the norm before.

        :param params: The policy's parameters.
        :param max_norm: The clip.
        """
        return th.nn.utils.clip_grad_norm_(params, max_norm).item()

    def full_state(self, model: Any) -> dict[str, dict] | None:  # noqa: ARG002 (the seam's signature)
        """The state dicts ``save`` writes, when they are not the policy's own (``None``: they are). A collective
        call under FSDP: every rank calls it, rank 0 gets the state."""
        return None


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
        grad_norm = self.clip_grad_norm(policy.parameters(), max_grad_norm)
        if math.isfinite(grad_norm):
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


class FullyShardedDataParallel(DataParallel):
    """The seam under ``torch.distributed`` with the policy sharded by FSDP2 (``data_parallel="fsdp"``).

    At :meth:`shard`, after rank 0's weights are broadcast, the policy's units are sharded (``fully_shard``) and the
    optimizer is rebuilt over the shards: each rank stores ``1 / world_size`` of every unit's parameters, gradients
    and optimizer state. The units (:func:`fsdp_units`) are modules used only through their own forward:

    - a :class:`~sb3_grpo.policies.CausalLMPolicy`: its LM's blocks (the classes a Hugging Face model names in
      ``_no_split_modules``, e.g. ``GPT2Block``, ``Qwen2DecoderLayer``), which hold almost all of a large model's
      weights; the embeddings, the final norm, the (tied) output head and the critic stay whole, since the policy
      uses them directly;
    - any other policy (SB3's MLP and CNN policies): every child module that holds parameters.

    The LM body that runs the blocks (``lm.base_model``, the module whose forward the policy calls; :func:`fsdp_root`)
    is sharded too, as the blocks' common FSDP root, with its own parameters (the embeddings and the final norm)
    left out (``ignored_params``): whole, as before. A unit gathers its parameters for its forward and backward and
    reduce-scatters (averages) its gradients in the backward; the parameters outside the units stay whole on every
    rank and are averaged as under :class:`DataParallel`. ``save`` gathers the full state to rank 0
    (:meth:`full_state`), so the file loads on one process.

    When a unit's gathered parameters are freed again depends on where the forward runs:

    - in the update (:meth:`updating`), right after the unit's forward, and after its backward: a rank holds its
      shards plus the one or two units being computed, so its peak falls with the number of ranks;
    - outside it (the rollout, ``predict``), a unit gathered by a forward stays gathered until the rollout ends
      (:meth:`release`) or the update starts. The ranks may make different numbers of forwards in a rollout (the KV
      cache serves some steps without a forward, episodes end at different steps), and gathering is a collective
      call, so the rollout gathers each unit once, in its first forward (which every rank makes), and not once per
      forward: during a rollout a rank holds the whole model's weights beside its shards.

    Every rank must run every forward and backward of the update: the ranks need the same number of minibatches per
    epoch (SB3's per-transition buffers give it with the same ``n_envs``, ``n_steps`` and ``batch_size``; the text
    fast path's packed sequences do not), and there are no idle steps.
    """

    def __init__(self, world_size: int, rank: int) -> None:
        super().__init__(world_size, rank)
        self._units: list[th.nn.Module] = []  # the sharded units, once :meth:`shard` ran
        self._optimizer_names: list[str] = []  # the optimizer's parameters by name (:meth:`shard`)
        self._optimizer_flags: dict[str, Any] = {}  # the flags a one-process optimizer runs with

    def shard(self, policy: th.nn.Module) -> None:
        """Shard the policy's units and rebuild its optimizer over the shards (after rank 0's weights were broadcast
        by :meth:`start`, and after a frozen KL reference was copied: an FSDP module cannot be deep-copied, so the
        reference stays whole on every rank)."""
        from torch.distributed.fsdp import fully_shard

        units = fsdp_units(policy)
        # the parameters the optimizer steps (with LoRA only the adapters and the critic), by name: sharding replaces
        # the parameter objects, and the saved optimizer state numbers these as a one-process optimizer does
        in_optimizer = {id(p) for group in policy.optimizer.param_groups for p in group["params"]}
        self._optimizer_names = [name for name, p in policy.named_parameters() if id(p) in in_optimizer]
        if not units:
            raise ValueError(
                f"data_parallel='fsdp' found nothing to shard in {type(policy).__name__}: no child module with "
                "parameters (nor Hugging Face blocks named in _no_split_modules); use data_parallel='ddp'"
            )
        # the mesh on the policy's device: FSDP2's default is the machine's accelerator, which would move the units of
        # a policy trained on the CPU (gloo) to a GPU the machine happens to have
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(next(policy.parameters()).device.type, (self.world_size,))
        root = fsdp_root(policy, units)
        for unit in units:  # inner units first (fsdp_units lists them so); kept gathered until an update (updating)
            fully_shard(unit, mesh=mesh, reshard_after_forward=False)
        if root is not None:
            # the blocks' common root: without one each block is a root of its own, and FSDP2 keeps a root's gathered
            # parameters from its forward to its backward; the body's own parameters stay whole (ignored)
            in_units = {id(p) for unit in units for p in unit.parameters()}
            whole = {p for p in root.parameters() if id(p) not in in_units}
            fully_shard(root, mesh=mesh, reshard_after_forward=False, ignored_params=whole)
            # FSDP2 warns that the body returns a view (its last hidden state), on which an in-place op would drop the
            # root's pre-backward hook and so its gather: the root has no parameters of its own to gather
            warnings.filterwarnings(
                "ignore", message=re.escape(f"FSDP2-wrapped module ({type(root).__name__}) returned a view tensor")
            )
        self._units = units
        group = policy.optimizer.param_groups[0]
        kwargs = dict(policy.optimizer_kwargs)
        # the flags a one-process optimizer runs with, restored in the saved state (full_state)
        self._optimizer_flags = {key: group[key] for key in ("fused", "foreach") if key in group}
        named = dict(policy.named_parameters())
        params = [named[name] for name in self._optimizer_names]
        if any(not _is_sharded(p) for p in params):
            # a fused or multi-tensor kernel cannot mix sharded and whole parameters: the per-parameter loop
            kwargs.update({key: False for key in self._optimizer_flags})
        policy.optimizer = policy.optimizer_class(params, lr=group["lr"], **kwargs)

    def release(self, policy: th.nn.Module) -> None:  # noqa: ARG002 (the seam's signature)
        """Reshard every unit: each rank drops its gathered copies (no collective call), keeping its shards."""
        for unit in self._units:
            unit.reshard()

    @contextlib.contextmanager
    def updating(self, policy: th.nn.Module) -> Iterator[None]:
        """Free the units still gathered (:meth:`release`: by forwards since the rollout's end), reshard each unit
        after its forward for the update, and keep the units gathered again after it (for the next rollout)."""
        self.release(policy)
        units = self._units
        for unit in units:
            unit.set_reshard_after_forward(True, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.set_reshard_after_forward(False, recurse=False)

    def epoch(self, minibatches: Iterable[T]) -> Iterator[T | None]:
        for minibatch in distributed.pad_to_max(minibatches):
            if minibatch is None:
                raise RuntimeError(
                    "data_parallel='fsdp': the ranks have different numbers of minibatches in an epoch, and under FSDP "
                    "every rank must run every forward and backward (they gather the shards together); use the same "
                    "n_envs, n_steps and batch_size on every rank with SB3's per-transition buffers, or "
                    "data_parallel='ddp'"
                )
            yield minibatch

    def average_gradients(self, params: Iterable[th.nn.Parameter]) -> None:
        # the sharded parameters' gradients were averaged by FSDP's reduce-scatter; the whole ones are averaged here
        distributed.average_gradients([p for p in params if not _is_sharded(p)])

    def idle_step(self, policy: Any, max_grad_norm: float, scaler: Any = None) -> None:  # noqa: ARG002 (the seam's)
        raise RuntimeError(
            "data_parallel='fsdp': a rank has no gradient for this step (a skipped non-finite minibatch), and under "
            "FSDP every rank must run every backward; use nonfinite='raise' or data_parallel='ddp'"
        )

    def clip_grad_norm(self, params: Iterable[th.nn.Parameter], max_norm: float) -> float:
        """``clip_grad_norm_``'s formula over the shards: the squared norms of this rank's shards summed over the
        ranks, plus the whole parameters' (the same on every rank), then every gradient scaled alike."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return 0.0
        device = grads[0].device
        sharded = [g.to_local() for g in grads if _is_sharded(g)]
        whole = [g for g in grads if not _is_sharded(g)]
        sq_sharded = th.stack([_squared_norm(g) for g in sharded]).sum() if sharded else th.zeros((), device=device)
        distributed.all_reduce_sum_(sq_sharded)
        sq_whole = th.stack([_squared_norm(g) for g in whole]).sum() if whole else th.zeros((), device=device)
        total = th.sqrt(sq_sharded + sq_whole)
        coef = th.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in [*sharded, *whole]:
            g.mul_(coef.to(g.dtype))
        return total.item()

    def full_state(self, model: Any) -> dict[str, dict] | None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        policy = model.policy
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(policy, options=options)
        optim = get_optimizer_state_dict(policy, policy.optimizer, options=options)
        if not self.is_main:
            return None
        # the optimizer's state keyed by parameter name -> by index, as a one-process optimizer numbers them
        index = {name: i for i, name in enumerate(self._optimizer_names)}
        optim = {
            "state": {index[name]: value for name, value in optim["state"].items()},
            "param_groups": [
                {**group, **self._optimizer_flags, "params": [index[n] for n in group["params"]]}
                for group in optim["param_groups"]
            ],
        }
        # the other state dicts (a frozen KL reference: whole on every rank) as they are
        return {**model.get_parameters(), "policy": weights, "policy.optimizer": optim}

    def record(self, logger: Logger, num_timesteps: int) -> None:
        super().record(logger, num_timesteps)
        logger.record("dist/data_parallel", "fsdp", exclude="tensorboard")


def fsdp_units(policy: th.nn.Module) -> list[th.nn.Module]:
    """The modules :class:`FullyShardedDataParallel` shards, inner ones first (see there).

    :param policy: The policy.
    """
    blocks: set[str] = set()
    for module in policy.modules():
        blocks.update(getattr(module, "_no_split_modules", None) or ())
    block_units = [m for m in policy.modules() if type(m).__name__ in blocks and any(True for _ in m.parameters())]
    if hasattr(policy, "evaluate_sequences"):  # the LM's trunk, head and embeddings are used outside their forwards
        return block_units
    children = [child for child in policy.children() if any(True for _ in child.parameters())]
    return [*block_units, *children]


def fsdp_root(policy: th.nn.Module, units: list[th.nn.Module]) -> th.nn.Module | None:
    """The module :class:`FullyShardedDataParallel` makes the common FSDP root of ``units``: a
    :class:`~sb3_grpo.policies.CausalLMPolicy`'s LM body (``policy.lm.base_model``, whose forward the policy calls and
    which runs every block), or ``None`` (another policy, whose units are called one by one, each its own root; or a
    block outside the body).

    :param policy: The policy.
    :param units: Its units (:func:`fsdp_units`).
    """
    body = getattr(getattr(policy, "lm", None), "base_model", None)
    if not hasattr(policy, "evaluate_sequences") or not isinstance(body, th.nn.Module) or not units:
        return None
    inside = set(body.modules())
    return body if all(unit in inside and unit is not body for unit in units) else None


def _squared_norm(grad: th.Tensor) -> th.Tensor:
    """``(grad ** 2).sum()`` in float32, without a squared copy of the gradient."""
    return th.linalg.vector_norm(grad.detach(), dtype=th.float32).pow(2)


def _is_sharded(tensor: th.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def make_data_parallel(backend: str | None = None, mode: str = "ddp") -> SingleProcess:
    """The seam for this process: :class:`DataParallel` (``mode="ddp"``) or :class:`FullyShardedDataParallel`
    (``mode="fsdp"``) under ``torchrun`` (or an initialised process group with more than one process), else
    :class:`SingleProcess`, without touching ``torch.distributed``.

    :param backend: Passed to :func:`sb3_grpo.distributed.setup` when a process group must be started.
    :param mode: ``"ddp"`` or ``"fsdp"`` (:data:`DATA_PARALLEL`); on one process both are :class:`SingleProcess`.
    """
    if mode not in DATA_PARALLEL:
        raise ValueError(f"data_parallel must be one of {DATA_PARALLEL}, got {mode!r}")
    if not distributed.launched():
        return SingleProcess()
    if not distributed.setup(backend=backend):
        return SingleProcess()
    cls = FullyShardedDataParallel if mode == "fsdp" else DataParallel
    return cls(distributed.get_world_size(), distributed.get_rank())
