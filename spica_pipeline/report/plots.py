"""PNG plots: the throughput/latency trade-off (AI Configurator style) and search convergence.

matplotlib runs on the Agg backend and renders into memory; the caller writes the bytes atomically.
"""

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from spica_pipeline.search import scoring  # noqa: E402
from spica_pipeline.report.merge import MergeResult  # noqa: E402
from spica_pipeline.report.tables import plot_axes  # noqa: E402

BRANCH_STYLE = {"agg": ("tab:blue", "o"), "disagg": ("tab:orange", "s")}
AXES_DIRS = ("max", "max")  # tok/s/user (x) and tok/s/GPU (y) are both maximised


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _front_xy(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The 2-D max/max front of (x, y) points, ascending in x (so y descends)."""
    front = sorted(scoring.pareto_front(points, AXES_DIRS), key=lambda p: p[0])
    return [p[0] for p in front], [p[1] for p in front]


def pareto_png(merge: MergeResult, title: str | None = None) -> bytes:
    """tok/s/GPU (y) against tok/s/user (x): every feasible point per branch, each branch's front
    (thin) and the merged front (bold step line); for a scalar goal the best candidate is starred."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    all_xy = []
    for branch in merge.branches:
        pts = [plot_axes(c) for c in merge.feasible if c.branch == branch]
        if not pts:
            continue
        color, marker = BRANCH_STYLE.get(branch, ("tab:gray", "^"))
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=22, alpha=0.45, color=color, marker=marker,
                   label=f"{branch} ({len(pts)} feasible)")
        fx, fy = _front_xy(pts)
        ax.plot(fx, fy, drawstyle="steps-pre", color=color, lw=1.0, ls="--", alpha=0.8)
        all_xy += pts
    if all_xy:
        fx, fy = _front_xy(all_xy)
        ax.plot(fx, fy, drawstyle="steps-pre", color="black", lw=2.0, label=f"front on these axes ({len(fx)})")
        ax.scatter(fx, fy, s=36, facecolors="none", edgecolors="black", zorder=3)
    best = merge.best
    if best is not None:
        bx, by = plot_axes(best)
        label = "best" if not merge.is_pareto else f"best {merge.objectives[0]} on the front"
        ax.scatter([bx], [by], s=260, marker="*", color="crimson", edgecolors="black", zorder=4, label=label)
    if not all_xy:
        ax.text(0.5, 0.5, "no feasible candidate", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("output tokens/s/user")
    ax.set_ylabel("output tokens/s/GPU")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or f"goal: {merge.target}" + (f" {merge.objectives}" if merge.is_pareto else ""))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return _png(fig)


def convergence_png(merge: MergeResult) -> bytes:
    """Best score (raw goal units) or front hypervolume after each evaluation, per branch and merged."""
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
