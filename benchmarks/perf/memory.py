"""Peak memory of one GRPO update (rollout + train, the text fast path) and of TRL's ``GRPOTrainer`` on the same set-up.

Each configuration runs in its own subprocess, so the peaks do not mix: peak RSS (``ru_maxrss``) and, on CUDA, peak
GPU memory (``torch.cuda.max_memory_allocated``). ``base MB`` is the RSS after the imports and the env, before any
model is built; ``update MB = peak - base`` is what the training costs. The set-up (the same for every row, and for
TRL when it is importable): ``TextGen-v0`` with its bundled tokenizer and reward, ``n_envs`` completions of up to
``tokens`` tokens in groups of ``group_size`` (``n_steps = tokens``), ``advantage="group"`` with ``kl_coef=0.04``
(DeepSeekMath's beta), one epoch over the rollout as one minibatch, no gradient-variance penalty (TRL has none).
``textrl-bench memory`` (:mod:`benchmarks.memory_configs`) is the command-line front end (every configuration:
LoRA, checkpointing, autocast); :func:`memory_vs_trl` is the perf row.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["KL_COEF", "LORA", "build_lm", "child", "label", "memory_vs_trl", "rss_mb", "run_child"]

LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"], "fan_in_fan_out": True}
KL_COEF = 0.04


def rss_mb() -> float:
    """Peak resident set size of this process so far, in MB.

    On Linux this is ``VmHWM`` of ``/proc/self/status``, the peak of this program's own memory: ``ru_maxrss`` is not,
    since a child keeps the high-water mark of the parent it was forked from (at least the parent's RSS at the
    fork), so a child started by a large process would measure nothing. Elsewhere ``ru_maxrss`` (bytes on macOS).
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def gpu_mb(device) -> float | None:
    import torch as th

    if device.type != "cuda":
        return None
    th.cuda.synchronize(device)
    return th.cuda.max_memory_allocated(device) / 2**20


def build_lm(name: str):
    """The model object (``None``: the bundled LM, which the policy loads itself)."""
    if name == "bundled":
        return None
    from benchmarks.perf.rollout import gpt2_small

    return gpt2_small().train(False)


def _measured(base: float, built: float, device: Any, parameters: Any) -> dict:
    """The memory figures of a child after its update (both implementations report the same keys): RSS before the
    model, after building it, the peak so far, the CUDA peak, and the parameter counts in millions."""
    params = list(parameters)
    return {
        "base_mb": base,
        "built_mb": built,
        "peak_mb": rss_mb(),
        "gpu_peak_mb": gpu_mb(device),
        "params_m": sum(p.numel() for p in params) / 1e6,
        "trainable_m": sum(p.numel() for p in params if p.requires_grad) / 1e6,
    }


def run_grpo(cfg: dict) -> dict:
    """Child: build GRPO, collect one rollout, run one update; report the memory peaks."""
    import torch as th

    th.set_num_threads(cfg["threads"])
    import transformers  # noqa: F401  (imported before the baseline, as TRL's child does)
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.logger import configure

    import sb3_grpo.policies  # noqa: F401  (imported before the baseline, as the other child does)
    from sb3_grpo import GRPO
    from textrl_envs.sb3 import make_vec_env

    if importlib.util.find_spec("peft") is not None:
        import peft  # noqa: F401  (in every row, LoRA or not: the same imports before the baseline)
    device = th.device(cfg["device"])
    env = make_vec_env(
        "TextGen-v0",
        n_envs=cfg["n_envs"],
        group_size=cfg["group_size"],
        seed=0,
        device=str(device),
        max_new_tokens=cfg["tokens"],
    )
    base = rss_mb()
    policy_kwargs = {"model": build_lm(cfg["model"]), "gradient_checkpointing": cfg["ckpt"]}
    if cfg["lora"]:
        policy_kwargs["lora"] = LORA
    if cfg.get("autocast"):
        policy_kwargs["autocast_dtype"] = cfg["autocast"]
    n_steps = cfg["tokens"]
    model = GRPO(
        "CausalLMPolicy",
        env,
        n_steps=n_steps,
        batch_size=n_steps * cfg["n_envs"],
        n_epochs=1,
        learning_rate=1e-5,
        seed=0,
        advantage="group",
        kl_coef=KL_COEF,
        grad_var_coef=0.0,
        device=device,
        policy_kwargs=policy_kwargs,
    )
    model.set_logger(configure(None, []))
    built = rss_mb()
    model._setup_learn(n_steps * cfg["n_envs"], None)
    callback = CallbackList([])
    callback.init_callback(model)
    t0 = time.perf_counter()
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_steps)
    t1 = time.perf_counter()
    model.train()
    t2 = time.perf_counter()
    return {
        **_measured(base, built, device, model.policy.parameters()),
        "kl_reference": "frozen copy" if model.ref_policy is not None else "adapters off",
        "rollout_s": t1 - t0,
        "update_s": t2 - t1,
        "rollout_tokens": int(n_steps * cfg["n_envs"]),
    }


def _prompt_rows(prompts: list[str]):
    for p in prompts:
        yield {"prompt": p}


def _trl_dataset(prompts: list[str]) -> Any:
    """The prompts as the ``datasets.Dataset`` TRL's trainer takes (an iterable one where building that fails)."""
    from datasets import Dataset

    try:
        return Dataset.from_dict({"prompt": prompts})
    except Exception:  # noqa: BLE001  (datasets/pyarrow version mismatch): a plain list serves the DataLoader too
        from datasets import IterableDataset

        return IterableDataset.from_generator(_prompt_rows, gen_kwargs={"prompts": prompts})


