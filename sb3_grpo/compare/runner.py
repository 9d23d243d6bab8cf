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
  and ``kl_ref``: the last ``train/kl_ref`` the algorithm logged, when it has a reference term;
- ``lm_eval`` (with ``--eval-every``): the metrics of :class:`~sb3_grpo.callbacks.LMEvalCallback` on held-out
  prompts (:mod:`sb3_grpo.compare.heldout`), ``during`` training and ``final`` (once more after training).
"""

from __future__ import annotations

import copy
import json
import resource
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sb3_grpo.compare.algos import ALGOS, AlgoSpec
from sb3_grpo.compare.config import TEXT_N_ENVS, CompareConfig, CompareError
from sb3_grpo.compare.heldout import make_eval_callback
from sb3_grpo.compare.results import (
    RESULTS_FILE,
    TENSORBOARD_DIR,
    load_results,
    new_results,
)
from sb3_grpo.file_io import to_jsonable, write_json_atomic, write_text_atomic

EVAL_SEED_OFFSET = 10_000
#: At most this many evaluation states are kept to measure the KL to the initial policy.
KL_MAX_STATES = 2048


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


def _make_callback(report: Callable[[int, float | None], None] | None, extra: Sequence[Any]) -> tuple[Any, dict]:
    """The callback that records the reward curve and reports progress, plus ``extra`` callbacks.

    :param report: ``f(env_steps, latest_reward)``, called at most twice a second and at every rollout's end.
    :param extra: More SB3 callbacks.
    """
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList

    curve: dict[str, list] = {"steps": [], "reward": [], "episodes": []}

    class CurveCallback(BaseCallback):
        def _on_training_start(self) -> None:
            self._episodes: list[dict] = []
            self._reported = 0.0

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", ()):
                episode = info.get("episode")
                if episode is not None:  # read at the rollout's end: GRPO lands rewards scored in the background
                    self._episodes.append(episode)  # in these records before then
            now = time.perf_counter()
            if report is not None and now - self._reported > 0.5:
                report(int(self.num_timesteps), None)
                self._reported = now
            return True

        def _on_rollout_end(self) -> None:
            if self._episodes:
                curve["steps"].append(int(self.num_timesteps))
                curve["reward"].append(float(np.mean([float(episode["r"]) for episode in self._episodes])))
                curve["episodes"].append(len(self._episodes))
            if report is not None:
                report(int(self.num_timesteps), curve["reward"][-1] if curve["reward"] else None)
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
        from sb3_grpo.compare.heldout import train_env_kwargs
        from textrl_envs.sb3 import make_vec_env

        g = cfg.group_sizes.get(algo, 1) if group_size is None else group_size
        return make_vec_env(cfg.env_id, n_envs=n, group_size=g, device=cfg.device, seed=seed, **train_env_kwargs(cfg))
    from stable_baselines3.common.env_util import make_vec_env

    return make_vec_env(cfg.env_id, n_envs=n, seed=seed, env_kwargs=cfg.env_kwargs or None)


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


def _policy_kl(policy: Any, initial: Any, observations: list[Any]) -> float | None:
    """Mean ``KL(policy || initial)`` over the given observation batches (``None`` if not computable)."""
    import torch as th

    if initial is None or not observations:
        return None
    try:
        total, count = 0.0, 0
        with th.no_grad():
            for obs in observations:
                tensor, _ = policy.obs_to_tensor(obs)
                dist = policy.get_distribution(tensor).distribution
                ref = initial.get_distribution(tensor).distribution
                kl = th.distributions.kl_divergence(dist, ref)
                if kl.dim() > 1:
                    kl = kl.sum(dim=-1)
                total += float(kl.sum())
                count += int(kl.numel())
        return total / count if count else None
    except Exception:  # noqa: BLE001  (a missing KL must not lose the run)
        return None


def evaluate(model: Any, cfg: CompareConfig, algo: str, seed: int, initial: Any = None) -> dict[str, Any]:
    """Evaluate ``model`` on a separately seeded env (``EVAL_SEED_OFFSET + seed``), torch seeded the same way.

    :param model: Trained (or untrained) model.
    :param cfg: The comparison.
    :param algo: Algorithm name.
    :param seed: The run's seed.
    :param initial: The initial policy, to measure ``KL(pi || pi_init)`` on the evaluation states.
    :return: ``reward_mean``, ``reward_std``, ``episodes``, ``deterministic``, ``eval_time_s``, ``kl_to_init`` and
        ``samples`` (a text env's first :data:`SAMPLES_KEPT` episodes, :func:`completion_sample`).
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

    samples: list[dict[str, Any]] = []

    def keep_states(local: dict[str, Any], _globals: dict[str, Any]) -> None:
        if initial is not None and local.get("i") == 0 and kept[0] < KL_MAX_STATES:
            obs = local["observations"]
            states.append({k: np.array(v) for k, v in obs.items()} if isinstance(obs, dict) else np.array(obs))
            kept[0] += n_envs
        info = local.get("info") or {}
        if local.get("done") and "completion" in info and len(samples) < SAMPLES_KEPT:
            samples.append(completion_sample(info, local.get("reward")))

    start = time.perf_counter()
    try:
        rewards, _lengths = evaluate_policy(
            model,
            env,
            n_eval_episodes=cfg.eval_episodes,
            deterministic=deterministic,
            return_episode_rewards=True,
            callback=keep_states,
            warn=False,
        )
    finally:
        env.close()
    elapsed = time.perf_counter() - start
    kl = _policy_kl(model.policy, initial, states)
    return {
        "reward_mean": float(np.mean(rewards)),
        "reward_std": float(np.std(rewards)),
        "episodes": len(rewards),
        "deterministic": deterministic,
        "eval_seed": eval_seed,
        "eval_time_s": round(elapsed, 2),
        "kl_to_init": kl,
        "samples": samples,
    }


#: Completions of the final evaluation kept per run (``samples.jsonl`` in the run's folder).
SAMPLES_KEPT = 8


def completion_sample(info: dict[str, Any], reward: Any) -> dict[str, Any]:
    """One evaluation episode of a text env as a row of ``samples.jsonl``: its prompt, completion (or transcript),
    reward and turns."""
    row: dict[str, Any] = {"prompt": info.get("prompt"), "completion": info.get("completion")}
    row["reward"] = float(info["reward"]) if "reward" in info else (None if reward is None else float(reward))
    for key in ("turns", "transcript"):
        if key in info:
            row[key] = to_jsonable(info[key])
    return row


def build_model(
    cfg: CompareConfig, algo: str, seed: int, tensorboard: Path | None = None, track: Sequence[str] = ()
) -> Any:
    """Build the model of one run (env included).

    :param cfg: The comparison.
    :param algo: Algorithm name.
    :param seed: The run's seed.
    :param tensorboard: Folder for this run's tensorboard logs (``None``: no logger is configured).
    :param track: Trackers that also get the run's logs and config (``"wandb"``, ``"mlflow"``; needs ``tensorboard``).
    :return: The model.
    """
    spec = ALGOS[algo]
    env = make_env(cfg, algo, seed)
    kwargs = dict(cfg.hyperparameters[algo])
    if "adaptive_clip" in kwargs and isinstance(kwargs["adaptive_clip"], list):
        kwargs["adaptive_clip"] = tuple(kwargs["adaptive_clip"])
    model = spec.make(_policy_for(spec, env), env, seed=seed, device=cfg.device, verbose=0, **kwargs)
    if tensorboard is not None and track:
        model.set_logger(_tracked_logger(cfg, algo, seed, tensorboard, track, model))
    elif tensorboard is not None:
        from stable_baselines3.common.logger import configure

        model.set_logger(configure(str(tensorboard), ["tensorboard"]))
    return model


def _tracked_logger(cfg: CompareConfig, algo: str, seed: int, folder: Path, track: Sequence[str], model: Any) -> Any:
    """Tensorboard plus the trackers, one tracker run per (algo, seed), named so, with the run's config; MLflow runs
    of one comparison share a store in the out dir (``sqlite:///<out>/mlflow.db``) unless ``MLFLOW_TRACKING_URI`` says
    where."""
    import os

    from sb3_grpo.callbacks.trackers import configure_logger, default_tracking_uri, run_config

    config = {**run_config(model), "env": cfg.env_id, "seed": seed, "timesteps": cfg.timesteps}
    name = f"{algo}-seed{seed}"
    kwargs: dict[str, dict[str, Any]] = {}
    if "wandb" in track:
        # quiet: without it wandb prints each run's history and summary (about 30 lines a run) into the comparison
        quiet = {"quiet": True}
        kwargs["wandb"] = {"name": name, "group": cfg.env_id, "dir": str(folder.parents[2]), "settings": quiet}
    if "mlflow" in track:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(folder.parents[2].resolve())
        kwargs["mlflow"] = {"tracking_uri": uri, "experiment_name": f"compare {cfg.env_id}", "run_name": name}
    return configure_logger(str(folder), ["tensorboard", *track], config=config, **kwargs)


def run_one(
    cfg: CompareConfig,
    algo: str,
    seed: int,
    out: Path,
    report: Callable[[int, float | None], None] | None = None,
    callbacks: Sequence[Any] = (),
    track: Sequence[str] = (),
) -> dict[str, Any]:
    """Train one algorithm on one seed, evaluate it, and return its results.

    :param cfg: The comparison.
    :param algo: Algorithm name.
    :param seed: Seed.
    :param out: The out dir (tensorboard logs go to ``out/tensorboard/<algo>/seed<seed>``).
    :param report: ``f(env_steps, latest_training_reward)`` for a progress display (or ``None``).
    :param callbacks: Extra SB3 callbacks (tests use one to simulate Ctrl-C; the claims study adds its probes).
    :param track: Trackers that also get the run's logs (``"wandb"``, ``"mlflow"``).
    :return: The run's entry of ``results.json["runs"]``.
    """
    import torch as th

    tb_dir = out / TENSORBOARD_DIR / algo / f"seed{seed}"
    if tb_dir.exists():  # a run interrupted earlier: start its logs afresh
        shutil.rmtree(tb_dir)
    memory = _PeakMemory()
    memory.start()
    model = build_model(cfg, algo, seed, tb_dir, track=track)
    initial = copy.deepcopy(model.policy)
    initial.set_training_mode(False)
    lm_eval = make_eval_callback(cfg, EVAL_SEED_OFFSET + seed)  # the final evaluation's seed
    callback, curve = _make_callback(report, [*callbacks, *([lm_eval] if lm_eval is not None else [])])
    start = time.perf_counter()
    model.learn(cfg.timesteps, callback=callback)
    wall = time.perf_counter() - start  # evaluations during training included
    steps = int(model.num_timesteps)
    rss, cuda = memory.rss_mb(), memory.cuda_mb()
    evaluations = None
    if lm_eval is not None:  # once more on the trained policy: the run's final figures
        lm_eval.evaluate()
        model.logger.dump(steps)
        lm_eval.eval_env.close()
        evaluations = {"final": lm_eval.evaluations[-1], "during": lm_eval.evaluations[:-1]}
    kl_ref = model.logger.name_to_value.get("train/kl_ref") if getattr(model, "kl_coef", 0) else None
    final = evaluate(model, cfg, algo, seed, initial=initial)
    samples = final.pop("samples")
    if samples:  # what the trained policy writes: the final evaluation's first episodes, in the run's folder
        tb_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(tb_dir / "samples.jsonl", "".join(json.dumps(row) + "\n" for row in samples))
    if track:
        model.logger.close()  # ends the tracker runs
    model.get_env().close()
    del model, initial
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
        **({"lm_eval": to_jsonable(evaluations)} if evaluations is not None else {}),
    }


