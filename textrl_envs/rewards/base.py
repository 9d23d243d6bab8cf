"""The reward-model protocol, and the one place where rewards are called and checked.

A reward model scores whole completions in batches, called with keywords as Hugging Face TRL calls its reward
functions::

    reward(prompts=[...], completions=[...], completion_ids=[...], trainer_state=..., **columns) -> floats

``columns`` are per-example metadata lists aligned with ``prompts`` (for example ``answer=[...]`` for a verifiable
task or ``references=[[...], ...]`` for a reference-based one), so a TRL reward function plugs in unchanged; a
function without ``**kwargs`` gets only the arguments it names, and an older positional ``f(prompts, completions)``
still works (:mod:`textrl_envs.rewards.calls`). A plain callable is accepted everywhere a :class:`RewardModel` is.
A score of ``None`` means "this reward does not apply" (TRL's convention): a sum of rewards leaves it out.
"""

from __future__ import annotations

import math
import numbers
import os
import queue
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from textrl_envs.rewards.calls import conversational_completions, reward_arguments, wants_conversations
from textrl_envs.rewards.model import RewardModel  # noqa: F401  (its home before it had a module of its own)

RewardFn = Callable[..., Sequence[float]]


def reward_name(reward: Any) -> str:
    """A readable name for a reward model or callable, for messages."""
    if isinstance(reward, RewardModel):
        return reward.name
    return getattr(reward, "__name__", None) or type(reward).__name__


def _shorten(text: str, limit: int = 80) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: What :func:`call_reward` may do with NaN/inf rewards.
ON_NONFINITE = ("raise", "nan")


#: The default ``reward_timeout`` of every text env, in seconds: ten minutes per reward call (a batch of finished
#: episodes), far above what a reward model or a checker needs, so that only a reward that hangs trips it, and then a
#: run stops with an error naming it instead of waiting forever. ``reward_timeout=None`` waits without a limit.
DEFAULT_REWARD_TIMEOUT = 600.0


def check_reward_timeout(timeout: Any) -> float | None:
    """Validate a reward timeout: ``None`` (wait forever) or a positive number of seconds.

    :raises ValueError: for anything else.
    """
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float, np.integer, np.floating))
        or not (math.isfinite(float(timeout)) and float(timeout) > 0)
    ):
        raise ValueError(
            f"reward_timeout must be None (no limit) or a positive number of seconds, got {timeout!r}; "
            "e.g. reward_timeout=30.0"
        )
    return float(timeout)


class RewardTimeoutError(TimeoutError):
    """A reward model ran longer than its ``reward_timeout`` (see :func:`call_reward`)."""


class _TimedCalls:
    """The daemon thread that runs one calling thread's timed calls, one at a time.

    A thread per call cost a thread start per reward call (hundreds of microseconds on a busy machine, several times
    the env step it served); this thread is started once and reused. When the calling thread ends, its
    :class:`_TimedCalls` is collected and the thread stops. A call that times out (or is interrupted) keeps the thread
    busy: the caller abandons it and gets a new one for its next call.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, args=(self._jobs,), name=name, daemon=True).start()
        weakref.finalize(self, self._jobs.put, None)  # collected with its caller: the thread's loop ends

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            fn, box, done = job
            try:
                box["out"] = fn()
            except BaseException as exc:  # handed to the caller
                box["exc"] = exc
            done.set()
            del job, fn, box, done  # keep no reference to a finished call's inputs and results while idle

    def call(self, fn: Callable[[], Any], timeout: float) -> dict[str, Any] | None:
        """``{"out": ...}`` or ``{"exc": ...}`` of ``fn()``, or ``None`` if it did not finish within ``timeout``."""
        box: dict[str, Any] = {}
        done = threading.Event()
        self._jobs.put((fn, box, done))
        return box if done.wait(timeout) else None


_timed_calls = threading.local()


def _forget_timed_calls() -> None:
    """A forked child has none of its parent's threads, the workers included: its callers start their own."""
    global _timed_calls
    _timed_calls = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_timed_calls)


