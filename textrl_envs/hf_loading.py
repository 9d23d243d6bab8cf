"""Loading Hugging Face models and tokenizers on the user's behalf: by Hub id or local directory, without a progress
bar.

transformers 5 draws a "Loading weights" progress bar on stderr for every ``from_pretrained``. The envs' reward
models and the policy's LM load that way each time an env or a policy is built, so a short script printed one bar
per load. :func:`no_progress_bars` switches transformers' (and the Hub's) bars off for the length of such a load
and back on afterwards, so the user's own ``from_pretrained`` calls still show theirs.

A name that is no local directory but has the shape of a Hub repository id (``"org/name"`` or ``"name"``) loads the
way every Hugging Face library loads it (:func:`load_from_hub`): online it downloads into the Hugging Face cache, with
``HF_HUB_OFFLINE=1`` it comes from that cache; when neither works the error names the id, the cache directory and
the command that fetches it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["cached_commit", "hub_cache_dir", "hub_offline", "load_from_hub", "looks_like_hub_id", "no_progress_bars"]


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


def looks_like_hub_id(name: str) -> bool:
    """Whether ``name`` has the shape of a Hugging Face Hub repository id (``"org/name"`` or ``"name"``), so that a
    string that is no local directory is loaded from the Hub or its cache rather than refused as a missing path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if os.path.isabs(name) or name.startswith((".", "~")) or os.sep in name.replace("/", ""):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_cache_dir() -> str:
    """The Hugging Face cache directory that downloads go to and offline loads read (``HF_HUB_CACHE``, by default
    ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """Whether the Hub is switched off (``HF_HUB_OFFLINE=1``): then only the local cache is read."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cached_commit(repo_id: str, revision: str | None = None) -> str | None:
    """The commit hash the Hugging Face cache holds ``repo_id`` at for ``revision`` (a branch or tag it recorded under
    ``refs/``, or a commit hash it has a snapshot of); ``None`` when the cache has no such entry."""
    from huggingface_hub.file_download import repo_folder_name

    repo = os.path.join(hub_cache_dir(), repo_folder_name(repo_id=repo_id, repo_type="model"))
    revision = revision or "main"
    if os.path.isdir(os.path.join(repo, "snapshots", revision)):
        return revision
    ref = os.path.join(repo, "refs", revision)
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            return f.read().strip() or None
    return None


def load_from_hub(load: Callable[..., Any], repo_id: str, what: str, revision: str | None = None, **kwargs: Any) -> Any:
    """``load(repo_id, revision=revision, **kwargs)`` (a ``from_pretrained``), with its failures explained.

    Online the files download into the Hugging Face cache (:func:`hub_cache_dir`); with ``HF_HUB_OFFLINE=1`` they are
    read from it. A failure raises ``OSError`` naming ``what`` (e.g. ``"CausalLMPolicy model"``), the id, the
    revision, the cache directory and the command that fetches the files.

    :param load: e.g. ``AutoModelForCausalLM.from_pretrained``.
    :param repo_id: The Hub id, e.g. ``"Qwen/Qwen2.5-0.5B-Instruct"``.
    :param what: What is being loaded, for the error message.
    :param revision: A branch, tag or commit hash (``None``: ``main``).
    """
    from huggingface_hub.errors import HFValidationError

    try:
        with no_progress_bars():
            return load(repo_id, revision=revision, **kwargs)
    except (OSError, HFValidationError) as err:
        at = "" if revision is None else f" --revision {revision}"
        fetch = f"`hf download {repo_id}{at}` (or `huggingface-cli download {repo_id}{at}`)"
        where = f"the Hugging Face cache at {hub_cache_dir()}"
        named = f"{what} {repo_id!r}" + ("" if revision is None else f" (revision {revision!r})")
        if hub_offline():
            reason = f"is neither a local directory nor in {where}, and HF_HUB_OFFLINE=1 forbids downloading it"
            todo = f"fetch it once on a machine that is online with {fetch}, or unset HF_HUB_OFFLINE"
        else:
            reason = f"is no local directory and could not be downloaded from the Hugging Face Hub into {where}"
            todo = (
                "check the id, the revision and the network (a gated model needs `hf auth login`), or fetch it with "
                f"{fetch}"
            )
        cause = " ".join(str(err).split())  # one line
        raise OSError(f"{named} {reason} ({type(err).__name__}: {cause}); {todo}") from err
