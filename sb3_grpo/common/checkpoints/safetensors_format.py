"""A checkpoint format that cannot run code: the weights in safetensors, everything else in plain JSON.

``model.save("model.safetensors")`` (any algorithm of this package; :func:`save_safetensors` for any SB3 algorithm)
writes one safetensors file: its tensors are the state dicts SB3's ``.zip`` holds (the policy's, the optimizer's,
a KL reference's), and its header's metadata holds, as JSON, the algorithm's name and every attribute SB3 saves.
What SB3 would pickle is written as tagged JSON instead (:func:`encode`): spaces by their arguments, NumPy arrays as
base64 bytes with their dtype and shape, SB3's schedule classes by their arguments, random generators by their
state, classes by their import name. An attribute that only code could rebuild (a ``lambda`` schedule, an object of
another package) is refused at save time, naming it.

Loading (``GRPO.load("model.safetensors")``, :func:`safetensors_source` for any SB3 class) parses the JSON and the
tensors and hands them to SB3's own ``load`` as ``custom_objects`` and in-memory state dicts: nothing from the file
goes through pickle. A class the JSON names must pass the same allow-list as the restricted unpickler
(:func:`sb3_grpo.common.checkpoints.unpickling.allowed_global`) unless the file is trusted.
"""

from __future__ import annotations

import base64
import collections
import importlib
import io
import json
import math
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch as th

from sb3_grpo.common.checkpoints.unpickling import UntrustedCheckpointError, allowed_global
from sb3_grpo.file_io import atomic_write

__all__ = [
    "FORMAT_NAME",
    "SAFETENSORS_SUFFIX",
    "decode",
    "encode",
    "is_safetensors_path",
    "read_safetensors",
    "safetensors_algorithm",
    "safetensors_source",
    "save_safetensors",
]

#: The ``format`` key of the file's metadata.
FORMAT_NAME = "sb3_grpo.safetensors"
FORMAT_VERSION = "1"
SAFETENSORS_SUFFIX = ".safetensors"
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_SCHEDULES = {"FloatSchedule": ("value_schedule",), "ConstantSchedule": ("val",),
              "LinearSchedule": ("start", "end", "end_fraction")}  # fmt: skip


def is_safetensors_path(path: Any) -> bool:
    """Whether ``path`` names a file of this format (by its suffix)."""
    return isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(SAFETENSORS_SUFFIX)


class _Tensors:
    """The tensors of one file, by name; a tensor met twice (tied weights) is stored once."""

    def __init__(self) -> None:
        self.tensors: dict[str, th.Tensor] = {}
        self._seen: dict[tuple[Any, ...], str] = {}
        self._storages: set[int] = set()

    def add(self, name: str, tensor: th.Tensor) -> str:
        tensor = tensor.detach()
        if tensor.numel() == 0:
            self.tensors[name] = tensor.to("cpu").contiguous()
            return name
        storage = tensor.untyped_storage().data_ptr()
        view = (storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype,
                str(tensor.device))  # fmt: skip
        if view in self._seen:  # the same tensor again (tied weights): one copy in the file
            return self._seen[view]
        stored = tensor.to("cpu")
        # safetensors refuses tensors that share memory: another view of a storage already stored is copied
        self.tensors[name] = (
            stored.clone(memory_format=th.contiguous_format) if storage in self._storages else stored.contiguous()
        )
        self._seen[view] = name
        self._storages.add(storage)
        return name


def _space(value: Any, tensors: _Tensors | None, where: str) -> dict[str, Any]:
    from gymnasium import spaces

    def enc(v: Any, sub: str) -> Any:
        return encode(v, tensors, f"{where}.{sub}")

    kind = type(value)
    if kind is spaces.Box:
        args = {"low": enc(value.low, "low"), "high": enc(value.high, "high"), "shape": list(value.shape),
                "dtype": str(value.dtype)}  # fmt: skip
    elif kind is spaces.Discrete:
        args = {"n": int(value.n), "start": int(value.start)}
    elif kind is spaces.MultiDiscrete:
        args = {"nvec": enc(value.nvec, "nvec"), "dtype": str(value.dtype), "start": enc(value.start, "start")}
    elif kind is spaces.MultiBinary:
        args = {"n": enc(value.n, "n")}
    elif kind is spaces.Dict:
        return {":space:": "Dict", "spaces": [[k, _space(s, tensors, f"{where}.{k}")] for k, s in value.spaces.items()]}
    elif kind is spaces.Tuple:
        return {":space:": "Tuple", "spaces": [_space(s, tensors, f"{where}[{i}]") for i, s in enumerate(value)]}
    elif kind is spaces.Text:
        args = {"max_length": value.max_length, "min_length": value.min_length, "charset": "".join(value.character_set)}
    else:
        raise ValueError(f"{where}: the space {kind.__name__} is not one the safetensors format stores")
    return {":space:": kind.__name__, "args": args}


