"""Runs of ``sb3-grpo compare``: every algorithm on every seed, results kept in ``results.json``.

:func:`run_compare` trains each (algorithm, seed) pair in turn and, after each run, rewrites
``results.json`` atomically (temp file + ``os.replace``), so an interrupted comparison keeps every run that
finished and ``--resume`` can skip them. A run records:

- ``curve``: the mean reward of the episodes that finished in each rollout, against env steps;
- ``final``: the mean reward of a separate evaluation of ``eval_episodes`` episodes on an env seeded
  ``EVAL_SEED_OFFSET + seed`` (torch seeded the same way), after training;
- ``wall_time_s`` (``learn()`` only), ``steps_per_s``, ``peak_rss_mb`` (this process's peak resident memory
  during the run; Linux resets the peak before each run), ``cuda_peak_mb``;
- ``kl_to_init``: mean ``KL(pi_final || pi_initial)`` over the evaluation's states, for every algorithm,
  and ``kl_ref``: the last ``train/kl_ref`` the algorithm logged, when it has a reference term.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sb3_grpo.bench.algos import ALGOS, DEFAULT_GROUP_SIZE, AlgoSpec

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
CURVES_FILE = "curves.png"
TENSORBOARD_DIR = "tensorboard"
#: Files and folders ``--overwrite`` removes from an out dir (nothing else is touched).
OUTPUT_NAMES = (RESULTS_FILE, REPORT_FILE, CURVES_FILE, TENSORBOARD_DIR)
SCHEMA_VERSION = 1
EVAL_SEED_OFFSET = 10_000
#: At most this many evaluation states are kept to measure the KL to the initial policy.
KL_MAX_STATES = 2048

#: Hyperparameters of every algorithm on a text env, unless overridden (tuned for the bundled LM on CPU:
#: see the README's comparison section). Rollouts of ``n_envs x n_steps`` tokens; gamma 1 because the
#: reward comes at the end of the completion.
TEXT_DEFAULTS: dict[str, Any] = {
    "n_steps": 32,
    "batch_size": 256,
    "n_epochs": 1,
    "learning_rate": 3e-4,
    "gamma": 1.0,
    "gae_lambda": 0.95,
    "clip_range": 0.2,
    "ent_coef": 0.0,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
}
TEXT_N_ENVS = 16
TEXT_EVAL_EPISODES = 128
CLASSIC_N_ENVS = 1
CLASSIC_EVAL_EPISODES = 10


class CompareError(ValueError):
    """A comparison that cannot run as asked (bad names, numbers, out dir); the message says what to do."""


@dataclass
class CompareConfig:
    """Everything that defines a comparison (what ``results.json`` stores under ``config``).

    :param env_id: A registered Gymnasium id (text env of ``textrl_envs`` or any other).
    :param algos: Names from :data:`~sb3_grpo.bench.algos.ALGOS`.
    :param seeds: Seeds (``--seeds K`` gives ``0 .. K-1``).
    :param timesteps: Env steps per run (tokens, for text envs).
    :param n_envs: Envs stepped in parallel.
    :param group_size: Envs per prompt group for group-advantage algorithms (others use 1).
    :param eval_episodes: Episodes of the final evaluation.
    :param eval_deterministic: Greedy actions in the evaluation (``None``: greedy for non-text envs,
        sampled from the policy for text envs).
    :param device: ``"auto"``, ``"cpu"``, ``"cuda"``.
    :param overrides: Per algorithm name (or ``"*"``), constructor arguments on top of the defaults.
    :param threshold: Reward the ``steps to threshold`` column waits for (``None``: halfway from the untrained
        policy to the best final reward).
    :param text: Whether ``env_id`` is a text env (set by :func:`make_config`).
    :param hyperparameters: The resolved constructor arguments per algorithm (set by :func:`make_config`).
    :param group_sizes: The group size each algorithm's envs use (set by :func:`make_config`).
    """

    env_id: str
    algos: list[str]
    seeds: list[int]
    timesteps: int
    n_envs: int
    group_size: int = DEFAULT_GROUP_SIZE
    eval_episodes: int = TEXT_EVAL_EPISODES
    eval_deterministic: bool | None = None
    device: str = "auto"
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    threshold: float | None = None
    text: bool = False
    hyperparameters: dict[str, dict[str, Any]] = field(default_factory=dict)
    group_sizes: dict[str, int] = field(default_factory=dict)

    def run_key(self, algo: str, seed: int) -> str:
        """Key of one run in ``results.json["runs"]``."""
        return f"{algo}/seed{seed}"

    def fingerprint(self, algo: str) -> dict[str, Any]:
        """What must be equal for a stored run of ``algo`` to count as done under this config."""
        return {
            "env_id": self.env_id,
            "timesteps": self.timesteps,
            "n_envs": self.n_envs,
            "group_size": self.group_sizes.get(algo),
            "eval_episodes": self.eval_episodes,
            "eval_deterministic": self.eval_deterministic,
            "hyperparameters": self.hyperparameters.get(algo),
        }


# ------------------------------------------------------------------------------------------------------------
# Building the config (all validation happens here, before anything touches the disk)
# ------------------------------------------------------------------------------------------------------------


def is_text_env(env_id: str) -> bool:
    """Whether ``env_id`` is one of ``textrl_envs``' text envs."""
    import textrl_envs

    return env_id in textrl_envs.ENV_IDS


