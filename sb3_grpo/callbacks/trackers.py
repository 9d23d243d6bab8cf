"""Experiment trackers (Weights & Biases, MLflow) as output formats of SB3's logger.

SB3 logs through a :class:`~stable_baselines3.common.logger.Logger` that hands every dump to its output formats
(``KVWriter`` objects: stdout, csv, tensorboard, ...). The trackers here are two more ``KVWriter`` s, so an
algorithm logs to them exactly what it logs to tensorboard, with no change to the algorithm: stock ``PPO`` and
``GRPO`` alike. SB3's own ``configure(folder, format_strings)`` knows only its built-in names;
:func:`configure_logger` takes the same arguments and also knows ``"wandb"`` and ``"mlflow"``::

    from sb3_grpo import GRPO
    from sb3_grpo.callbacks import configure_logger

    model = GRPO("MlpPolicy", "CartPole-v1", n_steps=256)
    model.set_logger(configure_logger("runs/cartpole", ["stdout", "tensorboard", "mlflow"], config=model))
    model.learn(10_000)
    model.logger.close()  # ends the tracker runs

``config=model`` logs the algorithm's hyperparameters (:func:`run_config`) once, as the run's config (wandb) or
parameters (MLflow). Each tracker is an optional extra (``pip install 'textrl[wandb]'``, ``'textrl[mlflow]'``);
its library is imported only when its format is asked for.

Values a tracker receives: numbers (scalars), :class:`Table` (a table of rows: ``wandb.Table``, MLflow
``log_table``), text (``str``: an HTML panel in wandb, a text artifact in MLflow) and SB3's ``HParam`` (the
config). Keys excluded for a format by name (``logger.record(key, value, exclude="wandb")``) are skipped, as SB3's
own formats do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import inspect
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from stable_baselines3.common.logger import KVWriter, Logger, make_output_format

from sb3_grpo.callbacks.output_format import SB3_FORMATS, Table, TrackerOutputFormat, config_value, extra_error
from sb3_grpo.callbacks.prometheus import PrometheusOutputFormat

__all__ = [
    "SB3_FORMATS",
    "TRACKERS",
    "MLflowOutputFormat",
    "Table",
    "TrackerOutputFormat",
    "WandbOutputFormat",
    "check_tracker_ready",
    "configure_logger",
    "log_config",
    "make_tracker",
    "run_config",
    "tracker_formats",
]


def _env_id(env: Any) -> str | None:
    """The registered id of a (vectorized) env, else its class name."""
    if env is None:
        return None
    try:
        spec = env.get_attr("spec", [0])[0] if hasattr(env, "get_attr") else getattr(env, "spec", None)
    except Exception:  # noqa: BLE001  (an env without the attribute: its class name will do)
        spec = None
    spec = spec or getattr(getattr(env, "unwrapped", None), "spec", None)
    return getattr(spec, "id", None) or type(env).__name__


def run_config(model: Any) -> dict[str, bool | int | float | str | None]:
    """The hyperparameters of an SB3 algorithm, as a flat dict of plain values (a run's config).

    The arguments of the algorithm's constructor (its class and its bases) that the model keeps as attributes, plus
    ``algorithm``, ``policy`` and ``env``. Schedules are given by their value at the start of training; dataclass
    arguments (such as GRPO's extras) are flattened as ``name.field``.

    :param model: An SB3 ``BaseAlgorithm``.
    :return: Name -> value (``bool``, ``int``, ``float``, ``str`` or ``None``).
    """
    names: list[str] = []
    for cls in type(model).__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        for name in inspect.signature(init).parameters:
            if name not in ("self", "args", "kwargs", "env", "policy", "_init_setup_model") and name not in names:
                names.append(name)
    config: dict[str, Any] = {"algorithm": type(model).__name__}
    policy = getattr(model, "policy", None)
    config["policy"] = type(policy).__name__ if policy is not None else None
    config["env"] = _env_id(getattr(model, "env", None))
    for name in names:
        if name == "policy_kwargs":
            for key, value in (getattr(model, "policy_kwargs", None) or {}).items():
                config[f"policy_kwargs.{key}"] = config_value(value)
            continue
        for attr in (name, f"_{name}"):
            if hasattr(model, attr):
                value = getattr(model, attr)
                break
        else:
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                config[f"{name}.{field.name}"] = config_value(getattr(value, field.name))
        else:
            config[name] = config_value(value)
    return config


#: Seconds a tracker's server gets to answer the check before the first run (:func:`check_tracker_ready`).
TRACKER_PROBE_TIMEOUT_S = 5.0
_OFFLINE_WANDB_MODES = ("offline", "disabled", "dryrun")


def _wandb_logged_in() -> bool:
    """Whether wandb has an API key: ``WANDB_API_KEY``, or a ``netrc`` entry for its server (what ``wandb login``
    writes)."""
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _mlflow_server_problem(uri: str) -> str | None:
    """Why an HTTP(S) MLflow tracking server cannot be reached (``None``: it answered)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=TRACKER_PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None  # it answered (an older server has no /health): reachable
    except (TimeoutError, urllib.error.URLError, OSError) as err:
        return str(getattr(err, "reason", err))
    return None


def check_tracker_ready(name: str, mode: str | None = None, tracking_uri: str | None = None) -> None:
    """Refuse, in one line and before anything runs, a tracker that cannot log: wandb online without a login, an
    MLflow tracking server that does not answer (instead of minutes of retries and a traceback).

    :param name: ``"wandb"`` or ``"mlflow"`` (anything else: nothing to check).
    :param mode: wandb's ``mode`` (default ``WANDB_MODE``; ``offline`` and ``disabled`` need no login).
    :param tracking_uri: MLflow's tracking URI (default ``MLFLOW_TRACKING_URI``; only ``http(s)`` ones are probed).
    :raises ValueError: saying what to do.
    """
    if name == "wandb":
        mode = (mode or os.environ.get("WANDB_MODE") or "online").lower()
        if mode not in _OFFLINE_WANDB_MODES and not _wandb_logged_in():
            raise ValueError(
                "wandb is not logged in (no WANDB_API_KEY and no netrc entry for its server): run `wandb login`, set "
                "WANDB_API_KEY, or set WANDB_MODE=offline to log into the run folder (wandb sync uploads it later)"
            )
    elif name == "mlflow":
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
        if uri.startswith(("http://", "https://")):
            problem = _mlflow_server_problem(uri)
            if problem is not None:
                raise ValueError(
                    f"the MLflow tracking server {uri} does not answer ({problem}) within "
                    f"{TRACKER_PROBE_TIMEOUT_S:g} s: start it, fix MLFLOW_TRACKING_URI, or unset it to log into the "
                    "run folder (mlruns)"
                )


class WandbOutputFormat(TrackerOutputFormat):
    """Weights & Biases as an SB3 output format: one wandb run, started here and finished by :meth:`close`.

    Scalars go to the run's history at SB3's step (the timestep count), tables as ``wandb.Table``, text as
    ``wandb.Html``, the config to ``run.config``. Offline runs (``mode="offline"`` or ``WANDB_MODE=offline``) write
    into ``folder/wandb`` and can be synced later with ``wandb sync``.

    :param folder: The run folder (wandb's ``dir``).
    :param config: The run's config (logged at the start; see :func:`run_config`).
    :param init_kwargs: More keyword arguments of ``wandb.init`` (``project``, ``name``, ``mode``, ``tags``, ...;
        ``project`` defaults to ``"textrl"``).
    """

    name = "wandb"

    def __init__(self, folder: str, /, config: Mapping[str, Any] | None = None, **init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError:
            raise extra_error("wandb", "wandb") from None
        self._wandb = wandb
        check_tracker_ready("wandb", mode=init_kwargs.get("mode"))
        os.makedirs(folder, exist_ok=True)
        init_kwargs.setdefault("project", "textrl")
        init_kwargs.setdefault("dir", folder)
        init_kwargs.setdefault("reinit", "create_new")  # one run per logger, several in one process
        self.run = wandb.init(config=dict(config) if config else None, **init_kwargs)
        self._last_step = -1

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update({k: config_value(v) for k, v in config.items()}, allow_val_change=True)

    def _step(self, step: int) -> int:
        # wandb's history steps only go up; a dump at an earlier step (a second learn() with
        # reset_num_timesteps=True) is logged at the latest step instead of being dropped
        self._last_step = max(self._last_step, int(step))
        return self._last_step

    def _log_scalars(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=self._step(step))

    def _log_table(self, key: str, table: Table, step: int) -> None:
        data = [list(r) for r in table.rows]
        self.run.log({key: self._wandb.Table(columns=list(table.columns), data=data)}, step=self._step(step))

    def _log_text(self, key: str, text: str, step: int) -> None:
        panel = self._wandb.Html(f"<pre>{html.escape(text)}</pre>")
        self.run.log({key: panel}, step=self._step(step))

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


_MLFLOW_KEY = re.compile(r"[^0-9A-Za-z_\-. /]")
#: MLflow's loggers that announce the creation of a store's tables, quieted while this module creates one.
_MLFLOW_STORE_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration", "alembic")


def default_tracking_uri(folder: str | os.PathLike) -> str:
    """The MLflow store of runs in ``folder`` when neither ``tracking_uri`` nor ``MLFLOW_TRACKING_URI`` says where:
    ``sqlite:///<folder>/mlflow.db``, the database store MLflow recommends (its plain ``file:`` folder store is in
    maintenance mode in MLflow 3, and MLflow's own ``MlflowClient`` refuses to read it without
    ``MLFLOW_ALLOW_FILE_STORE``). ``mlflow ui --backend-store-uri sqlite:///<folder>/mlflow.db`` shows it."""
    return "sqlite:///" + os.path.abspath(os.path.join(os.fspath(folder), "mlflow.db"))


@contextlib.contextmanager
def _quiet_store_creation() -> Any:
    """MLflow's INFO lines about creating and migrating a database store's tables, silenced while the block runs (the
    loggers' levels are restored after; nothing else in the process is touched)."""
    import logging

    loggers = [logging.getLogger(name) for name in _MLFLOW_STORE_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.level, logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class MLflowOutputFormat(TrackerOutputFormat):
    """MLflow as an SB3 output format: one MLflow run, created here and ended by :meth:`close`.

    Scalars become metrics at SB3's step, tables ``log_table`` artifacts (``<key>/step_<step>.json``), text
    ``log_text`` artifacts, the config the run's parameters (each once: MLflow parameters do not change). Uses an
    ``MlflowClient`` and never MLflow's global active run, so several loggers can run side by side.

    :param folder: The run folder (the default store is :func:`default_tracking_uri`, ``sqlite:///<folder>/mlflow.db``,
        when neither ``tracking_uri`` nor ``MLFLOW_TRACKING_URI`` is set). A ``file:`` store asked for (MLflow's plain
        folder store, which MLflow 3 keeps in maintenance mode) sets ``MLFLOW_ALLOW_FILE_STORE=true`` unless it is set
        already.

    MLflow allows only letters, digits, ``_ - . /`` and spaces in a metric's name: any other character becomes ``_``
    (``eval/pass@4`` is logged as ``eval/pass_4``). Each such renaming is said once, in a warning, and recorded as
    the run's tag ``textrl.renamed.<logged name>`` holding the original name.
    :param config: The run's config (logged at the start; see :func:`run_config`).
    :param tracking_uri: Where to log (``file:/path/mlruns``, ``sqlite:///mlflow.db``, ``http://host:5000``).
    :param experiment_name: The experiment (created when missing; default ``"textrl"``).
    :param run_name: The run's name.
    :param tags: The run's tags.
    """

    name = "mlflow"

    def __init__(
        self,
        folder: str,
        config: Mapping[str, Any] | None = None,
        tracking_uri: str | None = None,
        experiment_name: str = "textrl",
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise extra_error("mlflow", "mlflow") from None
        if tracking_uri is None:
            tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(folder)
        if tracking_uri.startswith("file:"):
            # MLflow 3 keeps its plain folder store in maintenance mode and refuses it unless this is set; a file:
            # URI asks for exactly that store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if tracking_uri.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(tracking_uri[len("sqlite:///") :]) or ".", exist_ok=True)
        check_tracker_ready("mlflow", tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        with _quiet_store_creation():
            self.client = MlflowClient(tracking_uri=tracking_uri)
            experiment = self.client.get_experiment_by_name(experiment_name)
            experiment_id = (
                experiment.experiment_id if experiment is not None else self.client.create_experiment(experiment_name)
            )
        self.run_id: str | None = self.client.create_run(
            experiment_id, run_name=run_name, tags=dict(tags or {})
        ).info.run_id
        self._params: dict[str, str] = {}
        self._renamed: dict[str, str] = {}
        if config:
            self.log_config(config)

    def _key(self, key: str) -> str:
        """``key`` as MLflow allows it; a renaming is warned about and tagged once (see the class docstring)."""
        name = _MLFLOW_KEY.sub("_", key)
        if name != key and self._renamed.get(name) != key:
            self._renamed[name] = key
            warnings.warn(
                f"MLflow allows only letters, digits, '_-. /' and spaces in names: {key!r} is logged as {name!r} "
                f"(the run's tag textrl.renamed.{name} records the original)",
                UserWarning,
                stacklevel=4,
            )
            if self.run_id is not None:
                self.client.set_tag(self.run_id, f"textrl.renamed.{name}", key)
        return name

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        new = []
        for key, value in config.items():
            name, text = self._key(str(key)), str(config_value(value))[:6000]
            if name in self._params:
                if self._params[name] != text:
                    warnings.warn(
                        f"MLflow parameter {name!r} was logged as {self._params[name]!r}; MLflow parameters do not "
                        f"change, so the new value {text!r} is not logged",
                        stacklevel=2,
                    )
                continue
            self._params[name] = text
            new.append(Param(name, text))
        for start in range(0, len(new), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=new[start : start + 100])

    def _log_scalars(self, scalars: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(self._key(k), v, now, int(step)) for k, v in scalars.items() if math.isfinite(v)]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def _log_table(self, key: str, table: Table, step: int) -> None:
        self.client.log_table(self.run_id, table.as_dict(), artifact_file=f"{self._key(key)}/step_{int(step)}.json")

    def _log_text(self, key: str, text: str, step: int) -> None:
        self.client.log_text(self.run_id, text, artifact_file=f"{self._key(key)}/step_{int(step)}.txt")

    def close(self) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id)
            self.run_id = None


#: Format name -> its class: the trackers, and the Prometheus exporter
#: (:class:`~sb3_grpo.callbacks.prometheus.PrometheusOutputFormat`).
TRACKERS: dict[str, type[TrackerOutputFormat]] = {
    "wandb": WandbOutputFormat,
    "mlflow": MLflowOutputFormat,
    "prometheus": PrometheusOutputFormat,
}


def make_tracker(
    tracker: str, folder: str, /, config: Mapping[str, Any] | None = None, **kwargs: Any
) -> TrackerOutputFormat:
    """The output format ``tracker`` (``"wandb"``, ``"mlflow"`` or ``"prometheus"``) for the run folder ``folder``;
    ``kwargs`` are the format's (for wandb, those of ``wandb.init``)."""
    if tracker not in TRACKERS:
        raise ValueError(f"unknown tracker {tracker!r}; known: {', '.join(TRACKERS)}")
    return TRACKERS[tracker](folder, config=config, **kwargs)


def _as_config(config: Any) -> dict[str, Any] | None:
    if config is None:
        return None
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "policy") and hasattr(config, "learn"):
        return run_config(config)
    raise TypeError(f"config must be a dict or an SB3 algorithm (its hyperparameters), got {type(config).__name__}")


def configure_logger(
    folder: str | os.PathLike,
    format_strings: Sequence[str] = ("stdout", "tensorboard"),
    config: Any = None,
    log_suffix: str = "",
    **tracker_kwargs: Mapping[str, Any],
) -> Logger:
    """SB3's ``configure(folder, format_strings)``, which also knows ``"wandb"``, ``"mlflow"`` and ``"prometheus"``.

    SB3's own names (``stdout``, ``log``, ``json``, ``csv``, ``tensorboard``) are made by SB3's
    ``make_output_format``; the trackers by :func:`make_tracker`. Give the result to ``model.set_logger``, and call
    ``logger.close()`` when training is done (it ends the tracker runs).

    :param folder: The run folder (SB3's files, tensorboard's events, wandb's offline runs, MLflow's default store).
    :param format_strings: The output formats, e.g. ``["stdout", "tensorboard", "wandb", "mlflow"]``.
    :param config: The run's config, logged once by each tracker: a dict, or an SB3 algorithm (its
        hyperparameters, :func:`run_config`).
    :param log_suffix: SB3's suffix of its file names.
    :param tracker_kwargs: Per tracker, the keyword arguments of its format, e.g.
        ``wandb={"project": "p", "mode": "offline"}``, ``mlflow={"tracking_uri": "file:/tmp/mlruns"}``,
        ``prometheus={"port": 9100}``.
    :return: SB3's ``Logger`` over those formats.
    """
    if isinstance(format_strings, str):
        format_strings = [f for f in format_strings.split(",") if f]
    unknown = set(tracker_kwargs) - set(TRACKERS)
    if unknown:
        raise ValueError(f"keyword arguments for unknown trackers {sorted(unknown)}; trackers: {', '.join(TRACKERS)}")
    unused = set(tracker_kwargs) - set(format_strings)
    if unused:
        raise ValueError(f"keyword arguments for {sorted(unused)}, which are not in format_strings {format_strings}")
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    run_cfg = _as_config(config)
    formats: list[KVWriter] = []
    try:
        for name in format_strings:
            if name in TRACKERS:
                formats.append(make_tracker(name, folder, config=run_cfg, **dict(tracker_kwargs.get(name) or {})))
            else:
                try:
                    formats.append(make_output_format(name, folder, log_suffix))
                except ValueError:
                    raise ValueError(
                        f"unknown output format {name!r}; known: {', '.join(SB3_FORMATS + tuple(TRACKERS))}"
                    ) from None
    except BaseException:
        for made in formats:
            made.close()
        raise
    return Logger(folder=folder, output_formats=formats)


def log_config(logger: Logger, config: Any) -> int:
    """Log a run's config (a dict, or an SB3 algorithm's hyperparameters) to every tracker format of ``logger``.

    For a logger made elsewhere (or a config known only later); :func:`configure_logger` logs its ``config=``
    itself. SB3's ``HParam`` values recorded on the logger reach the trackers too.

    :return: The number of tracker formats that logged it.
    """
    values = _as_config(config) or {}
    n = 0
    for fmt in logger.output_formats:
        if isinstance(fmt, TrackerOutputFormat):
            fmt.log_config(values)
            n += 1
    return n


def tracker_formats(logger: Logger) -> list[TrackerOutputFormat]:
    """The tracker formats of ``logger``."""
    return [f for f in logger.output_formats if isinstance(f, TrackerOutputFormat)]
