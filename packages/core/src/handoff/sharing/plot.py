"""A small timeline plot written as PNG with the standard library only (zlib and struct).

Why not matplotlib: `handoff profile` runs where the engines run (a GPU host, a runtime image
with no package index in reach), and one line chart with a few labelled marks does not justify
a plotting stack there; a PNG is a few dozen lines of deflate and CRCs. The text is a 3x5 pixel
capital font drawn at twice its size: axis values, series names and event names.

`timeline_png(path, series, events, title, limit)` draws each series (name -> [(seconds, GiB)])
as a line, each event (seconds, name) as a vertical line in its kind's colour, the title, and
optionally a limit (a budget) as a horizontal line.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path

WIDTH, HEIGHT = 960, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 40
SCALE = 2  # font pixels per glyph pixel

WHITE, BLACK, GRID = (255, 255, 255), (0, 0, 0), (225, 225, 225)
SERIES_COLOURS = [(31, 119, 180), (148, 103, 189), (140, 86, 75), (23, 190, 207)]
EVENT_COLOURS = {
    "FAULT": (214, 39, 40),
    "MIGRATION": (255, 127, 14),
    "DONE": (44, 160, 44),
}
OTHER_EVENT = (150, 150, 150)

# 3x5 glyphs: five rows of three, top to bottom, "#" = ink.
_GLYPHS = {
    "0": "###/#.#/#.#/#.#/###", "1": ".#./##./.#./.#./###", "2": "###/..#/###/#../###",
    "3": "###/..#/.##/..#/###", "4": "#.#/#.#/###/..#/..#", "5": "###/#../###/..#/###",
    "6": "###/#../###/#.#/###", "7": "###/..#/.#./.#./.#.", "8": "###/#.#/###/#.#/###",
    "9": "###/#.#/###/..#/###", ".": ".../.../.../.../.#.", "-": ".../.../###/.../...",
    ":": ".../.#./.../.#./...", "/": "..#/..#/.#./#../#..", " ": ".../.../.../.../...",
    "(": ".#./#../#../#../.#.", ")": ".#./..#/..#/..#/.#.", "%": "#.#/..#/.#./#../#.#",
    "_": ".../.../.../.../###", ",": ".../.../.../.#./#..", "=": ".../###/.../###/...",
    "+": ".../.#./###/.#./...",
    "A": ".#./#.#/###/#.#/#.#", "B": "##./#.#/##./#.#/##.", "C": ".##/#../#../#../.##",
    "D": "##./#.#/#.#/#.#/##.", "E": "###/#../##./#../###", "F": "###/#../##./#../#..",
    "G": ".##/#../#.#/#.#/.##", "H": "#.#/#.#/###/#.#/#.#", "I": "###/.#./.#./.#./###",
    "J": "..#/..#/..#/#.#/.#.", "K": "#.#/#.#/##./#.#/#.#", "L": "#../#../#../#../###",
    "M": "#.#/###/###/#.#/#.#", "N": "##./#.#/#.#/#.#/#.#", "O": ".#./#.#/#.#/#.#/.#.",
    "P": "##./#.#/##./#../#..", "Q": ".#./#.#/#.#/##./.##", "R": "##./#.#/##./#.#/#.#",
    "S": ".##/#../.#./..#/##.", "T": "###/.#./.#./.#./.#.", "U": "#.#/#.#/#.#/#.#/###",
    "V": "#.#/#.#/#.#/#.#/.#.", "W": "#.#/#.#/###/###/#.#", "X": "#.#/#.#/.#./#.#/#.#",
    "Y": "#.#/#.#/.#./.#./.#.", "Z": "###/..#/.#./#../###",
}  # fmt: skip


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(WHITE * (width * height))

    def dot(self, x: int, y: int, colour: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            at = 3 * (y * self.width + x)
            self.pixels[at : at + 3] = bytes(colour)

    def line(self, x0: int, y0: int, x1: int, y1: int, colour, dashed: bool = False) -> None:
        """Bresenham's line."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, n = dx + dy, 0
        while True:
            if not dashed or (n // 4) % 2 == 0:
                self.dot(x0, y0, colour)
            if x0 == x1 and y0 == y1:
                return
            n += 1
            twice = 2 * err
            if twice >= dy:
                err, x0 = err + dy, x0 + sx
            if twice <= dx:
                err, y0 = err + dx, y0 + sy

    def text(self, x: int, y: int, text: str, colour=BLACK) -> None:
        """Capitals, digits and a few signs; other characters are left blank."""
        for i, char in enumerate(text.upper()):
            rows = _GLYPHS.get(char, _GLYPHS[" "]).split("/")
            for row, ink in enumerate(rows):
                for col, pixel in enumerate(ink):
                    if pixel == "#":
                        for a in range(SCALE):
                            for b in range(SCALE):
                                self.dot(x + (i * 4 + col) * SCALE + a, y + row * SCALE + b, colour)

    def png(self) -> bytes:
        rows = b"".join(
            b"\x00" + bytes(self.pixels[3 * y * self.width : 3 * (y + 1) * self.width])
            for y in range(self.height)
        )
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(rows, 9))
            + _chunk(b"IEND", b"")
        )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def text_width(text: str) -> int:
    return len(text) * 4 * SCALE


