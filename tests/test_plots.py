"""The report's plots: both branches visible over the merged front, coinciding picks sharing one
label, no two labels overlapping, the pick starred, and the SLA drawn where an axis can show it."""

import itertools

import pytest
from test_report import make_ledger

from spica_pipeline.report import merge_candidates
from spica_pipeline.report.plots import (
    MERGED_BAND,
    _pyplot,
    convergence_png,
    pareto_figure,
    pareto_png,
    rank_groups,
    sla_thresholds,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rank_labels(fig):
    ax = fig.axes[0]
    return [a for a in ax.texts if a.get_text()[:1].isdigit()]


def test_coinciding_picks_share_a_label_and_ranges_read_as_ranges():
    points = [(10.0, 600.0)] * 4 + [(10.0, 590.0), (50.0, 400.0), (10.0, 600.0)]
    labels = rank_groups(points, (100.0, 700.0))
    assert [text for text, _ in labels] == ["1-4, 7", "5", "6"]
    assert rank_groups([(1.0, 1.0)] * 3 + [(9.0, 9.0)], (10.0, 10.0))[0][0] == "1-3"


@pytest.mark.parametrize("target", ["throughput_per_gpu", "pareto", "goodput_per_gpu"])
def test_labels_never_overlap_and_both_branches_stay_visible(target):
    merge = merge_candidates(make_ledger(seed=5, n=60), target, gpu_budget=16)
    sla = {"ttft_ms": 600.0, "itl_ms": 30.0}
    fig = pareto_figure(merge, sla=sla)
    try:
        ax = fig.axes[0]
        renderer = fig.canvas.get_renderer()
        boxes = [t.get_window_extent(renderer) for t in _rank_labels(fig)]
        assert boxes, "the ranked picks are labelled"
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b), "two rank labels overprint"
        inside = ax.get_window_extent(renderer)
        assert all(inside.contains(b.x0, b.y0) and inside.contains(b.x1, b.y1) for b in boxes)
        lines = {line.get_label(): line for line in ax.get_lines()}
        band = next(line for line in ax.get_lines() if line.get_color() == MERGED_BAND)
        for branch in merge.branches:  # each branch's own front is drawn above the merged band
            own = lines.get(f"{branch}: its best trade-off")
            assert own is not None and own.get_zorder() > band.get_zorder()
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(t.startswith("the pick (rank 1)") for t in legend)
        assert "SLA ITL 30 ms = 33.3 tok/s/user" in legend  # x is per-user speed: ITL maps onto it
        assert "SLA TTFT <= 600 ms (not on these axes)" in legend
    finally:
        _pyplot().close(fig)


def test_sla_thresholds_map_onto_the_axes_that_can_show_them():
    assert sla_thresholds("throughput_per_user", {"itl_ms": 25.0}) == [(40.0, "SLA ITL 25 ms = 40 tok/s/user",
                                                                         "above")]
    assert sla_thresholds("e2e_latency", {"e2e_ms": 2000.0})[0][::2] == (2000.0, "below")
    assert sla_thresholds("throughput_per_gpu", {"itl_ms": 25.0, "e2e_ms": 9.0}) == []
    assert sla_thresholds("throughput_per_user", None) == []


def test_pngs_render_with_and_without_candidates():
    merge = merge_candidates(make_ledger(seed=3, n=36), "throughput_per_gpu", gpu_budget=16)
    assert pareto_png(merge, sla={"itl_ms": 40.0}).startswith(PNG_MAGIC)
    assert convergence_png(merge).startswith(PNG_MAGIC)
    empty = merge_candidates(make_ledger(seed=3, n=36).iloc[0:0], "throughput_per_gpu", gpu_budget=16)
    assert pareto_png(empty).startswith(PNG_MAGIC) and convergence_png(empty).startswith(PNG_MAGIC)


def test_dagster_plots_an_inline_sketch_and_a_readable_full_size_plot():
    import base64
    import io
    import re

    from PIL import Image

    from spica_pipeline.dagster.result import result_plots
    from spica_pipeline.dagster.ui_plots import INLINE_LIMIT

    merge = merge_candidates(make_ledger(seed=5, n=60), "throughput_per_gpu", gpu_budget=16)
    plots = result_plots(merge, {"ttft_ms": 600.0, "itl_ms": 30.0})

    def image(md: str):
        data = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", md).group(1)
        return Image.open(io.BytesIO(base64.b64decode(data)))

    for name in ("tradeoff_plot", "convergence_plot"):
        md = plots[name].value
        assert len(md) < INLINE_LIMIT  # the UI renders it inline
        assert image(md).size == (320, 160)
    for name in ("tradeoff_plot_full_size", "convergence_plot_full_size"):
        width, height = image(plots[name].value).size
        assert 750 <= width <= 1100 and height >= 400  # readable, and fits the UI's dialog without scrolling


def test_full_size_plot_keeps_a_branch_colour_that_covers_few_pixels():
    """One disagg point next to a large shaded SLA region: its orange must survive the palette."""
    import base64
    import io
    import re

    from PIL import Image

    from spica_pipeline.dagster.ui_plots import png_markdown

    ledger = make_ledger(seed=5, n=60)
    disagg = ledger.index[(ledger["branch"] == "disagg") & (ledger["status"] == "feasible")]
    merge = merge_candidates(ledger.drop(disagg[1:]), "throughput_per_gpu", gpu_budget=16)
    png = pareto_png(merge, sla={"itl_ms": 5.0}, dpi=110, legend="below")  # shades nearly all of the axes
    md = png_markdown("trade-off", png)
    data = base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", md).group(1))
    with Image.open(io.BytesIO(data)) as img:
        colours = {rgb for _, rgb in img.convert("RGB").getcolors(maxcolors=1 << 16)}
    for name, rgb in (("tab:orange", (255, 127, 14)), ("tab:blue", (31, 119, 180))):
        assert min(sum((a - b) ** 2 for a, b in zip(c, rgb)) for c in colours) <= 3 * 8 ** 2, name
