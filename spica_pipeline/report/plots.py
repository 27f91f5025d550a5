"""PNG plots: the throughput/latency trade-off (AI Configurator style) and search convergence.

matplotlib runs on the Agg backend and renders into memory; the caller writes the bytes atomically.
What each plot keeps readable: every branch keeps its own colour, marker and line, drawn over the
merged front (a grey band underneath, never a line on top of them); picks that sit on the same
point share one label ("1-4"); labels move until no two overlap; the SLA appears as a threshold
line wherever one of its limits maps onto an axis.
"""

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from spica_pipeline.evaluate import scoring
from spica_pipeline.report.merge import MergeResult
from spica_pipeline.report.tables import goal_value

BRANCH_STYLE = {"agg": ("tab:blue", "o", "-"), "disagg": ("tab:orange", "s", "--")}
OTHER_STYLE = ("tab:green", "^", ":")
MERGED_BAND = "#9e9e9e"
PICK_COLOUR = "crimson"
SLA_COLOUR = "tab:red"
AXES_DIRS = ("max", "max")  # tok/s/user (x) and tok/s/GPU (y) are both maximised
AXIS_LABELS = {
    "throughput": "output tokens/s",
    "throughput_per_gpu": "output tokens/s/GPU",
    "throughput_per_user": "output tokens/s/user",
    "e2e_latency": "mean end-to-end latency (ms)",
    "goodput": "goodput: output tokens/s of requests within the SLA",
    "goodput_per_gpu": "goodput/GPU: output tokens/s/GPU of requests within the SLA",
    "min_gpus": "requests/s/GPU (SLA-passing candidates)",
}
LABELLED_RANKS = 10
# label offsets tried in turn (points from the marker), nearest first; an arrow marks the far ones
_OFFSETS = [(dx * r, dy * r) for r in (1, 2, 3, 4) for dx, dy in
            ((7, 7), (7, -13), (-15, 7), (-15, -13), (0, 12), (0, -18), (14, -3), (-22, -3))]
_ARROW_FROM = 20.0  # points: offsets further than this draw a thin arrow back to the marker


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported at the first plot (it costs half a second)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


DPI = 120  # the report's PNGs


def _png(fig, dpi: int = DPI) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def _branch_order(branches: Sequence[str]) -> list[str]:
    """agg, disagg, then any other branch: the same order, colours and legend in every plot."""
    known = list(BRANCH_STYLE)
    return sorted(branches, key=lambda b: (known.index(b) if b in known else len(known), b))


def _style(branch: str | None) -> tuple[str, str, str]:
    return BRANCH_STYLE.get(branch or "", OTHER_STYLE)


def plot_axes_for(merge: MergeResult) -> tuple[str, str]:
    """(x, y) goal metrics the trade-off plot shows: a front's first two objectives (y = first);
    goodput goals plot goodput/GPU, min_gpus requests/s/GPU, others tok/s/GPU; x is per-user speed."""
    if merge.is_pareto:
        return merge.objectives[1], merge.objectives[0]
    if merge.target in ("goodput", "goodput_per_gpu"):
        return "throughput_per_user", "goodput_per_gpu"
    if merge.target == "min_gpus":
        return "throughput_per_user", "min_gpus"
    if merge.target == "e2e_latency":
        return "e2e_latency", "throughput_per_gpu"
    return "throughput_per_user", "throughput_per_gpu"


def _xy(c, x: str, y: str) -> tuple[float, float]:
    return goal_value(c, x), goal_value(c, y)


def front_points(points: Sequence[tuple[float, float]], dirs: tuple[str, str]) -> list[tuple[float, float]]:
    """Non-dominated (x, y) points on the plotted axes, ascending in x; y <= 0 never counts (a goal
    value of 0 serves nothing, e.g. no request met the SLA)."""
    usable = [p for p in points if p[1] > 0 and math.isfinite(p[0]) and math.isfinite(p[1])]
    return sorted(scoring.pareto_front(usable, dirs), key=lambda p: p[0])


