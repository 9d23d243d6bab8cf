"""The bookkeeping of :class:`~textrl_envs.vector.TextGenVectorEnv` as small pure functions over arrays.

The vector env keeps N right-aligned observation windows (``(N, W)`` token ids and attention mask, see
:mod:`textrl_envs.core`) and per-env counters; these functions are every operation on them that the tests pin
down: pack the prompt table (:func:`pack_prompts`), start episodes (:func:`start_windows_`), append a token
(:func:`append_tokens`, in place :func:`append_tokens_`), write an interactive task's reply into some rows
(:func:`inject_tokens_`), detect the end of episodes (:func:`episode_ends`),
number episodes and group rounds (:func:`episode_ids`, :func:`group_ids`) and cut out and decode the finished
completions (:func:`completion_bounds`, :func:`completion_tuples`, :func:`decode_completions`), and build the
per-env info arrays (:func:`int_array`, :func:`flag_array`, :func:`object_array`). A trailing
``_`` means the function writes into its arguments. On CPU tensors the in-place ones go through numpy views,
which costs less per call than torch indexing; on other devices they use torch ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from textrl_envs.core import EpisodeSpec
from textrl_envs.decoding import ByteTableDecoder


def pack_prompts(prompt_ids: Sequence[np.ndarray], width: int, pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack token-id arrays into one right-aligned, padded ``(R, width)`` table and its mask.

    :param prompt_ids: One int array per prompt, each of length ``1..width``.
    :param width: The table width (the prompt budget ``max_prompt_tokens``).
    :param pad_token_id: Id written left of each prompt.
    :return: ``(ids, mask)``: ``int64`` arrays of shape ``(R, width)``.
    """
    ids = np.full((len(prompt_ids), width), pad_token_id, dtype=np.int64)
    mask = np.zeros((len(prompt_ids), width), dtype=np.int64)
    for r, p in enumerate(prompt_ids):
        n = len(p)
        if not 0 < n <= width:
            raise ValueError(f"prompt #{r} has {n} tokens; expected 1..{width}")
        ids[r, width - n :] = p
        mask[r, width - n :] = 1
    return ids, mask


def start_windows_(
    ids: torch.Tensor | np.ndarray,
    mask: torch.Tensor | np.ndarray,
    envs: torch.Tensor | np.ndarray,
    rows: torch.Tensor | np.ndarray,
    packed_ids: torch.Tensor | np.ndarray,
    packed_mask: torch.Tensor | np.ndarray,
    pad_token_id: int,
) -> None:
    """Write the first observation of new episodes in place: an index gather from the prompt table.

    Rows ``envs`` of the ``(N, W)`` state become padding with the prompt right-aligned in the last
    ``P`` columns. (``index_copy_``/``index_fill_`` rather than ``t[idx] = x``, which is far slower on CPU.)
    On CPU, numpy views of the tensors (or numpy arrays in their place) go through numpy.

    :param ids: ``(N, W)`` token ids, modified in place.
    :param mask: ``(N, W)`` attention mask, modified in place.
    :param envs: ``(M,)`` env indices that start an episode (on CPU, a numpy array will do).
    :param rows: ``(M,)`` rows of the prompt table they use (idem).
    :param packed_ids: ``(R, P)`` right-aligned prompt table (see :func:`pack_prompts`), ``P <= W``;
        with ``P == W`` whole rows are copied (fewer, contiguous ops).
    :param packed_mask: ``(R, P)`` its mask.
    :param pad_token_id: Id of padded slots.
    """
    if isinstance(ids, np.ndarray) or ids.device.type == "cpu":  # numpy: less overhead per call than torch
        ids, mask, envs, rows, packed_ids, packed_mask = (
            x.numpy() if isinstance(x, torch.Tensor) else x for x in (ids, mask, envs, rows, packed_ids, packed_mask)
        )
        _start_windows_numpy(ids, mask, envs, rows, packed_ids, packed_mask, pad_token_id)
        return
    _start_windows_torch(ids, mask, envs, rows, packed_ids, packed_mask, pad_token_id)


