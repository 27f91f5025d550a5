"""Plots for the Dagster UI's asset pages: an inline sketch and the full plot.

The UI shows a markdown metadata value inline only below 1,000 characters; anything longer hides
behind "[Show Markdown]", which opens it in a dialog at its own size. So each plot comes twice: a
1-bit PNG sketch (a few hundred bytes, with the axis ranges as rounded text) that renders inline,
and the report's own plot as a palette PNG (`png_markdown`), readable in that dialog.
"""

import base64
import io
import math
from collections.abc import Sequence

INLINE_LIMIT = 1000  # the UI's inline threshold for markdown metadata (characters)
SKETCH_SIZES = ((320, 160), (240, 120), (160, 80))


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in points
            if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _sketch(points: list[tuple[float, float]], highlight: list[tuple[float, float]], *, line: bool,
            size: tuple[int, int], pick: tuple[float, float] | None = None, crosses: bool = True) -> bytes:
    """A 1-bit sketch: points as small crosses or single pixels (or one line), `highlight` as filled
    squares, `pick` as a ringed square; a margin keeps every mark inside the frame."""
    from PIL import Image, ImageDraw

    w, h = size
    img = Image.new("1", (w, h), 1)
    draw = ImageDraw.Draw(img)
    draw.line([(0, 0), (0, h - 1), (w - 1, h - 1)], fill=0)  # axes
    everything = points + highlight + ([pick] if pick else [])
    if everything:
        xs, ys = [p[0] for p in everything], [p[1] for p in everything]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        m = 7  # pixels between the frame and the outermost mark

        def px(p):
            fx = (p[0] - x0) / (x1 - x0) if x1 > x0 else 0.5
            fy = (p[1] - y0) / (y1 - y0) if y1 > y0 else 0.5
            return (m + round(fx * (w - 2 * m)), h - m - round(fy * (h - 2 * m)))

        if line:
            draw.line([px(p) for p in points], fill=0, width=2)
        else:
            for p in points:
                x, y = px(p)
                if crosses:
                    draw.line([(x - 2, y), (x + 2, y)], fill=0)
                    draw.line([(x, y - 2), (x, y + 2)], fill=0)
                else:
                    draw.point((x, y), fill=0)
        for p in highlight:
            x, y = px(p)
            draw.rectangle([x - 2, y - 2, x + 2, y + 2], fill=0)
        if pick:
            x, y = px(pick)
            draw.rectangle([x - 5, y - 5, x + 5, y + 5], outline=0)
            draw.rectangle([x - 2, y - 2, x + 2, y + 2], fill=0)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def inline_plot(title: str, points: Sequence[tuple[float, float]], *, highlight: Sequence[tuple[float, float]] = (),
                x_label: str, y_label: str, line: bool = False, pick: tuple[float, float] | None = None) -> str:
    """Markdown with a small PNG sketch and its rounded axis ranges, always under INLINE_LIMIT.
    Scatter: crosses, the front as filled squares, the pick ringed."""
    pts, hi = _finite(points), _finite(highlight)
    picked = _finite([pick]) if pick is not None else []
    chosen = picked[0] if picked else None
    everything = pts + hi + ([chosen] if chosen else [])
    if not everything:
        return f"**{title}**: no points to plot"
    xs, ys = [p[0] for p in everything], [p[1] for p in everything]
    marks = "" if line else "; squares: front" * bool(hi) + "; ringed: the pick" * bool(chosen)
    caption = f"x: {x_label} {_fmt(min(xs))}..{_fmt(max(xs))}; y: {y_label} {_fmt(min(ys))}..{_fmt(max(ys))}{marks}"
    # the largest sketch that fits: every point as crosses, then as single pixels, then (many
    # points) the front and the pick alone (every point is in the full-size plot); then smaller
    styles: list[tuple[bool, list[tuple[float, float]]]] = [(True, pts), (False, pts)]
    if not line and hi:
        styles.append((True, []))
    tries = [(size, crosses, shown) for size in SKETCH_SIZES for crosses, shown in styles]
    for size, crosses, shown in tries:
        data = base64.b64encode(_sketch(shown, hi, line=line, size=size, pick=chosen, crosses=crosses)).decode()
        note = "" if shown or not pts else "; the front only, every point in the full-size plot"
        text = f"**{title}** ({caption}{note})\n\n![{title}](data:image/png;base64,{data})"
        if len(text) < INLINE_LIMIT:
            return text
    return f"**{title}** ({caption}): too many points for an inline sketch, see the full-size plot"


FULL_SIZE_COLOURS = 256  # palette entries: the plots' few colours and their anti-aliasing


def png_markdown(title: str, png: bytes, caption: str = "") -> str:
    """Markdown holding a full plot as a palette PNG (about a third of the RGB bytes); the UI opens
    it with "[Show Markdown]" at its natural size. Octree quantization keeps a colour that covers
    few pixels (one branch's thin line) instead of folding it into a large neighbour."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        small = img.convert("RGB").quantize(colors=FULL_SIZE_COLOURS, method=Image.Quantize.FASTOCTREE)
        buf = io.BytesIO()
        small.save(buf, format="PNG", optimize=True)
    data = base64.b64encode(buf.getvalue()).decode()
    head = f"**{title}**" + (f" ({caption})" if caption else "")
    return f"{head}\n\n![{title}](data:image/png;base64,{data})"
