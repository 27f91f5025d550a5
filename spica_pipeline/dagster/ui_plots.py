"""Plots small enough for the Dagster UI to render inline on the asset page.

The UI shows a markdown metadata value inline only below 1,000 characters; anything longer hides
behind "[Show Markdown]". So the asset page gets a 1-bit PNG sketch (a few hundred bytes) with the
axis ranges as rounded text, and links to the full-resolution PNGs in the output folder.
"""

import base64
import io
import math
from collections.abc import Sequence

INLINE_LIMIT = 1000  # the UI's inline threshold for markdown metadata (characters)


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in points
            if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _sketch(points: list[tuple[float, float]], highlight: list[tuple[float, float]], *, line: bool,
            size: tuple[int, int]) -> bytes:
    from PIL import Image, ImageDraw

    w, h = size
    img = Image.new("1", (w, h), 1)
    draw = ImageDraw.Draw(img)
    draw.line([(0, 0), (0, h - 1), (w - 1, h - 1)], fill=0)  # axes
    everything = points + highlight
    if everything:
        xs, ys = [p[0] for p in everything], [p[1] for p in everything]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)

        def px(p):
            fx = (p[0] - x0) / (x1 - x0) if x1 > x0 else 0.5
            fy = (p[1] - y0) / (y1 - y0) if y1 > y0 else 0.5
            return (3 + round(fx * (w - 7)), h - 4 - round(fy * (h - 7)))

        if line:
            draw.line([px(p) for p in points], fill=0)
        else:
            for p in points:
                x, y = px(p)
                draw.point((x, y), fill=0)
        for p in highlight:
            x, y = px(p)
            draw.rectangle([x - 1, y - 1, x + 1, y + 1], fill=0)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def inline_plot(title: str, points: Sequence[tuple[float, float]], *, highlight: Sequence[tuple[float, float]] = (),
                x_label: str, y_label: str, line: bool = False) -> str:
    """Markdown with a tiny PNG sketch and its rounded axis ranges, always under INLINE_LIMIT."""
    pts, hi = _finite(points), _finite(highlight)
    everything = pts + hi
    if not everything:
        return f"**{title}**: no points to plot"
    xs, ys = [p[0] for p in everything], [p[1] for p in everything]
    caption = (f"x: {x_label} {_fmt(min(xs))}..{_fmt(max(xs))}; y: {y_label} {_fmt(min(ys))}..{_fmt(max(ys))}"
               + ("; squares: front" if hi and not line else ""))
    for size in ((160, 80), (120, 60), (80, 40)):
        data = base64.b64encode(_sketch(pts, hi, line=line, size=size)).decode()
        text = f"**{title}** ({caption})\n\n![{title}](data:image/png;base64,{data})"
        if len(text) < INLINE_LIMIT:
            return text
    return f"**{title}** ({caption}): too many points for an inline sketch, see the PNG"
