"""Live metrics: the run's scalars served to Prometheus on a local port, and alert rules for their thresholds.

:class:`PrometheusOutputFormat` is an SB3 output format (like the trackers of ``sb3_grpo.callbacks.trackers``):
every scalar the algorithm logs becomes a gauge, updated at each dump, on an HTTP endpoint that Prometheus scrapes
(``configure_logger(folder, ["stdout", "prometheus"], prometheus={"port": 9100})``). Names are the logger's keys
with ``/`` and other characters Prometheus does not allow turned into ``_`` and a prefix: ``train/grad_norm`` is
``sb3_train_grad_norm``; every gauge has a ``run`` label, and two keys never share a gauge. The run's config is
served only when asked (``export_config=True``), secret-looking values redacted. With CUDA, the device's memory (and
utilisation, where ``torch.cuda.utilization`` can read it) is exported too; the process's memory and CPU come from
prometheus_client's process collector (on Linux).

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

__all__ = [
    "ALERT_DEFAULTS",
    "RESERVED_LABELS",
    "SECRET_WORDS",
    "PrometheusOutputFormat",
    "alert_rules",
    "config_labels",
    "is_secret_key",
    "metric_name",
    "write_alert_rules",
]

_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(key: str, prefix: str = "sb3") -> str:
    """The Prometheus name of a logger key: ``train/grad_norm`` -> ``sb3_train_grad_norm``."""
    name = _BAD.sub("_", key)
    return f"{prefix}_{name}" if prefix else (name if not name[:1].isdigit() else f"_{name}")


#: Words that mark a config key as a secret: its value is never served (``"<redacted>"``).
SECRET_WORDS = ("token", "key", "apikey", "password", "passwd", "secret", "credential", "credentials", "auth")
_WORDS = re.compile(r"[a-z0-9]+")
#: Label names the exporter uses itself (a config key of that name gets the prefix ``config_``).
RESERVED_LABELS = ("run",)


def is_secret_key(key: str) -> bool:
    """Whether a config key looks like a secret: one of its words (split at anything but letters and digits) is in
    :data:`SECRET_WORDS` (``api_key``, ``WANDB_TOKEN``, ``db.password``; not ``tokenizer`` or ``max_new_tokens``)."""
    return any(word in SECRET_WORDS for word in _WORDS.findall(str(key).lower()))


def _short_hash(text: str) -> str:
    import hashlib

    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]  # noqa: S324  (a name suffix, not security)


def config_labels(config: Mapping[str, Any]) -> dict[str, str]:
    """A run's config as the labels of its info metric: keys made valid label names (a reserved or ``__`` name gets
    the prefix ``config_``; two keys that would become one label stay apart, the second with a hash of its key) and
    values as text, a secret-looking key's value redacted (:func:`is_secret_key`)."""
    labels: dict[str, str] = {}
    for key, value in config.items():
        name = _BAD.sub("_", str(key)) or "_"
        if name[0].isdigit() or name in RESERVED_LABELS or name.startswith("__"):
            name = f"config_{name}"
        if name in labels:
            name = f"{name}_{_short_hash(str(key))}"
        labels[name] = "<redacted>" if is_secret_key(str(key)) else str(value)
    return labels


class PrometheusOutputFormat(TrackerOutputFormat):
    """Every scalar of SB3's logger as a Prometheus gauge, served on ``http://<addr>:<port>/metrics``.

    Each logger key has a gauge of its own: two keys that would get one name (``train/a_b`` and ``train_a/b``), or a
    key whose name the exporter uses itself (``timesteps``, ``run_info``), keep apart, the later one named with a hash
    of its key added (a warning says which). The run's config is served only when asked (``export_config=True``), as
    the labels of ``<prefix>_run_info``, with the values of secret-looking keys (token, key, password, secret)
    redacted; otherwise that metric carries the ``run`` label alone.

    :param folder: The run folder (its name is the default ``run`` label).
    :param config: The run's config (see ``export_config``).
    :param port: The port (0: any free port; the one taken is the attribute ``port``).
    :param addr: The address to listen on (default ``127.0.0.1``: this machine only).
    :param prefix: The metric names' prefix.
    :param run: The ``run`` label (default: the run folder's name).
    :param export_config: Serve the config's values on the metrics port (default ``False``: anyone who reaches the
        port could read them).
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
        export_config: bool = False,
    ) -> None:
        try:
            import prometheus_client
        except ImportError:
            raise extra_error("prometheus_client", "prometheus") from None
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535] (0: any free port), got {port!r}")
        if not isinstance(export_config, bool):
            raise TypeError(f"export_config must be True or False, got {export_config!r}")
        self._prom = prometheus_client
        self.prefix = prefix
        self.export_config = export_config
        self.run = run if run is not None else (Path(folder).resolve().name or "run")
        self.registry = prometheus_client.CollectorRegistry()
        try:
            prometheus_client.ProcessCollector(registry=self.registry)
        except Exception:  # noqa: BLE001  (no /proc here: no process metrics)
            pass
        self._gauges: dict[str, Any] = {}  # logger key -> the gauge's child of this run
        self._names: dict[str, str | None] = {}  # metric name -> the logger key it serves (None: the exporter's own)
        self._info = prometheus_client.Info(f"{prefix}_run", "the run's config", ["run"], registry=self.registry)
        self._names.update({f"{prefix}_run": None, f"{prefix}_run_info": None})
        self._step = self._new_gauge(f"{prefix}_timesteps", "SB3 timestep of the last dump", None)
        self.server, self._thread = prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(self.server.server_port)
        self.addr = addr
        self.log_config(config or {})

    @property
    def url(self) -> str:
        """Where the metrics are served."""
        return f"http://{self.addr}:{self.port}/metrics"

    def _new_gauge(self, name: str, doc: str, key: str | None) -> Any:
        gauge = self._prom.Gauge(name, doc, ["run"], registry=self.registry)
        self._names[name] = key
        return gauge.labels(run=self.run)

    def _gauge(self, key: str, doc: str | None = None) -> Any:
        child = self._gauges.get(key)
        if child is not None:
            return child
        name = metric_name(key, self.prefix)
        if name in self._names:
            taken = self._names[name]
            name = f"{name}_{_short_hash(key)}"
            import warnings

            warnings.warn(
                f"Prometheus: the logger key {key!r} would share the metric name {metric_name(key, self.prefix)} with "
                f"{'the exporter' if taken is None else repr(taken)}; it is served as {name}",
                UserWarning,
                stacklevel=4,
            )
        try:
            child = self._new_gauge(name, doc or f"SB3 logger key {key}", key)
        except ValueError:  # a name prometheus_client holds already (e.g. a process metric): keep it apart too
            child = self._new_gauge(f"{name}_{_short_hash(key)}", doc or f"SB3 logger key {key}", key)
        self._gauges[key] = child
        return child

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The run's info metric: the config's labels when ``export_config``, else the ``run`` label alone."""
        labels = config_labels(config) if self.export_config else {}
        self._info.labels(run=self.run).info(labels)

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
