"""Prompts from data: files (``.jsonl``, ``.json``, ``.csv``, ``.txt``) and Hugging Face ``datasets.Dataset``\\ s.

TRL's dataset convention: every row has a ``prompt`` column; the other columns are metadata that reach the
reward as keyword lists (``answer=[...]``). :func:`load_prompts` turns any of the sources below into the list
of prompt items every text env takes (``str``, or ``{"prompt": str, **metadata}``):

* ``.jsonl``: one JSON object per line, ``{"prompt": "2+2=", "answer": "4"}`` (blank lines are skipped);
* ``.json``: a list of such objects (or of strings), or one object of equal-length columns
  ``{"prompt": [...], "answer": [...]}``;
* ``.csv``: a header row with a ``prompt`` column (values are strings);
* ``.txt``: one prompt per line (blank lines skipped, the line break removed, nothing else);
* a ``datasets.Dataset`` (e.g. from ``datasets.load_from_disk``; the ``datasets`` package is the extra
  ``textrl[data]``): its rows.

Every row must have the same columns as the first, and ``prompt`` must be a str (a list of chat messages
``[{"role": ..., "content": ...}]`` too when the env renders a chat template). A bad file gets a
``ValueError`` that names the file and the line (or item).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: File kinds :func:`load_prompts` reads, by suffix.
FILE_KINDS = (".jsonl", ".json", ".csv", ".txt")
_KINDS = ", ".join(FILE_KINDS)


class PromptFileError(ValueError):
    """A prompt file that cannot be read as prompts; the message names the file and the line or item."""


def is_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face ``datasets`` object (checked by its module; nothing is imported)."""
    return type(obj).__module__.split(".")[0] == "datasets"


def load_prompts(source: Any) -> Any:
    """The prompt items of ``source``: a path to a prompt file, a ``datasets.Dataset``, or a list (returned as is).

    :param source: See the module docstring.
    :return: A list of ``str`` or ``{"prompt": ..., **metadata}`` dicts (a list given is returned unchanged).
    :raises PromptFileError: (a ``ValueError``) for a file or dataset that holds no valid prompts.
    :raises FileNotFoundError: for a path with a known suffix that does not exist.
    :raises TypeError: for a str that is not a prompt file (a single prompt must be given as a list).
    """
    if is_dataset(source):
        return dataset_prompts(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix in FILE_KINDS:
            if path.is_dir():
                raise PromptFileError(f"prompt file {str(path)!r} is a folder, not a file; give the file's path")
            if not path.is_file():
                raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
            return _READERS[suffix](path)
        if path.is_file():
            raise PromptFileError(f"prompt file {str(path)!r} has an unknown kind; give a {_KINDS} file")
        raise TypeError(
            f"prompts must be a list of str (or of dicts with a 'prompt' key), a path to a {_KINDS} file or a "
            f"datasets.Dataset; got the str {str(source)[:60]!r}, which is not a prompt file (for one prompt, "
            f"pass a list: prompts=[{str(source)[:30]!r}])"
        )
    return source


# -- the readers --------------------------------------------------------------------------------------------------


def _check_row(row: Any, where: str, columns: list[str] | None) -> tuple[Any, list[str]]:
    """A row as a prompt item, after checking its ``prompt`` and that it has the first row's columns."""
    if isinstance(row, str):
        row_columns = ["prompt"]
    elif isinstance(row, dict):
        if "prompt" not in row:
            raise PromptFileError(f"{where} has no 'prompt' key (it has {sorted(row)}); every row needs one")
        prompt = row["prompt"]
        if not (isinstance(prompt, str) or _is_messages(prompt)):
            raise PromptFileError(
                f"{where}: 'prompt' must be a str (or a list of chat messages), got {type(prompt).__name__}"
            )
        row_columns = sorted(row)
    else:
        raise PromptFileError(f"{where} is a {type(row).__name__}; expected an object with a 'prompt' key")
    if columns is not None and row_columns != columns:
        raise PromptFileError(f"{where} has the columns {row_columns}, but the first row has {columns}; all must match")
    return row, row_columns


def _is_messages(value: Any) -> bool:
    """A list of chat messages, ``[{"role": str, "content": str}, ...]`` (TRL's conversational format)."""
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)
    )


def _finish(rows: list[Any], path: Path) -> list[Any]:
    if not rows:
        raise PromptFileError(f"prompt file {str(path)!r} holds no prompts (it is empty or blank)")
    return rows


