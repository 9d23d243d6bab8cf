"""Rewards off the critical path: a background thread that scores finished episodes while the policy computes.

A Python reward (VADER, ROUGE, a task's checker) costs the rollout its full time when the env scores each batch of
finished episodes inside ``step``. :class:`RewardWorker` runs those calls in one background thread instead, in the
order they were submitted; the env's ``step`` returns at once with a placeholder reward, and the caller collects the
rewards later (:meth:`RewardWorker.collect`), in GRPO before the rollout's returns and advantages are computed. The
thread runs while the main thread is inside torch (which releases the GIL in its kernels) or waits for a device, so
the reward's time overlaps the policy's forward passes.

The rules of a synchronous reward are kept, because the job is the same call
(:meth:`~textrl_envs.core.EpisodeSpec.score_flagged`): ``reward_timeout`` bounds it, a NaN/inf reward raises or is
flagged as ``nonfinite_reward`` says, and any error is raised by :meth:`RewardWorker.collect`, with its message and
cause unchanged. Torch reward models run in the thread as they are, batched per finishing step on their own device
(the classifier's default ``device="auto"`` is the policy's default too).

:class:`~textrl_envs.vector.TextGenVectorEnv` uses a worker only between ``defer_rewards(True)`` and
``defer_rewards(False)``; everything else keeps the synchronous contract. Those methods are :class:`RewardDeferral`,
the env's side of the worker (a mixin of the vector env).
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RewardDeferral", "RewardResult", "RewardWorker"]


@dataclass
class RewardResult:
    """The scores of one batch of finished episodes.

    :param ticket: The batch's ticket (as returned by :meth:`RewardWorker.submit`, and in the episodes' infos).
    :param envs: The env index of each episode.
    :param episode_ids: The episode ids.
    :param rewards: The rewards (``float64``; 0 where ``nonfinite``).
    :param nonfinite: Which rewards were NaN/inf and were scored 0 (``nonfinite_reward="skip"``).
    :param components: Each episode's reward components (``{label: score}``; ``None`` for a reward without any).
    """

    ticket: int
    envs: np.ndarray
    episode_ids: np.ndarray
    rewards: np.ndarray
    nonfinite: np.ndarray
    components: list[dict[str, float]] | None = None


class RewardWorker:
    """One background thread scoring batches of finished episodes in submission order.

    The thread is a daemon: Ctrl-C (or any exit) never waits for it, even while a reward hangs (the env's
    ``reward_timeout`` bounds each call; :meth:`collect` raises its error).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._jobs: OrderedDict[int, tuple[np.ndarray, np.ndarray, Future]] = OrderedDict()
        self._next_ticket = 0

    @staticmethod
    def _run(jobs: queue.SimpleQueue) -> None:
        """The thread: run each job in order until ``None`` arrives."""
        while (job := jobs.get()) is not None:
            future, score, args, kw = job
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started
            try:
                future.set_result(score(*args, **kw))
            except BaseException as exc:  # handed to collect()
                future.set_exception(exc)

    def __len__(self) -> int:
        """Batches submitted and not yet collected."""
        return len(self._jobs)

    def submit(
        self, envs: np.ndarray, episode_ids: np.ndarray, score: Callable[..., Any], *args: Any, **kw: Any
    ) -> int:
        """Score a batch in the background: ``score(*args, **kw)`` must return ``(rewards, nonfinite)`` arrays, or
        ``(rewards, nonfinite, components)``.

        :param envs: The env index of each episode of the batch.
        :param episode_ids: Their episode ids.
        :param score: The scoring call (the env's ``score_detailed``).
        :return: The batch's ticket.
        """
        if self._thread is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, args=(self._queue,), name="textrl-reward", daemon=True)
            self._thread.start()
        ticket = self._next_ticket
        self._next_ticket += 1
        future: Future = Future()
        self._jobs[ticket] = (np.asarray(envs).copy(), np.asarray(episode_ids).copy(), future)
        self._queue.put((future, score, args, kw))
        return ticket

    def collect(self, wait: bool = True) -> list[RewardResult]:
        """The finished batches, in submission order (all of them with ``wait``; else those done so far, up to the
        first still running).

        :raises Exception: the first failing batch's error (a reward that raised, timed out or returned NaN/inf
            under ``nonfinite_reward="raise"``); the batches after it are dropped.
        """
        out = []
        while self._jobs:
            ticket, (envs, episode_ids, future) = next(iter(self._jobs.items()))
            if not wait and not future.done():
                break
            del self._jobs[ticket]
            try:
                rewards, nonfinite, *parts = future.result()
            except BaseException:
                self.cancel()
                raise
            rewards, nonfinite = np.asarray(rewards, dtype=np.float64), np.asarray(nonfinite, dtype=bool)
            out.append(RewardResult(ticket, envs, episode_ids, rewards, nonfinite, parts[0] if parts else None))
        return out

    def cancel(self) -> None:
        """Forget every batch not collected (running ones finish in the background, unread)."""
        for _, _, future in self._jobs.values():
            future.cancel()
        self._jobs.clear()

    def close(self, wait: float = 5.0) -> None:
        """Forget pending batches and stop the thread: it ends after the batch it is scoring, waited for at most
        ``wait`` seconds (a reward that hangs is left behind in its daemon thread)."""
        self.cancel()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(wait)
            self._thread = self._queue = None

    def __getstate__(self) -> dict[str, Any]:
        if self._jobs:
            raise RuntimeError(f"a RewardWorker with {len(self._jobs)} batches not collected cannot be pickled")
        return {"_next_ticket": self._next_ticket}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()
        self._next_ticket = state["_next_ticket"]


