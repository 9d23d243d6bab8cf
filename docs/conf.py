"""Sphinx configuration of the textrl docs.

Build (as CI does): ``sphinx-build -W --keep-going -n -b html docs docs/_build/html``. Warnings are errors and
``nitpicky`` is on, so a cross-reference to a name of ours that does not exist fails the build; names of other
packages (torch, numpy, Gymnasium, SB3, transformers, ...) are not resolved (no intersphinx: the build needs no
network) and are listed in ``nitpick_ignore_regex``. The per-env pages in ``docs/envs/`` are generated at build
time from the task registry by ``docs/_ext/textrl_docs.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document this checkout, whatever is installed
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # importing the packages never reaches for a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import textrl_envs  # noqa: E402  (after the path set-up above)

project = "textrl"
author = "The textrl authors"
copyright = "2026, The textrl authors"  # noqa: A001  (Sphinx's name)
release = textrl_envs.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "myst_parser",
    "textrl_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# -- autodoc: the docstrings are Sphinx style (:param x:), so no napoleon --------------------------------------
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True
# an override without a docstring of its own stays undocumented, rather than showing the docstring of the SB3 or
# Gymnasium method it overrides (written for their docs, in another docstring style)
autodoc_inherit_docstrings = False

# -- cross-references: every name of ours must resolve; names of other packages are not looked up -------------
nitpicky = True
_EXTERNAL = (
    "torch",
    "numpy",
    "np",
    "gymnasium",
    "gym",
    "stable_baselines3",
    "sb3_contrib",
    "transformers",
    "peft",
    "datasets",
    "tokenizers",
    "safetensors",
    "scipy",
    "matplotlib",
    "PIL",
    "reasoning_gym",
    "textarena",
    "nltk",
    "vaderSentiment",
    "rouge_score",
    "sacrebleu",
    "tensorboard",
    "typing",
    "typing_extensions",
    "collections",
    "pathlib",
    "os",
    "concurrent",
    "threading",
    "random",
    "enum",
    "abc",
    "dataclasses",
    "contextlib",
    "io",
    "logging",
    "argparse",
    "types",
)
nitpick_ignore_regex = [(r"py:.*", rf"{name}(\..*)?") for name in _EXTERNAL]

# -- HTML ---------------------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"textrl {release}"
html_static_path: list[str] = []
pygments_style = "sphinx"
pygments_dark_style = "monokai"
