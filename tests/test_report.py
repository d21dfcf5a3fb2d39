"""The run report: quotable header, formatted numbers, charts with integer generation axes,
lineage edges, the test comparison, baseline wording, and a real-browser check."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dp_textgrad import workflow
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.report import BASELINE_BANNER, UNSAFE_BANNER, charts, plots, write_report
from dp_textgrad.report.browser import BrowserUnavailable, check_page, find_chromium, screenshot
from dp_textgrad.tasks.synthetic import make_support_task

PROMPTS = ["Label the message with one of: bill, tech, cancel, fraud, update.</PROMPT>",
           "Read the customer message carefully and name its main request.</PROMPT>"]
RULE = {"refund": "bill", "charge": "bill", "app": "tech", "cancel": "cancel", "stolen": "fraud", "address": "update"}
SCHEDULE = dict(epsilon=4.0, generations=3, population=4, parents=2, sampling_rate=0.3)


def finished(tmp_path_factory, **overrides) -> Path:
    task = make_support_task(n_private=150, n_test=30)
    config = DPESConfig(**{**SCHEDULE, **overrides}, insecure_noise_seed=7)
    engine = ScriptedEngine(responses=list(PROMPTS), choice_rule=RULE)
    return workflow.run(task, engine, config, runs_root=tmp_path_factory.mktemp("runs")).run_dir


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory) -> Path:
    return finished(tmp_path_factory)


def test_header_is_quotable_and_numbers_are_formatted(dp_run) -> None:
    report = (dp_run / "report.md").read_text(encoding="utf-8")
    quote = next(line for line in report.splitlines() if line.startswith("> "))
    assert re.search(r"\*\*\(\d\.\d{4}, 1e-05\)-differential privacy\*\*", quote), quote  # rounded up
    for phrase in ("add or remove one record", "bound: PLD", "noise multiplier z = ", "q = 0.3", "3 generations"):
        assert phrase in quote
    # No raw float reprs anywhere (q = 0.06666666666666667, z = 0.7135868540626021, ...).
    assert not re.findall(r"\d\.\d{6,}", report), re.findall(r"\d\.\d{6,}", report)
    assert "None" not in report
    assert UNSAFE_BANNER not in report and BASELINE_BANNER not in report


def test_test_comparison_has_intervals_and_a_paired_test(dp_run) -> None:
    report = (dp_run / "report.md").read_text(encoding="utf-8")
    section = report.split("## Test-split evaluation (outside the guarantee)")[1].split("\n## ")[0]
    assert "not covered by the guarantee" in section
    assert re.search(r"\| seed \| \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \|", section)
    assert "McNemar test p = " in section and "95% CI" in section


def test_privacy_table_marks_the_used_bound_per_generation(dp_run) -> None:
    report = (dp_run / "report.md").read_text(encoding="utf-8")
    rows = [line for line in report.split("## Privacy spent per generation")[1].split("\n## ")[0].splitlines()
            if re.match(r"\| \d+ \|", line)]
    assert len(rows) == SCHEDULE["generations"]
    assert all("**" in row for row in rows)


def test_lineage_lists_parents(dp_run) -> None:
    report = (dp_run / "report.md").read_text(encoding="utf-8")
    rows = [line for line in report.split("## Lineage")[1].splitlines() if line.startswith("| ") and "`" in line]
    assert rows and rows[0].split("|")[4].strip() == "-"  # the seed has no parent
    ids = {row.split("`")[1] for row in rows}
    assert all(parent.strip() in ids for row in rows[1:] for parent in row.split("|")[4].split(","))


class _Captured(Exception):
    pass


@pytest.mark.parametrize("chart", ["scores", "privacy", "lineage"])
def test_generation_axes_have_integer_ticks_and_lineage_has_edges(dp_run, chart, monkeypatch) -> None:
    import json

    seen = {}

    def capture(fig):
        ax = fig.axes[0]
        seen["ticks"] = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        seen["arrows"] = sum(1 for child in ax.texts if getattr(child, "arrow_patch", None) is not None)
        raise _Captured

    monkeypatch.setattr(plots, "_png", capture)
    result = json.loads((dp_run / "result.json").read_text())
    metrics = [json.loads(line) for line in (dp_run / "metrics.jsonl").read_text().splitlines()]
    # A lineage with a crossover (two parents) besides the run's own (which may be the seed alone).
    lineage = [{"id": "g2-c", "generation": 2, "operator": "crossover", "parent_ids": ["g1-a", "g1-b"]},
               {"id": "g1-a", "generation": 1, "operator": "llm_rewrite", "parent_ids": ["g0-seed"]},
               {"id": "g1-b", "generation": 1, "operator": "verbaliser_hint", "parent_ids": ["g0-seed"]},
               {"id": "g0-seed", "generation": 0, "operator": "seed", "parent_ids": []}]
    draw = {"scores": lambda: plots.scores_chart(metrics), "privacy": lambda: plots.privacy_chart(metrics, 4.0),
            "lineage": lambda: plots.lineage_chart(lineage)}[chart]
    with pytest.raises(_Captured):
        draw()
    assert seen["ticks"] and all(float(t).is_integer() for t in seen["ticks"]), seen["ticks"]
    if chart == "lineage":
        assert seen["arrows"] == 4 and seen["ticks"] == [0, 1, 2]


def test_privacy_off_is_called_a_non_private_baseline(tmp_path_factory) -> None:
    run_dir = finished(tmp_path_factory, privacy="off")
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert BASELINE_BANNER in report and UNSAFE_BANNER not in report
    assert "unsafe" not in report.lower()
    assert "epsilon.png" not in report  # no privacy chart for a run that claims none


def test_report_rebuild_is_deterministic(dp_run) -> None:
    before = (dp_run / "report.md").read_text(encoding="utf-8")
    write_report(dp_run)
    assert (dp_run / "report.md").read_text(encoding="utf-8") == before


def _chromium() -> str:
    try:
        return find_chromium()
    except BrowserUnavailable as exc:
        pytest.skip(f"headless browser test: {exc}")


@pytest.mark.slow
def test_report_renders_in_headless_chromium(dp_run, tmp_path) -> None:
    _chromium()
    html_file = dp_run / "report.html"
    verdict = check_page(html_file)
    import json

    result = json.loads((dp_run / "result.json").read_text())
    config = json.loads((dp_run / "config.json").read_text())
    metrics = [json.loads(line) for line in (dp_run / "metrics.jsonl").read_text().splitlines()]
    assert verdict.ok, verdict
    assert verdict.images == len(charts(config, result, metrics)) == 4
    shot = screenshot(html_file, dp_run / "report_screenshot.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    # The check can fail: a broken image and a script error in a copy are both reported.
    broken = tmp_path / "broken.html"
    broken.write_text(html_file.read_text(encoding="utf-8").replace("base64,iVBOR", "base64,AAAA", 1)
                      .replace("</body>", "<script>missing_function()</script></body>"), encoding="utf-8")
    bad = check_page(broken)
    assert len(bad.broken_images) == 1 and any("missing_function" in e for e in bad.errors)


def test_missing_browser_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("DP_TEXTGRAD_CHROMIUM", "no-such-browser-here")
    with pytest.raises(BrowserUnavailable, match="DP_TEXTGRAD_CHROMIUM"):
        find_chromium()
    monkeypatch.delenv("DP_TEXTGRAD_CHROMIUM")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(BrowserUnavailable, match="chromium"):
        find_chromium()


def test_the_report_describes_only_the_mechanisms_the_ledger_charged(tmp_path) -> None:
    # A run planned with DP feedback that never read it (one generation, or no LLM operator) must
    # not describe feedback (issue 47); one that charged it does, and so for the count of failures.
    from dp_textgrad.report.markdown import _mechanism, charged_parts

    config = {"task_kind": "generate", "noise_multiplier": 1.2,
              "config": {"selection": "gaussian", "parents": 2, "feedback": "dp_confusion",
                         "feedback_noise_ratio": 3.0, "max_error_share": 0.5}}

    def ledger(*metadata: dict) -> set[str]:
        lines = [json.dumps({"header": True})] + [json.dumps({"label": "g", "metadata": m}) for m in metadata]
        (tmp_path / "ledger.jsonl").write_text("\n".join(lines) + "\n")
        return charged_parts(tmp_path)

    none = ledger({"feedback_candidates": 0, "noise_multiplier": 1.2})
    assert none == set() and "feedback" not in _mechanism(config, None, none)
    both = ledger({"feedback_candidates": 0}, {"feedback_candidates": 1, "error_noise_multiplier": 3.6})
    text = _mechanism(config, None, both)
    assert "DP failure-histogram feedback" in text and "failed to score" in text


def test_released_estimates_stay_in_the_metrics_range_and_say_what_they_cover(tmp_path) -> None:
    # Issue 46: a privacy-off estimate reached 1.0067 on a metric in [0, 1] (exact sums over the
    # public q N of a subsample that came out larger), and the "95% noise interval" covered only the noise.
    import dp_textgrad
    from dp_textgrad.privacy.data import PrivateDataset
    from dp_textgrad.tasks.base import ClassificationTask, Example
    from tests.twin import LABELS, LengthTimedEngine, base_rows

    # A long schedule (40 subsamples) so that a subsample larger than q N, the case to clip, arises.
    # Every record is read right (the engine follows each record's cue): a candidate's exact sum is
    # |B|, and its estimate |B| / (q N) is above 1 whenever the subsample comes out larger than q N.
    task = ClassificationTask(name="cues", description="bill, tech or fraud", labels=list(LABELS),
                              private_train=PrivateDataset([Example(t, y) for t, y in base_rows(200)]), test=[],
                              seed_prompt="Label the message.")
    engine = LengthTimedEngine()
    # The subsamples are seeded (insecure_noise_seed): with fresh ones the case arose in most runs,
    # not all (a CI run once drew no subsample large enough).
    outcome = dp_textgrad.optimize(task, engine, runs_root=tmp_path, privacy="off", generations=10, population=4,
                                   parents=1, sampling_rate=0.1, evaluate=False, seed=2, insecure_noise_seed=7)
    raw = [s.estimate for c in outcome.optimizer.population.archive for s in c.evaluations]
    released = [h.best_estimate for h in outcome.result.history] + [outcome.result.estimate]
    assert max(raw) > 1.0, raw  # the case to clip arose
    assert all(0.0 <= v <= 1.0 for v in released), released
    dp = dp_textgrad.optimize(task, engine, runs_root=tmp_path / "dp", epsilon=4.0, generations=2, population=4,
                              parents=1, sampling_rate=0.2, dataset_size=200, evaluate=False, insecure_noise_seed=1)
    report = (dp.run_dir / "report.md").read_text()
    text = " ".join(report.split())
    assert "95% noise interval" in text and "With the subsampling as well" in text
    assert "Winner's curse: this prompt was released because its estimate was the best of 4" in text