def _unspace(value: dict[str, Any], tensors: dict[str, th.Tensor], trusted: bool) -> Any:
    from gymnasium import spaces

    kind = value[":space:"]
    if kind == "Dict":
        return spaces.Dict({k: _unspace(s, tensors, trusted) for k, s in value["spaces"]})
    if kind == "Tuple":
        return spaces.Tuple([_unspace(s, tensors, trusted) for s in value["spaces"]])
    if kind not in ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Text"):
        raise ValueError(f"unknown space {kind!r}")
    args = {k: decode(v, tensors, trusted) for k, v in value["args"].items()}
    if "shape" in args:
        args["shape"] = tuple(args["shape"])
    return getattr(spaces, kind)(**args)


def _array(value: np.ndarray | np.generic, where: str) -> dict[str, Any]:
    array = np.asarray(value)
    if array.dtype.kind not in "biufc" or array.dtype.hasobject:
        raise ValueError(f"{where}: a NumPy array of dtype {array.dtype} (only numbers and booleans are stored)")
    return {"dtype": array.dtype.str, "shape": list(array.shape),
            "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")}  # fmt: skip


def _unarray(value: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(value["dtype"])
    if dtype.kind not in "biufc" or dtype.hasobject:
        raise ValueError(f"a NumPy array of dtype {dtype} is not allowed")
    raw = base64.b64decode(value["data"].encode("ascii"), validate=True)
    return np.frombuffer(raw, dtype=dtype).reshape([int(n) for n in value["shape"]]).copy()


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _unclass(name: str, trusted: bool) -> type:
    module, _, qualname = name.partition(":")
    if trusted:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    obj = allowed_global(module, qualname)
    if obj is None or not isinstance(obj, type):
        raise UntrustedCheckpointError(
            f"the checkpoint names the class {module}.{qualname}, which is not among the classes a checkpoint may name "
            "(policies, feature extractors, buffers of SB3 and this package, torch activations and optimizers); "
            "importing it could run code. Load it only if you trust the file: load(..., trusted=True) or the CLI's "
            "--trust-checkpoint"
        )
    return obj


def _encode_container(value: Any, tensors: _Tensors | None, where: str) -> Any:
    """A list, tuple, deque or dict, its items encoded; ``NotImplemented`` for anything else."""
    if isinstance(value, (list, tuple)):
        items = [encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else {":tuple:": items}
    if isinstance(value, collections.deque):
        return {":deque:": [encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)], "maxlen": value.maxlen}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith(":") for k in value):
            return {k: encode(v, tensors, f"{where}.{k}") for k, v in value.items()}
        pairs = [[encode(k, tensors, where), encode(v, tensors, f"{where}[{k!r}]")] for k, v in value.items()]
        return {":dict:": pairs}
    return NotImplemented


def _encode_object(value: Any, tensors: _Tensors | None, where: str) -> Any:
    """NumPy, torch, Gymnasium and SB3 objects as tagged JSON; ``NotImplemented`` for anything else."""
    from gymnasium.spaces import Space
    from stable_baselines3.common import utils as sb3_utils

    if isinstance(value, np.ndarray):
        return {":ndarray:": _array(value, where)}
    if isinstance(value, np.generic):
        return {":npscalar:": _array(value, where)}
    if isinstance(value, np.dtype):
        return {":dtype:": value.str}
    if isinstance(value, th.Tensor):
        if tensors is None:
            raise ValueError(f"{where}: a tensor where none is expected")
        return {":tensor:": tensors.add(where, value)}
    if isinstance(value, th.dtype):
        return {":torch_dtype:": str(value).removeprefix("torch.")}
    if isinstance(value, Space):
        return _space(value, tensors, where)
    if isinstance(value, np.random.Generator):
        name = type(value.bit_generator).__name__
        if name not in _BIT_GENERATORS:
            raise ValueError(f"{where}: a random generator on {name}")
        return {":generator:": name, "state": encode(value.bit_generator.state, tensors, where)}
    kind = type(value)
    if kind.__name__ in _SCHEDULES and getattr(sb3_utils, kind.__name__, None) is kind:
        args = {a: encode(getattr(value, a), tensors, f"{where}.{a}") for a in _SCHEDULES[kind.__name__]}
        return {":schedule:": kind.__name__, "args": args}
    if isinstance(value, type):
        return {":class:": _class_name(value)}
    return NotImplemented