def evaluate_untrained(cfg: CompareConfig) -> dict[str, Any]:
    """Evaluate the first algorithm's freshly built policy (seed 0): the reward to beat."""
    algo = cfg.algos[0]
    model = build_model(cfg, algo, cfg.seeds[0])
    result = evaluate(model, cfg, algo, cfg.seeds[0])
    result.pop("samples")
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


class CompareInterrupted(KeyboardInterrupt):
    """The ``KeyboardInterrupt`` :func:`run_compare` re-raises, saying whether the report of the completed runs was
    written (a second Ctrl-C, or a full disk, may stop that too).

    :param report_written: Whether ``report.md`` (and ``curves.png``) now show the completed runs.
    """

    def __init__(self, report_written: bool) -> None:
        super().__init__()
        self.report_written = report_written


def completed_runs_left_out(old: dict[str, Any], cfg: CompareConfig) -> list[str]:
    """The keys of the completed runs of ``old`` (a stored ``results.json``) that ``cfg`` does not plan (another
    ``--algos`` or fewer ``--seeds``): what a ``--resume`` with ``cfg`` would drop."""
    planned = set(planned_runs(cfg))
    return [
        key
        for key, run in old.get("runs", {}).items()
        if isinstance(run, dict)
        and run.get("status") == "complete"
        and (run.get("algo"), run.get("seed")) not in planned
    ]


