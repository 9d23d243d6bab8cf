"""Reading the pickled entries of an SB3 checkpoint without running code from it.

SB3's ``.zip`` stores the model's attributes as JSON, except those JSON cannot hold (the spaces, the schedules, the
policy class, NumPy arrays, the episode-statistics deques), which it stores as cloudpickle. Unpickling runs whatever
callables the pickle names, so a crafted file runs code on ``load``. :class:`RestrictedUnpickler` resolves only the
names of :func:`allowed_global`: NumPy arrays, scalars, dtypes and random generators, Gymnasium's spaces, SB3's
schedule classes, and classes of the kinds SB3 stores by reference (policies, feature extractors, rollout buffers,
torch activation and optimizer classes) from stable-baselines3, sb3-contrib, this package and torch. Anything else
(``os.system``, ``builtins.eval``, a function pickled by value, a class of another package) is refused, naming it.

:func:`safe_custom_objects` decodes the pickled entries of a checkpoint's ``data`` this way and hands them to SB3's
``load`` as ``custom_objects``, so SB3 never unpickles them itself. An entry that is only a run's statistics or its
last observation (:data:`SKIPPABLE_ENTRIES`) and fails the allow-list is skipped with a warning; any other refused
entry is an :class:`UntrustedCheckpointError` naming it, unless the caller trusts the file (``trusted=True``, the
CLI's ``--trust-checkpoint``): then SB3 unpickles it as it always has.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import io
import json
import os
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from typing import Any

__all__ = [
    "REBUILT_ENTRIES",
    "SCHEDULE_ENTRIES",
    "SKIPPABLE_ENTRIES",
    "RestrictedUnpickler",
    "UntrustedCheckpointError",
    "allowed_global",
    "read_checkpoint_data",
    "restricted_loads",
    "safe_custom_objects",
    "user_schedule_function",
]

#: Entries of SB3's ``data`` that are rebuilt when the model is set up: ``lr_schedule`` (SB3 makes it again from
#: ``learning_rate``). They are never read from the file.
REBUILT_ENTRIES = ("lr_schedule",)
#: Entries of SB3's ``data`` a model runs without: the episode statistics (rebuilt by ``learn``) and the last
#: observation (reset by ``learn`` and by ``load`` with an env). One that fails the allow-list is skipped, not refused.
SKIPPABLE_ENTRIES = (
    "ep_info_buffer",
    "ep_success_buffer",
    "_last_obs",
    "_last_episode_starts",
    "_last_original_obs",
)

# exact (module, name) pairs: data types whose construction runs no code of the file
_EXACT = {
    ("builtins", name)
    for name in (
        "bool",
        "bytearray",
        "bytes",
        "complex",
        "dict",
        "float",
        "frozenset",
        "int",
        "list",
        "range",
        "set",
        "slice",
        "str",
        "tuple",
    )  # fmt: skip
} | {
    ("collections", "deque"),
    ("collections", "OrderedDict"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("numpy.random.bit_generator", "SeedSequence"),
    ("numpy.random.mtrand", "RandomState"),
    ("numpy.random._pcg64", "PCG64"),
    ("numpy.random._pcg64", "PCG64DXSM"),
    ("numpy.random._mt19937", "MT19937"),
    ("numpy.random._philox", "Philox"),
    ("numpy.random._sfc64", "SFC64"),
    ("stable_baselines3.common.utils", "FloatSchedule"),
    ("stable_baselines3.common.utils", "ConstantSchedule"),
    ("stable_baselines3.common.utils", "LinearSchedule"),
}
# NumPy's array and scalar reconstructors, under the module names of NumPy 1 and 2
_NUMPY_CORE = {"numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric"}
_NUMPY_CORE_NAMES = {"_reconstruct", "scalar", "_frombuffer"}
# packages whose classes of the kinds below may be named by reference (a policy class, a buffer class, ...)
_CLASS_PACKAGES = ("stable_baselines3", "sb3_contrib", "sb3_grpo", "textrl_envs")


def _class_kinds() -> tuple[type, ...]:
    """The base classes an allowed class of :data:`_CLASS_PACKAGES` must derive from (imported lazily)."""
    from stable_baselines3.common.buffers import BaseBuffer
    from stable_baselines3.common.policies import BasePolicy
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    return (BasePolicy, BaseFeaturesExtractor, BaseBuffer)


def _resolve(module: str, name: str) -> Any:
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _lookup(module: str, name: str) -> tuple[Any, bool] | None:
    """``(object, whether a pickle may call it)`` for an allowed ``module.name`` (see :func:`allowed_global`)."""
    parts = [*module.split("."), *name.split(".")]
    if any(not p or (p.startswith("__") and p.endswith("__")) for p in parts):
        return None  # dunder names (``__main__``, ``__builtins__``, ``__globals__``) never resolve
    try:
        if (module, name) in _EXACT or (module in _NUMPY_CORE and name in _NUMPY_CORE_NAMES):
            return _resolve(module, name), True
        if _under(module, ("gymnasium.spaces",)):
            from gymnasium.spaces import Space

            obj = _resolve(module, name)
            return (obj, True) if isinstance(obj, type) and issubclass(obj, Space) else None
        if module == "torch" or _under(module, ("torch.nn.modules", "torch.optim")):
            import torch as th

            obj = _resolve(module, name)
            if module == "torch":
                return (obj, False) if isinstance(obj, th.dtype) else None
            kinds = (th.nn.Module, th.optim.Optimizer)
            return (obj, False) if isinstance(obj, type) and issubclass(obj, kinds) else None
        if _under(module, _CLASS_PACKAGES):
            obj = _resolve(module, name)
            return (obj, False) if isinstance(obj, type) and issubclass(obj, _class_kinds()) else None
    except (ImportError, AttributeError):
        return None
    return None


def allowed_global(module: str, name: str) -> Any | None:
    """The object a pickle may name as ``module.name``, or ``None`` when it is not allowed.

    Allowed: the data types of builtins (containers, numbers), ``collections.deque``, NumPy's dtype, array and
    random-generator reconstructors, SB3's schedule classes and any Gymnasium space class, which a pickle may also
    call; and, as references only (a pickle that calls or instantiates them is refused), torch dtypes, ``torch.nn``
    module and ``torch.optim`` optimizer classes, and the policy, feature-extractor and buffer classes of
    stable-baselines3, sb3-contrib, ``sb3_grpo`` and ``textrl_envs``. No module outside those packages is imported to
    check a name.
    """
    found = _lookup(module, name)
    return None if found is None else found[0]


class UntrustedCheckpointError(ValueError):
    """A checkpoint entry names code outside the allow-list of :func:`allowed_global` (see
    :func:`safe_custom_objects`)."""


class _Refused(pickle.UnpicklingError):
    def __init__(self, module: str, name: str, what: str | None = None) -> None:
        self.qualified = what or f"{module}.{name}"
        super().__init__(self.qualified)


#: Entries that hold a schedule: a plain function of the user's own, already imported, may be named there.
SCHEDULE_ENTRIES = ("learning_rate", "clip_range", "clip_range_vf", "ent_coef")


def _install_paths() -> tuple[str, ...]:
    """Where the standard library and installed packages live (their functions are never schedules)."""
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(
        os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths
    )


def user_schedule_function(module: str, name: str) -> Any | None:
    """A schedule function a pickle names by reference, when it is the user's own code: a plain Python function of a
    module that this process has already imported (nothing is imported to find it), from a file outside the standard
    library, the installed packages and the packages a checkpoint's classes come from. ``None`` otherwise.
    """
    import sys
    import types

    loaded = sys.modules.get(module)
    if loaded is None or _under(module, _CLASS_PACKAGES) or "." in name:
        return None
    obj = getattr(loaded, name, None)
    source = getattr(loaded, "__file__", None)
    if not isinstance(obj, types.FunctionType) or obj.__module__ != module or not source:
        return None
    return None if os.path.realpath(source).startswith(_install_paths()) else obj


class RestrictedUnpickler(pickle._Unpickler):
    """The pure-Python :class:`pickle.Unpickler`, resolving only :func:`allowed_global` names and calling only those
    that are data types (a class allowed as a reference, such as a policy class, is never instantiated).

    :param schedule: Also resolve, as references, the user's own schedule functions
        (:func:`user_schedule_function`): for the entries of :data:`SCHEDULE_ENTRIES`.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, schedule: bool = False) -> None:
        super().__init__(file)
        self._references: list[Any] = []
        self._schedule = schedule

    def find_class(self, module: str, name: str) -> Any:
        found = _lookup(module, name)
        if found is None and self._schedule:
            function = user_schedule_function(module, name)
            found = None if function is None else (function, False)
        if found is None:
            raise _Refused(module, name)
        obj, callable_ = found
        if not callable_:
            self._references.append(obj)
        return obj

    def persistent_load(self, pid: Any) -> Any:  # noqa: ARG002  (pickle's signature)
        raise pickle.UnpicklingError("persistent ids are not allowed in a checkpoint entry")

    def _check_call(self, target: Any) -> None:
        if any(target is ref for ref in self._references):
            name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
            raise _Refused(*name.rsplit(".", 1), what=f"a call of {name}")

    def load_reduce(self) -> None:
        self._check_call(self.stack[-2])
        super().load_reduce()

    def load_newobj(self) -> None:
        self._check_call(self.stack[-2])
        super().load_newobj()

    def load_newobj_ex(self) -> None:
        self._check_call(self.stack[-3])
        super().load_newobj_ex()

    def load_inst(self) -> None:
        raise pickle.UnpicklingError("the INST opcode (pickle protocol 0) is not allowed in a checkpoint entry")

    def load_obj(self) -> None:
        raise pickle.UnpicklingError("the OBJ opcode (pickle protocol 1) is not allowed in a checkpoint entry")

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.INST[0]] = load_inst
    dispatch[pickle.OBJ[0]] = load_obj


