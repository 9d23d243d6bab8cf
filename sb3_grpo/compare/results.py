"""The out dir of a comparison and its ``results.json``: prepared before anything runs, written atomically.

``results.json`` is rewritten after every run through :func:`~sb3_grpo.file_io.write_json_atomic` (temp file,
``fsync``, ``os.replace``), so an interrupted comparison keeps every run that finished.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sb3_grpo.compare.config import CompareConfig, CompareError
from sb3_grpo.file_io import LOCK_FILE, FolderBusyError, FolderLock, write_json_atomic

__all__ = [
    "OUTPUT_NAMES",
    "RESULTS_FILE",
    "discard_failed_out_dir",
    "environment_info",
    "git_commit",
    "load_results",
    "new_results",
    "prepare_out_dir",
    "resolved_device",
    "write_json_atomic",
]

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
CURVES_FILE = "curves.png"
TENSORBOARD_DIR = "tensorboard"
#: Files and folders ``--overwrite`` removes from an out dir (nothing else is touched).
OUTPUT_NAMES = (RESULTS_FILE, REPORT_FILE, CURVES_FILE, TENSORBOARD_DIR)
SCHEMA_VERSION = 1


# ------------------------------------------------------------------------------------------------------------
# The out dir and results.json
# ------------------------------------------------------------------------------------------------------------


def prepare_out_dir(
    out: Path,
    overwrite: bool,
    resume: bool,
    outputs: tuple[str, ...] = OUTPUT_NAMES,
    lock: FolderLock | None = None,
) -> list[Path]:
    """Create (or check) the out dir; on any failure nothing is left behind.

    :param out: The folder.
    :param overwrite: Remove this command's previous outputs (``outputs``: for ``compare`` results.json, report.md,
        curves.png, tensorboard/) and start afresh; other files are left alone.
    :param resume: Keep previous results and skip the runs they hold (a damaged results.json is refused now).
    :param outputs: The names ``overwrite`` removes.
    :param lock: A :class:`~sb3_grpo.file_io.FolderLock` of ``out`` to take once the folder exists and before
        anything in it is removed (the caller releases it when the command ends); ``None``: no lock.
    :return: The folders created now, innermost first (empty when ``out`` existed): what
        :func:`discard_failed_out_dir` removes when the comparison then fails before any run completes.
    :raises CompareError: exists without --overwrite/--resume, is not a folder, is not writable, or another
        command holds ``lock``.
    """
    if overwrite and resume:
        raise CompareError("--overwrite and --resume exclude each other: pick one")
    existed = out.exists()
    if existed and not out.is_dir():
        raise CompareError(f"--out {out} exists and is not a folder")
    if existed and any(p.name != LOCK_FILE for p in out.iterdir()) and not (overwrite or resume):
        raise CompareError(
            f"--out {out} already exists; pass --resume to continue it (completed runs are skipped), "
            "--overwrite to replace its results, or another --out"
        )
    if resume and not (out / RESULTS_FILE).is_file():
        raise CompareError(f"--resume: {out / RESULTS_FILE} does not exist; nothing to resume (drop --resume)")
    if resume:
        load_results(out)  # refuse a damaged results.json before anything runs
    created: list[Path] = []
    try:
        missing = [p for p in [out, *out.parents] if not p.exists()]
        out.mkdir(parents=True, exist_ok=True)
        created = missing
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as err:
        for path in created:  # innermost first
            try:
                path.rmdir()
            except OSError:
                pass
        raise CompareError(f"cannot write to --out {out}: {err.strerror or err}; choose a writable folder") from None
    if lock is not None:
        _take_lock(lock, created)
    if overwrite:
        for name in outputs:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    return created


def _take_lock(lock: FolderLock, created: list[Path]) -> None:
    """Take ``lock``; when another command holds it, remove the (empty) folders made now and refuse."""
    try:
        lock.acquire()
    except FolderBusyError as err:
        for path in created:  # innermost first; the other command's lock file keeps a folder it uses
            try:
                path.rmdir()
            except OSError:
                break
        raise CompareError(str(err)) from None


def discard_failed_out_dir(created: list[Path]) -> bool:
    """After a comparison failed: remove the out dir it created (and the parents it created) when no run completed,
    so a command that fails on its input (found only when a run starts) leaves nothing behind.

    :param created: What :func:`prepare_out_dir` returned (innermost first); empty: the folder existed, keep it.
    :return: Whether the folders were removed.
    """
    if not created:
        return False
    out = created[0]
    try:
        with open(out / RESULTS_FILE) as f:
            runs = json.load(f).get("runs", {})
    except (OSError, ValueError, AttributeError):
        runs = {}
    if any(isinstance(r, dict) and r.get("status") == "complete" for r in runs.values()):
        return False
    shutil.rmtree(out, ignore_errors=True)
    for parent in created[1:]:
        try:
            parent.rmdir()
        except OSError:
            break
    return True


#: What a ``results.json`` must hold for a report: config keys and the keys of every run.
CONFIG_KEYS = ("env_id", "algos", "seeds", "timesteps", "n_envs", "eval_episodes", "hyperparameters")
RUN_KEYS = ("algo", "seed", "curve")


def _results_problem(data: Any) -> str | None:
    """What keeps ``data`` from being a comparison's results (``None``: nothing)."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    if data.get("kind") == "claims":  # textrl-bench claims: runs keyed by experiment/arm/seed, under a budget
        if not isinstance(data.get("runs"), dict) or not isinstance(data.get("budget"), str):
            return "it is a claims study's without 'runs' and 'budget'"
        bad = [k for k, r in data["runs"].items() if not isinstance(r, dict) or "status" not in r]
        return f"its run {bad[0]!r} has no status" if bad else None
    config, runs = data.get("config"), data.get("runs")
    if not isinstance(config, dict) or not isinstance(runs, dict):
        return "it has no 'config' and 'runs' objects"
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        return f"its config lacks {', '.join(missing)}"
    if not isinstance(config["algos"], list) or not isinstance(config["seeds"], list):
        return "its config's algos and seeds are not lists"
    for key, run in runs.items():
        if not isinstance(run, dict) or any(k not in run for k in RUN_KEYS) or not isinstance(run["curve"], dict):
            return f"its run {key!r} lacks {', '.join(RUN_KEYS)}"
        problem = _run_problem(run)
        if problem:
            return f"its run {key!r} {problem}"
    return None


