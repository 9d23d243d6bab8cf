"""A short, seeded learning run on an interactive task (the longer one: ``python -m benchmarks.learn_interactive``).

GuessNumber-v0 with the bundled LM: a secret in 1-8, four turns, the env answers "Higher" / "Lower" / "Correct!".
The untrained LM guesses small numbers and ignores the answers (mean reward 0.23 over 512 sampled episodes, 3.6
turns, on seed 0). GRPO with group-relative advantages must lift the reward clearly and shorten the episodes in 16
updates of one epoch (the settings of ``benchmarks/learn_interactive.py``), on the fast path (one forward per
sequence, the env's replies as context). "Clearly" is measured on the episodes themselves: the gain must exceed
2.5 standard errors of the difference of the two means (about 0.032 with 2048 episodes each), so a policy that
does not learn fails (it passes by chance about 1 time in 160). Seeds 0-3 gain 0.062-0.123 (AMD EPYC). The
run's trajectory depends on the CPU's float rounding: with 512 evaluation episodes (a margin of 0.065) seed 0
gained 0.116 on an Intel Xeon and 0.043 on an AMD EPYC, so the evaluation is made precise enough for the
smaller gains a different machine gives.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch as th
from helpers import quiet

# the study's settings and evaluation, so that the test pins exactly the run the README reports
from benchmarks import learn_interactive
from sb3_grpo.common.buffers import SequenceRolloutBuffer

#: Episodes of each evaluation (before and after training).
EPISODES = 2048


def _seeds() -> list[int]:
    """Seeds to run: ``TEXTRL_LEARNING_SEEDS="0-9"`` (or ``"3"``) sweeps them; the default is seed 0 only."""
    first, _, last = os.environ.get("TEXTRL_LEARNING_SEEDS", "0").partition("-")
    return list(range(int(first), int(last or first) + 1))


# The settings of benchmarks/learn_interactive.py's GRPO run (groups of 4, 64-step rollouts, one epoch, 16 updates).
@pytest.mark.parametrize("seed", _seeds())
def test_grpo_learns_to_guess_the_number(seed):
    th.set_num_threads(1)
    th.manual_seed(seed)
    model = quiet(learn_interactive.build("grpo-group", "GuessNumber-v0", seed, group_size=4))
    assert isinstance(model.rollout_buffer, SequenceRolloutBuffer)
    before, se_before, turns_before = learn_interactive.evaluate(model, "GuessNumber-v0", EPISODES)
    model.learn(16 * 64 * 16)
    after, se_after, turns_after = learn_interactive.evaluate(model, "GuessNumber-v0", EPISODES)
    margin = 2.5 * float(np.hypot(se_before, se_after))
    assert after - before > margin and turns_after < turns_before, (before, after, margin, turns_before, turns_after)
