"""The out dir of a comparison and its ``results.json``: prepared before anything runs, written atomically.

``results.json`` is rewritten after every run through :func:`~sb3_grpo.common.io.write_json_atomic` (temp file,
``fsync``, ``os.replace``), so an interrupted comparison keeps every run that finished.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sb3_grpo.bench.config import CompareConfig, CompareError
from sb3_grpo.common.io import write_json_atomic

__all__ = [
    "OUTPUT_NAMES",
    "RESULTS_FILE",
    "environment_info",
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


def prepare_out_dir(out: Path, overwrite: bool, resume: bool, outputs: tuple[str, ...] = OUTPUT_NAMES) -> bool:
    """Create (or check) the out dir; on any failure nothing is left behind.

    :param out: The folder.
    :param overwrite: Remove this command's previous outputs (``outputs``: for ``compare`` results.json, report.md,
        curves.png, tensorboard/) and start afresh; other files are left alone.
    :param resume: Keep previous results and skip the runs they hold.
    :param outputs: The names ``overwrite`` removes.
    :return: Whether the folder was created now.
    :raises CompareError: exists without --overwrite/--resume, is not a folder, or is not writable.
    """
    if overwrite and resume:
        raise CompareError("--overwrite and --resume exclude each other: pick one")
    existed = out.exists()
    if existed and not out.is_dir():
        raise CompareError(f"--out {out} exists and is not a folder")
    if existed and any(out.iterdir()) and not (overwrite or resume):
        raise CompareError(
            f"--out {out} already exists; pass --resume to continue it (completed runs are skipped), "
            "--overwrite to replace its results, or another --out"
        )
    if resume and not (out / RESULTS_FILE).is_file():
        raise CompareError(f"--resume: {out / RESULTS_FILE} does not exist; nothing to resume (drop --resume)")
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
    if overwrite:
        for name in outputs:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    return not existed


def load_results(out: Path) -> dict[str, Any]:
    """Read ``results.json`` of an out dir.

    :param out: The folder.
    :return: The stored results.
    """
    with open(out / RESULTS_FILE) as f:
        return json.load(f)


def environment_info(device: str = "cpu") -> dict[str, Any]:
    """Versions and hardware, for the report.

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
    return {"versions": versions, "hardware": hardware}


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