def encode(value: Any, tensors: _Tensors | None, where: str) -> Any:
    """``value`` as plain JSON (tagged objects for what JSON lacks); tensors go to ``tensors`` by name.

    :raises ValueError: naming ``where`` for a value only code could rebuild.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {":float:": repr(value)}
    for encoder in (_encode_container, _encode_object):
        out = encoder(value, tensors, where)
        if out is not NotImplemented:
            return out
    kind = type(value)
    raise ValueError(
        f"{where} is a {kind.__module__}.{kind.__qualname__}, which the safetensors format cannot store without code "
        "(it stores numbers, strings, arrays, spaces, SB3's schedule classes and class names); use SB3's "
        "LinearSchedule / ConstantSchedule instead of a function, or save a .zip (SB3's format, which pickles it)"
    )


def _decode_generator(value: dict[str, Any], tensors: dict[str, th.Tensor], trusted: bool) -> np.random.Generator:
    if value[":generator:"] not in _BIT_GENERATORS:
        raise ValueError(f"unknown bit generator {value[':generator:']!r}")
    bit_generator = getattr(np.random, value[":generator:"])()
    bit_generator.state = decode(value["state"], tensors, trusted)
    return np.random.Generator(bit_generator)


def _decode_schedule(value: dict[str, Any], tensors: dict[str, th.Tensor], trusted: bool) -> Any:
    from stable_baselines3.common import utils as sb3_utils

    name = value[":schedule:"]
    if name not in _SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}")
    args = {k: decode(v, tensors, trusted) for k, v in value["args"].items() if k in _SCHEDULES[name]}
    return getattr(sb3_utils, name)(**args)


def _decode_torch_dtype(name: Any) -> th.dtype:
    dtype = getattr(th, str(name), None)
    if not isinstance(dtype, th.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def _checked_dtype(name: Any) -> np.dtype:
    dtype = np.dtype(str(name))
    if dtype.hasobject:
        raise ValueError(f"a NumPy dtype {dtype} is not allowed")
    return dtype


# tag -> decoder of the tag's value alone
_LEAF_DECODERS: dict[str, Any] = {
    ":float:": float,
    ":ndarray:": _unarray,
    ":npscalar:": lambda array: _unarray(array)[()],
    ":dtype:": _checked_dtype,
    ":torch_dtype:": _decode_torch_dtype,
}
# tag -> decoder(the tagged dict, the file's tensors, trusted) of the tags that hold encoded values
_NESTED_DECODERS: dict[str, Any] = {
    ":tuple:": lambda v, t, tr: tuple(decode(x, t, tr) for x in v[":tuple:"]),
    ":deque:": lambda v, t, tr: collections.deque((decode(x, t, tr) for x in v[":deque:"]), maxlen=v.get("maxlen")),
    ":dict:": lambda v, t, tr: {_hashable(decode(k, t, tr)): decode(x, t, tr) for k, x in v[":dict:"]},
    ":space:": _unspace,
    ":generator:": _decode_generator,
    ":schedule:": _decode_schedule,
}


def decode(value: Any, tensors: dict[str, th.Tensor], trusted: bool = False) -> Any:
    """The inverse of :func:`encode` (``tensors``: the file's tensors by name).

    :raises UntrustedCheckpointError: for a class outside the allow-list (unless ``trusted``).
    :raises ValueError: for a tag it does not know or a malformed value.
    """
    if isinstance(value, list):
        return [decode(v, tensors, trusted) for v in value]
    if not isinstance(value, dict):
        return value
    tags = [k for k in value if k.startswith(":")]
    if not tags:
        return {k: decode(v, tensors, trusted) for k, v in value.items()}
    tag = tags[0]
    if tag in _LEAF_DECODERS:
        return _LEAF_DECODERS[tag](value[tag])
    if tag == ":tensor:":
        return tensors[value[tag]]
    if tag == ":class:":
        return _unclass(str(value[tag]), trusted)
    if tag not in _NESTED_DECODERS:
        raise ValueError(f"unknown tag {tag!r}")
    return _NESTED_DECODERS[tag](value, tensors, trusted)


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _save_parts(model: Any, exclude: Iterable[str] | None, include: Iterable[str] | None) -> tuple[dict, dict, dict]:
    """What SB3's ``BaseAlgorithm.save`` writes: ``(data, params, pytorch_variables)``, chosen by the same rules."""
    from stable_baselines3.common.save_util import recursive_getattr

    data = model.__dict__.copy()
    excluded = set(exclude or []).union(model._excluded_save_params())
    if include is not None:
        excluded = excluded.difference(include)
    state_dicts_names, torch_variable_names = model._get_torch_save_params()
    for name in [*state_dicts_names, *torch_variable_names]:
        excluded.add(name.split(".")[0])
    for name in excluded:
        data.pop(name, None)
    variables = {name: recursive_getattr(model, name) for name in torch_variable_names or []}
    return data, model.get_parameters(), variables


def _system_info() -> str:
    from stable_baselines3.common.utils import get_system_info

    return get_system_info(print_info=False)[1]


def save_safetensors(
    model: Any, path: str | os.PathLike, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None
) -> Path:
    """Save an SB3 algorithm as one safetensors file (atomically, :func:`~sb3_grpo.file_io.atomic_write`).

    :param model: Any SB3 algorithm.
    :param path: The file; it must end in ``.safetensors``.
    :param exclude: Attributes not to save (SB3's ``save`` argument).
    :param include: Attributes to save that are excluded by default (SB3's).
    :return: The path written.
    :raises ValueError: naming an attribute that only code could rebuild (nothing is written).
    """
    from safetensors.torch import save_file

    if not is_safetensors_path(path):
        raise ValueError(f"save_safetensors: {os.fspath(path)!r} must end in {SAFETENSORS_SUFFIX}")
    data, params, variables = _save_parts(model, exclude, include)
    tensors = _Tensors()
    metadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "algorithm": _class_name(type(model)),
        "data": json.dumps({k: encode(v, tensors, k) for k, v in data.items()}, allow_nan=False),
        "params": json.dumps({k: encode(v, tensors, k) for k, v in params.items()}, allow_nan=False),
        "pytorch_variables": json.dumps({k: encode(v, tensors, k) for k, v in variables.items()}, allow_nan=False),
        "system_info": _system_info(),
    }
    return atomic_write(path, lambda tmp: save_file(tensors.tensors, tmp, metadata=metadata))


