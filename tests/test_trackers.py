"""Trackers as SB3 output formats: what PPO and GRPO log reaches wandb (offline) and MLflow (a local file store),
read back from what the trackers wrote."""

from __future__ import annotations

import csv
import glob
import json
import math
import struct
import sys
import time
import warnings

import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.logger import HParam

from sb3_grpo import GRPO
from sb3_grpo.callbacks import Table, configure_logger, log_config, run_config

SMALL = {"n_steps": 64, "batch_size": 32, "n_epochs": 1, "seed": 0}


def _csv_rows(path) -> list[dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def wandb_records(run_dir, timeout: float = 30.0) -> list:
    """The records of a finished offline wandb run, once its ``exit`` record is on disk (wandb's service may still be
    writing the file when ``run.finish()`` returns)."""
    deadline = time.monotonic() + timeout
    while True:
        records = _read_wandb_file(run_dir)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _read_wandb_file(run_dir) -> list:
    """The records of an offline wandb run's ``run-*.wandb`` file: a header, then LevelDB-log framed protobuf
    ``Record`` messages in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 7:
        return []
    assert data[:4] == b":W&B", "not a wandb run file"
    block, pos, pending, payloads = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:  # full
            payloads.append(payload)
        elif kind == 2:  # first
            pending = payload
        elif kind == 3:  # middle
            pending += payload
        elif kind == 4:  # last
            payloads.append(pending + payload)
    records = []
    for payload in payloads:
        record = pb.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def wandb_history(run_dir) -> list[dict]:
    rows = []
    for r in wandb_records(run_dir):
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows


def wandb_config(run_dir) -> dict:
    config = {}
    for r in wandb_records(run_dir):
        kind = r.WhichOneof("record_type")
        items = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        for item in items:
            config[item.key] = json.loads(item.value_json)
    return {k: v.get("value", v) if isinstance(v, dict) else v for k, v in config.items()}


def _train(algo, folder, formats, **tracker_kwargs):
    model = algo("MlpPolicy", "CartPole-v1", **SMALL)
    logger = configure_logger(folder, ["csv", *formats], config=model, **tracker_kwargs)
    model.set_logger(logger)
    model.learn(192)
    logger.close()
    return model, _csv_rows(folder / "progress.csv")


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # keep wandb off pytest's stdout
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))


@pytest.fixture
def mlflow_store(monkeypatch, tmp_path):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use a plain folder store
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return "file:" + str(tmp_path / "mlruns")


@pytest.mark.parametrize("algo", [PPO, GRPO])
def test_wandb_offline_gets_every_scalar_and_the_config(offline_wandb, tmp_path, algo):
    model, rows = _train(algo, tmp_path / "run", ["wandb"])
    history = wandb_history(tmp_path / "run")
    assert len(rows) == 3 and len(history) == len(rows)
    for row, logged in zip(rows, history):
        assert logged["_step"] == row["time/total_timesteps"]
        for key, value in row.items():
            assert key in logged, f"{key} is in SB3's csv but not in wandb's history"
            assert math.isclose(logged[key], value, rel_tol=1e-6, abs_tol=1e-9), key
    config = wandb_config(tmp_path / "run")
    assert config["algorithm"] == algo.__name__
    assert config["n_steps"] == 64 and config["learning_rate"] == pytest.approx(model.learning_rate)


@pytest.mark.parametrize("algo", [PPO, GRPO])
def test_mlflow_file_store_gets_every_scalar_and_the_config(mlflow_store, tmp_path, algo):
    from mlflow.tracking import MlflowClient

    _, rows = _train(algo, tmp_path / "run", ["mlflow"], mlflow={"tracking_uri": mlflow_store, "run_name": "r"})
    client = MlflowClient(tracking_uri=mlflow_store)
    (run,) = client.search_runs([client.get_experiment_by_name("textrl").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    for key in rows[-1]:
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        expected = {int(r["time/total_timesteps"]): r[key] for r in rows if key in r}
        assert history.keys() == expected.keys(), key
        for step, value in expected.items():
            assert math.isclose(history[step], value, rel_tol=1e-6, abs_tol=1e-9), (key, step)
    params = run.data.params
    assert params["algorithm"] == algo.__name__ and params["n_steps"] == "64" and params["gamma"] == "0.99"


def test_tables_text_and_hparams_reach_the_trackers(offline_wandb, mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    logger = configure_logger(tmp_path, ["stdout", "wandb", "mlflow"], mlflow={"tracking_uri": mlflow_store})
    mlflow_format = logger.output_formats[2]
    run_id = mlflow_format.run_id
    table = Table(columns=("prompt", "reward"), rows=[("a", 1.0), ("b", 0.5)])
    logger.record("samples/table", table, exclude=("stdout", "log", "json", "csv", "tensorboard"))
    logger.record("samples/text", "hello <world>", exclude=("stdout", "log", "json", "csv", "tensorboard"))
    logger.record("hparams", HParam({"lr": 0.5}, {"x": 0.0}), exclude=("stdout", "log", "json", "csv"))
    logger.record("only/tensorboard", 3.0, exclude=("wandb", "mlflow"))
    logger.record("x/y", 2.0)
    logger.dump(7)
    assert log_config(logger, {"extra_key": "v"}) == 2
    logger.close()
    client = MlflowClient(tracking_uri=mlflow_store)
    table_file = client.download_artifacts(run_id, "samples/table/step_7.json", str(tmp_path / "dl"))
    saved = json.loads(open(table_file).read())
    assert saved["columns"] == ["prompt", "reward"] and saved["data"] == [["a", 1.0], ["b", 0.5]]
    text_file = client.download_artifacts(run_id, "samples/text/step_7.txt", str(tmp_path / "dl2"))
    assert open(text_file).read() == "hello <world>"
    data = client.get_run(run_id).data
    assert data.params == {"lr": "0.5", "extra_key": "v"}
    assert data.metrics == {"x/y": 2.0}
    (row,) = wandb_history(tmp_path)
    assert row["x/y"] == 2.0 and "only/tensorboard" not in row
    assert row["samples/table/_type"] == "table-file" and row["samples/table/nrows"] == 2
    assert row["samples/text/_type"] == "html-file"
    assert wandb_config(tmp_path)["lr"] == 0.5 and wandb_config(tmp_path)["extra_key"] == "v"


def test_run_config_has_the_hyperparameters_of_both_algorithms():
    ppo = run_config(PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16, learning_rate=lambda p: 1e-3 * p))
    assert ppo["algorithm"] == "PPO" and ppo["env"] == "CartPole-v1" and ppo["n_steps"] == 32
    assert ppo["learning_rate"] == pytest.approx(1e-3)  # a schedule: its value at the start
    grpo = run_config(GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16, kl_coef=0.05))
    assert grpo["kl_coef"] == 0.05 and grpo["advantage"] == "gae" and grpo["adaptive_clip"] == "[1.1, 0.9]"
    assert all(v is None or isinstance(v, (bool, int, float, str)) for v in grpo.values())


def test_a_missing_extra_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install 'textrl\[wandb\]'"):
        configure_logger(tmp_path, ["wandb"])
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(ImportError, match=r"pip install 'textrl\[mlflow\]'"):
        configure_logger(tmp_path, ["stdout", "mlflow"])


def test_bad_arguments_say_what_is_known(tmp_path):
    with pytest.raises(ValueError, match="unknown output format 'tensorbord'.*tensorboard.*wandb"):
        configure_logger(tmp_path, ["tensorbord"])
    with pytest.raises(ValueError, match="unknown trackers.*wandbb"):
        configure_logger(tmp_path, ["stdout"], wandbb={})
    with pytest.raises(ValueError, match="not in format_strings"):
        configure_logger(tmp_path, ["stdout"], wandb={"mode": "offline"})
    with pytest.raises(TypeError, match="config must be a dict or an SB3 algorithm"):
        configure_logger(tmp_path, ["stdout"], config=3)
    with pytest.raises(ValueError, match=r"rows \[1\] do not have 2 values"):
        Table(columns=("a", "b"), rows=[(1, 2), (3,)])


COMPARE = ["compare", "--env", "CartPole-v1", "--algos", "ppo,grpo", "--seeds", "1", "--timesteps", "128",
           "--eval-episodes", "2", "--no-progress", "--set", '*.n_steps=64', "--set", "*.batch_size=32"]  # fmt: skip


def test_compare_track_mlflow_and_wandb(offline_wandb, mlflow_store, tmp_path, capfd, monkeypatch):
    from mlflow.tracking import MlflowClient

    from sb3_grpo.cli import main

    monkeypatch.delenv("WANDB_SILENT")  # as a user has it: wandb speaks, but compare keeps it to essentials
    out = tmp_path / "out"
    assert main([*COMPARE, "--track", "mlflow", "--track", "wandb", "--out", str(out)]) == 0
    printed = "".join(capfd.readouterr())
    assert "Run history" not in printed and "Run summary" not in printed
    client = MlflowClient(tracking_uri="sqlite:///" + str(out / "mlflow.db"))  # the default store: MLflow's database
    assert not (out / "mlruns").exists()
    runs = client.search_runs([client.get_experiment_by_name("compare CartPole-v1").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["grpo-seed0", "ppo-seed0"]
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.params["env"] == "CartPole-v1"
        assert run.data.params["n_steps"] == "64" and run.data.params["seed"] == "0"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/value_loss")] == [128]
    wandb_runs = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2


def test_compare_track_names_the_missing_extra(monkeypatch, tmp_path, capsys):
    from sb3_grpo.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(SystemExit):
        main([*COMPARE, "--track", "wandb", "--out", str(tmp_path / "o")])
    assert "pip install 'textrl[wandb]'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_mlflow_default_store_is_a_database_and_renamed_keys_are_said(mlflow_store, tmp_path):
    import logging

    from mlflow.tracking import MlflowClient

    from sb3_grpo.callbacks.trackers import MLflowOutputFormat, default_tracking_uri

    folder = tmp_path / "run"
    assert default_tracking_uri(folder) == "sqlite:///" + str(folder / "mlflow.db")
    level = logging.getLogger("mlflow.store.db.utils").level
    writer = MLflowOutputFormat(str(folder), experiment_name="e")
    assert writer.tracking_uri == default_tracking_uri(folder) and (folder / "mlflow.db").is_file()
    assert logging.getLogger("mlflow.store.db.utils").level == level  # quieted only while the store was made
    with pytest.warns(UserWarning, match=r"'eval/pass@4' is logged as 'eval/pass_4'"):
        writer.write({"eval/pass@4": 0.5, "eval/mean": 0.25}, {"eval/pass@4": None, "eval/mean": None}, step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        writer.write({"eval/pass@4": 0.75}, {"eval/pass@4": None}, step=2)
    run_id = writer.run_id
    writer.close()
    client = MlflowClient(tracking_uri=default_tracking_uri(folder))  # MLflow's own client reads it, no flag needed
    run = client.get_run(run_id)
    assert run.data.tags["textrl.renamed.eval/pass_4"] == "eval/pass@4"
    assert [m.value for m in client.get_metric_history(run_id, "eval/pass_4")] == [0.5, 0.75]
