"""Why GRPO's design default ends below PPO on ``TextGen-v0``: the variance penalty's gradient against the loss's.

Trains ``grpo`` (the design defaults), ``grpo-normvar`` (the scale-free penalty) and ``ppo-seq`` (no penalty) with
``sb3-grpo compare``'s text settings on ``TextGen-v0`` for one seed, and after every rollout, before the update,
takes the first minibatch the update will see and splits the gradient of its loss into

- ``g_loss``: the gradient of PPO's loss (clipped surrogate, value and entropy terms), and
- ``g_pen``: the gradient of ``grad_var_coef * Var`` (the rest of the total gradient),

printing their norms, the cosine between the total gradient and ``g_loss`` (1: the penalty does not turn the step;
near 0: the clipped step follows the penalty), ``Var`` itself and the policy-gradient loss. Then each run's final
reward (128 evaluation episodes, as ``compare``). About 2 CPU-minutes::

    python -m benchmarks.penalty_vs_surrogate [--timesteps 8192] [--seed 0]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback


class PenaltyProbe(BaseCallback):
    """After each rollout: the norms of the loss's and the penalty's gradients on the update's first minibatch."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, float]] = []

    def _on_step(self) -> bool:
        return True

    def _flat_grad(self, loss: th.Tensor) -> th.Tensor:
        params = [p for p in self.model.policy.parameters() if p.requires_grad]
        grads = th.autograd.grad(loss, params, allow_unused=True)
        return th.cat([(th.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)])

    def _on_rollout_end(self) -> None:
        from sb3_grpo.common.update.train_stats import TrainStats

        model = self.model
        np_state, th_state = np.random.get_state(), th.get_rng_state()
        try:
            minibatch = next(iter(model.batch_source.minibatches(model.rollout_buffer, model.batch_size)))
            clip = model.clip_range(model._current_progress_remaining)
            with th.enable_grad():
                stats = TrainStats()
                total = self._flat_grad(model._minibatch_loss(minibatch, clip, None, stats).loss)
                coef, model.grad_var_coef = model.grad_var_coef, 0.0
                try:
                    base = self._flat_grad(model._minibatch_loss(minibatch, clip, None, TrainStats()).loss)
                finally:
                    model.grad_var_coef = coef
        finally:
            np.random.set_state(np_state)
            th.set_rng_state(th_state)
        pen = total - base
        cos = float(th.dot(total, base) / (total.norm() * base.norm() + 1e-12))
        self.rows.append(
            {
                "update": len(self.rows),
                "loss_grad": float(base.norm()),
                "penalty_grad": float(pen.norm()),
                "cos_total_loss": cos,
                "grad_var": stats.grad_vars[0] if stats.grad_vars else 0.0,
                "pg_loss": stats.pg_losses[0],
            }
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    th.set_num_threads(1)

    from transformers.utils import logging as hf_logging

    from sb3_grpo.compare.config import make_config
    from sb3_grpo.compare.runner import build_model, evaluate

    hf_logging.disable_progress_bar()
    for algo in ("grpo", "grpo-normvar", "ppo-seq"):
        cfg = make_config("TextGen-v0", [algo], seeds=1, timesteps=args.timesteps, device="cpu")
        model = build_model(cfg, algo, args.seed)
        probe = PenaltyProbe()
        model.learn(args.timesteps, callback=probe)
        final = evaluate(model, cfg, algo, args.seed)["reward_mean"]
        print(f"\n{algo} (seed {args.seed}, {args.timesteps} tokens): final reward {final:.3f}")
        print("update | |grad loss| | |grad penalty| | cos(total, loss) | Var | pg_loss")
        for r in probe.rows:
            print(
                f"{r['update']:6d} | {r['loss_grad']:11.3g} | {r['penalty_grad']:14.3g} | {r['cos_total_loss']:16.3f} "
                f"| {r['grad_var']:8.3g} | {r['pg_loss']:.4f}",
                flush=True,
            )
        model.get_env().close()


if __name__ == "__main__":
    main()