def restricted_loads(data: bytes, schedule: bool = False) -> Any:
    """``pickle.loads(data)`` through :class:`RestrictedUnpickler` (``schedule``: see there).

    :raises pickle.UnpicklingError: for a name outside the allow-list (its message is the name) or a broken pickle.
    """
    return RestrictedUnpickler(io.BytesIO(data), schedule=schedule).load()


def read_checkpoint_data(source: str | os.PathLike | io.IOBase) -> dict[str, Any]:
    """The ``data`` entry of an SB3 zip (path or binary file object, left at its start), as parsed JSON, nothing
    decoded.

    :raises ValueError: when it is not a zip with a JSON object in ``data``.
    """
    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "the file object"
    try:
        with zipfile.ZipFile(source) as archive:
            data = json.loads(archive.read("data").decode("utf-8"))
    except (OSError, zipfile.BadZipFile, KeyError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where} is not an SB3 checkpoint with a readable 'data' entry ({err})") from None
    finally:
        if not isinstance(source, (str, os.PathLike)):
            source.seek(0)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: its 'data' entry is not a JSON object; give a file written by model.save()")
    return data


def _refusal(where: str, key: str, what: str) -> UntrustedCheckpointError:
    return UntrustedCheckpointError(
        f"{where}: the checkpoint entry {key!r} is a pickle that names {what}, which is not among the classes a "
        "checkpoint may hold (spaces, arrays, SB3 schedules, policy and buffer classes); loading it would run code "
        "from the file. Load it only if you trust whoever wrote it: load(..., trusted=True), "
        "ElasticCheckpointCallback(..., trusted=True) or the CLI's "
        f"--trust-checkpoint; or pass custom_objects={{{key!r}: <value>}} to replace the entry"
    )


