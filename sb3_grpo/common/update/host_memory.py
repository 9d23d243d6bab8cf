"""Give freed host memory back to the operating system before the update's largest allocation.

On Linux with glibc, memory that torch frees on the CPU (activations after a backward) stays in the process's heap
when it is not at the top of it, so the resident size keeps it. The first optimizer step of a model then allocates
Adam's state (twice the trainable parameters) on top of that garbage, and that step is the peak of a full
fine-tuning update. :func:`release_free_heap` asks glibc to return the free pages (``malloc_trim(0)``, which
``madvise``\\ s free chunks inside the heap too); GRPO calls it once, before the first optimizer step of its optimizer
(measured by ``textrl-bench memory``). Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys

__all__ = ["release_free_heap"]


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def release_free_heap() -> bool:
    """Return the heap's free pages to the operating system (glibc's ``malloc_trim(0)``).

    :return: Whether anything was asked of the C library (``False`` off Linux / glibc).
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
