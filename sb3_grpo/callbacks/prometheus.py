"""Live metrics: the run's scalars served to Prometheus on a local port, and alert rules for their thresholds.

:class:`PrometheusOutputFormat` is an SB3 output format (like the trackers of ``sb3_grpo.callbacks.trackers``):
every scalar the algorithm logs becomes a gauge, updated at each dump, on an HTTP endpoint that Prometheus scrapes
(``configure_logger(folder, ["stdout", "prometheus"], prometheus={"port": 9100})``). Names are the logger's keys
with ``/`` and other characters Prometheus does not allow turned into ``_`` and a prefix: ``train/grad_norm`` is
``sb3_train_grad_norm``; every gauge has a ``run`` label. With CUDA, the device's memory (and utilisation, where
``torch.cuda.utilization`` can read it) is exported too; the process's memory and CPU come from prometheus_client's
process collector (on Linux).

:func:`alert_rules` writes the alerts for the thresholds :class:`~sb3_grpo.callbacks.TrainingMonitor` warns on as a
Prometheus rules file (``promtool check rules`` accepts it). The library is the optional extra
``pip install 'textrl[prometheus]'``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sb3_grpo.callbacks.output_format import Table, TrackerOutputFormat, extra_error

__all__ = ["ALERT_DEFAULTS", "PrometheusOutputFormat", "alert_rules", "metric_name", "write_alert_rules"]

_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(key: str, prefix: str = "sb3") -> str:
    """The Prometheus name of a logger key: ``train/grad_norm`` -> ``sb3_train_grad_norm``."""
    name = _BAD.sub("_", key)
    return f"{prefix}_{name}" if prefix else (name if not name[:1].isdigit() else f"_{name}")


class PrometheusOutputFormat(TrackerOutputFormat):
    """Every scalar of SB3's logger as a Prometheus gauge, served on ``http://<addr>:<port>/metrics``.

    :param folder: The run folder (its name is the default ``run`` label).
    :param config: The run's config, exported as the info metric ``<prefix>_run_info`` (its labels).
    :param port: The port (0: any free port; the one taken is the attribute ``port``).
    :param addr: The address to listen on (default ``127.0.0.1``: this machine only).
    :param prefix: The metric names' prefix.
    :param run: The ``run`` label (default: the run folder's name).
    """

    name = "prometheus"

    def __init__(
        self,
        folder: str,
        /,
        config: Mapping[str, Any] | None = None,
        port: int = 9100,
        addr: str = "127.0.0.1",
        prefix: str = "sb3",
        run: str | None = None,
    ) -> None:
        try:
            import prometheus_client
        except ImportError:
            raise extra_error("prometheus_client", "prometheus") from None
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535] (0: any free port), got {port!r}")
        self._prom = prometheus_client
        self.prefix = prefix
        self.run = run if run is not None else (Path(folder).resolve().name or "run")
        self.registry = prometheus_client.CollectorRegistry()
        try:
            prometheus_client.ProcessCollector(registry=self.registry)
        except Exception:  # noqa: BLE001  (no /proc here: no process metrics)
            pass
        self._gauges: dict[str, Any] = {}
        self._step = self._gauge("timesteps", "SB3 timestep of the last dump")
        self.server, self._thread = prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(self.server.server_port)
        self.addr = addr
        if config:
            self.log_config(config)

    @property
    def url(self) -> str:
        """Where the metrics are served."""
        return f"http://{self.addr}:{self.port}/metrics"

    def _gauge(self, key: str, doc: str | None = None) -> Any:
        name = metric_name(key, self.prefix)
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = self._prom.Gauge(name, doc or f"SB3 logger key {key}", ["run"], registry=self.registry)
            self._gauges[name] = gauge
        return gauge.labels(run=self.run)

    def log_config(self, config: Mapping[str, Any]) -> None:
        info = self._prom.Info(f"{self.prefix}_run", "the run's config", ["run"], registry=self.registry)
        info.labels(run=self.run).info({_BAD.sub("_", str(k)): str(v) for k, v in config.items()})

    def _log_scalars(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self._gauge(key).set(value)
        self._step.set(step)
        self._device_metrics()

    def _device_metrics(self) -> None:
        import sys

        torch = sys.modules.get("torch")  # only when the run already uses torch
        if torch is None or not torch.cuda.is_available():
            return
        self._gauge("cuda/memory_allocated_bytes", "torch.cuda.memory_allocated()").set(torch.cuda.memory_allocated())
        self._gauge("cuda/max_memory_allocated_bytes", "torch.cuda.max_memory_allocated()").set(
            torch.cuda.max_memory_allocated()
        )
        try:
            self._gauge("cuda/utilization_percent", "torch.cuda.utilization()").set(torch.cuda.utilization())
        except Exception:  # noqa: BLE001  (needs pynvml / NVML; not every device reports it)
            pass

    def _log_table(self, key: str, table: Table, step: int) -> None:
        """Tables are not metrics: not exported."""

    def _log_text(self, key: str, text: str, step: int) -> None:
        """Text is not a metric: not exported."""

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


#: The thresholds of :func:`alert_rules` (those of the seeds' runbook; :class:`TrainingMonitor` takes the same).
ALERT_DEFAULTS = {
    "max_grad_norm": 1000.0,
    "kl_target": 0.1,
    "min_value_return_corr": 0.5,
    "stall_evaluations": 5,
}


def alert_rules(
    max_grad_norm: float = ALERT_DEFAULTS["max_grad_norm"],
    kl_target: float = ALERT_DEFAULTS["kl_target"],
    min_value_return_corr: float = ALERT_DEFAULTS["min_value_return_corr"],
    stall_evaluations: int = ALERT_DEFAULTS["stall_evaluations"],
    prefix: str = "sb3",
    for_: str = "0m",
    group: str = "textrl-training",
) -> dict[str, Any]:
    """The alerting rules for a run's thresholds, as the structure of a Prometheus rules file.

    * ``GradNormHigh``: ``train/grad_norm_max`` (GRPO; the largest minibatch gradient norm before clipping) above
      ``max_grad_norm``;
    * ``KLToReferenceHigh``: ``train/kl_ref`` above ``kl_target``; ``ApproxKLHigh``: ``train/approx_kl`` above it;
    * ``ValueReturnCorrelationLow``: ``train/value_return_corr`` below ``min_value_return_corr`` (the critic no
      longer predicts the returns);
    * ``RewardStalled``: ``eval/evals_without_improvement`` (:class:`~sb3_grpo.callbacks.LMEvalCallback`,
      :class:`~sb3_grpo.callbacks.EarlyStoppingCallback`) at least ``stall_evaluations``.

    :param for_: How long a condition must hold before the alert fires (Prometheus duration, e.g. ``"5m"``).
    :return: ``{"groups": [{"name": group, "rules": [...]}]}``.
    """
    for name, value in (("max_grad_norm", max_grad_norm), ("kl_target", kl_target)):
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if isinstance(stall_evaluations, bool) or not isinstance(stall_evaluations, int) or stall_evaluations < 1:
        raise ValueError(f"stall_evaluations must be an int >= 1, got {stall_evaluations!r}")
    if not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", for_):
        raise ValueError(f"for_ must be a Prometheus duration such as '0m', '30s' or '5m', got {for_!r}")

    def rule(alert: str, key: str, op: str, limit: float, summary: str, advice: str) -> dict[str, Any]:
        metric = metric_name(key, prefix)
        return {
            "alert": alert,
            "expr": f"{metric} {op} {limit:g}",
            "for": for_,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"{summary} in run {{{{ $labels.run }}}}: {key} = {{{{ $value }}}} ({op} {limit:g})",
                "description": advice,
            },
        }

    rules = [
        rule("GradNormHigh", "train/grad_norm_max", ">", max_grad_norm, "gradient norm high",
             "Lower the learning rate or scale the rewards."),
        rule("KLToReferenceHigh", "train/kl_ref", ">", kl_target, "KL to the reference policy high",
             "Raise kl_coef (or set kl_target on GRPO) or lower the learning rate."),
        rule("ApproxKLHigh", "train/approx_kl", ">", kl_target, "KL between iterations high",
             "Lower the learning rate or n_epochs, or set target_kl."),
        rule("ValueReturnCorrelationLow", "train/value_return_corr", "<", min_value_return_corr,
             "value-return correlation low", "The critic no longer tracks the returns: check vf_coef and the rewards."),
        rule("RewardStalled", "eval/evals_without_improvement", ">=", stall_evaluations, "evaluation reward stalled",
             "No better evaluation for a while: lower the learning rate, or stop and keep the best model."),
    ]  # fmt: skip
    return {"groups": [{"name": group, "rules": rules}]}


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """Block YAML of the nested dicts / lists / scalars of a rules file (strings double-quoted, JSON-escaped)."""
    import json

    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(v, (Mapping, list)):
                lines.append(f"{pad}{k}:")
                lines.extend(_yaml(v, indent + 2))
            else:
                lines.append(f"{pad}{k}: {json.dumps(v)}")
    elif isinstance(value, list):
        for item in value:
            sub = _yaml(item, indent + 2)
            lines.append(f"{pad}- {sub[0].lstrip()}")
            lines.extend(sub[1:])
    else:
        lines.append(f"{pad}{json.dumps(value)}")
    return lines


def write_alert_rules(path: str | os.PathLike, **thresholds: Any) -> Path:
    """Write :func:`alert_rules` (with ``thresholds``) as a Prometheus rules file (YAML); returns the path.

    Check it with ``promtool check rules PATH``; load it with ``rule_files: [PATH]`` in ``prometheus.yml``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(_yaml(alert_rules(**thresholds))) + "\n", encoding="utf-8")
    return path