def check_resume_keeps_runs(old: dict[str, Any], cfg: CompareConfig) -> None:
    """Refuse a ``--resume`` whose ``--algos`` / ``--seeds`` leave out completed runs of the out dir (they would
    vanish from ``results.json`` and the report).

    :raises CompareError: naming the runs and the settings that keep them.
    """
    dropped = completed_runs_left_out(old, cfg)
    if not dropped:
        return
    config = old.get("config", {})
    algos = sorted({*cfg.algos, *(old["runs"][k].get("algo") for k in dropped)}, key=str)
    seeds = max([*cfg.seeds, *(old["runs"][k].get("seed", 0) for k in dropped)]) + 1
    raise CompareError(
        f"--resume: {len(dropped)} completed run(s) of this --out are not in --algos {','.join(cfg.algos)} "
        f"--seeds {len(cfg.seeds)} ({', '.join(dropped[:6])}{' ...' if len(dropped) > 6 else ''}) and would be "
        f"dropped from results.json and the report; resume with --algos {','.join(algos)} --seeds {seeds} (the "
        f"out dir was run with --algos {','.join(map(str, config.get('algos', [])))} --seeds "
        f"{len(config.get('seeds', []))}), or write the smaller comparison to another --out"
    )


def run_compare(
    cfg: CompareConfig,
    out: Path,
    command: str,
    resume: bool = False,
    progress: bool | None = None,
    callbacks_for: Callable[[str, int], Sequence[Any]] | None = None,
    log: Callable[[str], None] = print,
    track: Sequence[str] = (),
) -> dict[str, Any]:
    """Run the comparison, writing ``results.json`` after every run; report and curves at the end.

    On ``KeyboardInterrupt`` the completed runs are kept, ``status`` becomes ``"interrupted"``, the report
    is written with the missing runs marked, and a :class:`CompareInterrupted` (a ``KeyboardInterrupt`` that says
    whether the report was written: a second Ctrl-C may stop that too) is raised.

    :param cfg: The comparison (from :func:`make_config`).
    :param out: The prepared out dir (:func:`prepare_out_dir`).
    :param command: The exact command line, for the report.
    :param resume: Keep the runs in ``out/results.json`` whose fingerprint matches, skip them; refused
        (:func:`check_resume_keeps_runs`) when ``cfg`` leaves out completed runs.
    :param progress: Show progress (``None``: a live bar on a terminal, plain lines otherwise; ``False``: nothing).
    :param callbacks_for: ``f(algo, seed) -> extra SB3 callbacks`` (tests simulate Ctrl-C with it).
    :param log: Where one-line messages go.
    :param track: Trackers that also get every run's logs and config (``"wandb"``, ``"mlflow"``).
    :return: The results.
    """
    from sb3_grpo.compare.progress import Progress
    from sb3_grpo.compare.report import write_report

    quiet_hf_loading(cfg.text)
    results = new_results(cfg, command)
    if resume:
        _keep_finished_runs(results, load_results(out), cfg, out, log)
    path = out / RESULTS_FILE
    write_json_atomic(path, results)
    started = time.perf_counter()
    todo = [(a, s) for a, s in planned_runs(cfg) if cfg.run_key(a, s) not in results["runs"]]
    unit = "tok" if cfg.text else "step"
    bar = Progress(len(todo), len(todo) * cfg.timesteps, enabled=progress is not False, unit=unit)
    try:
        if results["untrained"] is None:
            bar.write("evaluating the untrained policy")
            results["untrained"] = evaluate_untrained(cfg)
            write_json_atomic(path, results)
        for algo, seed in todo:
            label = f"{algo} seed {seed}"
            bar.start_run(label, cfg.timesteps)
            extra = callbacks_for(algo, seed) if callbacks_for is not None else ()
            run = run_one(
                cfg, algo, seed, out, report=lambda n, r, lb=label: bar.advance(lb, n, r), callbacks=extra, track=track
            )
            results["runs"][cfg.run_key(algo, seed)] = run
            write_json_atomic(path, results)
            bar.end_run(
                label,
                f"{label}: final reward {run['final']['reward_mean']:.3f} "
                f"({run['wall_time_s']:.0f} s, {run['steps_per_s']:.0f} {run['step_unit']}/s)",
                steps=run["env_steps"],
            )
    except KeyboardInterrupt:
        bar.close()
        written = False
        try:  # a second Ctrl-C (or a full disk) may stop this too: then say so instead of claiming a report
            _finish(results, path, "interrupted", None)
            write_report(results, out)
            written = True
        except (KeyboardInterrupt, OSError):
            pass
        raise CompareInterrupted(written) from None
    bar.close()
    _finish(results, path, "complete", time.perf_counter() - started)
    write_report(results, out)
    return results