def check_env_id(env_id: str) -> None:
    """Raise :class:`CompareError` when ``env_id`` is not a registered Gymnasium id.

    :param env_id: The id.
    """
    import gymnasium as gym

    import textrl_envs

    if env_id in gym.registry:
        return
    close = [k for k in gym.registry if k.lower().split("-")[0] == env_id.lower().split("-")[0]]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise CompareError(
        f"unknown env {env_id!r}{hint}; text envs: {', '.join(textrl_envs.ENV_IDS)}; "
        "or any registered Gymnasium id, e.g. CartPole-v1, Pendulum-v1"
    )


def _jsonable(value: Any) -> Any:
    """Tuples to lists etc., so a config compares equal to itself after a JSON round trip."""
    return json.loads(json.dumps(value, default=str))


def resolve_hyperparameters(
    spec: AlgoSpec, text: bool, n_envs: int, timesteps: int, overrides: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Constructor arguments of one algorithm: env-kind defaults, the algorithm's own, then the overrides.

    For non-text envs the defaults are SB3's, except that ``n_steps`` (and ``batch_size``) are lowered when
    one rollout would not fit in ``timesteps``.

    :param spec: The algorithm.
    :param text: Text env or not.
    :param n_envs: Number of envs.
    :param timesteps: Env steps of the run.
    :param overrides: ``{"*": {...}, name: {...}}``.
    :return: The keyword arguments (JSON-able) passed to the class besides policy, env, seed, device.
    """
    kwargs: dict[str, Any] = dict(TEXT_DEFAULTS) if text else {}
    if not text:
        n_steps = 2048
        if n_steps * n_envs > timesteps:
            n_steps = max(8, timesteps // n_envs)
            kwargs["n_steps"] = n_steps
            kwargs["batch_size"] = min(64, n_steps * n_envs)
    kwargs.update(spec.kwargs)
    kwargs.update(overrides.get("*", {}))
    kwargs.update(overrides.get(spec.name, {}))
    return _jsonable(kwargs)


def make_config(
    env_id: str,
    algos: Sequence[str],
    seeds: int,
    timesteps: int,
    n_envs: int | None = None,
    group_size: int | None = None,
    eval_episodes: int | None = None,
    eval_deterministic: bool | None = None,
    device: str = "auto",
    overrides: dict[str, dict[str, Any]] | None = None,
    threshold: float | None = None,
) -> CompareConfig:
    """Check every input and resolve the defaults; raises :class:`CompareError` with what to do.

    :param env_id: Registered env id.
    :param algos: Algorithm names.
    :param seeds: Number of seeds (>= 1).
    :param timesteps: Env steps per run (>= 1).
    :param n_envs: Envs per run (``None``: 16 for text envs, 1 otherwise).
    :param group_size: Group size of group-advantage algorithms (``None``: 4).
    :param eval_episodes: Evaluation episodes (``None``: 128 for text envs, 10 otherwise).
    :param eval_deterministic: See :class:`CompareConfig`.
    :param device: Torch device for model and text env.
    :param overrides: Per-algorithm constructor overrides (``"*"`` for all).
    :param threshold: See :class:`CompareConfig`.
    :return: The config.
    """
    from sb3_grpo.bench.algos import constructor_parameters

    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        raise CompareError(f"unknown algorithm(s) {', '.join(map(repr, unknown))}; known: {', '.join(ALGOS)}")
    if not algos:
        raise CompareError(f"no algorithm given; known: {', '.join(ALGOS)}")
    for name, value in (("--seeds", seeds), ("--timesteps", timesteps)):
        if not isinstance(value, int) or value < 1:
            raise CompareError(f"{name} must be an integer >= 1, got {value}")
    for name, value in (("--n-envs", n_envs), ("--group-size", group_size), ("--eval-episodes", eval_episodes)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise CompareError(f"{name} must be an integer >= 1, got {value}")
    check_env_id(env_id)
    text = is_text_env(env_id)
    overrides = dict(overrides or {})
    bad = [k for k in overrides if k != "*" and k not in ALGOS]
    if bad:
        raise CompareError(
            f"override for unknown algorithm(s) {', '.join(map(repr, bad))}; known: {', '.join(ALGOS)} (or '*' for all)"
        )
    for name, values in overrides.items():
        targets = list(algos) if name == "*" else [name]
        for target in targets:
            allowed = constructor_parameters(ALGOS[target])
            wrong = sorted(set(values) - allowed)
            if wrong:
                raise CompareError(
                    f"{target} has no parameter {', '.join(map(repr, wrong))}; its parameters: {', '.join(sorted(allowed))}"
                )
    n_envs = n_envs if n_envs is not None else (TEXT_N_ENVS if text else CLASSIC_N_ENVS)
    grouped = [a for a in algos if ALGOS[a].grouped]
    if group_size is not None and group_size < 2 and grouped:
        raise CompareError(f"--group-size must be >= 2 for group-advantage algorithms ({', '.join(grouped)})")
    group = group_size if group_size is not None else DEFAULT_GROUP_SIZE
    if grouped:
        if not text:
            raise CompareError(
                f"{', '.join(grouped)} need(s) envs in prompt groups (group_size > 1), which only the text envs "
                f"({', '.join(sorted(_text_ids()))}) provide; {env_id!r} is not one. Drop them from --algos"
            )
        if n_envs % group != 0:
            raise CompareError(
                f"--n-envs ({n_envs}) must be a multiple of the group size ({group}) for {', '.join(grouped)}"
            )
    cfg = CompareConfig(
        env_id=env_id,
        algos=list(dict.fromkeys(algos)),
        seeds=list(range(seeds)),
        timesteps=timesteps,
        n_envs=n_envs,
        group_size=group,
        eval_episodes=eval_episodes
        if eval_episodes is not None
        else (TEXT_EVAL_EPISODES if text else CLASSIC_EVAL_EPISODES),
        eval_deterministic=eval_deterministic,
        device=device,
        overrides=_jsonable(overrides),
        threshold=threshold,
        text=text,
    )
    for algo in cfg.algos:
        spec = ALGOS[algo]
        cfg.hyperparameters[algo] = resolve_hyperparameters(spec, text, n_envs, timesteps, overrides)
        cfg.group_sizes[algo] = group if spec.grouped else 1
        hp = cfg.hyperparameters[algo]
        batch = hp.get("batch_size", 64)
        if not isinstance(batch, int) or batch < 1:
            raise CompareError(f"{algo}: batch_size must be an integer >= 1, got {batch!r}")
        if hp.get("n_steps", 2048) < 1:
            raise CompareError(f"{algo}: n_steps must be >= 1, got {hp.get('n_steps')!r}")
    return cfg


def _text_ids() -> list[str]:
    import textrl_envs

    return list(textrl_envs.ENV_IDS)


# ------------------------------------------------------------------------------------------------------------
# The out dir and results.json
# ------------------------------------------------------------------------------------------------------------


def prepare_out_dir(out: Path, overwrite: bool, resume: bool) -> bool:
    """Create (or check) the out dir; on any failure nothing is left behind.

    :param out: The folder.
    :param overwrite: Remove this command's previous outputs (results.json, report.md, curves.png,
        tensorboard/) and start afresh; other files are left alone.
    :param resume: Keep previous results and skip the runs they hold.
    :return: Whether the folder was created now.
    :raises CompareError: exists without --overwrite/--resume, is not a folder, or is not writable.
    """
    if overwrite and resume:
        raise CompareError("--overwrite and --resume exclude each other: pick one")
    existed = out.exists()
    if existed and not out.is_dir():
        raise CompareError(f"--out {out} exists and is not a folder")
    if existed and any(out.iterdir()) and not (overwrite or resume):
        raise CompareError(
            f"--out {out} already exists; pass --resume to continue it (completed runs are skipped), "
            "--overwrite to replace its results, or another --out"
        )
    if resume and not (out / RESULTS_FILE).is_file():
        raise CompareError(f"--resume: {out / RESULTS_FILE} does not exist; nothing to resume (drop --resume)")
    created: list[Path] = []
    try:
        missing = [p for p in [out, *out.parents] if not p.exists()]
        out.mkdir(parents=True, exist_ok=True)
        created = missing
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as err:
        for path in created:  # innermost first
            try:
                path.rmdir()
            except OSError:
                pass
        raise CompareError(f"cannot write to --out {out}: {err.strerror or err}; choose a writable folder") from None
    if overwrite:
        for name in OUTPUT_NAMES:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    return not existed


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temp file in the same folder and ``os.replace``.

    :param path: Target file.
    :param data: JSON-able data (NaN is written as ``NaN``).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=_json_default)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def load_results(out: Path) -> dict[str, Any]:
    """Read ``results.json`` of an out dir.

    :param out: The folder.
    :return: The stored results.
    """
    with open(out / RESULTS_FILE) as f:
        return json.load(f)


def environment_info(device: str = "cpu") -> dict[str, Any]:
    """Versions and hardware, for the report.

    :param device: The device the comparison used.
    :return: A JSON-able dict.
    """
    import importlib.metadata as md

    import torch as th

    versions = {}
    for pkg in ("textrl", "stable-baselines3", "gymnasium", "torch", "transformers", "numpy"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "not installed"
    versions["python"] = platform.python_version()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory_gb = None
    try:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    hardware: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": th.get_num_threads(),
        "memory_gb": round(memory_gb, 1) if memory_gb else None,
        "device": device,
        "gpu": th.cuda.get_device_name(0) if th.cuda.is_available() else None,
    }
    try:
        hardware["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return {"versions": versions, "hardware": hardware}


def resolved_device(device: str) -> str:
    """``"auto"`` resolved as SB3 resolves it (``"cuda"`` when available, else ``"cpu"``)."""
    from stable_baselines3.common.utils import get_device

    return str(get_device(device))


def new_results(cfg: CompareConfig, command: str) -> dict[str, Any]:
    """The skeleton of ``results.json`` for a fresh comparison."""
    return {
        "schema": SCHEMA_VERSION,
        "command": command,
        "config": asdict(cfg),
        "environment": environment_info(resolved_device(cfg.device)),
        "status": "running",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "untrained": None,
        "runs": {},
    }


# ------------------------------------------------------------------------------------------------------------
# One run
# ------------------------------------------------------------------------------------------------------------


class _PeakMemory:
    """Peak resident memory of this process during a block (Linux resets the peak via ``clear_refs``).

    Elsewhere the figure is the process's peak since it started (``resource.getrusage``) and ``per_run`` is
    ``False``.
    """

    def __init__(self) -> None:
        self.per_run = False
        self.cuda = False

    def start(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.per_run = self._vm_hwm_kb() is not None
        except OSError:
            self.per_run = False
        try:
            import torch as th

            self.cuda = th.cuda.is_available()
            if self.cuda:
                th.cuda.reset_peak_memory_stats()
        except Exception:  # noqa: BLE001  (memory figures must never break a run)
            self.cuda = False

    @staticmethod
    def _vm_hwm_kb() -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def rss_mb(self) -> float:
        kb = self._vm_hwm_kb() if self.per_run else None
        if kb is None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            kb = peak / 1024 if sys.platform == "darwin" else peak  # bytes on macOS, KiB on Linux
        return round(kb / 1024, 1)

    def cuda_mb(self) -> float | None:
        if not self.cuda:
            return None
        import torch as th

        return round(th.cuda.max_memory_allocated() / 2**20, 1)


def _make_callback(progress: Any, extra: Sequence[Any]) -> tuple[Any, dict[str, list]]:
    """The callback that records the reward curve and moves the progress bar, plus ``extra`` callbacks."""
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList

    curve: dict[str, list] = {"steps": [], "reward": [], "episodes": []}

    class CurveCallback(BaseCallback):
        def _on_training_start(self) -> None:
            self._episodes: list[float] = []
            self._last = self.num_timesteps

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", ()):
                episode = info.get("episode")
                if episode is not None:
                    self._episodes.append(float(episode["r"]))
            if progress is not None:
                progress.update(self.num_timesteps - self._last)
            self._last = self.num_timesteps
            return True

        def _on_rollout_end(self) -> None:
            if self._episodes:
                curve["steps"].append(int(self.num_timesteps))
                curve["reward"].append(float(np.mean(self._episodes)))
                curve["episodes"].append(len(self._episodes))
            self._episodes = []

    return CallbackList([CurveCallback(), *extra]), curve


def make_env(cfg: CompareConfig, algo: str, seed: int, n_envs: int | None = None, group_size: int | None = None):
    """The SB3 ``VecEnv`` of one run (or of its evaluation).

    :param cfg: The comparison.
    :param algo: Algorithm name (decides the group size).
    :param seed: Seed of the env's first reset.
    :param n_envs: Override ``cfg.n_envs``.
    :param group_size: Override the algorithm's group size.
    :return: A ``VecEnv`` with episode statistics (``VecMonitor`` / ``Monitor``).
    """
    n = cfg.n_envs if n_envs is None else n_envs
    if cfg.text:
        from textrl_envs.sb3 import make_vec_env

        g = cfg.group_sizes.get(algo, 1) if group_size is None else group_size
        return make_vec_env(cfg.env_id, n_envs=n, group_size=g, device=cfg.device, seed=seed)
    from stable_baselines3.common.env_util import make_vec_env

    return make_vec_env(cfg.env_id, n_envs=n, seed=seed)


def _policy_for(spec: AlgoSpec, env: Any) -> Any:
    from gymnasium import spaces

    if isinstance(env.observation_space, spaces.Dict):
        if "input_ids" in env.observation_space.spaces:
            if spec.cls_name == "PPO":
                from sb3_grpo.policies import CausalLMPolicy

                return CausalLMPolicy
            return "CausalLMPolicy"
        return "MultiInputPolicy"
    return "MlpPolicy"


def _policy_kl(policy: Any, reference: Any, observations: list[Any]) -> float | None:
    """Mean ``KL(policy || reference)`` over the given observation batches (``None`` if not computable)."""
    import torch as th

    if reference is None or not observations:
        return None
    try:
        total, count = 0.0, 0
        with th.no_grad():
            for obs in observations:
                tensor, _ = policy.obs_to_tensor(obs)
                dist = policy.get_distribution(tensor).distribution
                ref = reference.get_distribution(tensor).distribution
                kl = th.distributions.kl_divergence(dist, ref)
                if kl.dim() > 1:
                    kl = kl.sum(dim=-1)
                total += float(kl.sum())
                count += int(kl.numel())
        return total / count if count else None
    except Exception:  # noqa: BLE001  (a missing KL must not lose the run)
        return None


def evaluate(model: Any, cfg: CompareConfig, algo: str, seed: int, reference: Any = None) -> dict[str, Any]:
    """Evaluate ``model`` on a separately seeded env (``EVAL_SEED_OFFSET + seed``), torch seeded the same way.

    :param model: Trained (or untrained) model.
    :param cfg: The comparison.
    :param algo: Algorithm name.
    :param seed: The run's seed.
    :param reference: The initial policy, to measure ``KL(pi || pi_init)`` on the evaluation states.
    :return: ``reward_mean``, ``reward_std``, ``episodes``, ``deterministic``, ``eval_time_s``, ``kl_to_init``.
    """
    import torch as th
    from stable_baselines3.common.evaluation import evaluate_policy

    deterministic = (not cfg.text) if cfg.eval_deterministic is None else cfg.eval_deterministic
    eval_seed = EVAL_SEED_OFFSET + seed
    n_envs = min(cfg.eval_episodes, TEXT_N_ENVS) if cfg.text else 1
    env = make_env(cfg, algo, eval_seed, n_envs=n_envs, group_size=1)
    th.manual_seed(eval_seed)
    states: list[Any] = []
    kept = [0]

    def keep_states(local: dict[str, Any], _globals: dict[str, Any]) -> None:
        if local.get("i") == 0 and kept[0] < KL_MAX_STATES:
            obs = local["observations"]
            states.append({k: np.array(v) for k, v in obs.items()} if isinstance(obs, dict) else np.array(obs))
            kept[0] += n_envs

    start = time.perf_counter()
    try:
        rewards, _lengths = evaluate_policy(
            model,
            env,
            n_eval_episodes=cfg.eval_episodes,
            deterministic=deterministic,
            return_episode_rewards=True,
            callback=keep_states if reference is not None else None,
            warn=False,
        )
    finally:
        env.close()
    elapsed = time.perf_counter() - start
    kl = _policy_kl(model.policy, reference, states)
    return {
        "reward_mean": float(np.mean(rewards)),
        "reward_std": float(np.std(rewards)),
        "episodes": len(rewards),
        "deterministic": deterministic,
        "eval_seed": eval_seed,
        "eval_time_s": round(elapsed, 2),
        "kl_to_init": kl,
    }


def build_model(cfg: CompareConfig, algo: str, seed: int, tensorboard: Path | None = None) -> Any:
    """Build the model of one run (env included).

    :param cfg: The comparison.
    :param algo: Algorithm name.
    :param seed: The run's seed.
    :param tensorboard: Folder for this run's tensorboard logs (``None``: no logger is configured).
    :return: The model.
    """
    spec = ALGOS[algo]
    env = make_env(cfg, algo, seed)
    kwargs = dict(cfg.hyperparameters[algo])
    if "adaptive_clip" in kwargs and isinstance(kwargs["adaptive_clip"], list):
        kwargs["adaptive_clip"] = tuple(kwargs["adaptive_clip"])
    model = spec.make(_policy_for(spec, env), env, seed=seed, device=cfg.device, verbose=0, **kwargs)
    if tensorboard is not None:
        from stable_baselines3.common.logger import configure

        model.set_logger(configure(str(tensorboard), ["tensorboard"]))
    return model


def run_one(
    cfg: CompareConfig,
    algo: str,
    seed: int,
    out: Path,
    progress: Any = None,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    """Train one algorithm on one seed, evaluate it, and return its results.

    :param cfg: The comparison.
    :param algo: Algorithm name.
    :param seed: Seed.
    :param out: The out dir (tensorboard logs go to ``out/tensorboard/<algo>/seed<seed>``).
    :param progress: A ``tqdm`` bar advanced by env steps (or ``None``).
    :param callbacks: Extra SB3 callbacks (tests use one to simulate Ctrl-C).
    :return: The run's entry of ``results.json["runs"]``.
    """
    import torch as th

    tb_dir = out / TENSORBOARD_DIR / algo / f"seed{seed}"
    if tb_dir.exists():  # a run interrupted earlier: start its logs afresh
        shutil.rmtree(tb_dir)
    memory = _PeakMemory()
    memory.start()
    model = build_model(cfg, algo, seed, tb_dir)
    reference = copy.deepcopy(model.policy)
    reference.set_training_mode(False)
    callback, curve = _make_callback(progress, callbacks)
    start = time.perf_counter()
    model.learn(cfg.timesteps, callback=callback)
    wall = time.perf_counter() - start
    steps = int(model.num_timesteps)
    rss, cuda = memory.rss_mb(), memory.cuda_mb()
    kl_ref = model.logger.name_to_value.get("train/kl_ref") if getattr(model, "kl_coef", 0) else None
    final = evaluate(model, cfg, algo, seed, reference=reference)
    model.get_env().close()
    del model, reference
    if th.cuda.is_available():
        th.cuda.empty_cache()
    return {
        "algo": algo,
        "seed": seed,
        "status": "complete",
        "fingerprint": cfg.fingerprint(algo),
        "curve": curve,
        "final": final,
        "env_steps": steps,
        "wall_time_s": round(wall, 2),
        "steps_per_s": round(steps / wall, 1) if wall > 0 else None,
        "step_unit": "tokens" if cfg.text else "steps",
        "peak_rss_mb": rss,
        "peak_rss_per_run": memory.per_run,
        "cuda_peak_mb": cuda,
        "kl_to_init": final.pop("kl_to_init"),
        "kl_ref": None if kl_ref is None else float(kl_ref),
    }


def evaluate_untrained(cfg: CompareConfig) -> dict[str, Any]:
    """Evaluate the first algorithm's freshly built policy (seed 0): the reward to beat."""
    algo = cfg.algos[0]
    model = build_model(cfg, algo, cfg.seeds[0])
    result = evaluate(model, cfg, algo, cfg.seeds[0])
    result.pop("kl_to_init", None)
    result["algo"] = algo
    model.get_env().close()
    return result


