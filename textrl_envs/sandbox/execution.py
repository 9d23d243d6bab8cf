"""Run generated code against unit tests in a sandbox process, one program or a batch at once.

:func:`run_tests` runs one :class:`SandboxJob` (the code, the test's ``check`` function, the entry point's name):

1. a fresh temporary folder (mode 0700) receives the job, ``launch.py`` and ``boot.py``;
2. ``python -I -B launch.py`` starts there in a new session (its own process group) with an empty environment but
   ``PATH``, ``HOME`` and ``TMPDIR`` (the folder); :mod:`~textrl_envs.sandbox.launch` sets CPU-time, memory,
   file-size, open-file and process-count limits, a new network namespace where the OS allows it, another user where
   the trainer is root and the interpreter is reachable by other users, then becomes :mod:`~textrl_envs.sandbox.boot`,
   whose audit hook keeps the code to the folder (no sockets, no new processes, no signals to others, no files
   outside);
3. the parent waits at most ``wall_seconds``, then kills the process group (and, with its own user, every process of
   that user), reads the unit results the harness wrote with the run's token, and removes the folder.

Whatever the code does (loops forever, forks, eats memory, reads or writes outside its folder, opens a socket, kills
its parent), the caller gets a :class:`SandboxResult`; units not reported as passed count as failed. Nothing is left
behind: no process, no folder. :func:`run_batch` runs jobs side by side in threads, each one such process.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from textrl_envs.sandbox.boot import units

__all__ = ["SandboxJob", "SandboxLimits", "SandboxResult", "run_batch", "run_tests", "unit_count"]

_HERE = Path(__file__).parent
#: Bytes of the results pipe read (the rest is drained and dropped: the code may write there too).
RESULTS_BYTES = 1 << 16
#: Bytes kept of the code's stdout and stderr (the tail).
OUTPUT_BYTES = 4096
#: The first user id of sandbox users (root only), and how many there are.
SANDBOX_UID_BASE, SANDBOX_UIDS = 61000, 4000
_next_uid = itertools.count()
_uid_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one sandbox process may use.

    :param cpu_seconds: CPU time (``RLIMIT_CPU``; SIGXCPU, then SIGKILL a second later).
    :param wall_seconds: Wall-clock time, after which the process group is killed.
    :param memory_bytes: Address space (``RLIMIT_AS``): a memory bomb gets ``MemoryError``.
    :param file_bytes: Size of any file it writes, its output included (``RLIMIT_FSIZE``).
    :param processes: Processes of its user (``RLIMIT_NPROC``; enforced by the kernel for users other than root; the
        audit hook refuses new processes in any case).
    :param open_files: Open file descriptors (``RLIMIT_NOFILE``).
    :param network_namespace: Run in a new network namespace where the OS allows it (sockets are refused by the
        audit hook in any case).
    """

    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 1 << 20
    processes: int = 16
    open_files: int = 64
    network_namespace: bool = True

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_bytes", "file_bytes", "processes", "open_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.wall_seconds, (int, float)) or not 0 < self.wall_seconds < float("inf"):
            raise ValueError(f"SandboxLimits.wall_seconds must be a positive number, got {self.wall_seconds!r}")


