"""Progress of ``sb3-grpo compare`` and ``textrl-bench claims``: a live bar on a terminal, plain lines elsewhere.

One :class:`Progress` follows a whole session of runs: how many runs are done, the env steps of the runs in flight,
each one's latest training reward, and the time left (from the steps still to run at the pace so far). On a terminal
it is a ``tqdm`` bar over all the session's env steps, as SB3's ``progress_bar=True`` shows one run; when the output
is not a terminal (a log file, CI) it prints a plain line when a run ends and at most one status line every
``interval`` seconds while runs are going.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``."""
    if seconds != seconds or seconds < 0:  # nan
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """Progress of a session of runs.

    :param total_runs: Runs this session will do.
    :param total_steps: Env steps of all of them together.
    :param enabled: Show anything at all (``False``: silent).
    :param live: Draw a live bar (``None``: when ``stream`` is a terminal); else plain lines.
    :param unit: The step unit (``"tok"`` for text envs, ``"step"`` otherwise).
    :param stream: Where to write (default ``sys.stderr``).
    :param interval: Seconds between two plain status lines.
    """

    def __init__(
        self,
        total_runs: int,
        total_steps: int,
        enabled: bool = True,
        live: bool | None = None,
        unit: str = "step",
        stream: TextIO | None = None,
        interval: float = 30.0,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.live = enabled and (live if live is not None else bool(getattr(self.stream, "isatty", lambda: False)()))
        self.total_runs, self.total_steps = total_runs, max(1, total_steps)
        self.runs_done = 0
        self.steps_done = 0  # of finished runs
        self.current: dict[str, tuple[int, int, float | None]] = {}  # label -> (steps, of, latest reward)
        self.interval = interval
        self._started = time.perf_counter()
        self._last_line = self._started
        self._bar: Any = None
        if self.live:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total_steps, unit=unit, unit_scale=True, dynamic_ncols=True, file=self.stream)

    # -- what the runs report --------------------------------------------------------------------------------

    def start_run(self, label: str, steps: int) -> None:
        """A run of ``steps`` env steps begins."""
        self.current[label] = (0, steps, None)
        self._show()

    def advance(self, label: str, steps: int, reward: float | None = None) -> None:
        """Run ``label`` is at ``steps`` env steps; ``reward`` is its latest training reward (if any new)."""
        old_steps, total, old_reward = self.current.get(label, (0, steps, None))
        self.current[label] = (steps, total, old_reward if reward is None else reward)
        if self._bar is not None:
            self._bar.update(max(0, steps - old_steps))
        self._show()

    def end_run(self, label: str, message: str, steps: int | None = None) -> None:
        """Run ``label`` finished (``message``: its one-line result)."""
        done, total, _ = self.current.pop(label, (0, steps or 0, None))
        steps = total if steps is None else steps
        self.runs_done += 1
        self.steps_done += steps
        if self._bar is not None:
            self._bar.update(max(0, steps - done))
        self.write(f"[{self.runs_done}/{self.total_runs}] {message} (left: {format_duration(self.eta())})")
        self._show(force=True)

    def write(self, line: str) -> None:
        """A line above the bar (or a plain line)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # -- what it shows ---------------------------------------------------------------------------------------

    def eta(self) -> float:
        """Seconds left at the pace so far (``nan`` before any step)."""
        done = self.steps_done + sum(s for s, _, _ in self.current.values())
        elapsed = time.perf_counter() - self._started
        if done <= 0:
            return float("nan")
        return elapsed * (self.total_steps - done) / done

    def status(self) -> str:
        """``runs 3/40 | ppo seed 2: 4,096/8,192, reward 0.55 | ...``"""
        parts = [f"runs {self.runs_done}/{self.total_runs}"]
        for label, (steps, total, reward) in self.current.items():
            part = f"{label}: {steps:,}/{total:,}"
            if reward is not None:
                part += f", reward {reward:.3f}"
            parts.append(part)
        return " | ".join(parts)

    def _show(self, force: bool = False) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_description_str(self.status(), refresh=False)
            self._bar.refresh()
            return
        now = time.perf_counter()
        if not force and now - self._last_line >= self.interval and self.current:
            print(f"... {self.status()} (left: {format_duration(self.eta())})", file=self.stream, flush=True)
            self._last_line = now