def _start_windows_numpy(ids, mask, envs, rows, packed_ids, packed_mask, pad_token_id: int) -> None:
    p = packed_ids.shape[1]
    if p < ids.shape[1]:
        ids[envs, :-p], mask[envs, :-p] = pad_token_id, 0
    ids[envs, -p:], mask[envs, -p:] = packed_ids[rows], packed_mask[rows]


def _start_windows_torch(ids, mask, envs, rows, packed_ids, packed_mask, pad_token_id: int) -> None:
    p = packed_ids.shape[1]
    if p == ids.shape[1]:  # a full-width table: whole rows, contiguous copies
        ids.index_copy_(0, envs, packed_ids.index_select(0, rows))
        mask.index_copy_(0, envs, packed_mask.index_select(0, rows))
        return
    ids.index_fill_(0, envs, pad_token_id)
    mask.index_fill_(0, envs, 0)
    ids[:, -p:].index_copy_(0, envs, packed_ids.index_select(0, rows))
    mask[:, -p:].index_copy_(0, envs, packed_mask.index_select(0, rows))


def append_tokens(ids: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append one token per row: shift the window left by one and write the token at index ``W - 1``.

    :param ids: ``(N, W)`` token ids.
    :param mask: ``(N, W)`` attention mask.
    :param tokens: ``(N,)`` the actions.
    :return: New ``(ids, mask)`` tensors (the inputs are not modified).
    """
    new_ids = torch.cat((ids[:, 1:], tokens.unsqueeze(1)), dim=1)
    new_mask = torch.cat((mask[:, 1:], torch.ones_like(mask[:, :1])), dim=1)
    return new_ids, new_mask


def append_tokens_(
    ids: torch.Tensor | np.ndarray,
    mask: torch.Tensor | np.ndarray,
    tokens: torch.Tensor | np.ndarray | None,
    host_tokens: np.ndarray | None = None,
) -> None:
    """In-place :func:`append_tokens`: shift each row left by one and write the token at index ``W - 1``.

    On CPU the shift is one overlapping copy of the flattened (contiguous) state through numpy: moving
    every element one place left moves each row's columns ``1..W-1`` to ``0..W-2``, and the element that
    crosses into the previous row's last column is then overwritten by that row's token. That is about
    5x cheaper than building new tensors with ``torch.cat`` at ``(256, 40)`` (numpy assignment is defined
    as if the source were copied first, so the overlap is safe). On other devices, torch ops.

    :param ids: ``(N, W)`` contiguous token ids, modified in place (a tensor, or a numpy view of a CPU one).
    :param mask: ``(N, W)`` contiguous attention mask, modified in place (idem).
    :param tokens: ``(N,)`` the actions on ``ids``' device (``None`` with numpy state and ``host_tokens``).
    :param host_tokens: The same actions as a numpy array, if at hand (spares a copy on CPU).
    """
    if isinstance(ids, np.ndarray):  # numpy views of CPU state: no conversion per call
        if not (ids.flags.c_contiguous and mask.flags.c_contiguous):
            raise ValueError("append_tokens_ needs contiguous (N, W) state arrays")
        _append_tokens_numpy(ids, mask, tokens if host_tokens is None else host_tokens)
        return
    if not (ids.is_contiguous() and mask.is_contiguous()):
        raise ValueError("append_tokens_ needs contiguous (N, W) state tensors")
    if ids.device.type == "cpu":
        _append_tokens_numpy(ids.numpy(), mask.numpy(), tokens.numpy() if host_tokens is None else host_tokens)
    else:
        _append_tokens_torch(ids, mask, tokens)


def _append_tokens_numpy(ids: np.ndarray, mask: np.ndarray, tokens: np.ndarray) -> None:
    for state, last in ((ids, tokens), (mask, 1)):
        flat = state.reshape(-1)  # a view: the state is contiguous
        flat[:-1] = flat[1:]
        state[:, -1] = last


def _append_tokens_torch(ids: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> None:
    ids[:, :-1] = ids[:, 1:].clone()
    ids[:, -1] = tokens
    mask[:, :-1] = mask[:, 1:].clone()
    mask[:, -1] = 1


def inject_tokens_(ids: torch.Tensor, mask: torch.Tensor, rows: Sequence[int], seqs: Sequence[Sequence[int]]) -> None:
    """Append a different number of tokens to some rows, in place (an interactive task's replies and openings).

    Row ``rows[m]`` shifts left by ``len(seqs[m])`` and ends with those tokens (mask 1); tokens shifted past the
    left edge are dropped, and a sequence longer than the window leaves only its last ``W`` tokens. One pass per
    row: replies come from a few rows per step.

    :param ids: ``(N, W)`` token ids, modified in place.
    :param mask: ``(N, W)`` attention mask, modified in place.
    :param rows: Row indices (distinct).
    :param seqs: The tokens to append to each row (an empty sequence changes nothing).
    """
    w = ids.shape[1]
    on_cpu = ids.device.type == "cpu"
    views = (ids.numpy(), mask.numpy()) if on_cpu else (ids, mask)
    for row, seq in zip(rows, seqs):
        k = len(seq)
        if k == 0:
            continue
        tail = seq[-w:] if k >= w else seq
        values = np.asarray(tail, dtype=np.int64) if on_cpu else torch.tensor(tail, device=ids.device)
        for state, new in zip(views, (values, 1)):
            if k < w:
                state[row, : w - k] = state[row, k:].copy() if on_cpu else state[row, k:].clone()
            state[row, w - len(tail) :] = new


def episode_ends(
    tokens: np.ndarray, generated: np.ndarray, eos_token_id: int | None, max_new_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """Which episodes end with this step's tokens.

    Computed on the host from the host copy of the actions: the flags are needed there anyway (to
    return them and to decode finished episodes), so a step costs no device-to-host sync.

    :param tokens: ``(N,)`` the actions just appended.
    :param generated: ``(N,)`` tokens generated so far, this step's included.
    :param eos_token_id: The EOS id (``None``: episodes end only by the budget).
    :param max_new_tokens: Generation budget.
    :return: ``(terminated, truncated)`` bool arrays: terminated on EOS; truncated when the budget is
        reached without EOS (the two are never both true, as in :class:`~textrl_envs.env.TextGenEnv`).
    """
    if eos_token_id is None:
        terminated = np.zeros(tokens.shape, dtype=bool)
    else:
        terminated = tokens == eos_token_id
    truncated = ~terminated & (generated >= max_new_tokens)
    return terminated, truncated


def episode_ids(rounds: np.ndarray, num_envs: int) -> np.ndarray:
    """Unique id of each env's current episode: ``round * num_envs + env_index``.

    :param rounds: ``(N,)`` how many episodes each env had begun before its current one (over the
        env's lifetime; see :class:`TextGenVectorEnv`).
    :param num_envs: ``N``.
    """
    return rounds * num_envs + np.arange(num_envs, dtype=np.int64)


def group_ids(rounds: np.ndarray, group_size: int) -> np.ndarray:
    """Unique id of each env's current group round: ``round * num_groups + env_index // group_size``.

    Equal to ``episode_ids(rounds, N) // group_size``: the G episodes of one group round share it.

    :param rounds: ``(N,)`` round of each env's current episode.
    :param group_size: ``G``.
    """
    n = len(rounds)
    return rounds * (n // group_size) + np.arange(n, dtype=np.int64) // group_size


def completion_bounds(width: int, generated: np.ndarray, terminated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns of finished episodes' completions in their final windows: ``rows[m, starts[m]:stops[m]]``.

    The generated tokens are the last ``generated`` columns of the right-aligned window (they always
    fit: ``W = max_prompt_tokens + max_new_tokens``); a terminated episode's last token is EOS, which
    the completion leaves out (as :class:`~textrl_envs.env.TextGenEnv` does).

    :param width: The window width ``W``.
    :param generated: ``(M,)`` tokens generated in each episode.
    :param terminated: ``(M,)`` whether each ended on EOS.
    :return: ``(starts, stops)``, ``int64`` arrays of shape ``(M,)``.
    """
    return width - generated, width - terminated.astype(np.int64)


def completion_tuples(rows: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> list[tuple[int, ...]]:
    """``[tuple(rows[m, starts[m]:stops[m]]) ...]`` as Python ints, with one ``tolist`` for the batch."""
    if len(rows) == 0:
        return []
    if len(rows) == 1:
        return [tuple(rows[0, int(starts[0]) : int(stops[0])].tolist())]
    first, last = int(starts.min()), int(stops.max())
    if first == starts.max() and last == stops.min():  # all the same columns (e.g. every episode hit the budget)
        return list(map(tuple, rows[:, first:last].tolist()))
    lists = rows[:, first:].tolist()
    return [tuple(r[a:b]) for r, a, b in zip(lists, (starts - first).tolist(), (stops - first).tolist())]


#: Up to this many completions, :func:`decode_completions` decodes them one by one even with a byte table.
SMALL_BATCH = 8


def decode_completions(
    spec: EpisodeSpec,
    rows: np.ndarray,
    starts: np.ndarray,
    stops: np.ndarray,
    id_tuples: Sequence[Sequence[int]],
    decode=None,
) -> list[str]:
    """Completion texts, exactly as :meth:`EpisodeSpec.decode` gives them, for a batch of finished episodes.

    :param spec: The episode spec (its tokenizer).
    :param rows: ``(M, W)`` final ``input_ids``; episode ``m``'s completion is ``rows[m, starts[m]:stops[m]]``.
    :param starts: ``(M,)`` see :func:`completion_bounds`.
    :param stops: ``(M,)`` idem.
    :param id_tuples: The same completions as id sequences (:func:`completion_tuples`).
    :param decode: :func:`fast_decoder` of the tokenizer, or ``None`` to go through ``spec.decode``. A
        :class:`ByteTableDecoder` decodes a batch of more than :data:`SMALL_BATCH` at once (below that, its fixed
        cost is more than per-sequence calls cost); other decoders are called once per sequence (the Rust
        ``decode_batch`` spends more on its thread pool than it saves on short completions, measured 13.7 against
        5.3 us per 32-token sequence).
    """
    if isinstance(decode, ByteTableDecoder) and len(id_tuples) > SMALL_BATCH:
        return decode.decode_rows(rows, starts, stops)
    if decode is not None:
        return [decode(seq) for seq in id_tuples]
    return [spec.decode(seq) for seq in id_tuples]


# -- info arrays ---------------------------------------------------------------------------------


def int_array(n: int, where: np.ndarray, values: Sequence[int]) -> np.ndarray:
    """An info array ``(n,)`` ``int64``: ``values`` at the envs ``where``, 0 elsewhere."""
    out = np.zeros(n, dtype=np.int64)
    out[where] = values
    return out


def flag_array(n: int, where: np.ndarray) -> np.ndarray:
    """An info array ``(n,)`` ``bool``: true at the envs ``where`` (Gymnasium's ``_key`` masks)."""
    m = np.zeros(n, dtype=np.bool_)
    m[where] = True
    return m


def object_array(n: int, where: np.ndarray, values: Sequence[Any]) -> np.ndarray:
    """An info array ``(n,)`` of objects: ``values`` (strings, tuples, dicts) at the envs ``where``, ``None``
    elsewhere."""
    out = np.empty(n, dtype=object)  # every element None
    if len(where) == 1:
        out[where[0]] = values[0]
    else:
        out[where] = np.fromiter(values, dtype=object, count=len(values))  # tuples stay elements, not a 2-D array
    return out
