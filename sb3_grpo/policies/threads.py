"""The CPU thread default of :class:`~sb3_grpo.policies.CausalLMPolicy`: one torch intra-op thread for a small LM,
every usable core for a real one.

A small LM (the bundled tiny GPT-2, anything up to :data:`SMALL_LM_PARAMETERS` parameters) runs many tiny matrix
products, one single-token forward per generated token. Splitting each over torch's default pool of intra-op threads
(one per core) costs more in synchronisation than it saves, and on a machine whose cores are busy with other work
every product waits for the slowest thread: a short training run can take ten times as long as with one thread.
So the first forward of a policy on the CPU sets torch to one intra-op thread (``torch.set_num_threads(1)``), as
the ``sb3-grpo`` command line does, unless the user has chosen a thread count:

- ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set in the environment;
- ``torch.set_num_threads`` was called after ``sb3_grpo`` was imported (a count set before that import cannot be
  told from torch's default: use the environment variable below); the rule sets the count at most once per
  process, so a count set after that is kept too;
- :data:`THREADS_ENV` (``SB3_GRPO_CPU_THREADS``) says otherwise: ``keep`` leaves torch's thread count alone, a
  positive integer ``N`` sets ``N`` threads instead of one, ``auto`` (or unset) is the rule above.

A larger LM (a real model: SmolLM2-135M, Qwen2.5-0.5B) is the opposite case: each product is big enough to split, and
a run on a dedicated machine should use its cores, so the rule sets every core this process may run on
(``os.sched_getaffinity``), under the same exceptions. Either choice is stated in the log (the ``sb3_grpo`` logger,
at INFO), with the model's size and how to override it.

One thread is also what the command line and the tests run at, so a script gets their results bit for bit. Other
thread counts give the same episodes up to float rounding: the backward pass sums gradients in another order
(after two updates of the bundled LM the parameters differ by about 1e-6, tested).
"""

from __future__ import annotations

import logging
import os

import torch as th

__all__ = ["SMALL_LM_PARAMETERS", "THREADS_ENV", "apply_cpu_thread_default", "cpu_thread_setting", "usable_cores"]

#: The environment variable that overrides the default: ``auto`` (default), ``keep``, or a thread count.
THREADS_ENV = "SB3_GRPO_CPU_THREADS"
#: LMs with at most this many parameters count as small (one thread is the fastest for them on the CPU).
SMALL_LM_PARAMETERS = 50_000_000
#: Variables by which the user sets torch's intra-op thread count before torch starts.
USER_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: torch's intra-op thread count when this module was imported (a later change is the user's choice).
_THREADS_AT_IMPORT = th.get_num_threads()
#: whether the ``auto`` rule has set the count in this process (it does so at most once: any count seen after that
#: is the user's, even one equal to the count at import)
_auto_applied = False

logger = logging.getLogger(__name__)


def cpu_thread_setting() -> str | int:
    """:data:`THREADS_ENV` read and checked: ``"auto"``, ``"keep"`` or a positive thread count.

    :raises ValueError: for any other value, naming the variable and the values it takes.
    """
    raw = os.environ.get(THREADS_ENV, "")
    value = raw.strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value == "keep":
        return "keep"
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError(
        f"{THREADS_ENV}={raw!r} is not a thread setting; use 'auto' (one thread for a small LM on the CPU, the "
        "default), 'keep' (leave torch's thread count as it is) or a positive integer (that many threads)"
    )


def _user_chose_threads() -> bool:
    """Whether the user set torch's intra-op thread count (an environment variable, or a call since import)."""
    if _auto_applied or any(os.environ.get(name) for name in USER_THREAD_VARIABLES):
        return True
    return th.get_num_threads() != _THREADS_AT_IMPORT


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where the OS has none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def apply_cpu_thread_default(n_parameters: int) -> int | None:
    """Set torch's intra-op thread count for an LM of ``n_parameters`` parameters running on the CPU (the rule in
    the module docstring: one thread up to :data:`SMALL_LM_PARAMETERS`, every usable core above), and say so in the
    log.

    :param n_parameters: the LM's parameter count.
    :return: the thread count set, or ``None`` when torch's was left as it was.
    """
    global _auto_applied
    setting = cpu_thread_setting()
    if setting == "keep":
        return None
    why = f"{THREADS_ENV}={setting}"
    if setting == "auto":
        if _user_chose_threads():
            return None
        small = n_parameters <= SMALL_LM_PARAMETERS
        setting, _auto_applied = (1 if small else usable_cores()), True
        size = "small" if small else "large"
        why = f"a {size} LM of {n_parameters / 1e6:.1f}M parameters on the CPU"
    if th.get_num_threads() != setting:
        th.set_num_threads(setting)
    logger.info("torch intra-op threads: %d, for %s (%s=N sets N, keep leaves torch's count)", setting, why,
                THREADS_ENV)  # fmt: skip
    return setting
