"""Nothing waits forever: rewards have a default timeout, Ctrl-C stops a process whose reward hangs at once, and a rank
that stalls after start-up stops the others with a clear error."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import pytest

import textrl_envs  # noqa: F401  (registers the env ids)
from sb3_grpo import distributed

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


def test_the_reward_timeout_has_a_large_documented_default():
    from textrl_envs.rewards.base import DEFAULT_REWARD_TIMEOUT

    assert DEFAULT_REWARD_TIMEOUT >= 60
    for env_id in ("TextGen-v0", "GuessNumber-v0"):
        assert gym.make(env_id).unwrapped.text_spec.reward_timeout == DEFAULT_REWARD_TIMEOUT
    vec = gym.make_vec("TextGen-v0", num_envs=2)
    assert vec.text_spec.reward_timeout == DEFAULT_REWARD_TIMEOUT
    vec.close()
    assert gym.make("TextGen-v0", reward_timeout=None).unwrapped.text_spec.reward_timeout is None  # asked for
    from textrl_envs.core import build_spec

    assert "600 s" in build_spec.__doc__


def test_ctrl_c_stops_a_process_whose_reward_hangs_at_once(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys, threading
            # A terminal's Ctrl-C reaches a process that turns SIGINT into KeyboardInterrupt. A process started from
            # a test runner inherits the runner's SIGINT state (ignored or blocked, after some libraries' child
            # processes): restore a terminal's, and say what was inherited.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
            print("inherited SIGINT:", signal.getsignal(signal.SIGINT), "blocked:", sorted(blocked), file=sys.stderr)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            import numpy as np
            from textrl_envs.vector import TextGenVectorEnv

            def hangs(prompts, completions, **kwargs):
                threading.Event().wait()  # never returns

            env = TextGenVectorEnv(num_envs=2, prompts=["the movie was"], reward=hangs, max_new_tokens=1, device="cpu")
            env.reset(seed=0)
            env.defer_rewards(True)
            env.step(np.full(2, 5))  # the episodes end: scored in the reward worker, which hangs
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C
            print("waiting", flush=True)
            env.collect_rewards()
            """
        )
    )
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the process did not exit after Ctrl-C: a reward thread kept it alive; stdout {out[-500:]!r}, "
                    f"stderr {err[-2000:]!r}")  # fmt: skip
    assert b"waiting" in out and b"KeyboardInterrupt" in err
    assert proc.returncode != 0 and time.monotonic() - start < 45


def test_a_bad_process_group_timeout_is_refused(monkeypatch):
    assert distributed.process_group_timeout() == distributed.PG_TIMEOUT_S
    monkeypatch.setenv("SB3_GRPO_PG_TIMEOUT", "2.5")
    assert distributed.process_group_timeout() == 2.5
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv("SB3_GRPO_PG_TIMEOUT", bad)
        with pytest.raises(ValueError, match="SB3_GRPO_PG_TIMEOUT must be a number of seconds"):
            distributed.process_group_timeout()


def test_a_stalled_rank_stops_the_live_one_with_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = Path(__file__).with_name("_stall_worker.py")
    procs = []
    for rank in (0, 1):
        env = {**_env(), "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "SB3_GRPO_PG_TIMEOUT": "3"}  # fmt: skip
        log = open(tmp_path / f"rank{rank}.log", "w")  # noqa: SIM115  (closed below)
        procs.append((subprocess.Popen([sys.executable, str(worker)], env=env, stdout=log, stderr=log), log))
    start = time.monotonic()
    try:
        rank0, _ = procs[0]
        try:
            rank0.wait(timeout=150)
        except subprocess.TimeoutExpired:
            pytest.fail("rank 0 kept waiting for the stalled rank (no process-group timeout)")
        elapsed = time.monotonic() - start
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    text = (tmp_path / "rank0.log").read_text()
    assert rank0.returncode != 0 and "finished" not in text
    assert "waited SB3_GRPO_PG_TIMEOUT=3 s for the other ranks" in text and "a rank is stalled" in text
    assert "rank 1 stalls" in (tmp_path / "rank1.log").read_text()
    assert elapsed < 140
