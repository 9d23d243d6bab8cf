"""A sandbox for generated code: a separate process with limits, no network, a folder of its own, a wall-clock kill.

* :mod:`~textrl_envs.sandbox.execution`: :func:`run_tests` and :func:`run_batch` run code against unit tests and count
  the units passed (:class:`SandboxJob`, :class:`SandboxLimits`, :class:`SandboxResult`);
* :mod:`~textrl_envs.sandbox.launch`: the sandbox process's first program, which sets its limits;
* :mod:`~textrl_envs.sandbox.boot`: the harness inside it, with the audit hook that keeps the code to its folder.

Linux only (``setrlimit``, process groups, ``unshare``, ``/proc``).
"""

from textrl_envs.sandbox.execution import SandboxJob, SandboxLimits, SandboxResult, run_batch, run_tests, unit_count

__all__ = ["SandboxJob", "SandboxLimits", "SandboxResult", "run_batch", "run_tests", "unit_count"]
