"""Prometheus: distinct logger keys stay distinct gauges, reserved names are escaped, and the run's config is served
only when asked, with secret-looking values redacted."""

from __future__ import annotations

import urllib.request

import pytest

pytest.importorskip("prometheus_client", reason="the prometheus extra is not installed")

from sb3_grpo.callbacks import configure_logger  # noqa: E402


def _samples(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples}  # fmt: skip


def _values(samples, run="r"):
    return {name: v for (name, labels), v in samples.items() if dict(labels) == {"run": run}}


def test_keys_that_differ_only_in_slash_and_underscore_stay_apart(tmp_path):
    logger = configure_logger(tmp_path / "r", ["prometheus"], prometheus={"port": 0})
    try:
        exporter = logger.output_formats[0]
        logger.record("train/a_b", 1.0)
        logger.record("train_a/b", 2.0)
        logger.record("timesteps", 3.0)  # the exporter's own name
        logger.record("run/info", 4.0)  # would be the info metric's sample name
        with pytest.warns(UserWarning, match="would share the metric name"):
            logger.dump(7)
        values = _values(_samples(exporter.url))
        assert values["sb3_train_a_b"] == 1.0 and values["sb3_timesteps"] == 7.0
        served = sorted(
            v for n, v in values.items() if n.startswith(("sb3_train_a_b_", "sb3_timesteps_", "sb3_run_info_"))
        )
        assert served == [2.0, 3.0, 4.0]  # every value served, none lost
    finally:
        logger.close()


def test_the_config_is_served_only_when_asked_and_secrets_are_redacted(tmp_path):
    config = {"run": "mine", "learning_rate": 3e-4, "wandb_api_key": "sk-123", "db.password": "hunter2",
              "HF_TOKEN": "hf_abc", "tokenizer": "gpt2", "max_new_tokens": 32, "a.b": 1, "a/b": 2}  # fmt: skip
    logger = configure_logger(tmp_path / "r", ["prometheus"], config=config, prometheus={"port": 0})
    try:
        samples = _samples(logger.output_formats[0].url)
        (labels,) = [dict(lb) for (name, lb) in samples if name == "sb3_run_info"]
        assert labels == {"run": "r"}  # nothing of the config unless asked
    finally:
        logger.close()
    logger = configure_logger(tmp_path / "r", ["prometheus"], config=config,
                              prometheus={"port": 0, "export_config": True})  # fmt: skip
    try:
        text = urllib.request.urlopen(logger.output_formats[0].url, timeout=10).read().decode()
        samples = _samples(logger.output_formats[0].url)
        (labels,) = [dict(lb) for (name, lb) in samples if name == "sb3_run_info"]
    finally:
        logger.close()
    assert labels["run"] == "r" and labels["config_run"] == "mine"  # the reserved name escaped, not a crash
    assert labels["learning_rate"] == "0.0003" and labels["tokenizer"] == "gpt2" and labels["max_new_tokens"] == "32"
    for key in ("wandb_api_key", "db_password", "HF_TOKEN"):
        assert labels[key] == "<redacted>"
    assert "sk-123" not in text and "hunter2" not in text and "hf_abc" not in text
    assert sorted(v for k, v in labels.items() if k.startswith("a_b")) == ["1", "2"]  # distinct keys stay distinct