def call_with_timeout(fn: Callable[[], Any], timeout: float, on_timeout: Callable[[], Exception]) -> Any:
    """Run ``fn()`` in a daemon worker thread and wait at most ``timeout`` seconds for it.

    A Python thread cannot be killed: on timeout the worker is abandoned (it is a daemon, so it never
    keeps the interpreter alive) and ``on_timeout()`` is raised in the caller; what ``fn`` raises is
    re-raised in the caller. Each calling thread reuses one worker for its calls (:class:`_TimedCalls`). Rewards
    (:func:`call_reward`), interactive replies (:func:`textrl_envs.interaction.answer_turns`) and tools all run
    through it.
    """
    worker = getattr(_timed_calls, "worker", None)
    if worker is None:
        caller = threading.current_thread().name  # the reward worker's thread: its name shows in the timeout thread's
        worker = _timed_calls.worker = _TimedCalls(f"{caller}/timeout" if caller.startswith("textrl-") else
                                                   "textrl-timeout")  # fmt: skip
    try:
        box = worker.call(fn, timeout)
    except BaseException:  # Ctrl-C while waiting: fn may still run there
        _timed_calls.worker = None
        raise
    if box is None:
        _timed_calls.worker = None  # still running fn: abandoned
        raise on_timeout()
    if "exc" in box:
        raise box["exc"]
    return box["out"]


def _call_with_timeout(fn: Callable[[], Any], timeout: float, name: str, completions: list[str]) -> Any:
    """:func:`call_with_timeout` for a reward: the error names the reward and the first completion."""

    def on_timeout() -> Exception:
        return RewardTimeoutError(
            f"reward {name!r} did not return within reward_timeout={timeout:g} s "
            f"(batch of {len(completions)}; first completion: {_shorten(completions[0]) if completions else ''!r}); "
            "the reward hangs or is too slow: fix it, or raise reward_timeout. Training can resume from the "
            "last checkpoint."
        )

    return call_with_timeout(fn, timeout, on_timeout)


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


_GRAD_WARNED: set[str] = set()


def _warn_if_grad(tensor: Any, name: str) -> bool:
    """Warn (once per reward name) when a reward returns a tensor that requires grad; it is detached. Returns
    ``False``, so that it can sit in a comprehension's condition."""
    if getattr(tensor, "requires_grad", False) and name not in _GRAD_WARNED:
        _GRAD_WARNED.add(name)
        warnings.warn(
            f"reward {name!r} returned a tensor that requires grad: it is detached (no gradient flows through a "
            "reward); compute the reward under torch.no_grad() (or return reward.detach()) to save the graph's time "
            "and memory",
            UserWarning,
            stacklevel=4,
        )
    return False


def reward_values(out: Any, name: str) -> np.ndarray:
    """What a reward returned, as ``float64``: numbers only (ints, floats, NumPy or torch numbers and arrays).

    A torch tensor is detached and brought to the CPU (a reward that forgot ``torch.no_grad`` still works, with a
    warning, once per reward: no gradient flows through a reward, and the graph it built cost time and memory).
    Strings (``"0.5"``), bools (``True``) and ``None`` are refused, not converted: they are bugs in the reward.

    :param out: The reward's return value.
    :param name: The reward's name, for messages.
    :raises ValueError: naming the reward and the first value that is not a number.
    """
    if type(out) is list and all(type(v) is float for v in out):  # the usual return: skip the per-item checks
        return np.array(out, dtype=np.float64)
    todo = "rewards are numbers only (not str, bool or None): convert them in the reward, e.g. [float(s) for s in ...]"
    if _is_tensor(out):
        _warn_if_grad(out, name)
        out = out.detach().cpu().numpy()
    if isinstance(out, numbers.Real) and not isinstance(out, (bool, np.bool_)):
        return np.asarray(float(out))  # a scalar: the caller says it needs one value per completion
    if isinstance(out, np.ndarray):
        if out.dtype.kind not in "iuf":
            raise ValueError(
                f"reward {name!r} must return a sequence of floats, one per completion; got an array of "
                f"dtype {out.dtype}; {todo}"
            )
        return out.astype(np.float64)
    if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Iterable):
        raise ValueError(
            f"reward {name!r} must return a sequence of floats, one per completion; got {type(out).__name__}"
        )
    items = [v.detach().cpu().numpy() if _is_tensor(v) and not _warn_if_grad(v, name) else v for v in out]
    for i, v in enumerate(items):
        number = isinstance(v, numbers.Real) or (isinstance(v, np.ndarray) and v.size == 1 and v.dtype.kind in "iuf")
        if not number or isinstance(v, (bool, np.bool_)):
            raise ValueError(
                f"reward {name!r} must return a sequence of floats, one per completion; got {type(out).__name__} "
                f"holding {v!r} ({type(v).__name__}) for completion #{i}; {todo}"
            )
    try:
        return np.array([float(v) if isinstance(v, numbers.Real) else float(v.reshape(())) for v in items])
    except OverflowError as exc:
        big = max((v for v in items if isinstance(v, numbers.Integral)), key=abs, default=None)
        shown = f"{str(big)[:12]}... ({len(str(abs(big)))} digits)" if big is not None else "a value"
        raise ValueError(
            f"reward {name!r} returned {shown}, too large for a float; rewards must be finite floats: scale or clip "
            "them in the reward"
        ) from exc


