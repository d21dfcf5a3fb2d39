"""Run reports (Markdown and a self-contained HTML page with charts), rebuilt from a run
directory's released files alone.

Everything shown is DP-released (noisy estimates with their noise, epsilon spent, the
public lineage), a public parameter, or the user's test-split evaluation, which the report
labels as outside the guarantee (:mod:`dp_textgrad.privacy.release` fixes what may appear).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dp_textgrad import _io, runs
from dp_textgrad.report.markdown import BASELINE_BANNER, FEWSHOT_BANNER, UNSAFE_BANNER, build_markdown, run_kind

__all__ = [
    "AUDIT_FILE_NAME",
    "AUDIT_FORMAT",
    "BASELINE_BANNER",
    "FEWSHOT_BANNER",
    "UNSAFE_BANNER",
    "build_markdown",
    "charts",
    "read_audit",
    "run_kind",
    "write_report",
]

AUDIT_FILE_NAME = runs.AUDIT_NAME  # written by dp_textgrad.audit.end_to_end
AUDIT_FORMAT = "dp-textgrad-audit"
HTML_NAME = runs.REPORT_HTML_NAME


def read_audit(directory: Path) -> dict[str, Any] | None:
    """The run's ``audit.json`` (an L2 canary audit), or ``None`` when there is none."""
    path = Path(directory) / AUDIT_FILE_NAME
    if not path.exists():
        return None
    audit = runs.read_json(path)
    if not isinstance(audit, dict) or audit.get("format") != AUDIT_FORMAT:
        raise ValueError(f"audit.json: {path} is not a dp-textgrad audit file (format {AUDIT_FORMAT!r})")
    return audit


def charts(
    config: dict[str, Any], result: dict[str, Any], metrics: list[dict[str, Any]], audit: dict[str, Any] | None = None
) -> dict[str, bytes]:
    """Every chart the report embeds, by file name (PNG bytes)."""
    from dp_textgrad.report import plots  # matplotlib only when a report is drawn
    from dp_textgrad.report.audit_section import ordered_attacks

    images: dict[str, bytes] = {}
    if result.get("evaluation"):
        images[runs.ACCURACY_PLOT_NAME] = plots.evaluation_chart(result["evaluation"])
    if metrics and run_kind(config, result) == "dp":
        images[runs.EPSILON_PLOT_NAME] = plots.privacy_chart(metrics, config.get("config", {}).get("epsilon"))
    if metrics:
        images[runs.SCORES_PLOT_NAME] = plots.scores_chart(metrics)
    if result.get("lineage"):
        images[runs.LINEAGE_PLOT_NAME] = plots.lineage_chart(result["lineage"])
    curves = [(n, a) for n, a in ordered_attacks((audit or {}).get("attacks", {})) if a.get("roc")]
    if audit is not None and curves:
        images[runs.AUDIT_ROC_PLOT_NAME] = plots.audit_roc_chart(audit, curves)
    return images


def write_report(run_dir: str | Path) -> Path:
    """(Re)build ``report.md``, ``report.html`` and ``plots/`` from the files of a run directory."""
    from dp_textgrad.report.html import markdown_to_html

    layout = runs.RunDir(Path(run_dir))
    directory = layout.path
    if not layout.result.exists():
        raise FileNotFoundError(
            f"run_dir: no {layout.result.name} in {directory}; the run has not finished (resume it first)"
        )
    config = runs.read_json(layout.config) if layout.config.exists() else {}
    result = runs.read_json(layout.result)
    metrics = list(_io.read_jsonl(layout.metrics))
    audit = read_audit(directory)
    images = charts(config, result, metrics, audit)
    plot_dir = directory / runs.PLOTS_DIR
    plot_dir.mkdir(exist_ok=True)
    for name, data in images.items():  # released files keep the public file time (runs.RELEASED_FILE_TIME)
        runs.write_released_bytes(plot_dir / name, data)
    markdown = build_markdown(directory, config, result, metrics, {n: f"{runs.PLOTS_DIR}/{n}" for n in images}, audit)
    runs.write_released_text(directory / runs.REPORT_NAME, markdown)
    page = markdown_to_html(
        build_markdown(directory, config, result, metrics, {n: n for n in images}, audit),
        images,
        title=f"dp-textgrad report: {directory.name}",
    )
    runs.write_released_text(directory / HTML_NAME, page)
    runs.stamp_released(directory)  # plots/ was perhaps created just now: the run directory's time changed
    return directory / runs.REPORT_NAME
