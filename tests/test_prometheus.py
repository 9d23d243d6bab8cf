"""Live metrics: the exporter scraped on 127.0.0.1 during and after training, the alert rules (checked and unit-tested
by Prometheus' own promtool when it is installed), and TrainingMonitor's value-return correlation threshold."""

from __future__ import annotations

import csv
import math
import shutil
import subprocess
import sys
import urllib.request
import warnings

import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure

from sb3_grpo import GRPO
from sb3_grpo.callbacks import TrainingAlertWarning, TrainingMonitor, configure_logger
from sb3_grpo.callbacks.prometheus import alert_rules, metric_name, write_alert_rules

pytest.importorskip("prometheus_client", reason="the prometheus extra is not installed")


def scrape(url: str) -> dict[tuple[str, str], float]:
    """(metric name, run label) -> value, from the text the endpoint serves."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("run", ""))] = sample.value
    return out


class Scraper(BaseCallback):
    """Scrapes the endpoint at each rollout start after the first (the previous iteration has been dumped)."""

    def __init__(self, url):
        super().__init__()
        self.url, self.scrapes = url, []

    def _on_rollout_start(self):
        if self.num_timesteps:
            self.scrapes.append(scrape(self.url))

    def _on_step(self):
        return True


@pytest.mark.parametrize("algo", [PPO, GRPO])
def test_every_scalar_is_served_live(tmp_path, algo):
    model = algo("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0)
    logger = configure_logger(tmp_path / "run1", ["csv", "prometheus"], config=model, prometheus={"port": 0})
    model.set_logger(logger)
    exporter = logger.output_formats[1]
    assert exporter.url.startswith("http://127.0.0.1:") and exporter.port > 0
    scraper = Scraper(exporter.url)
    model.learn(192, callback=scraper)
    rows = [
        {k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(open(tmp_path / "run1" / "progress.csv"))
    ]
    assert len(scraper.scrapes) == 2  # at the starts of rollouts 2 and 3: the dumps of iterations 1 and 2
    for row, scraped in zip(rows, [*scraper.scrapes, scrape(exporter.url)]):
        assert scraped[("sb3_timesteps", "run1")] == row["time/total_timesteps"]
        for key, value in row.items():
            got = scraped[(metric_name(key), "run1")]
            assert math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-9), key
    info = scrape(exporter.url)
    assert any(name == "sb3_run_info" for name, _ in info)
    logger.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(exporter.url, timeout=2)


def test_metric_names_and_bad_port(tmp_path, monkeypatch):
    assert metric_name("train/grad_norm") == "sb3_train_grad_norm"
    assert metric_name("eval/pass@4", prefix="x") == "x_eval_pass_4"
    with pytest.raises(ValueError, match=r"port must be an int in \[0, 65535\]"):
        configure_logger(tmp_path, ["prometheus"], prometheus={"port": 70000})
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"pip install 'textrl\[prometheus\]'"):
        configure_logger(tmp_path, ["prometheus"])


def test_rules_file_structure(tmp_path):
    yaml = pytest.importorskip("yaml")
    path = write_alert_rules(tmp_path / "rules.yml", kl_target=0.1, stall_evaluations=3)
    loaded = yaml.safe_load(path.read_text())
    assert loaded == alert_rules(kl_target=0.1, stall_evaluations=3)
    (group,) = loaded["groups"]
    by_name = {r["alert"]: r for r in group["rules"]}
    assert set(by_name) == {"GradNormHigh", "KLToReferenceHigh", "ApproxKLHigh", "ValueReturnCorrelationLow",
                            "RewardStalled"}  # fmt: skip
    assert by_name["KLToReferenceHigh"]["expr"] == "sb3_train_kl_ref > 0.1"
    assert by_name["ValueReturnCorrelationLow"]["expr"] == "sb3_train_value_return_corr < 0.5"
    assert by_name["RewardStalled"]["expr"] == "sb3_eval_evals_without_improvement >= 3"
    with pytest.raises(ValueError, match="Prometheus duration"):
        alert_rules(for_="five minutes")
    with pytest.raises(ValueError, match="stall_evaluations must be an int >= 1"):
        alert_rules(stall_evaluations=0)


PROMTOOL_TEST = """\
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'sb3_train_kl_ref{run="r"}'
        values: '0.05 0.2'
      - series: 'sb3_train_value_return_corr{run="r"}'
        values: '0.9 0.3'
      - series: 'sb3_eval_evals_without_improvement{run="r"}'
        values: '1 2'
    alert_rule_test:
      - eval_time: 0m
        alertname: KLToReferenceHigh
        exp_alerts: []
      - eval_time: 1m
        alertname: KLToReferenceHigh
        exp_alerts:
          - exp_labels: {severity: warning, run: r}
            exp_annotations:
              summary: "KL to the reference policy high in run r: train/kl_ref = 0.2 (> 0.1)"
              description: "Raise kl_coef (or set kl_target on GRPO) or lower the learning rate."
      - eval_time: 0m
        alertname: ValueReturnCorrelationLow
        exp_alerts: []
      - eval_time: 1m
        alertname: ValueReturnCorrelationLow
        exp_alerts:
          - exp_labels: {severity: warning, run: r}
            exp_annotations:
              summary: "value-return correlation low in run r: train/value_return_corr = 0.3 (< 0.5)"
              description: "The critic no longer tracks the returns: check vf_coef and the rewards."
      - eval_time: 1m
        alertname: RewardStalled
        exp_alerts: []
"""


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) is not installed")
def test_promtool_accepts_the_rules_and_they_fire_at_the_thresholds(tmp_path):
    write_alert_rules(tmp_path / "rules.yml", stall_evaluations=3)
    check = subprocess.run(["promtool", "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "5 rules found" in check.stdout
    (tmp_path / "test.yml").write_text(PROMTOOL_TEST)
    test = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr


def test_training_monitor_warns_on_a_low_value_return_correlation():
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16)
    model.set_logger(configure(None, []))
    monitor = TrainingMonitor(min_value_return_corr=0.5)
    monitor.init_callback(model)
    model._n_updates = 1
    model.logger.record("train/value_return_corr", 0.7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert monitor.check() == []
    model._n_updates = 2
    model.logger.record("train/value_return_corr", 0.2)
    with pytest.warns(TrainingAlertWarning, match=r"value_return_corr = 0.2 is below 0.5"):
        assert monitor.check() == [(2, "train/value_return_corr", 0.2, 0.5)]
    model._n_updates = 3
    model.logger.record("train/value_return_corr", float("nan"))  # no critic signal: not an alert
    assert monitor.check() == []
    with pytest.raises(ValueError, match=r"min_value_return_corr must be a number in \[-1, 1\]"):
        TrainingMonitor(min_value_return_corr=2.0)
