"""Is the env's tokenizer the policy model's own? Compared by more than its size.

A model trained with another tokenizer reads token ids that mean other words; when the two vocabularies have the same
size nothing else fails, and the run trains on garbage. :func:`tokenizer_fingerprint` describes a tokenizer by its
size, its special token ids (EOS, BOS, UNK) and a hash of its vocabulary (every ``token -> id``);
:func:`model_tokenizer` finds the tokenizer saved with the model (its folder, or the Hugging Face cache; nothing is
downloaded); :func:`check_tokenizer_identity` compares the two when both are known and warns, or refuses with
``tokenizer_check="strict"`` (a ``CausalLMPolicy`` argument, through ``policy_kwargs``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
import weakref
from typing import Any

from textrl_envs.gguf import gguf_available, gguf_folder

__all__ = [
    "TOKENIZER_CHECKS",
    "TokenizerMismatchWarning",
    "check_policy_tokenizer",
    "check_tokenizer_identity",
    "env_tokenizer",
    "model_tokenizer",
    "tokenizer_differences",
    "tokenizer_fingerprint",
]

#: What a ``CausalLMPolicy`` does when its model's tokenizer is not the env's: warn, refuse, or not look.
TOKENIZER_CHECKS = ("warn", "strict", "off")

_SPECIAL = ("eos_token_id", "bos_token_id", "unk_token_id")
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class TokenizerMismatchWarning(UserWarning):
    """The policy's model was saved with another tokenizer than the env's."""


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """``{"size", "eos_token_id", "bos_token_id", "unk_token_id", "vocab_sha256"}`` of a Hugging Face tokenizer (the
    hash is over its sorted ``token -> id`` pairs, added tokens included); computed once per tokenizer object."""
    try:
        return _FINGERPRINTS[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = sorted(tokenizer.get_vocab().items())
    fingerprint = {
        "size": len(tokenizer),
        **{name: getattr(tokenizer, name, None) for name in _SPECIAL},
        "vocab_sha256": hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest(),
    }
    try:
        _FINGERPRINTS[tokenizer] = fingerprint
    except TypeError:  # not weak-referenceable: computed again next time
        pass
    return fingerprint


@functools.lru_cache(maxsize=16)
def _saved_tokenizer(name_or_path: str, revision: str | None) -> Any:
    from transformers import AutoTokenizer

    from textrl_envs.core import TOKENIZER_FILES

    if gguf_available(name_or_path):  # a GGUF model: the tokenizer of its converted folder (converted on its load)
        name_or_path = gguf_folder(name_or_path)
    if os.path.isdir(name_or_path):
        if not any(os.path.isfile(os.path.join(name_or_path, f)) for f in TOKENIZER_FILES):
            return None
    elif os.path.exists(name_or_path) or not name_or_path:
        return None  # a file or nothing: no saved tokenizer to read here
    try:  # from the folder, or from the Hugging Face cache only: never downloaded for a check
        return AutoTokenizer.from_pretrained(name_or_path, revision=revision, local_files_only=True)
    except Exception:  # noqa: BLE001  (no tokenizer saved there, or not in the cache: nothing to compare)
        return None


def model_tokenizer(lm: Any, revision: str | None = None) -> Any | None:
    """The tokenizer saved with a Hugging Face model (its ``name_or_path``: a folder, or a Hub id in the local cache),
    or ``None`` when there is none (a model built from a config, a folder without tokenizer files)."""
    config = getattr(lm, "config", None)
    name = str(getattr(config, "_name_or_path", "") or getattr(lm, "name_or_path", "") or "")
    return _saved_tokenizer(name, revision) if name else None


def env_tokenizer(env: Any) -> Any | None:
    """The tokenizer of a text env (a VecEnv or a Gymnasium env), or ``None`` for an env without one."""
    try:
        if hasattr(env, "get_attr"):
            return env.get_attr("tokenizer", [0])[0]
        return getattr(getattr(env, "unwrapped", env), "tokenizer", None)
    except Exception:  # noqa: BLE001  (any env that has no tokenizer attribute)
        return None


def tokenizer_differences(model_tok: Any, env_tok: Any) -> list[str]:
    """What differs between the model's tokenizer and the env's (empty: the same vocabulary and special ids)."""
    ours, theirs = tokenizer_fingerprint(model_tok), tokenizer_fingerprint(env_tok)
    out = []
    if ours["size"] != theirs["size"]:
        out.append(f"{ours['size']} tokens in the model's tokenizer, {theirs['size']} in the env's")
    for name in _SPECIAL:
        if ours[name] is not None and theirs[name] is not None and ours[name] != theirs[name]:
            out.append(f"{name} {ours[name]} in the model's tokenizer, {theirs[name]} in the env's")
    if ours["vocab_sha256"] != theirs["vocab_sha256"]:
        mine, other = model_tok.get_vocab(), {i: t for t, i in env_tok.get_vocab().items()}
        first = next(((i, t) for t, i in sorted(mine.items(), key=lambda kv: kv[1]) if other.get(i) != t), None)
        shown = (
            ""
            if first is None
            else f" (id {first[0]}: {first[1]!r} in the model's, {other.get(first[0])!r} in the env's)"
        )
        out.append(f"other vocabularies{shown}")
    return out


def check_tokenizer_identity(lm: Any, env: Any, mode: str = "warn", revision: str | None = None) -> list[str]:
    """Compare the model's own tokenizer with the env's, when both are known.

    :param lm: The policy's Hugging Face model.
    :param env: The env (VecEnv or Gymnasium env).
    :param mode: ``"warn"`` (a :class:`TokenizerMismatchWarning`), ``"strict"`` (a ``ValueError``) or ``"off"``.
    :param revision: The model's Hub revision.
    :return: The differences found (empty when they match, or when either tokenizer is unknown).
    :raises ValueError: with ``mode="strict"`` and a mismatch, naming the differences and what to do.
    """
    if mode == "off" or env is None:
        return []
    env_tok = env_tokenizer(env)
    model_tok = None if env_tok is None else model_tokenizer(lm, revision)
    if model_tok is None or not hasattr(env_tok, "get_vocab"):
        return []
    differences = tokenizer_differences(model_tok, env_tok)
    if differences:
        message = (
            f"the policy's model was saved with another tokenizer than the env's: {'; '.join(differences)}. Its token "
            "ids would mean other words: build the env with the model's tokenizer (tokenizer=<the model's folder or "
            "Hub id>)"
        )
        if mode == "strict":
            raise ValueError(message + ", or pass policy_kwargs={'tokenizer_check': 'warn'} to train anyway")
        warnings.warn(
            message + " (policy_kwargs={'tokenizer_check': 'strict'} refuses it)", TokenizerMismatchWarning, 3
        )
    return differences


def check_policy_tokenizer(policy: Any, env: Any) -> list[str]:
    """:func:`check_tokenizer_identity` for a built policy (a ``CausalLMPolicy``: its ``lm``, ``tokenizer_check`` and
    ``revision``; any other policy: nothing to check)."""
    lm = getattr(policy, "lm", None)
    if lm is None:
        return []
    return check_tokenizer_identity(
        lm, env, getattr(policy, "tokenizer_check", "warn"), getattr(policy, "revision", None)
    )
