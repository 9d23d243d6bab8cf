"""``textrl-bench tools-code``: a short GRPO run on the tool task (``ToolUse-v0``) and the code task (``CodeGen-v0``),
written as a results page.

Each task trains the bundled LM with the ``"trl-grpo"`` preset (TRL's default loss) at a learning rate for a small
model, on ``make_vec_env(id, n_envs=8, group_size=4)``, one minibatch per rollout. Before and after, the policy plays
sampled episodes on a separately seeded env; the page gives their mean reward with its standard error, and what the
tasks did along the way: tool calls and their errors per episode, sandbox programs by how they ended and their wall
time, and the training's wall time::

    textrl-bench tools-code                    # writes docs/results/tools-code.md
    textrl-bench tools-code --updates 1 --episodes 8 --no-page   # a smoke run

The bundled LM is a GPT-2-sized model trained on movie reviews and arithmetic: it has never seen a tool call or Python,
so the page shows both tasks running end to end inside training (rollouts, tool calls answered, programs sandboxed,
rewards scored, updates), not that they are learned. The page has not been run on a real instruct model (see "Train a
real model on a CPU" for SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections import Counter
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from benchmarks import RESULTS_DIR
from sb3_grpo.compare.pages import write_results_page
from sb3_grpo.presets import make_preset
from textrl_envs.rewards.code import UnitTests
from textrl_envs.sandbox import SandboxLimits
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, LEARNING_RATE = 8, 4, 1e-4
#: Per task: steps per env per rollout (an episode's budget, so most episodes end in their rollout).
N_STEPS = {"ToolUse-v0": 80, "CodeGen-v0": 64}


class CountingUnitTests(UnitTests):
    """The ``"unit-tests"`` reward, counting every program's end (``done``, ``died``, ``timeout``) and wall time."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.statuses: Counter[str] = Counter()
        self.seconds: list[float] = []

    def score(self, prompts, completions, **kwargs):  # noqa: D102  (UnitTests.score)
        scores = super().score(prompts, completions, **kwargs)
        self.statuses.update(r.status for r in self.last_results)
        self.seconds.extend(r.seconds for r in self.last_results)
        return scores


