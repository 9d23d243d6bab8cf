"""Files that are either complete or absent, folders one process writes at a time, and values made JSON-able: one
of each for the whole package.

:func:`atomic_write` (and :func:`write_text_atomic`, :func:`write_json_atomic`) is the one place that writes a file:
``model.save`` (:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`), checkpoints (:mod:`sb3_grpo.callbacks`),
``results.json``, ``report.md``, ``curves.png`` and the results pages use it; :func:`atomic_folder` does the same for a
folder (``warm-start``'s model). :class:`FolderLock` keeps a second command off an out dir another one is writing.
:func:`to_jsonable` is what saved specs (LoRA, model configs) and the benchmark configs use.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "LOCK_FILE",
    "TMP_SUFFIX",
    "DiskWriteError",
    "FolderBusyError",
    "FolderLock",
    "atomic_folder",
    "atomic_write",
    "check_writable_file",
    "is_atomic_temp",
    "save_figure_atomic",
    "to_jsonable",
    "write_json_atomic",
    "write_text_atomic",
]

#: Suffix of the temporary files :func:`atomic_write` writes before renaming them into place.
TMP_SUFFIX = ".tmp"


def _fsync_path(path: str | os.PathLike, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. directories cannot be opened on some platforms
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], Any]) -> Path | None:
    """Write a file so that ``path`` is either the old file, absent, or the complete new file.

    ``write(tmp)`` writes to a temporary file in the same folder (named ``.<name>.<pid>.tmp``, so no
    glob for ``*.zip`` / ``*.pkl`` matches it); it is then flushed to disk (``fsync``) and renamed over
    ``path`` with :func:`os.replace` (atomic on POSIX and Windows), and the folder is synced. If ``write``
    raises, the temporary file is removed and the error propagates; if the process dies, at most a stale
    temporary file remains (:class:`~sb3_grpo.callbacks.AtomicCheckpointCallback` removes those of dead processes).

    :param path: The final file path.
    :param write: Writes the content to the path it is given (its suffix is ``.tmp``: writers that append a
        default extension to suffix-less paths, as SB3's do, leave it alone).
    :return: ``path`` as a :class:`~pathlib.Path`, or ``None`` if ``write`` wrote nothing (e.g. a
        ``torch.distributed`` rank other than 0, where ``GRPO.save`` is a no-op).
    """
    path = Path(path)
    if path.name in ("", ".", "..") or path.is_dir():
        raise IsADirectoryError(
            errno.EISDIR, f"cannot write a file at {str(path)!r}: it is a folder (or empty); give a file path"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}{TMP_SUFFIX}"
    _IN_PROGRESS.add(str(tmp))
    try:
        write(str(tmp))
        if not tmp.exists():
            return None
        _fsync_path(tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno in _FULL_ERRNOS or err.errno in _DENIED_ERRNOS:
            raise _disk_error(path, err) from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        _IN_PROGRESS.discard(str(tmp))
    _fsync_path(path.parent, directory=True)
    return path


#: The temporary files :func:`atomic_write` is writing now (a writer that is atomic itself writes them directly).
_IN_PROGRESS: set[str] = set()


def is_atomic_temp(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the temporary file an :func:`atomic_write` is writing now: a writer that writes
    atomically itself (``GRPO.save``) then writes it directly instead of through a second temporary file."""
    return os.fspath(path) in _IN_PROGRESS


class DiskWriteError(OSError):
    """An ``OSError`` (same ``errno``) whose message names the file that could not be written and what to do."""

    def __init__(self, code: int | None, message: str, path: Path) -> None:
        super().__init__(code, message, str(path))
        self.message = message

    def __str__(self) -> str:
        return self.message


#: Errors of a full disk (or quota) and of a folder one may not write: :func:`atomic_write` names the path in them.
_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DENIED_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}


def _disk_error(path: Path, err: OSError) -> OSError:
    """``err`` again, with a message that names ``path`` and what to do (the previous file is kept)."""
    reason = err.strerror or str(err)
    if err.errno in _FULL_ERRNOS:
        todo = "free some space (or write to another folder) and run the command again"
    elif err.errno in _DENIED_ERRNOS:
        todo = "make the folder writable (or write to another folder) and run the command again"
    else:
        todo = "check the folder and run the command again"
    return DiskWriteError(err.errno, f"could not write {path}: {reason}; nothing was replaced there ({todo})", path)