class RewardDeferral:
    """The vector env's side of the worker: :meth:`defer_rewards`, :meth:`collect_rewards`, and the scoring of the
    episodes that end (now, or in the worker when deferred).

    Mixed into :class:`~textrl_envs.vector.TextGenVectorEnv`, which sets ``text_spec``, ``reward_worker`` (whether a
    worker may be used), ``_worker`` (``None`` until the first ``defer_rewards(True)``) and ``_deferred``.
    """

    def defer_rewards(self, on: bool = True) -> bool:
        """Score finished episodes in a background thread (:class:`~textrl_envs.reward_worker.RewardWorker`) from
        now on (``on``), or synchronously again.

        While deferred, ``step`` returns reward 0 for the episodes that end and gives each batch a ticket
        (``final_info["reward_ticket"]``); :meth:`collect_rewards` returns their rewards. The reward's timeout and
        non-finite rules are those of a synchronous call (errors are raised by :meth:`collect_rewards`). Turning it
        off with batches not collected raises.

        :param on: Defer (``True``) or score in ``step`` (``False``).
        :return: Whether rewards are now deferred (``False`` when built with ``reward_worker=False``).
        """
        if not on and self._worker is not None and len(self._worker):
            raise RuntimeError(
                f"{len(self._worker)} batches of rewards are still pending; call collect_rewards() before "
                "defer_rewards(False)"
            )
        if on and not self.reward_worker:
            return False
        if on and self._worker is None:
            self._worker = RewardWorker()
        self._deferred = bool(on)
        return self._deferred

    def collect_rewards(self, wait: bool = True) -> list[RewardResult]:
        """The rewards scored in the background since the last call, in the order the episodes ended.

        :param wait: Wait for every pending batch (else return those finished so far).
        :raises Exception: a reward's error (raised, timed out, or non-finite under ``nonfinite_reward="raise"``).
        """
        return [] if self._worker is None else self._worker.collect(wait)

    def _score(
        self,
        done: np.ndarray,
        episode_ids: np.ndarray,
        prompt_index: list[int],
        completions: list[str],
        texts: list[str],
        completion_ids: list[tuple[int, ...]] | None = None,
        completion_messages: list[Any] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, int | None, list[dict[str, float]] | None]:
        """Rewards, non-finite flags and reward components of the episodes ``done`` ended, now; or zeros, a ticket and
        ``None`` when deferred (the reward then sees the ``trainer_state`` of this step)."""
        spec = self.text_spec
        if not self._deferred:
            rewards, nonfinite, parts = spec.score_detailed(
                prompt_index, completions, prompt_texts=texts, completion_ids=completion_ids,
                completion_messages=completion_messages,
            )  # fmt: skip
            return rewards, nonfinite, None, parts
        ticket = self._worker.submit(done, episode_ids[done], spec.score_detailed, prompt_index, completions,
                                     prompt_texts=texts, completion_ids=completion_ids,
                                     trainer_state=spec.trainer_state,
                                     completion_messages=completion_messages)  # fmt: skip
        return np.zeros(len(done)), np.zeros(len(done), dtype=bool), ticket, None

    def close_extras(self, **kwargs: Any) -> None:  # noqa: ARG002  (gymnasium's signature)
        """Stop the reward worker's thread (pending rewards are dropped)."""
        if self._worker is not None:
            self._worker.close()