@dataclasses.dataclass(frozen=True)
class SandboxJob:
    """Code and the unit tests it must pass.

    :param code: The program (a HumanEval prompt and its completion, or a whole module).
    :param test: A test module defining ``check(candidate)``, whose top-level statements holding an ``assert`` are
        the units (HumanEval's form).
    :param entry_point: The name of the function under test, defined by ``code``.
    """

    code: str
    test: str
    entry_point: str


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What a run came to.

    :param passed: Units passed.
    :param total: Units in the test.
    :param status: ``"done"`` (the harness ran every unit), ``"timeout"`` (killed at the wall-clock limit),
        ``"died"`` (the process ended before the harness was done: a crash, a resource limit, an early exit).
    :param returncode: The process's exit status (negative: the signal that ended it).
    :param seconds: Wall-clock time of the run.
    :param network_namespace: Whether the code ran in a network namespace of its own.
    :param stdout: The tail of its standard output.
    :param stderr: The tail of its standard error.
    """

    passed: int
    total: int
    status: str
    returncode: int | None
    seconds: float
    network_namespace: bool
    stdout: str = ""
    stderr: str = ""

    @property
    def fraction(self) -> float:
        """``passed / total`` (0 for a test without units)."""
        return self.passed / self.total if self.total else 0.0


def unit_count(test: str) -> int:
    """The unit tests of a test module: the top-level statements of its ``check`` holding an ``assert``."""
    return sum(is_unit for _, is_unit in units(test)[2])


def _interpreter_reachable_by_others() -> bool:
    """Whether another user can run this interpreter and read its library (every directory on the way searchable by
    others): only then can a sandbox drop to a user of its own."""
    paths = {os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    for path in paths:
        here = Path(path)
        for part in [here, *here.parents]:
            try:
                mode = part.stat().st_mode
            except OSError:
                return False
            if not mode & stat.S_IXOTH:
                return False
    return True


_OWN_USERS: bool | None = None


def own_users() -> bool:
    """Whether sandboxes run as users of their own (the trainer is root and the interpreter is reachable)."""
    global _OWN_USERS  # noqa: PLW0603  (computed once per process)
    if _OWN_USERS is None:
        _OWN_USERS = os.getuid() == 0 and _interpreter_reachable_by_others()
    return _OWN_USERS


def _sandbox_uid() -> int | None:
    if not own_users():
        return None
    with _uid_lock:
        return SANDBOX_UID_BASE + next(_next_uid) % SANDBOX_UIDS


def _prepare_folder(job: SandboxJob, uid: int | None) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="textrl-sandbox-"))
    (folder / "job.json").write_text(json.dumps(dataclasses.asdict(job)), encoding="utf-8")
    for name in ("boot.py", "launch.py"):
        shutil.copyfile(_HERE / name, folder / name)
    if uid is not None:
        for path in [folder, *folder.iterdir()]:
            os.chown(path, uid, uid)
    return folder


def _kill_user(uid: int) -> None:
    """SIGKILL every process of ``uid`` (a sandbox user: all of them are the sandbox's)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def _drain(fd: int, box: list[bytes]) -> None:
    """Read ``fd`` to its end, keeping the first :data:`RESULTS_BYTES`."""
    kept = 0
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            if kept < RESULTS_BYTES:
                box.append(chunk[: RESULTS_BYTES - kept])
                kept += len(box[-1])


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - OUTPUT_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _parse(lines: list[str], token: str, total: int) -> tuple[int, bool, bool]:
    """``(passed, done, network_namespace)`` from the results pipe (lines without the token are ignored)."""
    passed, done, netns, seen = 0, False, False, set()
    for line in lines:
        if line == "netns yes":
            netns = True
        parts = line.split(" ")
        if len(parts) < 2 or parts[0] != token:
            continue
        if parts[1:] == ["done"]:
            done = True
        elif len(parts) == 3 and parts[1].isdigit() and parts[2] == "pass" and int(parts[1]) < total:
            seen.add(int(parts[1]))
    passed = len(seen)
    return passed, done, netns


def run_tests(job: SandboxJob, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``job`` in a sandbox process and count the units it passes (see the module docstring).

    :param job: The code and its test.
    :param limits: The process's limits (default :class:`SandboxLimits`).
    """
    limits = limits or SandboxLimits()
    total = unit_count(job.test)
    uid = _sandbox_uid()
    folder = _prepare_folder(job, uid)
    token = secrets.token_hex(16)
    read_end, write_end = os.pipe()
    config = {
        "cpu": limits.cpu_seconds, "memory": limits.memory_bytes, "file": limits.file_bytes,
        "processes": limits.processes, "open_files": limits.open_files, "network": limits.network_namespace,
        "uid": uid, "results_fd": write_end,
    }  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "TMPDIR": str(folder), "LANG": "C.UTF-8"}
    box: list[bytes] = []
    start = time.monotonic()
    status, returncode = "died", None
    try:
        with (folder / "stdout.txt").open("wb") as out, (folder / "stderr.txt").open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-I", "-B", "launch.py", json.dumps(config)],
                cwd=folder, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err, pass_fds=(write_end,),
                start_new_session=True,
            )  # fmt: skip
        os.close(write_end)
        write_end = -1
        reader = threading.Thread(target=_drain, args=(read_end, box), daemon=True)
        read_end = -1
        reader.start()
        try:
            process.stdin.write(f"{token}\n".encode())
            process.stdin.close()
        except OSError:  # the process is already gone
            pass
        try:
            returncode = process.wait(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            status = "timeout"
        _kill_group(process.pid)
        if uid is not None:
            _kill_user(uid)
        if returncode is None:
            returncode = process.wait()
        reader.join(timeout=5)
        stdout, stderr = _tail(folder / "stdout.txt"), _tail(folder / "stderr.txt")
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
    lines = b"".join(box).decode("utf-8", errors="replace").splitlines()
    passed, done, netns = _parse(lines, token, total)
    if done and status != "timeout":
        status = "done"
    return SandboxResult(passed, total, status, returncode, time.monotonic() - start, netns, stdout, stderr)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_batch(
    jobs: Sequence[SandboxJob], limits: SandboxLimits | None = None, workers: int | None = None
) -> list[SandboxResult]:
    """Run ``jobs`` side by side (``workers`` at once; default: the CPU count), each in its own sandbox process.

    :return: One :class:`SandboxResult` per job, in order.
    """
    if not jobs:
        return []
    workers = max(1, min(len(jobs), workers or os.cpu_count() or 1))
    if workers == 1:
        return [run_tests(job, limits) for job in jobs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="textrl-sandbox") as pool:
        return list(pool.map(lambda job: run_tests(job, limits), jobs))
