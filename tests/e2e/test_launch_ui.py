"""End to end in a real browser: docs/dagster.md's "Launch a sweep from the UI", step by step,
against a real `dagster dev` on 127.0.0.1 (a code location with one small agg + disagg sweep, the
fake evaluator, automation off).

Headless Chromium, driven over the DevTools protocol (tests/e2e/browser.py), clicks what a person
clicks: Jobs -> the sweep's job -> the menu next to "Materialize all..." -> "Open launchpad" ->
"Scaffold all default config" (the sweep file's values) -> an edited seed and SLA -> "Materialize".
The run's validated config carries the edits; the result page shows the trade-off sketch inline
and the full plot at a readable size behind "[Show Markdown]"; "Materialize all..." opens the
partition dialog the docs describe. Every step leaves a screenshot ($SPICA_E2E_ARTIFACTS keeps them).
"""

import json
import time
from pathlib import Path

import pytest
from dagster_dev import TESTS, dagster_dev, keep_artifact

pytestmark = [pytest.mark.e2e]

SWEEP = "e2e_launch"
SWEEP_YAML = """\
search_space:
  model_name: Qwen/Qwen3-32B
  hardware_sku: h200_sxm
  gpu_budget: 2
  deployment_mode: [agg, disagg]
  backend: [vllm]
  router_mode: [round_robin]
  planner_scaling_policy: [disabled]
  agg_max_num_seqs: [256, 512]
  agg_max_num_batched_tokens: [8192]
  prefill_max_num_seqs: [8]
  prefill_max_num_batched_tokens: [8192]
  decode_max_num_seqs: [256, 512]
workload: {isl: 512, osl: 64, request_rate: 4, num_request_ratio: 10}
goal:
  target: throughput_per_gpu
  sla: {ttft_ms: 500, itl_ms: 40}
sweep: {max_rounds: 2, candidates_per_round: 4, parallel_evals: 1, seed: 5, policy: thorough,
        algorithm: QUASI_RANDOM_SEARCH}
"""
LOCATION = """\
import sys
sys.path.insert(0, {tests!r})
from dagster_fakes import FakeEvaluator
from spica_pipeline.dagster.factory import sweeps_definitions
from spica_pipeline.dagster.io import ParquetIOManager, SweepStorage
from spica_pipeline.dagster.spec import sweep_spec
from spica_pipeline.optimize.vizier import VizierClient

defs = sweeps_definitions(
    [sweep_spec({name!r}, {path!r})],
    resources={{"io_manager": ParquetIOManager(), "sweep_storage": SweepStorage(), "replay": FakeEvaluator(),
               "vizier": VizierClient()}})
"""
METADATA = """
query Meta($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) { ... on Asset { assetMaterializations(limit: 1) { runId
    metadataEntries { label ... on IntMetadataEntry { intValue } ... on MarkdownMetadataEntry { mdStr } } } } }
}"""
# what the launchpad's editor gets: the scaffolded defaults with the seed and the SLA changed
EDITED = """\
ops:
  {name}__branch_study:
    config:
      warm_start: false
  {name}__validated_config:
    config:
      algorithm: QUASI_RANDOM_SEARCH
      gpu_budget: 2
      max_rounds: 2
      parallel_evals: 1
      policy: thorough
      request_rate: 4
      seed: 11
      sla_itl_ms: 30
      sla_ttft_ms: 500
"""


@pytest.fixture
def server(tmp_path):
    browser_binary = Path(__import__("browser").CHROMIUM)
    if not browser_binary.exists():
        pytest.skip(f"{browser_binary} not found: the UI walk needs the Debian package `chromium`")
    pytest.importorskip("websockets.sync.client")
    config = tmp_path / f"{SWEEP}.yaml"
    config.write_text(SWEEP_YAML)
    (tmp_path / "location.py").write_text(LOCATION.format(tests=str(TESTS), name=SWEEP, path=str(config)))
    with dagster_dev(tmp_path, tmp_path / "location.py", "e2e") as dev:
        dev.wait_loaded("e2e")
        yield dev


