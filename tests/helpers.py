"""Small helpers the test modules share (importable because pytest puts ``tests/`` on ``sys.path``)."""

import torch as th
from stable_baselines3.common.logger import configure


def quiet(model):
    """``model`` with a logger that writes nowhere (and keeps ``name_to_value`` readable)."""
    model.set_logger(configure(None, []))
    return model


def params(model) -> dict[str, th.Tensor]:
    """A detached copy of the policy's state dict."""
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
