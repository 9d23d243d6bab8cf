"""Bundled offline assets: a tiny byte-level BPE tokenizer, a tiny GPT-2 and a sentiment classifier.

All three are trained on a synthetic corpus (:mod:`textrl_envs.assets.corpus`) by
``python -m textrl_envs.assets.build``; the built folders ship with the package. Importing this
module is cheap: it only computes paths.

Example::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from textrl_envs.assets import lm_path, tokenizer_path

    tok = AutoTokenizer.from_pretrained(tokenizer_path())
    lm = AutoModelForCausalLM.from_pretrained(lm_path())
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = [
    "ASSETS_DIR",
    "BUILD_COMMAND",
    "assets_dir",
    "classifier_path",
    "lm_path",
    "load_manifest",
    "manifest_path",
    "tokenizer_path",
]

ASSETS_DIR = os.path.dirname(os.path.abspath(__file__))
BUILD_COMMAND = "python -m textrl_envs.assets.build"


def assets_dir() -> str:
    """The folder that holds the bundled assets.

    :return: absolute path of ``textrl_envs/assets``
    """
    return ASSETS_DIR


def _existing_dir(name: str, marker: str) -> str:
    """Absolute path of an asset folder, checked for a file it must contain.

    :param name: folder name under :data:`ASSETS_DIR`
    :param marker: a file the folder must hold
    :return: the absolute folder path
    :raises FileNotFoundError: when the folder or the file is missing
    """
    path = os.path.join(ASSETS_DIR, name)
    if not os.path.isfile(os.path.join(path, marker)):
        raise FileNotFoundError(
            f"bundled asset '{name}' not found at {path} (expected {marker}); rebuild the assets with `{BUILD_COMMAND}`"
        )
    return path


def tokenizer_path() -> str:
    """The bundled tokenizer (``AutoTokenizer.from_pretrained`` loads it).

    :return: absolute path of the tokenizer folder
    :raises FileNotFoundError: when the assets were not built
    """
    return _existing_dir("tokenizer", "tokenizer.json")


def lm_path() -> str:
    """The bundled tiny causal LM (``AutoModelForCausalLM.from_pretrained`` loads it).

    The folder also holds the tokenizer files, so ``AutoTokenizer`` works on it too.

    :return: absolute path of the LM folder
    :raises FileNotFoundError: when the assets were not built
    """
    return _existing_dir("lm", "model.safetensors")


def classifier_path() -> str:
    """The bundled sentiment classifier, labels ``{0: "NEGATIVE", 1: "POSITIVE"}``.

    ``AutoModelForSequenceClassification`` and ``AutoTokenizer`` both load it.

    :return: absolute path of the classifier folder
    :raises FileNotFoundError: when the assets were not built
    """
    return _existing_dir("classifier", "model.safetensors")


def manifest_path() -> str:
    """The build manifest (seed, steps, losses, accuracy, sha256 of the weights).

    :return: absolute path of ``MANIFEST.json``
    :raises FileNotFoundError: when the assets were not built
    """
    path = os.path.join(ASSETS_DIR, "MANIFEST.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found; rebuild the assets with `{BUILD_COMMAND}`")
    return path


def load_manifest() -> dict[str, Any]:
    """Read the build manifest.

    :return: the parsed ``MANIFEST.json``
    :raises FileNotFoundError: when the assets were not built
    """
    with open(manifest_path(), encoding="utf-8") as f:
        return json.load(f)
