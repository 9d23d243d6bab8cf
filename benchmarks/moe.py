"""``textrl-bench moe``: what a mixture of K LoRA experts costs per step, and whether it changes learning, against
plain LoRA, with the bundled LM on ``TextGen-v0``, written to ``docs/results/moe.md``.

Two measurements:

- **Cost**: the wall time of one rollout and one update (GRPO, group advantages) for plain LoRA and for
  ``policy_kwargs["moe"] = {"experts": K}``, ``K = 1, 2, 4`` (the same LoRA config per expert), the median over a few
  iterations after a warm-up, one CPU thread.
- **Learning**: a short GRPO run per seed for plain LoRA and ``K = 2``; the mean episode reward of the last rollouts
  (SB3's episode buffer), IQM over seeds with 95% bootstrap intervals, and the relative difference of the IQMs with
  its interval: "resolved" only when that interval excludes 0.

::

    textrl-bench moe                                  # writes docs/results/moe.md
    textrl-bench moe --seeds 2 --timesteps 512 --page /tmp/moe.md   # a quick look
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch as th
from stable_baselines3.common.logger import configure

from benchmarks import RESULTS_DIR
from sb3_grpo import GRPO
from sb3_grpo.compare import stats
from sb3_grpo.compare.pages import write_results_page
from textrl_envs.sb3 import make_vec_env

LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"], "fan_in_fan_out": True}
N_ENVS, GROUP, N_STEPS = 8, 4, 16
HP = {
    "n_steps": N_STEPS,
    "batch_size": N_ENVS * N_STEPS,
    "n_epochs": 2,
    "learning_rate": 3e-3,
    "advantage": "group",
    "grad_var_coef": 0.0,
    "explore_alpha": 0.0,
    "kl_coef": 0.0,
}


def build(experts: int | None, seed: int) -> GRPO:
    """GRPO with plain LoRA (``experts=None``) or a mixture of ``experts`` LoRA experts, on ``TextGen-v0``."""
    env = make_vec_env("TextGen-v0", n_envs=N_ENVS, group_size=GROUP, seed=seed, device="cpu")
    kwargs = {"lora": LORA} if experts is None else {"lora": LORA, "moe": {"experts": experts}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GRPO("CausalLMPolicy", env, seed=seed, device="cpu", policy_kwargs=kwargs, **HP)
    model.set_logger(configure(None, []))
    return model


class TimedModel:
    """A GRPO model whose updates (``train``) are timed, so one iteration's rollout time is its total minus that."""

    def __init__(self, experts: int | None):
        self.model = build(experts, seed=0)
        self.rollouts: list[float] = []
        self.updates: list[float] = []
        self._train = self.model.train
        self.model.train = self._timed_train  # type: ignore[method-assign]

    def _timed_train(self) -> None:
        start = time.perf_counter()
        self._train()
        self.updates.append(time.perf_counter() - start)

    def iteration(self, first: bool) -> None:
        start = time.perf_counter()
        self.model.learn(N_ENVS * N_STEPS, reset_num_timesteps=first)
        self.rollouts.append(time.perf_counter() - start - self.updates[-1])


def time_steps(configs: tuple[int | None, ...], iterations: int) -> dict[int | None, tuple[float, float]]:
    """Median seconds of one rollout and one update per config, after one warm-up iteration each. The configs take
    their iterations in turn (round robin), so a change in the machine's load falls on all of them alike."""
    timed = {experts: TimedModel(experts) for experts in configs}
    for i in range(iterations + 1):
        for model in timed.values():
            model.iteration(first=i == 0)
    return {e: (statistics.median(m.rollouts[1:]), statistics.median(m.updates[1:])) for e, m in timed.items()}


def final_reward(experts: int | None, seed: int, timesteps: int) -> float:
    """Mean episode reward of the last rollouts (SB3's episode buffer) after ``timesteps`` steps of GRPO."""
    th.manual_seed(seed)
    model = build(experts, seed)
    model.learn(timesteps)
    return float(np.mean([info["r"] for info in model.ep_info_buffer]))


def _label(experts: int | None) -> str:
    return "LoRA" if experts is None else f"MoE K={experts}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="textrl-bench moe", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=7, help="timed rollout+update iterations per config")
    parser.add_argument("--seeds", type=int, default=5, help="seeds of the learning runs")
    parser.add_argument("--timesteps", type=int, default=2048, help="env steps of each learning run")
    parser.add_argument("--page", type=Path, default=RESULTS_DIR / "moe.md", help="the results page to write")
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join(["textrl-bench moe", *(shlex.quote(a) for a in given)])

    rows = ["| policy | rollout s | update s | rollout+update vs LoRA |", "|---|---|---|---|"]
    times = time_steps((None, 1, 2, 4), args.iterations)
    base_total = sum(times[None])
    for experts, (rollout, update) in times.items():
        rows.append(f"| {_label(experts)} | {rollout:.2f} | {update:.2f} | {(rollout + update) / base_total:.2f}x |")
        print(rows[-1], flush=True)

    rewards = {e: [final_reward(e, s, args.timesteps) for s in range(args.seeds)] for e in (None, 2)}
    learn = ["| policy | final reward IQM [95% CI] | per seed |", "|---|---|---|"]
    for experts, values in rewards.items():
        est = stats.iqm_estimate(values)
        per_seed = ", ".join(f"{v:.3f}" for v in values)
        learn.append(f"| {_label(experts)} | {est.value:.3f} [{est.low:.3f}, {est.high:.3f}] | {per_seed} |")
    diff = stats.relative_difference(rewards[2], rewards[None])
    resolved = diff.excludes(0.0)
    verdict = (
        f"MoE K=2 {'beats' if diff.value > 0 else 'trails'} plain LoRA: resolved (the interval excludes 0)."
        if resolved
        else "Not resolved: the interval of the difference includes 0; these seeds cannot tell the two apart."
    )
    body = f"""
Plain LoRA against a mixture of K LoRA experts (`policy_kwargs={{"lora": ..., "moe": {{"experts": K}}}}`) on
`TextGen-v0` with the bundled LM: GRPO with group advantages, {N_ENVS} envs in groups of {GROUP}, {N_STEPS} steps
per env per rollout, {HP["n_epochs"]} epochs, learning rate {HP["learning_rate"]:g}, LoRA `r={LORA["r"]}` on
`c_attn` for every expert, one CPU thread. The formula is on {{doc}}`/algorithms/moe`.

## Cost per iteration

Median seconds of {args.iterations} iterations (one rollout of {N_ENVS * N_STEPS} env steps and its update) after a
warm-up, the four policies taking their iterations in turn. The mixture runs the LM once per expert, in the rollout
and in the update; K=1 is LoRA plus a gate that does nothing. The machine is shared with other jobs, so the figures
move by tens of percent between runs: read the ratios, not the digits.

{chr(10).join(rows)}

## Learning

{args.seeds} seeds of {args.timesteps} env steps each; the figure is the mean episode reward of the last rollouts.

{chr(10).join(learn)}

Relative difference of the IQMs (MoE K=2 vs LoRA): {diff.value:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}].
{verdict}
"""
    page = write_results_page(args.page, "Mixture of LoRA experts: cost and learning", body, command)
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
