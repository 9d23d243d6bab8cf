"""Smoke test: every script in examples/ runs to the end with a small step count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "quickstart.py": ["--timesteps", "96"],
    "custom_reward.py": ["--timesteps", "128"],
    "interactive_task.py": ["--timesteps", "256"],
    "distributed_train.py": ["--timesteps", "128"],
    "local_hf_model.py": ["--timesteps", "64"],
    "ppo_vs_grpo.py": ["--timesteps", "128"],
    "reliable_training.py": ["--timesteps", "128", "--out", "run"],
    "tensorboard_logging.py": ["--timesteps", "96"],
}


def test_every_example_is_tested():
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    args = list(EXAMPLES[name])
    if name == "tensorboard_logging.py":
        args += ["--logdir", str(tmp_path / "tb")]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    if name == "tensorboard_logging.py":
        assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))
