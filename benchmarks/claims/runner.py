"""Running the claims study's jobs: in this process, or in worker processes (``--workers N``).

A job is one :class:`~benchmarks.claims.experiments.Job`; :func:`execute` trains and evaluates it (one torch thread) and
returns its record. :func:`run_jobs` runs a queue of jobs, hands each record to ``on_done`` as soon as it exists
(the caller writes ``results.json`` there), asks ``more()`` for jobs that became possible (the tuned runs, once
tuning is over), and keeps a :class:`~sb3_grpo.compare.progress.Progress` up to date: workers report their steps and
latest rewards through a queue. Every run seeds its own RNGs, so a run's numbers do not depend on the number of
workers or on which worker ran it. On Ctrl-C (``KeyboardInterrupt``) pending jobs are cancelled and the
interrupt is re-raised; what ``on_done`` received is kept.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from benchmarks.claims.experiments import Job
from sb3_grpo.compare.progress import Progress

__all__ = ["execute", "run_jobs"]

_QUEUE: Any = None  # the worker's progress queue (set by _init_worker)


def _curriculum_callback(job: Job) -> Any:
    from benchmarks.claims.experiments import curriculum_budget
    from sb3_grpo.callbacks import MaxNewTokensCurriculum

    spec = dict(job.curriculum or {})
    max_tokens = _max_new_tokens(job.cfg.env_id)
    return MaxNewTokensCurriculum(lambda p: curriculum_budget(p, max_tokens, **spec))


def _max_new_tokens(env_id: str) -> int:
    from textrl_envs.tasks import get_task

    return get_task(env_id).max_new_tokens


def execute(job: Job, out: Path, report: Callable[[int, float | None], None] | None = None) -> dict[str, Any]:
    """Train and evaluate one job (or only evaluate the untrained policy); return its ``results.json`` record.

    :param job: The job.
    :param out: The study's out dir (tensorboard logs go to ``out/<experiment>/<arm>/tensorboard/...``).
    :param report: Progress callback ``f(env_steps, latest_reward)``.
    """
    from benchmarks.claims.diagnostics import GradientNoiseProbe, RewardTerms, UpdateLog
    from sb3_grpo.compare.runner import evaluate_untrained, run_one

    base = {"key": job.key, "experiment": job.experiment, "arm": job.arm, "algo": job.algo, "seed": job.seed}
    if job.untrained:
        return {**base, "status": "complete", "fingerprint": job.fingerprint(), "final": evaluate_untrained(job.cfg)}
    updates, probe, terms = UpdateLog(), GradientNoiseProbe(), RewardTerms()
    callbacks = [updates, terms] + ([probe] if job.probe else [])
    callbacks += [_curriculum_callback(job)] if job.curriculum else []
    run = run_one(job.cfg, job.algo, job.seed, out / job.experiment / job.arm, report=report, callbacks=callbacks)
    run.update(base)
    run["fingerprint"] = job.fingerprint()
    run["updates"] = updates.summary()
    run["grad_norm_series"] = updates.records.get("train/grad_norm", [])
    if terms.series:
        run["reward_terms"] = terms.summary()
    if job.probe:
        run["probe"] = probe.summary()
    return run


def _safe_execute(job: Job, out: Path, report: Callable[[int, float | None], None] | None) -> dict[str, Any]:
    """:func:`execute`, with an exception turned into a failed record (one bad run must not end a long study)."""
    try:
        return execute(job, out, report)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001  (recorded, reported, and the command exits nonzero)
        return {
            "key": job.key,
            "experiment": job.experiment,
            "arm": job.arm,
            "algo": job.algo,
            "seed": job.seed,
            "status": "failed",
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(limit=8),
        }


def _exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """Exit this worker process as soon as its parent is gone (polled every ``poll_s`` seconds).

    Ctrl-C reaches every process of the terminal's group, but a parent that is killed (``kill PID``, a scheduler's
    SIGTERM or SIGKILL) cannot stop its workers: they would finish their run and write its logs into an out dir that a
    ``--resume`` may be cleaning. A worker's parent pid changes when the parent dies, so the worker ends too.
    """
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    os._exit(1)


def _init_worker(progress_queue: Any, threads: int) -> None:
    global _QUEUE
    import torch as th
    from transformers.utils import logging as hf_logging

    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True, name="exit-with-parent").start()
    _QUEUE = progress_queue
    th.set_num_threads(threads)
    hf_logging.disable_progress_bar()


def _worker_execute(job: Job, out: Path) -> dict[str, Any]:
    _QUEUE.put(("start", job.label, job.steps, None))
    return _safe_execute(job, out, lambda n, r: _QUEUE.put(("advance", job.label, n, r)))


def _drain(progress_queue: Any, progress: Progress) -> None:
    while True:
        try:
            kind, label, steps, reward = progress_queue.get_nowait()
        except queue_mod.Empty:
            return
        if kind == "start":
            progress.start_run(label, steps)
        else:
            progress.advance(label, steps, reward)


def run_jobs(
    jobs: list[Job],
    out: Path,
    on_done: Callable[[Job, dict[str, Any]], str],
    progress: Progress,
    more: Callable[[], list[Job]] = list,
    workers: int = 1,
    threads: int = 1,
) -> None:
    """Run ``jobs`` (and whatever ``more()`` returns after each finished job), ``workers`` at a time.

    :param jobs: The jobs to start with.
    :param out: The study's out dir.
    :param on_done: ``f(job, record) -> one-line summary``, called in this process as each job finishes.
    :param progress: The progress display.
    :param more: ``f() -> new jobs``, asked after every finished job.
    :param workers: Worker processes (1: run in this process).
    :param threads: Torch threads per worker process.
    """
    todo = deque(jobs)
    if workers <= 1:
        while todo:
            job = todo.popleft()
            progress.start_run(job.label, job.steps)
            record = _safe_execute(job, out, lambda n, r, lb=job.label: progress.advance(lb, n, r))
            progress.end_run(job.label, on_done(job, record), steps=job.steps)
            todo.extendleft(reversed(more()))  # jobs that became possible go first
        return
    ctx = mp.get_context("spawn")
    progress_queue = ctx.Queue()
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(progress_queue, threads))
    try:
        running: dict[Future, Job] = {}
        while todo or running:
            while todo and len(running) < workers:  # submit lazily, so that new jobs can jump the queue
                job = todo.popleft()
                running[pool.submit(_worker_execute, job, out)] = job
            done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(progress_queue, progress)
            for future in done:
                job = running.pop(future)
                progress.end_run(job.label, on_done(job, future.result()), steps=job.steps)
                todo.extendleft(reversed(more()))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
