"""``textrl-bench claims``: run the study of :mod:`benchmarks.claims.experiments` into an out dir and write its report.

The out dir holds ``results.json`` (rewritten atomically after every run: Ctrl-C keeps what finished, ``--resume``
skips it), ``claims.md`` (a verdict per claim with its effect and 95% interval, the tuning trials, the ablation),
``curves.png``, ``profiles.png`` and tensorboard logs under ``<experiment>/<arm>/tensorboard/``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.claims.experiments import (
    BUDGETS,
    Budget,
    Job,
    phase_one,
    phase_two,
    phase_two_runs,
    plan_summary,
    tuned,
)
from sb3_grpo.compare.results import RESULTS_FILE, environment_info, load_results
from sb3_grpo.file_io import to_jsonable, write_json_atomic

__all__ = ["CLAIMS_OUTPUTS", "check_claims_extra", "run_claims"]

CLAIMS_FILE = "claims.md"
#: What ``--overwrite`` removes from an out dir of ``claims``.
CLAIMS_OUTPUTS = (RESULTS_FILE, CLAIMS_FILE, "curves.png", "profiles.png")


def check_claims_extra() -> None:
    """Raise ``ImportError`` naming the install when a library the study needs is missing (SciPy)."""
    try:
        import scipy.stats  # noqa: F401  (its bootstrap makes every interval)
    except ImportError:
        raise ImportError(
            "textrl-bench claims needs SciPy for its interval estimates (a dependency of textrl): pip install scipy"
        ) from None


def _new_results(budget: Budget, command: str, workers: int) -> dict[str, Any]:
    return {
        "schema": 1,
        "kind": "claims",
        "command": command,
        "budget": budget.name,
        "plan": to_jsonable(plan_summary(budget)),
        "workers": workers,
        "environment": environment_info("cpu"),
        "status": "running",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tuning": None,
        "runs": {},
    }


def _kept(old: dict[str, Any], jobs: list[Job]) -> dict[str, dict[str, Any]]:
    """The runs of ``old`` that are complete and were made exactly as the job of the same key would make them."""
    wanted = {job.key: to_jsonable(job.fingerprint()) for job in jobs}
    return {
        key: run
        for key, run in old.get("runs", {}).items()
        if run.get("status") == "complete" and key in wanted and to_jsonable(run.get("fingerprint")) == wanted[key]
    }


class _Study:
    """The state of one session: results, the jobs still to schedule, what to do with a finished one."""

    def __init__(self, budget: Budget, out: Path, results: dict[str, Any], log: Any) -> None:
        self.budget, self.out, self.results, self.log = budget, out, results, log
        self.second_phase_started = False
        self.old_runs: dict[str, dict[str, Any]] = {}

    def save(self) -> None:
        write_json_atomic(self.out / RESULTS_FILE, self.results)

    def on_done(self, job: Job, record: dict[str, Any]) -> str:
        self.results["runs"][job.key] = record
        self.save()
        if record.get("status") != "complete":
            return f"{job.label}: FAILED ({record.get('error')})"
        if job.untrained:
            return f"{job.label}: reward {record['final']['reward_mean']:.3f}"
        return (
            f"{job.label}: final reward {record['final']['reward_mean']:.3f} "
            f"({record['wall_time_s']:.0f} s, {record['steps_per_s']:.0f} {record['step_unit']}/s)"
        )

    def todo(self, jobs: list[Job]) -> list[Job]:
        """The jobs whose run is not already kept (from ``--resume``), those kept copied into the results."""
        kept = _kept({"runs": self.old_runs}, jobs)
        self.results["runs"].update(kept)
        return [job for job in jobs if job.key not in kept]

    def more(self) -> list[Job]:
        """The tuned runs, once every tuning run is in (asked after every finished run)."""
        if self.second_phase_started:
            return []
        tuning = tuned(self.budget, self.results["runs"])
        if tuning is None:
            return []
        self.second_phase_started = True
        self.results["tuning"] = to_jsonable(tuning)
        self.save()
        return self.todo(phase_two(self.budget, tuning))


def run_claims(
    budget: str | Budget,
    out: Path,
    command: str,
    resume: bool = False,
    workers: int = 1,
    progress: bool | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Run the claims study and write its report.

    :param budget: ``"smoke"``, ``"default"``, ``"full"`` (or a :class:`~benchmarks.claims.experiments.Budget`).
    :param out: The prepared out dir.
    :param command: The command line, for the report.
    :param resume: Keep the completed runs of ``out/results.json`` made as this study would make them.
    :param workers: Runs at a time, each in its own process with one torch thread (1: in this process).
    :param progress: Show progress (``None``: a live bar on a terminal, plain lines otherwise; ``False``: nothing).
    :param log: Where one-line messages go.
    :return: The results.
    """
    from benchmarks.claims.report import write_claims_report
    from benchmarks.claims.runner import run_jobs
    from sb3_grpo.compare.progress import Progress
    from sb3_grpo.compare.runner import quiet_hf_loading

    check_claims_extra()
    budget = BUDGETS[budget] if isinstance(budget, str) else budget
    quiet_hf_loading(True)
    study = _Study(budget, out, _new_results(budget, command, workers), log)
    if resume:
        old = load_results(out)
        study.old_runs = old.get("runs", {})
        study.results["started"] = old.get("started", study.results["started"])
    jobs = study.todo(phase_one(budget))
    if resume:
        log(f"resume: keeping {len(study.results['runs'])} completed run(s) from {out / RESULTS_FILE}")
    jobs += study.more()
    study.save()
    steps = sum(j.steps for j in jobs) + _phase_two_steps(budget) * (not study.second_phase_started)
    later = 0 if study.second_phase_started else phase_two_runs(budget)
    bar = Progress(len(jobs) + later, steps, progress is not False)
    started = time.perf_counter()
    try:
        run_jobs(jobs, out, study.on_done, bar, more=study.more, workers=workers)
    except KeyboardInterrupt:
        bar.close()
        _finish(study, "interrupted", None)
        write_claims_report(study.results, out)
        raise
    bar.close()
    failed = [k for k, r in study.results["runs"].items() if r.get("status") != "complete"]
    _finish(study, "failed" if failed else "complete", time.perf_counter() - started)
    write_claims_report(study.results, out)
    return study.results


def _phase_two_steps(budget: Budget) -> int:
    return phase_two_runs(budget) * budget.long_steps


def _finish(study: _Study, status: str, wall: float | None) -> None:
    study.results["status"] = status
    study.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if wall is not None:
        study.results["session_wall_s"] = round(wall, 1)
        study.results["session_cpu_s"] = round(_cpu_seconds(), 1)
    study.save()


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the workers)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def load_study(out: Path) -> dict[str, Any]:
    """``results.json`` of a claims out dir (for ``sb3-grpo report``)."""
    results = load_results(out)
    if results.get("kind") != "claims":
        raise ValueError(f"{out / RESULTS_FILE} is not from `textrl-bench claims`")
    return results