def quiet_hf_loading(text: bool) -> None:
    """No "Loading weights" bar from transformers for every run (it would break the progress bar)."""
    if text:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _keep_finished_runs(
    results: dict[str, Any], old: dict[str, Any], cfg: CompareConfig, out: Path, log: Callable[[str], None]
) -> None:
    """``--resume``: copy the completed runs of ``old`` whose fingerprint matches ``cfg`` into ``results`` (refusing
    first, with :func:`check_resume_keeps_runs`, when ``cfg`` leaves out completed runs)."""
    check_resume_keeps_runs(old, cfg)
    kept = 0
    for key, run in old.get("runs", {}).items():
        algo = run.get("algo")
        if algo in cfg.algos and run.get("seed") in cfg.seeds and run.get("status") == "complete":
            if run.get("fingerprint") == to_jsonable(cfg.fingerprint(algo)):
                results["runs"][key] = run
                kept += 1
            else:
                log(f"resume: {key} was run with other settings; running it again")
    if old.get("untrained") and old.get("config", {}).get("env_id") == cfg.env_id:
        results["untrained"] = old["untrained"]
    results["started"] = old.get("started", results["started"])
    log(f"resume: keeping {kept} completed run(s) from {out / RESULTS_FILE}")


def _finish(results: dict[str, Any], path: Path, status: str, session_wall: float | None) -> None:
    results["status"] = status
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if session_wall is not None:
        results["session_wall_s"] = round(session_wall, 1)
    write_json_atomic(path, results)