def safe_custom_objects(
    source: str | os.PathLike | io.IOBase,
    custom_objects: Mapping[str, Any] | None = None,
    trusted: bool = False,
    needed: tuple[str, ...] | None = None,
) -> dict[str, Any] | None:
    """``custom_objects`` for SB3's ``load`` (or ``load_from_zip_file``) that replace every pickled entry of the
    checkpoint's ``data`` with its value decoded by :class:`RestrictedUnpickler`, so that SB3 unpickles nothing.

    :param source: The zip (path or binary file object).
    :param custom_objects: The caller's own replacements (kept as given; those entries are not decoded).
    :param trusted: Decode nothing: return ``custom_objects`` as given (SB3 then unpickles the entries itself,
        running any code they name).
    :param needed: Decode only these entries; every other pickled entry becomes ``None`` unread (``None``: all).
    :return: The replacements (``None`` when there are none and ``custom_objects`` was ``None``).
    :raises UntrustedCheckpointError: naming the entry and the name it refers to, for an entry outside the allow-list
        that a model needs.
    :raises ValueError: for an entry that is not a readable pickle.
    """
    if trusted:
        return None if custom_objects is None else dict(custom_objects)
    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "checkpoint"
    out = dict(custom_objects or {})
    skipped = []
    for key, item in read_checkpoint_data(source).items():
        if key in out or not (isinstance(item, dict) and ":serialized:" in item):
            continue
        if key in REBUILT_ENTRIES or (needed is not None and key not in needed):
            out[key] = None
            continue
        try:
            raw = base64.b64decode(str(item[":serialized:"]).encode(), validate=True)
            out[key] = restricted_loads(raw, schedule=key in SCHEDULE_ENTRIES)
        except _Refused as err:
            if key not in SKIPPABLE_ENTRIES:
                raise _refusal(where, key, err.qualified) from None
            skipped.append(f"{key} ({err.qualified})")
        except (binascii.Error, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
            if key not in SKIPPABLE_ENTRIES:
                raise ValueError(
                    f"{where}: the checkpoint entry {key!r} is not a readable pickle ({type(err).__name__}: {err}); "
                    "the file is damaged or was not written by model.save()"
                ) from None
            skipped.append(f"{key} (unreadable)")
    if skipped:
        for key in SKIPPABLE_ENTRIES:  # SB3 rebuilds the statistics and the last observation together
            if key not in (custom_objects or {}):
                out[key] = None
        warnings.warn(
            f"{where}: skipped the entries {', '.join(skipped)}: episode statistics and the last observation, which "
            "the model runs without (learn() starts them again)",
            UserWarning,
            stacklevel=3,
        )
    return out or (None if custom_objects is None else out)
