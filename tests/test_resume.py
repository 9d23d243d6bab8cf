"""Save / load / resume: round trips, resume == continue, SIGKILLed training processes, misbehaving rewards.

The SIGKILL tests run ``tests/_resume_worker.py`` in a real subprocess that trains with
:class:`~sb3_grpo.callbacks.AtomicCheckpointCallback` and reports its progress to a file *after* the checkpoint
callback ran; the test kills it with SIGKILL (also while a checkpoint is half-written, with a simulated slow
disk), then checks that every file under a checkpoint name loads, that the newest one is at most one
checkpoint interval behind the last reported timestep, and that training resumes from it.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

from sb3_grpo import GRPO
from sb3_grpo.callbacks import (
    AtomicCheckpointCallback,
    is_complete_checkpoint,
    latest_checkpoint,
    nonfinite_parameters,
)
from textrl_envs.sb3 import make_vec_env

WORKER = Path(__file__).with_name("_resume_worker.py")
sys.path.insert(0, str(WORKER.parent))
import _resume_worker
from helpers import params, quiet

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and fork semantics are POSIX")


def _assert_same_params(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert th.equal(a[k], b[k]), k


def _optimizer_tensors(model):
    state = model.policy.optimizer.state_dict()
    return [(k, v) for s in state["state"].values() for k, v in sorted(s.items())], state["param_groups"]


def _assert_same_optimizer(a, b):
    (sa, ga), (sb, gb) = _optimizer_tensors(a), _optimizer_tensors(b)
    assert len(sa) == len(sb) > 0
    for (ka, va), (kb, vb) in zip(sa, sb):
        assert ka == kb and th.equal(th.as_tensor(va), th.as_tensor(vb))
    assert [g["lr"] for g in ga] == [g["lr"] for g in gb]


def _cartpole_env():
    return sb3_make_vec_env("CartPole-v1", n_envs=2, seed=0)


def _text_env():
    return make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=6)


def _lr(progress_remaining):
    return 1e-3 * progress_remaining


MODELS = {
    "mlp": (
        _cartpole_env,
        lambda env: GRPO(
            "MlpPolicy",
            env,
            n_steps=32,
            batch_size=32,
            n_epochs=2,
            learning_rate=_lr,
            explore_alpha=0.3,
            seed=0,
            device="cpu",
        ),
        64,
    ),
    "causal_lm": (
        _text_env,
        lambda env: GRPO(
            "CausalLMPolicy",
            env,
            n_steps=8,
            batch_size=16,
            n_epochs=1,
            learning_rate=_lr,
            explore_alpha=0.3,
            seed=0,
            device="cpu",
        ),
        32,
    ),
}


# ---------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_save_load_round_trip(tmp_path, kind):
    make_env, make_model, steps = MODELS[kind]
    model = quiet(make_model(make_env()))
    model.learn(steps)
    model.save(tmp_path / "model.zip")
    loaded = GRPO.load(tmp_path / "model.zip", env=make_env(), device="cpu")
    _assert_same_params(params(model), params(loaded))
    _assert_same_optimizer(model, loaded)
    assert loaded.num_timesteps == model.num_timesteps == steps
    assert loaded._n_updates == model._n_updates
    assert loaded._current_progress_remaining == model._current_progress_remaining
    assert loaded.current_explore_alpha() == model.current_explore_alpha()
    obs = make_env().reset()
    for m in (model, loaded):
        reset = getattr(m.policy, "reset_cache", None)
        if reset:
            reset()
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    with th.no_grad():
        obs_t = model.policy.obs_to_tensor(obs)[0]
        np.testing.assert_array_equal(
            model.policy.predict_values(obs_t).numpy(), loaded.policy.predict_values(obs_t).numpy()
        )


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_train_save_load_train_equals_continuing(tmp_path, kind):
    """train N, save; then (a) continue in process, (b) load and continue: same parameters, optimizer state,
    timesteps and schedules (learning rate and exploration decay over the combined N + M), when both continue
    from a reset env with the same seed (SB3 does not save the env's mid-episode state or the global RNGs)."""
    make_env, make_model, steps = MODELS[kind]
    a = quiet(make_model(make_env()))
    a.learn(steps)
    a.save(tmp_path / "model.zip")
    b = quiet(GRPO.load(tmp_path / "model.zip", env=make_env(), device="cpu"))
    for m in (a, b):  # one after the other: the seeded RNGs are global
        m.set_random_seed(7)
        m._last_obs = None  # a reset env, as after loading
        if hasattr(m.policy, "reset_cache"):
            m.policy.reset_cache()
        m.learn(steps, reset_num_timesteps=False)
    assert a.num_timesteps == b.num_timesteps == 2 * steps
    assert a._n_updates == b._n_updates
    _assert_same_params(params(a), params(b))
    _assert_same_optimizer(a, b)
    lr = a.policy.optimizer.param_groups[0]["lr"]
    assert lr == b.policy.optimizer.param_groups[0]["lr"] < 1e-3  # the linear schedule went on, not restarted


# ---------------------------------------------------------------------------------------------- SIGKILL
_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_stray_workers():
    """Kill any worker a failing test left running (they train forever otherwise)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _start(out: Path, kind: str, *flags: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    with open(out / "worker.log", "ab") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, str(WORKER), str(out), kind, *flags], stdout=log, stderr=log, env=env)
    _STARTED.append(proc)
    return proc


def _progress(out: Path) -> int:
    try:
        lines = (out / "progress.txt").read_text().split()
    except FileNotFoundError:
        return 0
    return max((int(x) for x in lines), default=0)


def _wait(proc: subprocess.Popen, out: Path, condition, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(
                f"worker exited ({proc.returncode}) before {what}:\n{(out / 'worker.log').read_text()[-3000:]}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}:\n{(out / 'worker.log').read_text()[-3000:]}")
        time.sleep(0.005)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("rl_model_") and p.suffix == ".zip")


def _check_all_load(folder: Path, env) -> None:
    """Every file under a checkpoint name is complete and loads with finite weights."""
    for path in _checkpoints(folder):
        assert is_complete_checkpoint(path), path
        model = GRPO.load(path, env=env, device="cpu")
        assert not nonfinite_parameters(model.policy)
        assert f"_{model.num_timesteps}_steps" in path.name


@pytest.mark.parametrize("kind", ["cartpole", "text"])
def test_sigkill_loses_at_most_one_checkpoint_interval(tmp_path, kind):
    interval = _resume_worker.SAVE_FREQ[kind] * _resume_worker.N_ENVS[kind]
    proc = _start(tmp_path, kind)
    _wait(proc, tmp_path, lambda: _progress(tmp_path) >= 3 * interval + 8, "three checkpoints")
    _kill(proc)
    reported = _progress(tmp_path)
    ckpt = tmp_path / "ckpt"
    env = _resume_worker.make_env(kind)
    _check_all_load(ckpt, env)
    last = latest_checkpoint(ckpt)
    steps = GRPO.load(last, env=env, device="cpu").num_timesteps
    assert reported - interval < steps <= reported + interval  # at most one interval lost
    assert steps == (reported // interval) * interval or steps > reported  # the one of the last interval (or newer)

    # resume in a fresh process from the newest checkpoint and keep training past it
    (tmp_path / "progress.txt").unlink()
    proc = _start(tmp_path, kind, "--resume")
    _wait(proc, tmp_path, lambda: _progress(tmp_path) >= steps + interval, "progress after resuming")
    _kill(proc)
    assert latest_checkpoint(ckpt) != last
    _check_all_load(ckpt, env)


def test_sigkill_while_a_checkpoint_is_half_written(tmp_path):
    interval = _resume_worker.SAVE_FREQ["cartpole"]
    atomic, plain = tmp_path / "atomic", tmp_path / "plain"
    procs = {
        out: _start(out, "cartpole", "--slow-save", *(["--plain"] if out is plain else [])) for out in (atomic, plain)
    }
    for out, proc in procs.items():
        _wait(proc, out, lambda out=out: (out / "writing").exists(), "a half-written checkpoint")
        _kill(proc)

    # atomic: the half-written file is a temp file; every checkpoint name holds a complete model
    env = _resume_worker.make_env("cartpole")
    names = sorted(p.name for p in (atomic / "ckpt").iterdir())
    assert names == [
        f".rl_model_192_steps.zip.{procs[atomic].pid}.tmp",
        "rl_model_128_steps.zip",
        "rl_model_64_steps.zip",
    ]
    _check_all_load(atomic / "ckpt", env)
    last = latest_checkpoint(atomic / "ckpt")
    assert last.name == "rl_model_128_steps.zip"
    model = GRPO.load(last, env=env, device="cpu")
    assert model.num_timesteps == 128 >= _progress(atomic) - interval
    # resuming with the callback cleans up the dead process's temp file
    quiet(model).learn(64, reset_num_timesteps=False, callback=AtomicCheckpointCallback(64, atomic / "ckpt"))
    assert sorted(p.name for p in (atomic / "ckpt").iterdir()) == [
        "rl_model_128_steps.zip",
        "rl_model_192_steps.zip",
        "rl_model_64_steps.zip",
    ]

    # SB3's plain CheckpointCallback, same kill: model.save is atomic itself, so here too every checkpoint name holds a
    # complete model and the half-written zip is a temp file
    half = plain / "ckpt" / f".rl_model_192_steps.zip.{procs[plain].pid}.tmp"
    assert sorted(p.name for p in (plain / "ckpt").iterdir()) == [half.name, *names[1:]]
    _check_all_load(plain / "ckpt", env)
    # a torn file under a checkpoint name (written by another tool) does not load, with a clear error
    torn = plain / "ckpt" / "rl_model_192_steps.zip"
    torn.write_bytes(half.read_bytes())
    assert not is_complete_checkpoint(torn)
    with pytest.raises(ValueError, match="is not a complete saved model .*latest_checkpoint"):
        GRPO.load(torn, env=env, device="cpu")
    assert latest_checkpoint(plain / "ckpt").name == "rl_model_128_steps.zip"  # and latest_checkpoint skips it


# ---------------------------------------------------------------------------------------------- misbehaving rewards
_RELEASE = threading.Event()


class Misbehaving:
    """A reward that behaves for ``good_calls`` calls, then raises, returns the wrong shape, or hangs."""

    def __init__(self, mode: str, good_calls: int):
        self.mode, self.good_calls, self.calls = mode, good_calls, 0
        self.__name__ = f"misbehaving_{mode}"

    def __call__(self, prompts, completions):
        self.calls += 1
        if self.calls > self.good_calls:
            if self.mode == "raises":
                raise ConnectionError("reward server went away")
            if self.mode == "wrong_shape":
                return [0.0] * (len(completions) + 1)
            _RELEASE.wait(30)  # hangs
        return [float(len(c)) / 10 for c in completions]


@pytest.fixture
def release_hung_rewards():
    _RELEASE.clear()
    yield
    _RELEASE.set()


@pytest.mark.parametrize(
    "mode, error, match",
    [
        ("raises", RuntimeError, r"reward 'misbehaving_raises' raised ConnectionError: reward server went away"),
        ("wrong_shape", ValueError, r"reward 'misbehaving_wrong_shape' returned 3 value\(s\) .* for 2 completions"),
        ("hangs", TimeoutError, r"reward 'misbehaving_hangs' did not return within reward_timeout=0.5 s"),
    ],
)
def test_misbehaving_reward_gives_a_clear_error_and_the_run_resumes(tmp_path, release_hung_rewards, mode, error, match):
    def env_with(reward):
        return make_vec_env(
            "TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=4, reward=reward, reward_timeout=0.5
        )

    model = quiet(
        GRPO(
            "CausalLMPolicy",
            env_with(Misbehaving(mode, good_calls=6)),
            n_steps=8,
            batch_size=16,
            n_epochs=1,
            seed=0,
            device="cpu",
        )
    )
    with pytest.raises(error, match=match):
        model.learn(10_000, callback=AtomicCheckpointCallback(8, tmp_path))
    last = latest_checkpoint(tmp_path)
    assert last is not None
    assert all(is_complete_checkpoint(p) for p in tmp_path.iterdir())
    resumed = quiet(GRPO.load(last, env=env_with(Misbehaving(mode, good_calls=10**9)), device="cpu"))
    start = resumed.num_timesteps
    assert start >= 16
    resumed.learn(32, reset_num_timesteps=False, callback=AtomicCheckpointCallback(8, tmp_path))
    assert resumed.num_timesteps == start + 32
    assert not nonfinite_parameters(resumed.policy)
