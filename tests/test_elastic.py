"""Elastic restarts: ``torchrun --max-restarts 1`` with two gloo ranks, one SIGKILLed mid-run; the restarted ranks
resume from the newest checkpoint by themselves (:class:`~sb3_grpo.callbacks.ElasticCheckpointCallback`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env

from sb3_grpo import GRPO
from sb3_grpo.callbacks import ElasticCheckpointCallback

WORKER = Path(__file__).with_name("_elastic_worker.py")
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


def _torchrun(out: Path, *flags: str) -> list[dict]:
    # --standalone: the c10d rendezvous on a free port; the static one (--master_addr/--master_port) cannot
    # reconnect the ranks' process group after a restart
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(var, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--max-restarts",
        "1", "--monitor-interval", "0.5", str(WORKER), str(out), *flags,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [th.load(out / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    return _torchrun(tmp_path_factory.mktemp("died"), "--kill"), _torchrun(tmp_path_factory.mktemp("never_died"))


def test_a_killed_rank_is_restarted_and_the_job_resumes_from_the_last_checkpoint(runs):
    died, _ = runs
    for rank in died:
        assert rank["attempt"] == 1, "torchrun must have restarted the job once"
        # rank 0 wrote the checkpoint after update 4 before rank 1 could pass update 5, and rank 1 died in rollout 6
        assert rank["resumed_from"] in ("rl_model_128_steps.zip", "rl_model_160_steps.zip")
    th.testing.assert_close(died[0]["params"], died[1]["params"], rtol=0, atol=0)


def test_the_resumed_job_has_the_step_count_of_a_run_that_never_died(runs):
    died, never = runs
    assert all(r["attempt"] == 0 and r["resumed_from"] is None for r in never)
    for a, b in zip(died, never, strict=True):
        assert a["num_timesteps"] == b["num_timesteps"] == 8 * 32
        assert a["n_updates"] == b["n_updates"] == 8
        assert th.isfinite(a["params"]).all()


def test_a_restarted_single_process_script_resumes_in_place(tmp_path):
    """The same callback without torchrun: a rerun of the script after a crash (here: after 3 updates)."""
    hp = {"n_steps": 32, "batch_size": 32, "n_epochs": 1, "seed": 0, "grad_var_coef": 0.0, "device": "cpu"}
    first = GRPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=0), kl_coef=0.1, kl_target=0.01, **hp)
    first.learn(3 * 32 + 1, callback=ElasticCheckpointCallback(1, tmp_path))  # saves after updates 1, 2 and 3
    again = GRPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=0), kl_coef=0.1, kl_target=0.01, **hp)
    callback = ElasticCheckpointCallback(1, tmp_path)
    again.learn(0, callback=callback)  # only resumes
    assert callback.resumed_from.name == "rl_model_96_steps.zip"
    assert again.num_timesteps == 96 and again._n_updates == 3
    assert again.kl_coef != 0.1 and again.kl_coef == pytest.approx(first.kl_coef, rel=0.25)
    assert again.policy.optimizer.state, "Adam's moments come back too"