def _step(span: float) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving at most about five ticks."""
    raw = max(span, 1e-9) / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(magnitude * f for f in (1, 2, 5, 10) if magnitude * f >= raw)


def _axes(
    canvas: Canvas,
    x_of: Callable[[float], int],
    y_of: Callable[[float], int],
    top: float,
    end: float,
) -> None:
    """The grid, its labels every `_step` of the values (up to `top`) and of the seconds (up to
    `end`), the axes and their names."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    y_step, x_step = _step(top), _step(end)
    value = 0.0
    while value <= top + 1e-9:
        y = y_of(value)
        canvas.line(LEFT, y, LEFT + plot_w, y, GRID)
        label = f"{value:g}"
        canvas.text(LEFT - 6 - text_width(label), y - 5, label)
        value += y_step
    value = 0.0
    while value <= end + 1e-9:
        x = x_of(value)
        canvas.line(x, TOP, x, TOP + plot_h, GRID)
        label = f"{value:g}"
        canvas.text(x - text_width(label) // 2, TOP + plot_h + 8, label)
        value += x_step
    canvas.line(LEFT, TOP, LEFT, TOP + plot_h, BLACK)
    canvas.line(LEFT, TOP + plot_h, LEFT + plot_w, TOP + plot_h, BLACK)
    canvas.text(LEFT + plot_w - text_width("SECONDS"), HEIGHT - 14, "SECONDS")
    canvas.text(4, TOP - 16, "GIB")


def timeline_png(
    path: Path,
    series: Mapping[str, Sequence[tuple[float, float]]],
    events: Sequence[tuple[float, str]],
    title: str,
    limit: tuple[float, str] | None = None,
) -> Path:
    """Draw and write the chart, with `limit` (value, name) as a dashed red line across it;
    returns `path`."""
    canvas = Canvas(WIDTH, HEIGHT)
    points = [p for values in series.values() for p in values]
    end = max([t for t, _ in points] + [t for t, _ in events] + [1.0])
    top = max([v for _, v in points] + [limit[0] if limit else 0.0]) * 1.1 or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(t: float) -> int:
        return LEFT + round(plot_w * max(0.0, t) / end)

    def y_of(v: float) -> int:
        return TOP + plot_h - round(plot_h * max(0.0, v) / top)

    _axes(canvas, x_of, y_of, top, end)
    label_row: dict[int, int] = {}
    for when, name in sorted(events):
        colour = EVENT_COLOURS.get(name.upper(), OTHER_EVENT)
        x = x_of(when)
        canvas.line(x, TOP, x, TOP + plot_h, colour, dashed=True)
        row = next(r for r in range(20) if label_row.get(r, -1) < x)  # no overlapping labels
        label_row[row] = x + text_width(name) + 4
        canvas.text(x + 3, TOP + 4 + row * 14, name, colour)
    if limit:
        y = y_of(limit[0])
        canvas.line(LEFT, y, LEFT + plot_w, y, EVENT_COLOURS["FAULT"], dashed=True)
        canvas.text(
            LEFT + plot_w - text_width(limit[1]) - 4, y - 14, limit[1], EVENT_COLOURS["FAULT"]
        )
    legend_x = LEFT + 8
    for i, (name, values) in enumerate(series.items()):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        xy = [(x_of(t), y_of(v)) for t, v in values]
        for (x0, y0), (x1, y1) in pairwise(xy):
            canvas.line(x0, y0, x1, y1, colour)
        canvas.text(legend_x, TOP + plot_h - 16, name, colour)
        legend_x += text_width(name) + 16
    canvas.text(LEFT, 10, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(canvas.png())
    return path
