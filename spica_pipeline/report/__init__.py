"""The output layer: ranked candidates or the Pareto front as tables, report.md, plots and
deployment starting points, all written atomically under one output directory."""

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from spica_pipeline.report.deploy import write_deploy_folder
from spica_pipeline.report.markdown import render_report
from spica_pipeline.report.merge import MergeResult, merge_candidates, merge_for_config
from spica_pipeline.report.plots import convergence_png, pareto_png
from spica_pipeline.report.sweep_result import ledger_to_sweep_result, to_json_text
from spica_pipeline.report.tables import arrow_safe, candidates_frame, describe_candidate
from spica_pipeline.storage import atomic_write_bytes, atomic_write_parquet, atomic_write_text


def _drop_stale_deploy_folders(deploy_dir: Path, keep: int) -> None:
    """A rerun with fewer picks (or a smaller top_n) must not leave an older run's deploy/<rank>/."""
    import shutil

    if not deploy_dir.is_dir():
        return
    for d in deploy_dir.iterdir():
        if d.is_dir() and d.name.isdigit() and int(d.name) > keep:
            shutil.rmtree(d)

__all__ = ["MergeResult", "merge_candidates", "merge_for_config", "write_outputs"]


def write_outputs(
    output_dir: str | Path,
    ledger_df: pd.DataFrame,
    merge_result: MergeResult,
    *,
    goal_summary: Mapping[str, Any],
    workload_summary: Mapping[str, Any],
    timings: Mapping[str, Any],
    top_n: int = 10,
    branch_notes: Mapping[str, str] | None = None,
    deploy_options: Any = None,
    config_json: Mapping[str, Any] | None = None,
    heldout_check: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write every artifact; returns name -> path. Each file is replaced atomically, so a reader
    never sees a half-written one and a crash leaves the previous run's file intact.

    branch_notes: branch -> why it was searched the way it was (shown in report.md).
    top_n / deploy_options: deploy/<rank>/ for the ranking's head (a front: every point up to top_n),
    rendered with report.dgd.DeployOptions (None: defaults).
    config_json: the validated config as JSON; when given, recommendation.json (SweepResult) is written.
    heldout_check: the recorded held-out check of the numbers ranked on (fidelity/profile.heldout_check),
    shown per backend in report.md and deploy/<rank>/.
    """

    out = Path(output_dir)
    m = merge_result
    paths: dict[str, Path] = {}
    paths["ledger"] = atomic_write_parquet(out / "ledger.parquet", arrow_safe(ledger_df))
    table = candidates_frame(m.candidates, m.objectives if m.is_pareto else None, target=m.target)
    paths["candidates"] = atomic_write_parquet(out / "candidates.parquet", table)
    paths["candidates_csv"] = atomic_write_text(out / "candidates.csv", table.to_csv(index=False))
    paths["pareto_png"] = atomic_write_bytes(out / "pareto.png", pareto_png(m, sla=goal_summary.get("sla")))
    paths["convergence_png"] = atomic_write_bytes(out / "convergence.png", convergence_png(m))
    for rank, cand in enumerate(m.top(top_n), start=1):
        written = write_deploy_folder(
            out / "deploy" / str(rank), cand, rank, target=m.target, options=deploy_options,
            description=describe_candidate(cand, m.target, m.objectives), sla=goal_summary.get("sla"),
            heldout_check=heldout_check, workload=workload_summary)
        paths[f"deploy_{rank}"] = written.get("dgd") or written["dgd_invalid"]
        paths[f"deploy_record_{rank}"] = written["record"]
    _drop_stale_deploy_folders(out / "deploy", keep=len(m.top(top_n)))
    if config_json is not None:
        doc = ledger_to_sweep_result(ledger_df, m, config_json=config_json, top_n=top_n, goal=goal_summary)
        paths["recommendation"] = atomic_write_text(out / "recommendation.json", to_json_text(doc))
    files = {k: str(p.relative_to(out)) for k, p in paths.items()}
    files["report"] = "report.md"
    text = render_report(m, ledger_df, goal_summary=goal_summary, workload_summary=workload_summary,
                         timings=timings, files=files, branch_notes=branch_notes, heldout_check=heldout_check)
    paths["report"] = atomic_write_text(out / "report.md", text)
    return paths