class EpisodeStats(BaseCallback):
    """Per finished training episode: its tool calls and errors (tool task)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.errors: list[int] = []

    def _on_step(self) -> bool:
        for done, info in zip(self.locals["dones"], self.locals["infos"]):
            if done and "tool_calls" in info:
                self.calls.append(int(info["tool_calls"]))
                self.errors.append(int(info["tool_errors"]))
        return True


def env_kwargs(env_id: str, reward: Any) -> dict[str, Any]:
    return {"reward": reward} if env_id == "CodeGen-v0" else {}


def evaluate(model: Any, env_id: str, episodes: int, reward: Any, seed: int = 123) -> tuple[float, float]:
    """Mean reward and its standard error of ``episodes`` sampled episodes on a separately seeded env."""
    env = make_vec_env(env_id, n_envs=N_ENVS, seed=seed, device="cpu", **env_kwargs(env_id, reward))
    obs, rewards, running = env.reset(), [], np.zeros(N_ENVS)
    while len(rewards) < episodes:
        actions, _ = model.predict(obs, deterministic=False)
        obs, r, dones, _ = env.step(actions)
        running += r
        for i in np.flatnonzero(dones):
            rewards.append(running[i])
            running[i] = 0.0
    env.close()
    values = np.asarray(rewards[:episodes])
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def run_task(env_id: str, updates: int, episodes: int, seed: int) -> dict[str, Any]:
    """Train one task briefly and measure it (see the module docstring)."""
    reward = CountingUnitTests(limits=SandboxLimits(cpu_seconds=2, wall_seconds=5)) if env_id == "CodeGen-v0" else None
    venv = make_vec_env(env_id, n_envs=N_ENVS, group_size=GROUP, seed=seed, device="cpu", **env_kwargs(env_id, reward))
    n_steps = N_STEPS[env_id]
    model = make_preset("trl-grpo", "CausalLMPolicy", venv, n_steps=n_steps, batch_size=n_steps * N_ENVS,
                        learning_rate=LEARNING_RATE, seed=seed, device="cpu")  # fmt: skip
    before = evaluate(model, env_id, episodes, reward)
    stats = EpisodeStats()
    start = time.perf_counter()
    model.learn(updates * n_steps * N_ENVS, callback=stats)
    seconds = time.perf_counter() - start
    after = evaluate(model, env_id, episodes, reward)
    venv.close()
    out = {"env": env_id, "updates": updates, "tokens": updates * n_steps * N_ENVS, "seconds": seconds,
           "before": before, "after": after, "calls": stats.calls, "errors": stats.errors}  # fmt: skip
    if reward is not None:
        out["statuses"], out["program_seconds"] = dict(reward.statuses), list(reward.seconds)
    return out


def _mean(values: list[float]) -> str:
    return f"{np.mean(values):.2f}" if values else "n/a"


def page_body(results: list[dict[str, Any]], episodes: int) -> str:
    """The page's Markdown: the table of rewards, then what each task did."""
    lines = [
        "A short GRPO run (the `trl-grpo` preset at learning rate 1e-4, 8 envs in groups of 4, one minibatch per "
        f"rollout) of the bundled LM on each task; rewards are the means of {episodes} sampled episodes on a "
        "separately seeded env, before and after, with their standard errors.",
        "",
        "| task | updates | tokens trained | training time (s) | reward before | reward after |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r['env']}` | {r['updates']} | {r['tokens']:,} | {r['seconds']:.1f} | "
            f"{r['before'][0]:.3f} ± {r['before'][1]:.3f} | {r['after'][0]:.3f} ± {r['after'][1]:.3f} |"
        )
    lines += ["", "What the tasks did during training:", ""]
    for r in results:
        if r["env"] == "ToolUse-v0":
            calls, errors = sum(r["calls"]), sum(r["errors"])
            lines.append(
                f"* `ToolUse-v0`: {len(r['calls'])} episodes ended, {_mean(r['calls'])} tool calls per episode, "
                f"{errors} of {calls} calls answered with an error (malformed, unknown tool, wrong arguments, raised "
                "or timed out): each a message the model read, none a crash."
            )
        else:
            statuses = ", ".join(f"{n} {s}" for s, n in sorted(r["statuses"].items()))
            lines.append(
                f"* `CodeGen-v0`: {sum(r['statuses'].values())} programs run in the sandbox ({statuses}), "
                f"{_mean(r['program_seconds'])} s of wall time each on average, side by side in the background "
                "reward worker."
            )
    lines += [
        "",
        "The bundled LM (GPT-2 sized, trained on movie reviews and arithmetic) has never seen a tool call or Python, "
        "so these rewards stay near 0: the page shows both tasks running end to end inside training, not that they "
        "are learned. This page has not been run on a real instruct model; the guide "
        "[Train a real model on a CPU](../guides/real_model.md) shows how to train SmolLM2-135M-Instruct.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3, help="updates (rollouts) per task")
    parser.add_argument("--episodes", type=int, default=32, help="evaluation episodes before and after")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default="ToolUse-v0,CodeGen-v0", help="comma-separated ids")
    parser.add_argument("--page", default=str(RESULTS_DIR / "tools-code.md"), help="the results page to write")
    parser.add_argument("--no-page", action="store_true", help="print the page's body instead of writing it")
    args = parser.parse_args(argv)
    results = [run_task(t, args.updates, args.episodes, args.seed) for t in args.tasks.split(",")]
    body = page_body(results, args.episodes)
    if args.no_page:
        print(body)
        return 0
    command = shlex.join(["textrl-bench", "tools-code", *(argv if argv is not None else sys.argv[1:])])
    print(write_results_page(args.page, "Tool use and code: a short run", body, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