def _trl_args(cfg: dict, tmp: str) -> Any:
    """TRL's ``GRPOConfig`` for one step (generation + update) at the sizes of ``cfg`` (those :func:`run_grpo` gets)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=os.path.join(tmp, "out"),
        per_device_train_batch_size=cfg["n_envs"],
        num_generations=cfg["group_size"],
        max_completion_length=cfg["tokens"],
        beta=KL_COEF,
        num_iterations=1,
        max_steps=1,
        learning_rate=1e-5,
        gradient_checkpointing=cfg["ckpt"],
        use_cpu=cfg["device"] == "cpu",
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )


def run_trl(cfg: dict) -> dict:
    """Child: TRL's ``GRPOTrainer``, one step (generation + update) on the same prompts, reward and sizes."""
    import torch as th

    th.set_num_threads(cfg["threads"])
    import datasets  # noqa: F401  (imported before the baseline; _trl_dataset uses it)
    import gymnasium as gym
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    import textrl_envs  # noqa: F401  (registers the ids before the baseline is read)
    from textrl_envs.assets import lm_path, tokenizer_path

    spec = gym.make("TextGen-v0").unwrapped.text_spec
    env_reward = spec.reward
    if importlib.util.find_spec("peft") is not None:
        import peft
    base = rss_mb()

    def reward(prompts, completions, **kwargs):
        return [float(r) for r in env_reward(prompts, completions)]

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path()))
    tmp = tempfile.mkdtemp(prefix="bench_memory_trl_")
    if cfg["model"] == "bundled":
        model_path = str(lm_path())
    else:  # TRL builds its reference model from a path
        model_path = os.path.join(tmp, "model")
        build_lm(cfg["model"]).save_pretrained(model_path)
    n_prompts = cfg["n_envs"] // cfg["group_size"]
    prompts = (spec.prompt_texts * n_prompts)[: max(n_prompts, 1) * 4]
    dataset = _trl_dataset(prompts)
    peft_config = None
    if cfg["lora"]:
        import peft

        peft_config = peft.LoraConfig(**LORA)
    args = _trl_args(cfg, tmp)
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    built = rss_mb()
    t0 = time.perf_counter()
    trainer.train()
    t1 = time.perf_counter()
    return {
        **_measured(base, built, th.device(cfg["device"]), trainer.model.parameters()),
        "kl_reference": "TRL",
        "rollout_s": float("nan"),
        "update_s": t1 - t0,
        "rollout_tokens": int(cfg["n_envs"] * cfg["tokens"]),
    }


def child(cfg: dict | str) -> None:
    """The child process: run one configuration, print ``RESULT <json>``."""
    import warnings

    if isinstance(cfg, str):
        cfg = json.loads(cfg)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    result = run_trl(cfg) if cfg["impl"] == "trl" else run_grpo(cfg)
    print("RESULT " + json.dumps({**cfg, **result}), flush=True)


def run_child(cfg: dict, timeout: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", f"from {__name__} import child; child({json.dumps(cfg)!r})"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {**cfg, "error": " | ".join(tail) or f"exit code {proc.returncode}"}


def label(r: dict) -> str:
    parts = ["TRL GRPOTrainer" if r["impl"] == "trl" else "GRPO"]
    parts.append("LoRA" if r["lora"] else "full")
    if r["ckpt"]:
        parts.append("ckpt")
    if r.get("autocast"):
        parts.append(r["autocast"])
    return " + ".join(parts)


def memory_vs_trl(model: str = "gpt2-small", device: str = "cpu", timeout: int = 900) -> dict:
    """Update MB (peak RSS minus the RSS before the model) of GRPO against TRL's ``GRPOTrainer``, full fine-tuning,
    each in its own process; on CUDA, peak GPU memory.

    :param model: ``"gpt2-small"`` or ``"bundled"``.
    :param device: ``"cpu"`` or a CUDA device.
    :param timeout: Seconds per process.
    :return: A row (target: at most TRL's, ratio >= 1.0 as TRL / ours).
    """
    from benchmarks.timing import make_row

    common = {
        "n_envs": 8,
        "group_size": 4,
        "tokens": 16,
        "device": device,
        "threads": 1,
        "model": model,
        "lora": False,
        "ckpt": False,
    }
    ours = run_child({**common, "impl": "grpo"}, timeout)
    have_trl = importlib.util.find_spec("trl") is not None
    theirs = run_child({**common, "impl": "trl"}, timeout) if have_trl else {"error": "TRL not installed"}
    gpu = device.startswith("cuda")

    def figure(r: dict) -> float | None:
        if "error" in r:
            return None
        return r["gpu_peak_mb"] if gpu else r["peak_mb"] - r["base_mb"]

    errors = "; ".join(f"{who}: {r['error'][:160]}" for who, r in (("GRPO", ours), ("TRL", theirs)) if "error" in r)
    notes = (
        f"{model}, full fine-tuning, 8 completions x 16 tokens (groups of 4), kl_coef 0.04, one update, "
        f"{'peak GPU MB' if gpu else 'peak RSS - RSS before the model'}, one process each"
    )
    if errors:
        notes += f"; {errors}" + ("" if have_trl else " (pip install trl, or put it on PYTHONPATH)")
    return make_row(
        "memory: one update, GRPO vs TRL GRPOTrainer",
        figure(ours),
        figure(theirs),
        "MB",
        notes,
        False,
        target=(">=", 1.0),
    )