# --------------------------------------------------------------------------------------------
# the SLA on the axes
# --------------------------------------------------------------------------------------------

def sla_thresholds(metric: str, sla: Mapping[str, float] | None) -> list[tuple[float, str, str]]:
    """(value, label, side that meets it: "above" | "below") for each SLA limit that maps onto an
    axis showing `metric`: ITL onto per-user speed (1000 / ITL ms tokens/s), e2e onto e2e latency."""
    if not sla:
        return []
    out = []
    itl = sla.get("itl_ms")
    if metric == "throughput_per_user" and itl:
        out.append((1000.0 / float(itl), f"SLA ITL {float(itl):g} ms = {1000.0 / float(itl):.3g} tok/s/user",
                    "above"))
    e2e = sla.get("e2e_ms")
    if metric == "e2e_latency" and e2e:
        out.append((float(e2e), f"SLA e2e {float(e2e):g} ms", "below"))
    return out


def _sla_note(sla: Mapping[str, float] | None, shown: set[str]) -> str | None:
    """The SLA limits no axis can show (e.g. TTFT), for the legend."""
    if not sla:
        return None
    rest = [f"{k.removesuffix('_ms').upper()} <= {float(v):g} ms" for k, v in sla.items()
            if v is not None and k not in shown]
    return ("SLA " + ", ".join(rest) + " (not on these axes)") if rest else None


def _draw_sla(ax, xname: str, yname: str, sla: Mapping[str, float] | None) -> None:
    shown: set[str] = set()
    for axis, metric in (("x", xname), ("y", yname)):
        for value, label, side in sla_thresholds(metric, sla):
            shown.add("itl_ms" if "ITL" in label else "e2e_ms")
            line = ax.axvline if axis == "x" else ax.axhline
            line(value, color=SLA_COLOUR, ls=(0, (5, 3)), lw=1.3, zorder=1.5, label=label)
            lo, hi = (ax.get_xlim() if axis == "x" else ax.get_ylim())
            span = (lo, value) if side == "above" else (value, hi)
            (ax.axvspan if axis == "x" else ax.axhspan)(*span, color=SLA_COLOUR, alpha=0.06, zorder=0,
                                                         label="misses it (shaded)")
    note = _sla_note(sla, shown)
    if note:
        ax.plot([], [], ls="none", label=note)


# --------------------------------------------------------------------------------------------
# rank labels
# --------------------------------------------------------------------------------------------

def rank_groups(points: Sequence[tuple[float, float]], span: tuple[float, float]) -> list[tuple[str, tuple[float, float]]]:
    """Ranks 1..n of `points` grouped where they coincide on the plot (within 0.5 % of each axis'
    span): one label per group, consecutive ranks as a range ("1-4", "1-3, 5")."""
    groups: list[tuple[list[int], tuple[float, float]]] = []
    for rank, (x, y) in enumerate(points, start=1):
        for ranks, (gx, gy) in groups:
            if abs(gx - x) <= 0.005 * span[0] and abs(gy - y) <= 0.005 * span[1]:
                ranks.append(rank)
                break
        else:
            groups.append(([rank], (x, y)))
    return [(_ranks_text(ranks), where) for ranks, where in groups]


def _ranks_text(ranks: list[int]) -> str:
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _overlaps(box, boxes) -> bool:
    return any(box.overlaps(other) for other in boxes)