def _numbers(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _run_problem(run: dict[str, Any]) -> str | None:
    """What in one run keeps the report from reading it (an edited file), or ``None``."""
    if not isinstance(run["algo"], str) or isinstance(run["seed"], bool) or not isinstance(run["seed"], int):
        return "has an algo that is not a name or a seed that is not an integer"
    curve = run["curve"]
    steps, reward = curve.get("steps", []), curve.get("reward", [])
    if not _numbers(steps) or not _numbers(reward) or len(steps) != len(reward):
        return "has a curve whose steps and reward are not two lists of numbers of one length"
    if run.get("status") != "complete":
        return None
    final = run.get("final")
    if not isinstance(final, dict) or not _numbers([final.get("reward_mean")]):
        return "is complete but has no final reward_mean number"
    timing = ("wall_time_s", "steps_per_s", "peak_rss_mb")
    bad = [k for k in timing if run.get(k) is not None and not _numbers([run[k]])]  # None: not measured
    return f"has {', '.join(bad)} that are not numbers" if bad else None


def load_results(out: Path) -> dict[str, Any]:
    """Read ``results.json`` of an out dir, checking that it is a comparison's (or a claims study's).

    :param out: The folder.
    :return: The stored results.
    :raises CompareError: for a file that is not valid JSON (e.g. truncated) or not a comparison's results.
    """
    path = out / RESULTS_FILE
    todo = "run the comparison again into a fresh --out (sb3-grpo compare ... --out DIR)"
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise CompareError(f"{path} is not valid JSON ({err}; truncated or edited?); {todo}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CompareError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    problem = _results_problem(data)
    if problem:
        raise CompareError(f"{path} is not the results.json of `sb3-grpo compare`: {problem}; {todo}")
    return data


#: The checkout the library runs from (its parent folder); :func:`git_commit` asks git about it by default.
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):  # no git executable, or it hung
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_commit(root: str | os.PathLike | None = None) -> str:
    """The short hash of the commit checked out at ``root``, with ``+dirty`` when tracked files have changes.

    :param root: A folder in the checkout (default: the one the library runs from).
    :return: E.g. ``"a1b2c3d"`` or ``"a1b2c3d+dirty"``; ``"unknown"`` outside a git checkout (or without git).
    """
    path = Path(root) if root is not None else _SOURCE_ROOT
    commit = _git(path, "rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    changes = _git(path, "status", "--porcelain", "--untracked-files=no")
    return commit + ("+dirty" if changes else "")


def environment_info(device: str = "cpu") -> dict[str, Any]:
    """Versions, hardware and the git commit of the library's checkout, for the report and the results page.

    :param device: The device the comparison used.
    :return: A JSON-able dict.
    """
    import importlib.metadata as md

    import torch as th

    versions = {}
    for pkg in ("textrl", "stable-baselines3", "gymnasium", "torch", "transformers", "numpy"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "not installed"
    versions["python"] = platform.python_version()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory_gb = None
    try:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    hardware: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": th.get_num_threads(),
        "memory_gb": round(memory_gb, 1) if memory_gb else None,
        "device": device,
        "gpu": th.cuda.get_device_name(0) if th.cuda.is_available() else None,
    }
    hardware.update(_math_libraries())
    try:
        hardware["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    # the code that runs, recorded when the run starts (a results page written later stamps this one)
    return {"versions": versions, "hardware": hardware, "commit": git_commit()}


def _math_libraries() -> dict[str, Any]:
    """What sets float rounding on a CPU, so two machines' reports can be told apart: the vector instructions
    torch dispatches to, and the BLAS / LAPACK / oneDNN it was built with."""
    import torch as th

    info: dict[str, Any] = {}
    try:
        info["cpu_capability"] = th.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001  (older torch: leave it out)
        pass
    config = th.__config__.show()
    for key in ("BLAS_INFO", "LAPACK_INFO"):
        found = re.search(rf"\b{key}=([^,\s]+)", config)
        if found:
            info[key.lower()] = found.group(1)
    dnn = [line.strip("- ").split(" (")[0] for line in config.splitlines() if "MKL-DNN" in line or "oneDNN" in line]
    if dnn:
        info["onednn"] = dnn[0]
    return info


def resolved_device(device: str) -> str:
    """``device`` as this machine resolves it (:func:`textrl_envs.devices.resolve_device`: ``"auto"`` is CUDA when
    available, else the CPU)."""
    from textrl_envs.devices import resolve_device

    return str(resolve_device(device))


def new_results(cfg: CompareConfig, command: str) -> dict[str, Any]:
    """The skeleton of ``results.json`` for a fresh comparison."""
    return {
        "schema": SCHEMA_VERSION,
        "command": command,
        "config": asdict(cfg),
        "environment": environment_info(resolved_device(cfg.device)),
        "status": "running",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "untrained": None,
        "runs": {},
    }
