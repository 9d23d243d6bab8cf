"""Loading Hugging Face models without a progress bar: the loads the packages make on the user's behalf.

transformers 5 draws a "Loading weights" progress bar on stderr for every ``from_pretrained``. The envs' reward
models and the policy's LM load that way each time an env or a policy is built, so a short script printed one bar
per load. :func:`no_progress_bars` switches transformers' (and the Hub's) bars off for the length of such a load
and back on afterwards, so the user's own ``from_pretrained`` calls still show theirs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["no_progress_bars"]


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """Run the block with transformers' progress bars off, then restore them as they were (a no-op when they are
    off already)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    if not hf_logging.is_progress_bar_enabled():
        yield
        return
    hub_bars_off = are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # transformers' switch; it turns the Hub's bars off too
    try:
        yield
    finally:
        with warnings.catch_warnings():
            # turning them on again also turns the Hub's on, which warns when HF_HUB_DISABLE_PROGRESS_BARS is set
            warnings.simplefilter("ignore")
            hf_logging.enable_progress_bar()
        if hub_bars_off:
            disable_progress_bars()  # the Hub's bars were off before: they stay off