def read_safetensors(path: str | os.PathLike, trusted: bool = False) -> dict[str, Any]:
    """The contents of a file written by :func:`save_safetensors`: ``{"algorithm", "data", "params",
    "pytorch_variables", "system_info"}``, decoded (no pickle is involved).

    :raises FileNotFoundError: when there is no such file.
    :raises ValueError: when it is not a file of this format.
    :raises UntrustedCheckpointError: for a class outside the allow-list (unless ``trusted``).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no saved model at {path!r}; give the path of a file written by model.save()")
    metadata = _metadata(path)
    try:
        tensors = load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{path!r} is not a readable safetensors file ({err})") from None
    try:
        parts = {key: json.loads(metadata[key]) for key in ("data", "params", "pytorch_variables")}
        out = {key: {k: decode(v, tensors, trusted) for k, v in parts[key].items()} for key in parts}
    except UntrustedCheckpointError as err:
        raise UntrustedCheckpointError(f"{path}: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{path!r}: its metadata is not a saved model ({type(err).__name__}: {err})") from None
    return {**out, "algorithm": metadata["algorithm"], "system_info": metadata.get("system_info", "")}


def _metadata(path: str) -> dict[str, str]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{path!r} is not a readable safetensors file ({err})") from None
    if metadata.get("format") != FORMAT_NAME:
        raise ValueError(
            f"{path!r} is a safetensors file but not a saved model (its metadata has no format={FORMAT_NAME!r}); "
            "give a file written by model.save('....safetensors')"
        )
    if metadata.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path!r}: format version {metadata.get('format_version')!r}, this version reads 1")
    return metadata


def safetensors_algorithm(path: str | os.PathLike) -> str:
    """The ``module:Class`` of the algorithm that saved ``path`` (read from the metadata only)."""
    return _metadata(os.fspath(path))["algorithm"]


def safetensors_source(
    path: str | os.PathLike, custom_objects: dict[str, Any] | None = None, trusted: bool = False
) -> tuple[io.BytesIO, dict[str, Any]]:
    """What SB3's ``load`` needs to load a file of this format: an in-memory SB3 zip (its ``data`` entry names the
    attributes, its state dicts are the file's tensors) and ``custom_objects`` holding every attribute (the caller's
    own ``custom_objects`` win). Nothing of the file is unpickled: the attributes arrive through ``custom_objects``.
    """
    content = read_safetensors(path, trusted=trusted)
    objects = {**content["data"], **(custom_objects or {})}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("data", json.dumps(dict.fromkeys(objects)))
        for name, state in content["params"].items():
            archive.writestr(f"{name}.pth", _torch_bytes(state))
        archive.writestr("pytorch_variables.pth", _torch_bytes(content["pytorch_variables"]))
        archive.writestr("system_info.txt", content["system_info"])
    buffer.seek(0)
    return buffer, objects


def _torch_bytes(obj: Any) -> bytes:
    out = io.BytesIO()
    th.save(obj, out)
    return out.getvalue()