# ------------------------------------------------------------------------------------------------------------
# The whole comparison
# ------------------------------------------------------------------------------------------------------------


def planned_runs(cfg: CompareConfig) -> list[tuple[str, int]]:
    """Every (algorithm, seed) pair, seed-major so that an interrupted comparison has every algorithm early."""
    return [(algo, seed) for seed in cfg.seeds for algo in cfg.algos]


def run_compare(
    cfg: CompareConfig,
    out: Path,
    command: str,
    resume: bool = False,
    progress: bool | None = None,
    callbacks_for: Callable[[str, int], Sequence[Any]] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the comparison, writing ``results.json`` after every run; report and curves at the end.

    On ``KeyboardInterrupt`` the completed runs are kept, ``status`` becomes ``"interrupted"``, the report
    is written with the missing runs marked, and the ``KeyboardInterrupt`` is re-raised.

    :param cfg: The comparison (from :func:`make_config`).
    :param out: The prepared out dir (:func:`prepare_out_dir`).
    :param command: The exact command line, for the report.
    :param resume: Keep the runs in ``out/results.json`` whose fingerprint matches, skip them.
    :param progress: Show a tqdm bar (``None``: only on a terminal).
    :param callbacks_for: ``f(algo, seed) -> extra SB3 callbacks`` (tests simulate Ctrl-C with it).
    :param log: Where one-line messages go.
    :return: The results.
    """
    from tqdm.auto import tqdm

    from sb3_grpo.bench.report import write_report

    if cfg.text:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Loading weights" bar per run would break the progress bar
    results = new_results(cfg, command)
    if resume:
        old = load_results(out)
        kept = 0
        for key, run in old.get("runs", {}).items():
            algo = run.get("algo")
            if algo in cfg.algos and run.get("seed") in cfg.seeds and run.get("status") == "complete":
                if run.get("fingerprint") == _jsonable(cfg.fingerprint(algo)):
                    results["runs"][key] = run
                    kept += 1
                else:
                    log(f"resume: {key} was run with other settings; running it again")
        if old.get("untrained") and old.get("config", {}).get("env_id") == cfg.env_id:
            results["untrained"] = old["untrained"]
        results["started"] = old.get("started", results["started"])
        log(f"resume: keeping {kept} completed run(s) from {out / RESULTS_FILE}")
    path = out / RESULTS_FILE
    write_json_atomic(path, results)
    started = time.perf_counter()

    todo = [(a, s) for a, s in planned_runs(cfg) if cfg.run_key(a, s) not in results["runs"]]
    bar = tqdm(
        total=len(todo) * cfg.timesteps,
        unit="tok" if cfg.text else "step",
        unit_scale=True,
        dynamic_ncols=True,
        disable=(not sys.stderr.isatty()) if progress is None else not progress,
    )
    try:
        if results["untrained"] is None:
            bar.set_description("untrained policy (eval)")
            results["untrained"] = evaluate_untrained(cfg)
            write_json_atomic(path, results)
        for algo, seed in todo:
            bar.set_description(f"{algo} seed {seed}")
            extra = callbacks_for(algo, seed) if callbacks_for is not None else ()
            run = run_one(cfg, algo, seed, out, progress=bar, callbacks=extra)
            results["runs"][cfg.run_key(algo, seed)] = run
            write_json_atomic(path, results)
            bar.write(
                f"{algo} seed {seed}: final reward {run['final']['reward_mean']:.3f} "
                f"({run['wall_time_s']:.0f} s, {run['steps_per_s']:.0f} {run['step_unit']}/s)"
            )
    except KeyboardInterrupt:
        bar.close()
        results["status"] = "interrupted"
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_json_atomic(path, results)
        write_report(results, out)
        raise
    bar.close()
    results["status"] = "complete"
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results["session_wall_s"] = round(time.perf_counter() - started, 1)
    write_json_atomic(path, results)
    write_report(results, out)
    return results
