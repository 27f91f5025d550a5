"""PNG plots: the throughput/latency trade-off (AI Configurator style) and search convergence.

matplotlib runs on the Agg backend and renders into memory; the caller writes the bytes atomically.
"""

import io
import math

from typing import Any

from spica_pipeline.evaluate import scoring
from spica_pipeline.report.merge import MergeResult
from spica_pipeline.report.tables import goal_value

BRANCH_STYLE = {"agg": ("tab:blue", "o"), "disagg": ("tab:orange", "s")}
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


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported at the first plot (it costs half a second)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


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


def _front(points: list[tuple[float, float]], dirs: tuple[str, str]) -> list[tuple[float, float]]:
    """Non-dominated (x, y) points on the plotted axes, ascending in x; y <= 0 never counts (a goal
    value of 0 serves nothing, e.g. no request met the SLA)."""
    usable = [p for p in points if p[1] > 0 and math.isfinite(p[0]) and math.isfinite(p[1])]
    return sorted(scoring.pareto_front(usable, dirs), key=lambda p: p[0])


def pareto_png(merge: MergeResult, title: str | None = None) -> bytes:
    """The goal's own metrics (see plot_axes_for): every feasible point per branch, each branch's
    non-dominated line (dashed), the merged one (bold), ranked picks numbered as in deploy/<rank>, and
    the recommended point starred. Every legend entry says what it is."""
    xname, yname = plot_axes_for(merge)
    dirs = (scoring.direction(xname), scoring.direction(yname))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    all_xy = []
    zero = 0
    for branch in merge.branches:
        pts = [_xy(c, xname, yname) for c in merge.feasible if c.branch == branch]
        if not pts:
            continue
        color, marker = BRANCH_STYLE.get(branch, ("tab:gray", "^"))
        live = [p for p in pts if p[1] > 0]
        zero += len(pts) - len(live)
        ax.scatter([p[0] for p in live], [p[1] for p in live], s=22, alpha=0.45, color=color, marker=marker,
                   label=f"{branch}: feasible candidates ({len(live)})")
        f = _front(pts, dirs)
        if f:
            ax.plot([p[0] for p in f], [p[1] for p in f], drawstyle="steps-pre", color=color, lw=1.0, ls="--",
                    alpha=0.8, label=f"{branch}: best trade-off within the branch (dashed)")
        all_xy += pts
    if zero:
        zs = [_xy(c, xname, yname) for c in merge.feasible if _xy(c, xname, yname)[1] <= 0]
        ax.scatter([p[0] for p in zs], [0.0] * len(zs), s=18, marker="x", color="gray", alpha=0.6,
                   label=f"{yname} = 0: served nothing toward the goal ({zero})")
    f = _front(all_xy, dirs)
    if f:
        what = "Pareto front of the goal" if merge.is_pareto else "best trade-off on these axes, all branches"
        ax.plot([p[0] for p in f], [p[1] for p in f], drawstyle="steps-pre", color="black", lw=2.0,
                label=f"{what} ({len(f)} points, bold)")
    ranked = merge.top(LABELLED_RANKS)
    for rank, c in enumerate(ranked, start=1):
        px, py = _xy(c, xname, yname)
        ax.annotate(str(rank), (px, py), textcoords="offset points", xytext=(5, 5), fontsize=8, weight="bold")
    if ranked:
        ax.scatter([], [], s=0, label=f"1..{len(ranked)}: rank, as in deploy/<rank>/ and the report table")
    rec = merge.recommendation
    if rec is not None:
        bx, by = _xy(rec[0], xname, yname)
        rule = "knee" if rec[1] == scoring.KNEE_RULE_2D else rec[1].split(":")[0]
        ax.scatter([bx], [by], s=260, marker="*", color="crimson", edgecolors="black", zorder=4,
                   label=f"recommended (rank 1): {rule}")
    if not all_xy:
        ax.text(0.5, 0.5, "no feasible candidate", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(AXIS_LABELS.get(xname, xname))
    ax.set_ylabel(AXIS_LABELS.get(yname, yname))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or f"goal: {merge.target}" + (f" {merge.objectives}" if merge.is_pareto else ""))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return _png(fig)


def convergence_png(merge: MergeResult) -> bytes:
    """Best score (raw goal units) or front hypervolume after each evaluation, per branch and merged."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    conv = merge.convergence
    flip = (not merge.is_pareto) and scoring.direction(merge.target) == "min"
    for scope in [*merge.branches, "merged"]:
        part = conv[conv["scope"] == scope]
        if part.empty:
            continue
        y = [-v if flip and not math.isnan(v) else v for v in part["value"]]
        if scope == "merged":
            ax.plot(part["evaluation"], y, color="black", lw=2.0, drawstyle="steps-post", label="merged")
        else:
            color = BRANCH_STYLE.get(scope, ("tab:gray", "^"))[0]
            ax.plot(part["evaluation"], y, color=color, lw=1.3, drawstyle="steps-post", label=scope)
    if merge.is_pareto:
        ylabel = f"front hypervolume {tuple(merge.objectives)}"
    else:
        ylabel = f"best {merge.target}" + (f" ({'min' if flip else 'max'})")
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_xlabel("evaluations (trials in ledger order, cache hits excluded)")
    ax.grid(True, alpha=0.3)
    ax.set_title("search convergence")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    return _png(fig)