def _decoded_lines(path: Path):
    """``(line_number, text)`` of each line of a UTF-8 file (a BOM at the start is dropped)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise PromptFileError(f"{path}:{number}: not UTF-8 text ({err.reason} at byte {err.start})") from None
            yield number, text


def read_jsonl(path: Path) -> list[Any]:
    """Prompt items of a ``.jsonl`` file: one JSON object per line."""
    rows, columns = [], None
    for number, text in _decoded_lines(path):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise PromptFileError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None
        item, columns = _check_row(row, f"{path}:{number}", columns)
        rows.append(item)
    return _finish(rows, path)


def read_json(path: Path) -> list[Any]:
    """Prompt items of a ``.json`` file: a list of rows, or an object of equal-length columns."""
    text = "".join(line for _, line in _decoded_lines(path))
    if not text.strip():
        return _finish([], path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PromptFileError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if isinstance(data, dict):
        data = _columns_to_rows(data, str(path))
    if not isinstance(data, list):
        raise PromptFileError(
            f"{path} holds a JSON {type(data).__name__}; expected a list of objects with a 'prompt' key, "
            "or an object of columns {'prompt': [...], ...}"
        )
    rows, columns = [], None
    for i, row in enumerate(data):
        item, columns = _check_row(row, f"{path}: item #{i}", columns)
        rows.append(item)
    return _finish(rows, path)


def _columns_to_rows(data: dict[str, Any], where: str) -> list[dict[str, Any]]:
    if "prompt" not in data:
        raise PromptFileError(f"{where} is a JSON object without a 'prompt' column (it has {sorted(data)})")
    lengths = {k: len(v) if isinstance(v, list) else None for k, v in data.items()}
    if None in lengths.values() or len(set(lengths.values())) > 1:
        raise PromptFileError(f"{where}: a JSON object of columns needs lists of equal length; got lengths {lengths}")
    return [dict(zip(data, values)) for values in zip(*data.values())]


def read_csv(path: Path) -> list[Any]:
    """Prompt items of a ``.csv`` file with a header row that has a ``prompt`` column."""
    lines = (text for _, text in _decoded_lines(path))
    reader = csv.reader(lines)
    try:
        header = next(reader, None)
        if header is None:
            return _finish([], path)
        if "prompt" not in header:
            raise PromptFileError(f"{path}:1: the header {header} has no 'prompt' column")
        if len(set(header)) != len(header):
            raise PromptFileError(f"{path}:1: the header {header} names a column twice")
        rows = []
        for values in reader:
            if not values:
                continue
            if len(values) != len(header):
                raise PromptFileError(
                    f"{path}:{reader.line_num}: {len(values)} fields, but the header has {len(header)} ({header})"
                )
            rows.append(dict(zip(header, values)))
    except csv.Error as err:
        raise PromptFileError(f"{path}:{reader.line_num}: not valid CSV ({err})") from None
    return _finish(rows, path)


def read_txt(path: Path) -> list[str]:
    """Prompts of a ``.txt`` file: one per non-blank line, without its line break."""
    return _finish([text.rstrip("\r\n") for _, text in _decoded_lines(path) if text.strip()], path)


_READERS = {".jsonl": read_jsonl, ".json": read_json, ".csv": read_csv, ".txt": read_txt}


def dataset_prompts(dataset: Any) -> list[Any]:
    """Prompt items of a ``datasets.Dataset``: its rows (the ``prompt`` column and metadata columns)."""
    name = type(dataset).__name__
    if name in ("DatasetDict", "IterableDatasetDict"):
        raise TypeError(f"prompts is a {name} with splits {list(dataset)}; pass one split, e.g. dataset['train']")
    columns: Sequence[str] | None = getattr(dataset, "column_names", None)
    if not hasattr(dataset, "__len__") or columns is None:
        raise TypeError(
            f"prompts is a datasets.{name}, which has no length; pass a datasets.Dataset (from an IterableDataset "
            "`ds`: datasets.Dataset.from_list(list(ds.take(n))))"
        )
    if "prompt" not in columns:
        raise PromptFileError(f"the dataset has the columns {list(columns)}, no 'prompt' column (TRL's convention)")
    if len(dataset) == 0:
        raise PromptFileError("the dataset has no rows")
    rows = []
    for i, row in enumerate(dataset):
        item, _ = _check_row(dict(row), f"dataset row #{i}", None)
        rows.append(item)
    return rows