#: The largest reward magnitude kept: SB3's rollout buffers and ``VecEnv`` rewards are float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _none_positions(out: Any) -> np.ndarray | None:
    """Where a reward's list of scores holds ``None`` (TRL's "not applicable"); ``None`` when it holds none."""
    if not isinstance(out, (list, tuple)) or not any(v is None for v in out):
        return None
    return np.array([v is None for v in out])


def call_reward(
    reward: RewardFn,
    prompts: Sequence[str],
    completions: Sequence[str],
    metadata: Mapping[str, Sequence[Any]] | None = None,
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    trainer_state: Any = None,
    chat_prompts: Sequence[Any] | None = None,
    chat_completions: Sequence[Any] | None = None,
    on_nonfinite: str = "raise",
    on_none: str | None = None,
    timeout: float | None = None,
) -> np.ndarray:
    """Call a reward model on a batch and check what it returns.

    This is the single entry point that environments use. It calls the reward as TRL does, with keywords
    (``prompts=``, ``completions=``, ``completion_ids=``, ``trainer_state=`` and the metadata columns; a function
    without ``**kwargs`` gets those it names), or positionally for an older ``f(p, c)``
    (:mod:`textrl_envs.rewards.calls`), and turns every failure into an error that names the reward and shows the
    completion.

    :param reward: A :class:`RewardModel` or a callable.
    :param prompts: Prompt texts.
    :param completions: Completion texts, aligned with ``prompts``.
    :param metadata: Per-example metadata lists, aligned with ``prompts``.
    :param completion_ids: Each completion's token ids (``None``: not given to the reward).
    :param trainer_state: How far training has come (:class:`~textrl_envs.rewards.calls.TrainerState`).
    :param chat_prompts: The prompts as chat conversations, when the env renders them with a chat template: a
        keyword-style reward then gets these as ``prompts`` and TRL's conversational completions
        (:func:`~textrl_envs.rewards.calls.wants_conversations`).
    :param chat_completions: Those conversational completions where the env has them as messages (an interactive
        episode's transcript; ``None`` entries, or ``None``: each completion's text as one assistant message).
    :param on_nonfinite: ``"raise"`` (default) raises on NaN/inf; ``"nan"`` returns them as they are
        (for callers that count and skip bad episodes).
    :param on_none: What a ``None`` score (TRL's "this reward does not apply") becomes: ``"raise"`` or ``"nan"``
        (a sum of several rewards leaves it out); default: as ``on_nonfinite``.
    :param timeout: Seconds to wait for the reward (``None``: no limit). The reward then runs in a
        daemon worker thread; a reward still running after ``timeout`` is abandoned and a
        :class:`TimeoutError` naming it and the first completion is raised.
    :return: ``float64`` array of shape ``(len(prompts),)``.
    :raises RuntimeError: if the reward raises (the cause is chained).
    :raises RewardTimeoutError: (a :class:`TimeoutError`) if it runs longer than ``timeout``.
    :raises ValueError: if it returns the wrong number of values, non-numbers, non-finite values or (with
        ``on_none="raise"``) ``None``.
    """
    if on_nonfinite not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
    on_none = on_nonfinite if on_none is None else on_none
    if on_none not in ON_NONFINITE:
        raise ValueError(f"on_none must be one of {ON_NONFINITE}, got {on_none!r}")
    timeout = check_reward_timeout(timeout)
    prompts, completions = list(prompts), list(completions)
    chat = chat_prompts is not None and wants_conversations(reward)
    context: dict[str, Any] = {
        "prompts": list(chat_prompts) if chat else prompts,
        "completions": conversational_completions(completions, chat_completions) if chat else completions,
    }
    if completion_ids is not None:
        context["completion_ids"] = [list(ids) for ids in completion_ids]
    if trainer_state is not None:
        context["trainer_state"] = trainer_state
    if chat_prompts is not None:  # a composite hands them on to its components
        context["chat_prompts"] = list(chat_prompts)
        if chat_completions is not None:
            context["chat_completions"] = list(chat_completions)
    args, kwargs = reward_arguments(reward, dict(metadata or {}), context)
    name = reward_name(reward)
    try:
        if timeout is None:
            out = reward(*args, **kwargs)
        else:
            out = _call_with_timeout(lambda: reward(*args, **kwargs), timeout, name, completions)
    except RewardTimeoutError:
        raise
    except Exception as exc:  # re-raised with context
        hint = ""
        if chat and isinstance(exc, (TypeError, AttributeError, KeyError)):
            hint = (
                "; with chat prompts a reward gets TRL's conversational form (prompts as lists of messages, each "
                "completion as [{'role': 'assistant', 'content': text}]): read completion[0]['content'], or annotate "
                "the parameter completions: list[str] to get text"
            )
        raise RuntimeError(
            f"reward {name!r} raised {type(exc).__name__}: {exc} "
            f"(batch of {len(completions)}; first completion: {_shorten(completions[0]) if completions else ''!r})"
            f"{hint}"
        ) from exc
    nones = _none_positions(out)
    if nones is not None:
        out = [0.0 if v is None else v for v in out]
    values = reward_values(out, name)
    if values.ndim == 0 or values.shape != (len(completions),):
        raise ValueError(
            f"reward {name!r} returned {values.size if values.ndim else 'a scalar'} value(s) of shape "
            f"{values.shape} for {len(completions)} completions; it must return exactly one float per completion"
        )
    values = _checked_finite(values, name, prompts, completions, on_nonfinite)
    if nones is not None:
        if on_none == "raise":
            i = int(np.flatnonzero(nones)[0])
            raise ValueError(
                f"reward {name!r} returned None (TRL's 'not applicable') for prompt {_shorten(prompts[i])!r} and "
                f"completion {_shorten(completions[i])!r}, and no other reward scores it; in a sum of rewards "
                "(reward=[f, g] or a CompositeReward) None leaves that reward out. Pass nonfinite_reward='skip' to "
                "leave such episodes out of training (TRL gives them advantage 0), or return a float"
            )
        values = np.where(nones, np.nan, values)
    return values