def check_writable_file(path: str | os.PathLike, what: str) -> Path:
    """Refuse, before any work, a file path that cannot be written: a folder, a missing folder, a folder without
    write permission.

    :param path: The file to write later.
    :param what: How the user gave it, for the message (e.g. ``"--out"``).
    :raises ValueError: saying what is wrong and what to do.
    """
    path = Path(os.path.expanduser(os.fspath(path)))
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"{what} {os.fspath(path)!r} is a folder; give a file name in it")
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what} {os.fspath(path)!r}: {str(folder)!r} is a file, not a folder; give another path")
    if not folder.is_dir():
        raise ValueError(f"{what} {os.fspath(path)!r}: the folder {str(folder)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"{what} {os.fspath(path)!r}: no permission to write there; choose a folder you can write to")
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_write`: the old file or the whole new one, never a
    truncated one (e.g. on a full disk).

    :raises OSError: naming ``path`` when the file cannot be written (the previous file, if any, is kept).
    """

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)
    return Path(path)


def save_figure_atomic(fig: Any, path: str | os.PathLike) -> Path:
    """``fig.savefig(path)`` (matplotlib) through :func:`atomic_write`; the format is taken from ``path``'s suffix."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt))
    return Path(path)


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """A folder that appears at ``path`` only once it is complete: the block writes into a temporary sibling folder
    (``.<name>.<pid>.tmp``), which is then renamed to ``path``; if the block raises, the temporary folder is removed
    and ``path`` is left as it was.

    :param path: The final folder.
    :param overwrite: Replace an existing ``path`` (it is removed only once the new folder is complete).
    :raises FileExistsError: when ``path`` exists and ``overwrite`` is false (checked before the block runs).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(errno.EEXIST, f"{path} already exists; pass overwrite=True to replace it", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}{TMP_SUFFIX}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        for entry in tmp.rglob("*"):
            if entry.is_file():
                _fsync_path(entry)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.{os.getpid()}.old{TMP_SUFFIX}"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_path(path.parent, directory=True)


#: Name of the lock file :class:`FolderLock` keeps in the folder it locks.
LOCK_FILE = ".lock"


class FolderBusyError(RuntimeError):
    """Another process holds the :class:`FolderLock` of a folder."""


class FolderLock:
    """An advisory lock (``fcntl.flock``) on a folder, held from :meth:`acquire` to :meth:`release`, so that two
    commands never write one out dir at the same time. The lock file (:data:`LOCK_FILE`) holds the holder's pid and is
    removed on release; a lock whose holder died is free again (the kernel drops ``flock`` locks with the process).

    On a platform without ``fcntl`` (Windows) the lock does nothing.

    :param folder: The folder (it must exist when :meth:`acquire` is called).
    :param what: How the folder is named in the error, e.g. ``"--out"``.
    """

    def __init__(self, folder: str | os.PathLike, what: str = "folder") -> None:
        self.folder = Path(folder)
        self.what = what
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.folder / LOCK_FILE

    def acquire(self) -> FolderLock:
        """Take the lock.

        :raises FolderBusyError: naming the folder and the pid of the process that holds it.
        """
        try:
            import fcntl
        except ImportError:  # pragma: no cover  (Windows)
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise FolderBusyError(
                    f"{self.what} {self.folder} is in use by another process (pid {holder}); wait for it to finish "
                    f"(or stop it), or choose another {self.what}"
                ) from None
            try:  # the holder before us may have removed the file between our open and our lock: lock the new one
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock and remove its file (nothing happens when it is not held)."""
        if self._fd is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                if os.fstat(self._fd).st_ino == os.stat(self.path).st_ino:
                    self.path.unlink()
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types, so that it compares equal to itself after a JSON round trip.

    Enums become their values, sets sorted lists, tuples lists, dict keys strings, numpy scalars and arrays
    Python numbers and lists; anything else that JSON cannot hold becomes ``str(value)``.

    :param value: Any value.
    :return: The JSON-able value.
    """
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((to_jsonable(v) for v in value), key=str)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return str(value)


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` through :func:`atomic_write` (temp file, ``fsync``, rename).

    :param path: Target file.
    :param data: Data; :func:`to_jsonable` converts what JSON cannot hold (NaN is written as ``NaN``).
    """

    write_text_atomic(path, json.dumps(to_jsonable(data), indent=1) + "\n")