def place_labels(ax, labels: Sequence[tuple[str, tuple[float, float]]], avoid: Sequence[tuple[float, float]] = ()):
    """Annotate each (text, (x, y)) at the nearest offset where it overlaps no other label, no
    avoided marker and stays inside the axes; the annotations, in order."""
    from matplotlib.transforms import Bbox

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    pad = 3.0 * fig.dpi / 72.0
    taken = [Bbox.from_bounds(px - pad, py - pad, 2 * pad, 2 * pad)
             for px, py in (ax.transData.transform(p) for p in avoid)]
    placed = []
    for text, (x, y) in labels:
        chosen = None
        for dx, dy in _OFFSETS:
            far = math.hypot(dx, dy) > _ARROW_FROM
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=8,
                               weight="bold", zorder=6,
                               bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8),
                               arrowprops=dict(arrowstyle="-", lw=0.6, color="0.3") if far else None)
            box = note.get_window_extent(renderer)
            if inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1) and not _overlaps(box, taken):
                chosen = note
                break
            note.remove()
        if chosen is None:  # nowhere free: the nearest spot, so the label still names its point
            dx, dy = _OFFSETS[0]
            chosen = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=8,
                                 weight="bold", zorder=6)
        taken.append(chosen.get_window_extent(renderer))
        placed.append(chosen)
    return placed


# --------------------------------------------------------------------------------------------
# the plots
# --------------------------------------------------------------------------------------------

def pareto_figure(merge: MergeResult, title: str | None = None, sla: Mapping[str, float] | None = None,
                  legend: str = "right"):
    """The trade-off figure (see `pareto_png`); the caller closes it. `legend`: "right" of the axes
    (the report), or "below" them (narrower, for the Dagster UI's dialog)."""
    xname, yname = plot_axes_for(merge)
    dirs = (scoring.direction(xname), scoring.direction(yname))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.0, 5.8))
    all_xy: list[tuple[float, float]] = []
    zero: list[tuple[float, float]] = []
    fronts: list[tuple[str, list[tuple[float, float]]]] = []
    for branch in _branch_order(merge.branches):
        pts = [_xy(c, xname, yname) for c in merge.feasible if c.branch == branch]
        if not pts:
            continue
        color, marker, _ = _style(branch)
        live = [p for p in pts if p[1] > 0]
        zero += [p for p in pts if p[1] <= 0]
        ax.scatter([p[0] for p in live], [p[1] for p in live], s=20, alpha=0.35, color=color, marker=marker,
                   linewidths=0, zorder=2, label=f"{branch}: feasible candidates ({len(live)})")
        fronts.append((branch, front_points(pts, dirs)))
        all_xy += pts
    if zero:
        ax.scatter([p[0] for p in zero], [0.0] * len(zero), s=16, marker="x", color="gray", alpha=0.6, zorder=2,
                   label=f"{yname} = 0: served nothing toward the goal ({len(zero)})")
    merged = front_points(all_xy, dirs)
    if merged:
        what = "Pareto front of the goal" if merge.is_pareto else "best trade-off of all branches"
        ax.plot([p[0] for p in merged], [p[1] for p in merged], drawstyle="steps-pre", color=MERGED_BAND, lw=9,
                alpha=0.45, solid_capstyle="round", zorder=1, label=f"{what} ({len(merged)} points, grey band)")
    for branch, front in fronts:  # over the band: each branch's own front stays visible
        if not front:
            continue
        color, marker, style = _style(branch)
        ax.plot([p[0] for p in front], [p[1] for p in front], drawstyle="steps-pre", color=color, lw=1.6, ls=style,
                zorder=3, label=f"{branch}: its best trade-off")
        ax.scatter([p[0] for p in front], [p[1] for p in front], s=34, color=color, marker=marker,
                   edgecolors="black", linewidths=0.6, zorder=4)
    if not all_xy:
        ax.text(0.5, 0.5, "no feasible candidate", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(AXIS_LABELS.get(xname, xname))
    ax.set_ylabel(AXIS_LABELS.get(yname, yname))
    ax.set_xlim(0, _top([p[0] for p in all_xy] + [t[0] for t in sla_thresholds(xname, sla)], 0.08))
    ax.set_ylim(0, _top([p[1] for p in all_xy] + [t[0] for t in sla_thresholds(yname, sla)], 0.12))
    _draw_sla(ax, xname, yname, sla)
    ranked = merge.top(LABELLED_RANKS)
    rec = merge.recommendation
    if rec is not None:
        bx, by = _xy(rec[0], xname, yname)
        rule = "knee" if rec[1] == scoring.KNEE_RULE_2D else rec[1].split(":")[0]
        ax.scatter([bx], [by], s=300, marker="*", color=PICK_COLOUR, edgecolors="black", linewidths=0.8, zorder=5,
                   label=f"the pick (rank 1): {rule}")
    ax.grid(True, alpha=0.3)
    ax.set_title(title or f"goal: {merge.target}" + (f" {merge.objectives}" if merge.is_pareto else ""))
    if ranked:
        x0, x1 = ax.get_xlim()
        y0, y1 = ax.get_ylim()
        spots = [_xy(c, xname, yname) for c in ranked]
        ax.scatter([p[0] for p in spots], [p[1] for p in spots], s=70, facecolors="none", edgecolors="black",
                   linewidths=0.9, zorder=4.5)
        place_labels(ax, rank_groups(spots, (x1 - x0, y1 - y0)), avoid=spots)
        ax.plot([], [], ls="none", label=f"1..{len(ranked)} (ringed): rank, as in deploy/<rank>/; one label per shared point")
    if ax.get_legend_handles_labels()[0]:
        if legend == "below":
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8, frameon=False)
        else:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig


def _top(values: Sequence[float], margin: float) -> float:
    """An axis' upper limit: the largest finite value plus `margin` of it (1 when there is none)."""
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return max(finite) * (1 + margin) if finite else 1.0


def pareto_png(merge: MergeResult, title: str | None = None, sla: Mapping[str, float] | None = None,
               dpi: int = DPI, legend: str = "right") -> bytes:
    """The goal's own metrics (see plot_axes_for): every feasible point per branch, each branch's
    own front (its colour and line style) over the merged front (a grey band), the ranked picks
    numbered as in deploy/<rank> with coinciding picks sharing a label, the pick starred, and the
    SLA (`goal.sla`: ttft_ms / itl_ms / e2e_ms) as a threshold where an axis can show it."""
    return _png(pareto_figure(merge, title, sla, legend), dpi)


def convergence_png(merge: MergeResult, dpi: int = DPI) -> bytes:
    """Best score (raw goal units) or front hypervolume after each evaluation, per branch and merged.
    The merged curve is a grey band underneath, so a branch curve that equals it stays visible."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    conv = merge.convergence
    flip = (not merge.is_pareto) and scoring.direction(merge.target) == "min"
    scopes = [s for s in ["merged", *_branch_order(merge.branches)] if not conv[conv["scope"] == s].empty]
    for scope in scopes:
        part = conv[conv["scope"] == scope]
        x = list(part["evaluation"])
        y = [-v if flip and not math.isnan(v) else v for v in part["value"]]
        if scope == "merged":
            ax.plot(x, y, color=MERGED_BAND, lw=7, alpha=0.5, drawstyle="steps-post", solid_capstyle="butt",
                    zorder=1, label="all branches, in ledger order (grey band)")
            continue
        color, marker, style = _style(scope)
        ax.plot(x, y, color=color, lw=1.6, ls=style, drawstyle="steps-post", zorder=3, label=scope)
        better = [(a, b) for i, (a, b) in enumerate(zip(x, y))
                  if not math.isnan(b) and (i == 0 or math.isnan(y[i - 1]) or b != y[i - 1])]
        ax.scatter([p[0] for p in better], [p[1] for p in better], s=18, color=color, marker=marker, zorder=4)
    if merge.is_pareto:
        ylabel = f"front hypervolume {tuple(merge.objectives)}"
    else:
        ylabel = f"best {merge.target}" + (f" ({'min' if flip else 'max'})")
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_xlabel("evaluations (per branch, in ledger order; repeats answered from earlier results excluded)")
    ax.grid(True, alpha=0.3)
    ax.set_title("search convergence (markers: a new best)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)
    return _png(fig, dpi)


_front = front_points  # its earlier private name, still imported by tests/test_report.py