def _checked_finite(
    values: np.ndarray, name: str, prompts: list[str], completions: list[str], on_nonfinite: str
) -> np.ndarray:
    """``values`` with those beyond float32's range made NaN; raises for NaN/inf under ``on_nonfinite="raise"``."""
    too_big = np.isfinite(values) & (np.abs(values) > FLOAT32_MAX)
    if too_big.any():  # finite here, but inf in SB3's float32 buffers: refuse it as the non-finite value it becomes
        i = int(np.flatnonzero(too_big)[0])
        if on_nonfinite == "raise":
            raise ValueError(
                f"reward {name!r} returned {values[i]:g} for prompt {_shorten(prompts[i])!r} and completion "
                f"{_shorten(completions[i])!r}, beyond float32's range (+-{FLOAT32_MAX:.4g}) that SB3's rollout "
                "buffers hold (it would become inf there); scale the reward down (e.g. divide it by a constant or "
                "clip it)"
            )
        values = np.where(too_big, np.nan, values)
    bad = ~np.isfinite(values)
    if bad.any() and on_nonfinite == "raise":
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"reward {name!r} returned a non-finite value ({values[i]}) for prompt {_shorten(prompts[i])!r} "
            f"and completion {_shorten(completions[i])!r}; non-finite rewards never enter training"
        )
    return values