def _shot(browser, path: Path, full_page: bool = False) -> Path:
    browser.screenshot(path, full_page=full_page)
    from PIL import Image

    with Image.open(path) as img:  # non-blank: many distinct colours, not one background
        colours = img.convert("RGB").resize((350, 225)).getcolors(maxcolors=1 << 16) or []
    assert len(colours) > 20, f"{path.name} looks blank ({len(colours)} colours)"
    keep_artifact(path)
    return path


def _editor_text(browser) -> str:
    return browser.evaluate("Array.from(document.querySelectorAll('.CodeMirror-line')).map(e => e.innerText)"
                            ".join('\\n')") or ""


def _meta(server, stage: str) -> dict:
    asset = server.graphql(METADATA, {"path": [SWEEP, stage]})["assetOrError"]
    mats = asset["assetMaterializations"]
    if not mats:
        return {}
    return {e["label"]: e.get("intValue", e.get("mdStr")) for e in mats[0]["metadataEntries"]}


def test_launch_from_the_ui_as_docs_dagster_md_says(server, tmp_path):
    from browser import Browser

    with Browser(tmp_path / "chrome-profile", 1400, 1000) as b:
        # 1. Jobs -> <name>_sweep
        b.goto(f"{server.url}/jobs")
        b.click_text(f"{SWEEP}_sweep", timeout=120)
        b.wait_text("Materialize all", 60)
        time.sleep(1)
        tabs = b.evaluate("Array.from(document.querySelectorAll('a, button')).map(e => (e.innerText || '').trim())")
        assert {"Overview", "Runs", "Partitions"} <= set(tabs) and "Launchpad" not in tabs  # no Launchpad tab
        _shot(b, tmp_path / "ui-1-job.png")

        # 2. "Materialize all..." opens the partition dialog (what the docs call it)
        b.click_text("Materialize all…")
        b.wait_text("Partition selection", 30)
        time.sleep(1.5)
        dialog = b.text()
        for words in ("Launch runs to materialize", "Partition selection", "All", "Missing", "Config",
                      "Launch backfill"):
            assert words in dialog, words
        _shot(b, tmp_path / "ui-2-partition-dialog.png")
        b.click_text("Cancel")
        b.wait_for("!document.body.innerText.includes('Partition selection')", 30, what="the dialog to close")

        # 3. the menu next to "Materialize all..." -> "Open launchpad"
        menu = b.evaluate("""(() => {
            const button = Array.from(document.querySelectorAll('button'))
                .find(e => (e.innerText || '').includes('Materialize all'));
            const caret = button.closest('span, div').nextElementSibling;
            caret.scrollIntoView({block: 'center'});
            const r = caret.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2];
        })()""")
        b.click_at(*menu)
        b.click_text("Open launchpad")
        b.wait_text("Scaffold all default config", 60)
        time.sleep(1.5)
        launchpad = b.text()
        assert "Launchpad (configure assets)" in launchpad
        assert "asset_partition_range_start: agg" in launchpad and "asset_partition_range_end: disagg" in launchpad
        _shot(b, tmp_path / "ui-3-launchpad.png")

        # 4. "Scaffold all default config": the sweep file's values
        b.click_text("Scaffold all default config", selector="button")
        b.wait_for(f"document.body.innerText.includes('{SWEEP}__validated_config')", 30, what="the scaffold")
        scaffold = _editor_text(b)
        for line in ("seed: 5", "max_rounds: 2", "request_rate: 4", "policy: thorough", "gpu_budget: 2",
                     "sla_itl_ms: 40", "sla_ttft_ms: 500"):
            assert line in scaffold, (line, scaffold)
        _shot(b, tmp_path / "ui-4-scaffolded.png")

        # 5. edit: seed 11 and an ITL limit, typed into the editor
        b.click_at(*b.evaluate("""(() => {
            const editor = Array.from(document.querySelectorAll('.CodeMirror'))
                .sort((x, y) => y.getBoundingClientRect().height - x.getBoundingClientRect().height)[0];
            const r = editor.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height - 30]; })()"""))
        assert b.evaluate("document.activeElement.tagName") == "TEXTAREA"  # the editor has the keyboard
        b.call("Input.dispatchKeyEvent", type="rawKeyDown", key="a", code="KeyA", windowsVirtualKeyCode=65,
               modifiers=2, commands=["selectAll"])
        b.call("Input.dispatchKeyEvent", type="keyUp", key="a", code="KeyA", windowsVirtualKeyCode=65, modifiers=2)
        b.type_text(EDITED.format(name=SWEEP))
        b.wait_for("Array.from(document.querySelectorAll('.CodeMirror-line')).some(e => e.innerText.includes('seed: 11'))",
                   30, what="the edit")
        time.sleep(1)
        text = b.text()
        assert "No errors" in text, text[-1500:]
        _shot(b, tmp_path / "ui-5-edited.png")

        # 6. "Materialize", then "Confirm": the job is partitioned and its tags name every mode
        b.click_text("Materialize", selector="button")
        b.wait_text("This job is partitioned", 30)
        _shot(b, tmp_path / "ui-6-confirm.png")
        b.click_text("Confirm", selector="button")
        server.wait(lambda: server.latest(SWEEP, "deploy"), 300, "the launched run to materialize deploy")
        validated = _meta(server, "validated_config")
        assert validated["seed"] == 11
        assert "itl_ms: 30.0" in validated["config"] and "ttft_ms: 500.0" in validated["config"]
        result = _meta(server, "sweep_result")
        assert len(result["tradeoff_plot"]) < 1000  # inline on the page
        assert "data:image/png;base64," in result["tradeoff_plot_full_size"]

        # 7. the result page: the inline sketch, then the full plot behind "[Show Markdown]"
        b.goto(f"{server.url}/assets/{SWEEP}/sweep_result?view=events")
        b.wait_text("tradeoff_plot_full_size", 120)
        time.sleep(2)
        sketch = b.wait_for("""(() => { const img = Array.from(document.images)
            .find(i => i.alt === 'trade-off' && i.naturalWidth > 0); return img ? img.naturalWidth : 0; })()""",
                            30, what="the inline trade-off sketch")
        assert sketch >= 300
        b.evaluate("Array.from(document.images).find(i => i.alt === 'trade-off').scrollIntoView({block: 'center'})")
        time.sleep(1)
        _shot(b, tmp_path / "ui-7-result.png")
        where = b.evaluate("""(() => {
            const cell = Array.from(document.querySelectorAll('td, div, span'))
                .find(e => (e.innerText || '').trim() === 'tradeoff_plot_full_size');
            const row = cell.closest('tr') || cell.parentElement.parentElement;
            const link = Array.from(row.querySelectorAll('*'))
                .filter(e => (e.innerText || '').trim() === '[Show Markdown]').pop();
            link.scrollIntoView({block: 'center'});
            const r = link.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2];
        })()""")
        b.click_at(*where)
        shown = b.wait_for("""(() => { const img = Array.from(document.images)
            .find(i => i.alt === 'trade-off' && i.naturalWidth >= 700);
            if (!img) return null;
            const r = img.getBoundingClientRect(), box = img.closest('[role=dialog], .bp5-dialog') || document.body;
            return [img.naturalWidth, Math.round(r.width), Math.round(box.getBoundingClientRect().right - r.right)]; })()""",
                           30, what="the full-size trade-off plot")
        # readable: at (or, in a narrow dialog, near) its own size, and not cut off
        assert shown[0] >= 750 and shown[1] >= 0.9 * shown[0] and shown[2] >= 0, shown
        _shot(b, tmp_path / "ui-8-full-plot.png")
        (tmp_path / "ui-walk.json").write_text(json.dumps({"launchpad": launchpad[-3000:], "scaffold": scaffold,
                                                           "full_plot_px": shown}, indent=2))
        keep_artifact(tmp_path / "ui-walk.json")
