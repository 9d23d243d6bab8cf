"""Warnings when training quantities cross thresholds: :class:`TrainingMonitor`."""

from __future__ import annotations

import math
import warnings

from stable_baselines3.common.callbacks import BaseCallback

from sb3_grpo.callbacks._common import TrainingAlertWarning

__all__ = ["TrainingMonitor"]


class TrainingMonitor(BaseCallback):
    """Warn when the gradient norm or the KL of an update passes a threshold, or the value-return correlation falls
    below one.

    Reads what the algorithm logged for its last update (``GRPO`` logs ``train/grad_norm_max`` /
    ``train/grad_norm`` (before clipping), ``train/kl_ref`` (KL to the reference policy, with ``kl_coef > 0``),
    ``train/value_return_corr`` and ``train/approx_kl`` (between iterations); stock ``PPO`` only the last) after
    each update, i.e. at the
    next rollout start and at the end of training. Each crossing issues a :class:`TrainingAlertWarning`, is
    appended to ``alerts`` as ``(update, key, value, limit)`` and counted in ``monitor/alerts``; with
    ``stop_on_alert=True`` training stops at the next step.

    :param max_grad_norm: Gradient norm above which to warn (``None``: not checked).
    :param kl_target: KL to the reference policy above which to warn (``None``: not checked).
    :param approx_kl_target: ``approx_kl`` between iterations above which to warn (``None``: not checked).
    :param min_value_return_corr: ``value_return_corr`` (the critic's values against the returns) below which to
        warn (``None``: not checked). The same thresholds make Prometheus alerts:
        :func:`~sb3_grpo.callbacks.prometheus.alert_rules`.
    :param stop_on_alert: Stop training at the first alert.
    """

    def __init__(
        self,
        max_grad_norm: float | None = None,
        kl_target: float | None = None,
        approx_kl_target: float | None = None,
        stop_on_alert: bool = False,
        verbose: int = 0,
        min_value_return_corr: float | None = None,
    ):
        super().__init__(verbose)
        limits = {"max_grad_norm": max_grad_norm, "kl_target": kl_target, "approx_kl_target": approx_kl_target}
        for name, value in limits.items():
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
        if min_value_return_corr is not None and not (
            isinstance(min_value_return_corr, (int, float)) and -1 <= min_value_return_corr <= 1
        ):
            raise ValueError(
                f"min_value_return_corr must be a number in [-1, 1] or None, got {min_value_return_corr!r}"
            )
        if all(v is None for v in limits.values()) and min_value_return_corr is None:
            raise ValueError(
                "TrainingMonitor needs at least one of max_grad_norm, kl_target, approx_kl_target"
                ", min_value_return_corr"
            )
        self.max_grad_norm, self.kl_target, self.approx_kl_target = max_grad_norm, kl_target, approx_kl_target
        self.min_value_return_corr = min_value_return_corr
        self.stop_on_alert = stop_on_alert
        self.alerts: list[tuple[int, str, float, float]] = []
        self._checked_update = -1
        self._stop = False

    def _checks(self) -> list[tuple[tuple[str, ...], float | None, str]]:
        return [
            (
                ("train/grad_norm_max", "train/grad_norm"),
                self.max_grad_norm,
                "lower the learning rate or scale the rewards",
            ),
            (("train/kl_ref",), self.kl_target, "raise kl_coef (or set kl_target on GRPO) or lower the learning rate"),
            (("train/approx_kl",), self.approx_kl_target, "lower the learning rate or n_epochs, or set target_kl"),
        ]

    def check(self) -> list[tuple[int, str, float, float]]:
        """Check the last update's logged values now; return the new alerts."""
        n_updates = int(getattr(self.model, "_n_updates", 0))
        if n_updates == self._checked_update or n_updates == 0:
            return []
        self._checked_update = n_updates
        logged = self.model.logger.name_to_value
        new = []
        for keys, limit, advice in self._checks():
            key = next((k for k in keys if k in logged), None)
            if limit is None or key is None:
                continue
            value = float(logged[key])
            if not math.isfinite(value) or value > limit:
                new.append((n_updates, key, value, float(limit)))
                warnings.warn(
                    f"TrainingMonitor: {key} = {value:.4g} exceeds {limit:g} at update {n_updates} "
                    f"({self.model.num_timesteps} timesteps); {advice}",
                    TrainingAlertWarning,
                    stacklevel=2,
                )
        corr = logged.get("train/value_return_corr")
        if self.min_value_return_corr is not None and corr is not None and math.isfinite(float(corr)):
            # NaN is no alert here: a constant value or return (e.g. GRPO's group advantage without a critic) has none
            if float(corr) < self.min_value_return_corr:
                new.append((n_updates, "train/value_return_corr", float(corr), float(self.min_value_return_corr)))
                warnings.warn(
                    f"TrainingMonitor: train/value_return_corr = {float(corr):.4g} is below "
                    f"{self.min_value_return_corr:g} at update {n_updates} ({self.model.num_timesteps} timesteps); "
                    "the critic no longer tracks the returns: check vf_coef and the rewards",
                    TrainingAlertWarning,
                    stacklevel=2,
                )
        if new:
            self.alerts.extend(new)
            self.logger.record("monitor/alerts", len(self.alerts))
            if self.stop_on_alert:
                self._stop = True
        return new

    def _on_rollout_start(self) -> None:
        self.check()

    def _on_training_end(self) -> None:
        self.check()

    def _on_step(self) -> bool:
        return not self._stop
