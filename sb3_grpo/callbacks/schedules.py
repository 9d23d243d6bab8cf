"""Schedules applied at rollout boundaries: :class:`GammaSchedule` and :class:`MaxNewTokensCurriculum`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo.callbacks._common import check_positive_int

__all__ = ["GammaSchedule", "MaxNewTokensCurriculum"]


def _progress(callback: BaseCallback, total_timesteps: int | None) -> float:
    """``t / T`` in [0, 1]: ``t`` the model's timesteps, ``T`` the given total or the one ``learn`` was given."""
    total = total_timesteps if total_timesteps is not None else getattr(callback.model, "_total_timesteps", 0)
    if not total:
        return 0.0
    return float(min(1.0, max(0.0, callback.model.num_timesteps / total)))


class GammaSchedule(BaseCallback):
    """Discount factor schedule ``gamma_t = gamma_min + (gamma_max - gamma_min) * t / T``.

    ``t`` is the model's ``num_timesteps`` and ``T`` is ``total_timesteps`` (default: the total of the current
    ``learn`` call, counted from 0 or, with ``reset_num_timesteps=False``, from where the model was); ``t / T``
    is clipped to [0, 1]. Before each rollout the value is written to ``model.gamma`` (used for the timeout
    bootstrap) and ``model.rollout_buffer.gamma`` (used for the returns and GAE), and logged as ``train/gamma``.

    :param gamma_min: Discount at ``t = 0``, in [0, 1].
    :param gamma_max: Discount at ``t = T``, in [0, 1] (it may be below ``gamma_min`` for a decreasing schedule).
    :param total_timesteps: ``T`` (``None``: the ``learn`` call's).
    """

    def __init__(self, gamma_min: float, gamma_max: float, total_timesteps: int | None = None, verbose: int = 0):
        super().__init__(verbose)
        for name, value in (("gamma_min", gamma_min), ("gamma_max", gamma_max)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a discount factor in [0, 1], got {value!r}")
        if total_timesteps is not None:
            check_positive_int("total_timesteps", total_timesteps)
        self.gamma_min, self.gamma_max = float(gamma_min), float(gamma_max)
        self.total_timesteps = total_timesteps

    def value(self, progress: float) -> float:
        """``gamma_min + (gamma_max - gamma_min) * progress``."""
        return self.gamma_min + (self.gamma_max - self.gamma_min) * progress

    def _apply(self) -> None:
        gamma = self.value(_progress(self, self.total_timesteps))
        self.model.gamma = gamma
        buffer = getattr(self.model, "rollout_buffer", None)
        if buffer is not None:
            buffer.gamma = gamma
        self.logger.record("train/gamma", gamma)

    def _on_training_start(self) -> None:
        self._apply()

    def _on_rollout_start(self) -> None:
        self._apply()

    def _on_step(self) -> bool:
        return True


class MaxNewTokensCurriculum(BaseCallback):
    """Short completions first, longer later: lower the text env's episode budget at rollout boundaries.

    The env keeps its observation width (``max_prompt_tokens + max_new_tokens`` it was built with); the
    curriculum only lowers the number of tokens an episode may generate, via the env's
    ``set_max_new_tokens(n)`` (:meth:`textrl_envs.vector.TextGenVectorEnv.set_max_new_tokens`, reached
    through ``VecEnv.env_method``). So build the env with the largest budget of the curriculum.

    ``schedule`` is either a list of ``(timestep, max_new_tokens)`` stages (from ``timestep`` on, episodes get
    that budget; the first stage should start at 0) or a callable ``f(progress) -> int`` of the training
    progress ``t / T`` in [0, 1] (see :meth:`linear`). ``None`` from the callable means the env's full budget.
    The budget in use is logged as ``rollout/max_new_tokens``; at the end of training the env's full budget is
    restored (``restore_at_end``).

    :param schedule: Stages or a callable, see above.
    :param total_timesteps: ``T`` for a callable schedule (``None``: the ``learn`` call's total).
    :param restore_at_end: Give the env its full budget back when training ends.
    """

    def __init__(
        self,
        schedule: Sequence[tuple[int, int]] | Callable[[float], int | None],
        total_timesteps: int | None = None,
        restore_at_end: bool = True,
        verbose: int = 0,
    ):
        super().__init__(verbose)
        if callable(schedule):
            self._stages = None
            self._fn = schedule
        else:
            try:
                stages = sorted((int(t), int(n)) for t, n in schedule)
            except (TypeError, ValueError):
                raise ValueError(
                    f"schedule must be a list of (timestep, max_new_tokens) pairs, e.g. [(0, 4), (5000, 8)], or a "
                    f"callable progress -> max_new_tokens; got {schedule!r}"
                ) from None
            if not stages:
                raise ValueError("schedule is empty; give at least one (timestep, max_new_tokens) stage, e.g. [(0, 4)]")
            for t, n in stages:
                if t < 0 or n < 1:
                    raise ValueError(f"stage ({t}, {n}): timesteps must be >= 0 and max_new_tokens >= 1")
            self._stages, self._fn = stages, None
        if total_timesteps is not None:
            check_positive_int("total_timesteps", total_timesteps)
        self.total_timesteps = total_timesteps
        self.restore_at_end = restore_at_end
        self.current: int | None = None

    @staticmethod
    def linear(start: int, end: int) -> Callable[[float], int]:
        """A schedule ``round(start + (end - start) * progress)``, for ``schedule=``."""
        check_positive_int("start", start)
        check_positive_int("end", end)

        def budget(progress: float) -> int:
            return round(start + (end - start) * progress)

        return budget

    def budget(self) -> int | None:
        """The budget the schedule gives now."""
        if self._stages is not None:
            n = self._stages[0][1]
            for t, m in self._stages:
                if self.model.num_timesteps >= t:
                    n = m
            return n
        return self._fn(_progress(self, self.total_timesteps))  # type: ignore[misc]

    def _set(self, n: int | None) -> None:
        env = self.training_env
        try:
            env.env_method("set_max_new_tokens", n)
        except AttributeError:
            raise TypeError(
                f"MaxNewTokensCurriculum needs a text env with set_max_new_tokens (textrl_envs.sb3.make_vec_env or "
                f"gym.make of a textrl_envs id); the training env {type(env).__name__} has none"
            ) from None
        self.current = n
        if n is not None:
            self.logger.record("rollout/max_new_tokens", n)

    def _on_training_start(self) -> None:
        self._set(self.budget())

    def _on_rollout_start(self) -> None:
        n = self.budget()
        if n != self.current:
            self._set(n)

    def _on_training_end(self) -> None:
        if self.restore_at_end:
            self._set(None)

    def _on_step(self) -> bool:
        return True


# ---------------------------------------------------------------------------------------------------------
# Monitors
# ---------------------------------------------------------------------------------------------------------
