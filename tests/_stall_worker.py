"""One rank of a two-rank gloo job in which rank 1 stalls after start-up (``tests/test_bounded_waits.py``).

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python _stall_worker.py
"""

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402

from sb3_grpo import GRPO, distributed  # noqa: E402


class StallAfterFirstUpdate(BaseCallback):
    """Rank 1 stops answering at its second rollout, as a rank whose reward hangs does."""

    def _on_rollout_start(self) -> None:
        if distributed.get_rank() == 1 and self.model.num_timesteps > 0:
            print("rank 1 stalls", flush=True)
            time.sleep(3600)

    def _on_step(self) -> bool:
        return True


model = GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")
model.learn(32 * 4, callback=StallAfterFirstUpdate())
print("finished", flush=True)
