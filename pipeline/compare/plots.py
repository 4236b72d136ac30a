"""PNG plots of a comparison, drawn with numpy and encoded with zlib: no plotting library needed.

Two plots: the histogram of absolute errors of one output (one bar colour per runner, the output's ``atol`` as
a dashed line) and the error along depth of the per-layer comparison (max absolute error of each matched module
in topological order, failing modules in red, the first divergence marked). Text uses a built-in 5x7 pixel
font (upper case, digits and common signs).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence

import numpy as np

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GRID: Color = (225, 225, 225)
FAIL: Color = (214, 39, 40)
SERIES: tuple[Color, ...] = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (148, 103, 189))

# Rows of a 5x7 glyph, top to bottom; bit 4 is the leftmost pixel.
_FONT: dict[str, str] = {
    "0": "0E11131519110E",
    "1": "040C040404040E",
    "2": "0E11010204081F",
    "3": "1F02040201110E",
    "4": "02060A121F0202",
    "5": "1F101E0101110E",
    "6": "0608101E11110E",
    "7": "1F010204080808",
    "8": "0E11110E11110E",
    "9": "0E11110F01020C",
    "A": "0E11111F111111",
    "B": "1E11111E11111E",
    "C": "0E11101010110E",
    "D": "1C12111111121C",
    "E": "1F10101E10101F",
    "F": "1F10101E101010",
    "G": "0E11101711110F",
    "H": "1111111F111111",
    "I": "0E04040404040E",
    "J": "0702020202120C",
    "K": "11121418141211",
    "L": "1010101010101F",
    "M": "111B1515111111",
    "N": "11111915131111",
    "O": "0E11111111110E",
    "P": "1E11111E101010",
    "Q": "0E11111115120D",
    "R": "1E11111E141211",
    "S": "0F10100E01011E",
    "T": "1F040404040404",
    "U": "1111111111110E",
    "V": "11111111110A04",
    "W": "1111111515150A",
    "X": "11110A040A1111",
    "Y": "1111110A040404",
    "Z": "1F01020408101F",
    " ": "00000000000000",
    ".": "00000000000C0C",
    ",": "000000000C0408",
    "-": "0000001F000000",
    "+": "0004041F040400",
    ":": "000C0C000C0C00",
    "(": "02040808080402",
    ")": "08040202020408",
    "[": "0E08080808080E",
    "]": "0E02020202020E",
    "|": "04040404040404",
    "/": "00010204081000",
    "_": "0000000000001F",
    "=": "00001F001F0000",
    "<": "02040810080402",
    ">": "08040201020408",
    "%": "18190204081303",
    "*": "0004150E150400",
    "'": "0C040800000000",
    "?": "0E110102040004",
}


def _glyph(char: str) -> np.ndarray:
    code = _FONT.get(char.upper(), _FONT["?"])
    rows = [int(code[i : i + 2], 16) for i in range(0, 14, 2)]
    return np.array([[(row >> (4 - col)) & 1 for col in range(5)] for row in rows], dtype=bool)


def text_mask(text: str, scale: int = 1) -> np.ndarray:
    """The pixels of ``text`` as a boolean (height, width) mask: 5x7 glyphs, one column between them."""
    if not text:
        return np.zeros((7 * scale, 0), dtype=bool)
    columns = []
    for char in text:
        columns += [_glyph(char), np.zeros((7, 1), dtype=bool)]
    mask = np.hstack(columns[:-1])
    return np.kron(mask, np.ones((scale, scale), dtype=bool)).astype(bool)


class Canvas:
    """An RGB image with the few drawing operations the plots need; (x, y) pixels, y down."""

    def __init__(self, width: int, height: int) -> None:
        self.pixels = np.full((height, width, 3), 255, dtype=np.uint8)

    @property
    def width(self) -> int:
        """Width in pixels."""
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        """Height in pixels."""
        return int(self.pixels.shape[0])

    def rect(self, x0: float, y0: float, x1: float, y1: float, color: Color) -> None:
        """Fill the rectangle between two corners (clipped to the canvas)."""
        left, right = sorted((int(round(x0)), int(round(x1))))
        top, bottom = sorted((int(round(y0)), int(round(y1))))
        left, top = max(left, 0), max(top, 0)
        self.pixels[top : max(bottom, top + 1), left : max(right, left + 1)] = color

    def line(self, x0: float, y0: float, x1: float, y1: float, color: Color, dash: int = 0) -> None:
        """Draw a line between two points; ``dash`` > 0 draws every other run of that many pixels."""
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        xs = np.rint(np.linspace(x0, x1, steps)).astype(int)
        ys = np.rint(np.linspace(y0, y1, steps)).astype(int)
        keep = (xs >= 0) & (xs < self.width) & (ys >= 0) & (ys < self.height)
        if dash:
            keep &= (np.arange(steps) // dash) % 2 == 0
        self.pixels[ys[keep], xs[keep]] = color

    def text(
        self,
        x: float,
        y: float,
        text: str,
        color: Color = BLACK,
        *,
        scale: int = 1,
        anchor: str = "left",
        vertical: bool = False,
    ) -> None:
        """Draw ``text`` with its top-left (``anchor="left"``), top-centre or top-right at ``(x, y)``;
        ``vertical`` turns it 90 degrees counter-clockwise (reading upwards) and centres it on ``y``."""
        mask = text_mask(text, scale)
        if vertical:
            mask = np.rot90(mask)
            x0, y0 = int(x), int(y - mask.shape[0] / 2)
        else:
            offset = {"left": 0.0, "center": mask.shape[1] / 2, "right": float(mask.shape[1])}[anchor]
            x0, y0 = int(x - offset), int(y)
        height, width = mask.shape
        top, left = max(y0, 0), max(x0, 0)
        bottom, right = min(y0 + height, self.height), min(x0 + width, self.width)
        if bottom <= top or right <= left:
            return
        region = self.pixels[top:bottom, left:right]
        region[mask[top - y0 : bottom - y0, left - x0 : right - x0]] = color

    def png(self) -> bytes:
        """The canvas as PNG bytes."""
        return encode_png(self.pixels)


def encode_png(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of a (height, width, 3) uint8 array (filter type 0 on every row)."""
    height, width, _ = pixels.shape
    rows = np.concatenate([np.zeros((height, 1), dtype=np.uint8), pixels.reshape(height, width * 3)], axis=1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


class Axes:
    """A plot area inside a canvas: data coordinates to pixels, a frame, ticks and labels."""

    def __init__(self, canvas: Canvas, xlim: tuple[float, float], ylim: tuple[float, float]) -> None:
        self.canvas = canvas
        self.left, self.right = 70, canvas.width - 20
        self.top, self.bottom = 40, canvas.height - 60
        self.xlim, self.ylim = xlim, ylim

    def px(self, x: float) -> float:
        """The pixel column of data value ``x``."""
        lo, hi = self.xlim
        return self.left + (x - lo) / ((hi - lo) or 1.0) * (self.right - self.left)

    def py(self, y: float) -> float:
        """The pixel row of data value ``y``."""
        lo, hi = self.ylim
        return self.bottom - (y - lo) / ((hi - lo) or 1.0) * (self.bottom - self.top)

    def frame(self, title: str, xlabel: str, ylabel: str) -> None:
        """Title, axis labels and the plot's border."""
        c = self.canvas
        c.text(c.width / 2, 12, title, anchor="center", scale=2 if len(title) * 12 < c.width - 20 else 1)
        c.text(c.width / 2, self.bottom + 38, xlabel, anchor="center")
        c.text(8, (self.top + self.bottom) / 2, ylabel, vertical=True)
        c.line(self.left, self.bottom, self.right, self.bottom, BLACK)
        c.line(self.left, self.top, self.left, self.bottom, BLACK)

    def xticks(self, ticks: Sequence[float], labels: Sequence[str]) -> None:
        """Tick marks and labels on the x axis."""
        for tick, label in zip(ticks, labels, strict=True):
            x = self.px(tick)
            self.canvas.line(x, self.bottom, x, self.bottom + 4, BLACK)
            self.canvas.text(x, self.bottom + 10, label, anchor="center")

    def yticks(self, ticks: Sequence[float], labels: Sequence[str]) -> None:
        """Grid lines and labels on the y axis."""
        for tick, label in zip(ticks, labels, strict=True):
            y = self.py(tick)
            self.canvas.line(self.left + 1, y, self.right, y, GRID)
            self.canvas.line(self.left - 4, y, self.left, y, BLACK)
            self.canvas.text(self.left - 7, y - 3, label, anchor="right")

    def legend(self, entries: Sequence[tuple[str, Color]]) -> None:
        """A colour key in the top right corner."""
        y = self.top + 6
        for label, color in entries:
            self.canvas.rect(self.right - 150, y, self.right - 140, y + 7, color)
            self.canvas.text(self.right - 135, y, label[:22])
            y += 12


def histogram_png(
    output: str, counts_by_runner: Sequence[tuple[str, Sequence[int]]], edges: Sequence[float], atol: float
) -> bytes:
    """Bars of absolute-error counts per log10 bin (first bin: below the range, last: above it or NaN)."""
    canvas = Canvas(720, 420)
    bins = len(edges) + 1  # below + (len(edges) - 1) bins + above
    peak = max((max(c) for _, c in counts_by_runner if len(c)), default=0) or 1
    axes = Axes(canvas, (0.0, float(bins)), (0.0, peak * 1.1))
    axes.yticks(*_linear_ticks(peak))
    width = 1.0 / max(len(counts_by_runner), 1)
    for r, (_, counts) in enumerate(counts_by_runner):
        color = SERIES[r % len(SERIES)]
        for b, count in enumerate(counts):
            if count:
                x0 = b + r * width
                canvas.rect(axes.px(x0) + 1, axes.py(count), axes.px(x0 + width), axes.bottom, color)
    if atol > 0:
        at = 1 + (math.log10(atol) - edges[0]) / (edges[-1] - edges[0]) * (bins - 2)
        canvas.line(axes.px(at), axes.top, axes.px(at), axes.bottom, FAIL, dash=4)
        canvas.text(axes.px(at) + 3, axes.top + 2, f"ATOL {atol:.0e}", FAIL)
    decades = [e for e in edges[1:-1] if float(e).is_integer() and int(e) % 2 == 0]
    positions = [1 + (e - edges[0]) / (edges[-1] - edges[0]) * (bins - 2) for e in decades]
    below, above = f"<1E{int(edges[0])}", f">1E{int(edges[-1])}"
    axes.xticks([0.5, *positions, bins - 0.5], [below, *[f"1E{int(e)}" for e in decades], above])
    axes.frame(f"ABS ERROR OF {output}", "|X - REF| (LOG10 BINS)", "ELEMENTS")
    axes.legend([(name, SERIES[i % len(SERIES)]) for i, (name, _) in enumerate(counts_by_runner)])
    return canvas.png()


def depth_png(modules: Sequence[str], max_abs: Sequence[float], passed: Sequence[bool], title: str) -> bytes:
    """Max absolute error per module in topological order (log scale); failing modules red, the first one
    marked with a dashed line and its name."""
    canvas = Canvas(900, 420)
    logs = [math.log10(v) if v > 0 else -12.0 for v in max_abs] or [0.0]
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    hi = hi if hi > lo else lo + 1
    n = max(len(modules), 1)
    axes = Axes(canvas, (-0.5, n - 0.5), (float(lo), float(hi)))
    step = max(1, math.ceil((hi - lo) / 8))
    decades = list(range(lo, hi + 1, step))
    axes.yticks(decades, [f"1E{d}" for d in decades])
    xstep = max(1, math.ceil(n / 12))
    axes.xticks(list(range(0, n, xstep)), [str(i) for i in range(0, n, xstep)])
    points = [(axes.px(i), axes.py(v)) for i, v in enumerate(logs[: len(modules)])]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        canvas.line(x0, y0, x1, y1, SERIES[0])
    first = next((i for i, ok in enumerate(passed) if not ok), None)
    for i, (x, y) in enumerate(points):
        canvas.rect(x - 2, y - 2, x + 3, y + 3, SERIES[0] if passed[i] else FAIL)
    if first is not None:
        x = axes.px(first)
        canvas.line(x, axes.top, x, axes.bottom, FAIL, dash=4)
        label = f"FIRST DIVERGENCE: {modules[first]}"
        anchor = "left" if x < canvas.width / 2 else "right"
        canvas.text(x + (4 if anchor == "left" else -4), axes.top + 4, label, FAIL, anchor=anchor)
    axes.frame(title, "MODULE (TOPOLOGICAL ORDER)", "MAX |X - REF|")
    axes.legend([("WITHIN TOLERANCE", SERIES[0]), ("OUTSIDE TOLERANCE", FAIL)])
    return canvas.png()


def _linear_ticks(peak: float) -> tuple[list[float], list[str]]:
    magnitude = 10 ** math.floor(math.log10(peak)) if peak > 0 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if peak / (m * magnitude) <= 6)
    ticks = [i * step for i in range(int(peak // step) + 1)]
    return [float(t) for t in ticks], [f"{t:g}".upper() for t in ticks]
