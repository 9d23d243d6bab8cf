"""``render_mode="rgb_array"``: an episode's transcript drawn as an RGB image (Pillow, which matplotlib requires).

Every frame of an env has the same size (Gymnasium's ``RecordVideo`` needs that): the text is wrapped to the
frame's width and, when it is longer than the frame, the newest lines are kept. The prompt is drawn in grey,
the agent's tokens in blue and the environment's replies (interactive tasks) in green, so a video of an episode
shows the completion growing token by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

#: Frame size ``(height, width)`` in pixels.
FRAME_SHAPE = (256, 512)
#: Text colour of each role of a transcript.
COLOURS = {"prompt": (90, 90, 90), "agent": (20, 70, 200), "env": (10, 130, 60)}
_BACKGROUND = (255, 255, 255)
_MARGIN = 6
_FONT_SIZE = 13


@lru_cache(maxsize=4)
def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def wrap_segments(segments: Sequence[tuple[str, str]], width: int, measure) -> list[list[tuple[str, str]]]:
    """Lines of ``(role, text)`` runs: the segments' text wrapped to ``width`` pixels, breaking at spaces
    (a word wider than a line is broken anywhere) and at ``\\n``.

    :param segments: ``(role, text)`` pairs in order.
    :param width: Line width in pixels.
    :param measure: ``str -> float``, the width of a text in pixels.
    """
    lines: list[list[tuple[str, str]]] = [[]]
    used = 0.0
    for role, text in segments:
        for k, paragraph in enumerate(text.split("\n")):
            if k > 0:
                lines.append([])
                used = 0.0
            for piece in _pieces(paragraph):
                w = measure(piece)
                if used + w > width and used > 0:
                    lines.append([])
                    used = 0.0
                    piece = piece.lstrip(" ")
                    w = measure(piece)
                while w > width and len(piece) > 1:  # a word wider than the line: break it
                    cut = _fit(piece, width, measure)
                    lines[-1].append((role, piece[:cut]))
                    lines.append([])
                    piece = piece[cut:]
                    w = measure(piece)
                lines[-1].append((role, piece))
                used += w
    return lines


def _pieces(paragraph: str) -> list[str]:
    """Words with their leading spaces (``" the"``), so that joining them gives the paragraph back."""
    out: list[str] = []
    for i, word in enumerate(paragraph.split(" ")):
        out.append(word if i == 0 else " " + word)
    return [p for p in out if p]


def _fit(piece: str, width: int, measure) -> int:
    """How many leading characters of ``piece`` fit in ``width`` (at least one)."""
    n = 1
    while n < len(piece) and measure(piece[: n + 1]) <= width:
        n += 1
    return n


def transcript_frame(segments: Sequence[tuple[str, str]], shape: tuple[int, int] = FRAME_SHAPE) -> np.ndarray:
    """An RGB image of a transcript.

    :param segments: ``(role, text)`` pairs, ``role`` one of ``"prompt"``, ``"agent"``, ``"env"``.
    :param shape: ``(height, width)`` of the frame.
    :return: A ``uint8`` array of shape ``(height, width, 3)``.
    """
    from PIL import Image, ImageDraw

    height, width = shape
    font = _font(_FONT_SIZE)
    line_height = _FONT_SIZE + 4
    lines = wrap_segments(segments, width - 2 * _MARGIN, font.getlength)
    visible = max(1, (height - 2 * _MARGIN) // line_height)
    image = Image.new("RGB", (width, height), _BACKGROUND)
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines[-visible:]):
        x = float(_MARGIN)
        y = _MARGIN + row * line_height
        for role, text in line:
            draw.text((x, y), text, fill=COLOURS.get(role, COLOURS["agent"]), font=font)
            x += font.getlength(text)
    return np.asarray(image, dtype=np.uint8)
