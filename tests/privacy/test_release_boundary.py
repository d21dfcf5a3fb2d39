"""The release boundary: the channel table, and the crash paths that must leak nothing.

- The table is the only place that decides what is released: an unclassified field is
  refused, and flipping an operator-only field to public makes the twin-run test fail.
- An over-long record and an unreachable engine each end a CLI run before any charge with one
  clear line holding no record text; an engine that fails on private records scores them 0 and
  the run goes on (a noisy share of failures may stop it, a DP decision); a scoring worker that
  dies ends the run with one clear line holding no private-derived number, the ledger intact,
  and a resume charged correctly.
- ``dp-textgrad --debug optimize`` on such a crash prints no local variables and no
  private-derived value (run in a real subprocess, so typer's own traceback printer runs).
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest

from dp_textgrad.privacy import release
from dp_textgrad.privacy.accounting import PrivacyLedger
from dp_textgrad.engines.base import EngineError
from tests.subprocess_driver import run_driver
from tests.twin import LengthTimedEngine, base_rows, differences, long_record, run_twin

REPO = Path(__file__).resolve().parents[2]
SECRET = "SECRETWORD"
SCHEDULE = ("epsilon = 4\ndataset_size = 40\ngenerations = 2\npopulation = 3\nparents = 2\nsampling_rate = 0.5\n"
            "feedback = \"none\"\ninsecure_noise_seed = 11\n")


# -- the table --------------------------------------------------------------------------------
def test_an_unclassified_field_is_refused() -> None:
    with pytest.raises(release.UnclassifiedFieldError, match="not classified"):
        release.split("metrics", {"generation": 0, "realised_batch_size": 37})
    with pytest.raises(release.UnclassifiedFieldError, match="unknown channel"):
        release.split("nowhere", {})


def test_split_moves_operator_fields_out_of_nested_payloads() -> None:
    public, private = release.split("result", {
        "prompt": "p", "seconds": 3.0,
        "history": [{"generation": 0, "best_estimate": 0.5, "private_prompt_tokens": 812}],
    })
    assert public == {"prompt": "p", "history": [{"generation": 0, "best_estimate": 0.5}]}
    assert private == {"seconds": 3.0, "history": [{"private_prompt_tokens": 812}]}


def test_every_class_in_the_table_is_known() -> None:
    for channel, fields in release.CHANNELS.items():
        for name, kind in fields.items():
            if kind.startswith(release.NESTED):
                assert kind[len(release.NESTED):] in release.CHANNELS, (channel, name)
            else:
                assert kind in release.CLASSES, (channel, name, kind)


def test_the_docs_show_the_table_the_code_uses() -> None:
    text = (REPO / "docs" / "privacy.md").read_text(encoding="utf-8")
    shown = text.split("<!-- release-table:start -->\n", 1)[1].split("\n<!-- release-table:end -->", 1)[0]
    assert shown.strip() == release.channel_table().strip(), "regenerate with `python -m dp_textgrad.privacy.release`"


@pytest.mark.parametrize("field", ["private_prompt_tokens", "seconds"])
def test_the_twin_test_fails_when_an_operator_field_is_released(tmp_path, monkeypatch, field) -> None:
    monkeypatch.setitem(release.CHANNELS["metrics"], field, release.PUBLIC)
    rows = base_rows(40)
    d = run_twin(tmp_path / "d", rows, monkeypatch, SCHEDULE)
    dx = run_twin(tmp_path / "dx", rows + [long_record(rows)], monkeypatch, SCHEDULE)
    assert d.exit_code == dx.exit_code == 0
    assert "metrics.jsonl" in differences(d, dx)


# -- crash paths ------------------------------------------------------------------------------
def ledger_entries(run_dir: Path) -> int:
    return len(PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl").entries)


def assert_clean_failure(capture, forbidden: tuple[str, ...]) -> str:
    lines = [line for line in capture.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), capture.stderr
    for name, data in capture.released.items():
        text = data.decode("utf-8", errors="replace")
        for word in forbidden:
            assert word not in text, (name, word)
    return lines[0]


def test_an_over_long_record_is_rejected_before_any_charge(tmp_path, monkeypatch) -> None:
    rows = base_rows(40)
    text, label = long_record(rows)
    capture = run_twin(tmp_path, rows + [(f"{SECRET} {text}", label)], monkeypatch,
                       SCHEDULE + "max_record_tokens = 64\nlong_records = \"reject\"\n")
    assert capture.exit_code == 2
    line = assert_clean_failure(capture, (SECRET, "zqxj"))
    assert "max_record_tokens = 64" in line and "record(s)" not in line
    assert not (capture.run_dir / "ledger.jsonl").exists() or ledger_entries(capture.run_dir) == 0


def test_an_over_long_record_is_truncated_to_the_public_cap(tmp_path, monkeypatch) -> None:
    seen: list[int] = []

    class Recording(LengthTimedEngine):
        def score_choices_batch(self, prefix, suffixes, choices):
            seen.extend(self.count_tokens(s) for s in suffixes)
            return super().score_choices_batch(prefix, suffixes, choices)

    rows = base_rows(40)
    capture = run_twin(tmp_path, rows + [long_record(rows)], monkeypatch,
                       SCHEDULE.replace("sampling_rate = 0.5", "sampling_rate = 1.0") + "max_record_tokens = 32\n",
                       engine_factory=Recording)
    assert capture.exit_code == 0, capture.stderr
    assert max(seen) <= 32 + 4  # the record plus the template's "Text:" / "Label:" words
    assert "truncated to that public cap" in " ".join(capture.stdout.split())


class Unreachable(LengthTimedEngine):
    def score_choices_batch(self, prefix, suffixes, choices):
        raise EngineError("could not reach http://127.0.0.1:9/v1 after 3 tries")


def test_an_unreachable_engine_fails_the_preflight_before_any_charge(tmp_path, monkeypatch) -> None:
    capture = run_twin(tmp_path, base_rows(40), monkeypatch, SCHEDULE, engine_factory=Unreachable)
    assert capture.exit_code == 1
    line = assert_clean_failure(capture, (SECRET,))
    assert "preflight" in line and "before anything was charged" in line
    assert ledger_entries(capture.run_dir) == 0


def failing_on_third_private_record():
    """Fails from the third private record scored on; its message quotes the record and a private count."""

    class ThirdRecordFails(LengthTimedEngine):
        private_records = 0

        def score_choices_batch(self, prefix, suffixes, choices):
            if any(SECRET in s for s in suffixes):
                ThirdRecordFails.private_records += len(suffixes)
                if ThirdRecordFails.private_records >= 3:
                    raise EngineError(f"input needs 3520 tokens but the context holds 2048: {suffixes[0]!r}")
            return super().score_choices_batch(prefix, suffixes, choices)

    return ThirdRecordFails


def secret_rows(n: int) -> list[tuple[str, str]]:
    return [(f"{text} {SECRET}", label) for text, label in base_rows(n)]


def test_an_engine_failing_on_private_records_scores_them_zero_and_the_run_ends(tmp_path, monkeypatch) -> None:
    # Failures on private records are data: each failed record scores 0, the run ends as planned
    # (exit 0), and only the operator's errors log holds the engine's text.
    capture = run_twin(tmp_path, secret_rows(40), monkeypatch, SCHEDULE, engine_factory=failing_on_third_private_record())
    assert capture.exit_code == 0, capture.stderr
    for name, data in capture.released.items():
        for word in (SECRET, "3520", "2048"):
            assert word.encode() not in data, (name, word)
    ledger = PrivacyLedger.from_jsonl(capture.run_dir / "ledger.jsonl")
    assert [e.label.split(":")[0] for e in ledger.entries] == ["generation 0", "generation 1"]
    errors = (capture.run_dir / "operator" / "errors.log").read_text()
    assert "3520" in errors and "failed to score" in errors


def test_a_noisy_share_of_failures_stops_the_run_with_exit_code_3(tmp_path, monkeypatch) -> None:
    # With dp.max_error_share the count of failed records is released with the scores (one charge)
    # and a share above the threshold stops the run: a DP decision, said with DP values only.
    capture = run_twin(tmp_path, secret_rows(40), monkeypatch,
                       SCHEDULE.replace("generations = 2", "generations = 4") + "max_error_share = 0.5\n",
                       engine_factory=failing_on_third_private_record())
    assert capture.exit_code == 3, capture.stdout + capture.stderr
    result = json.loads(capture.released["result.json"])
    assert result["stopped_because"].startswith("stopped on failures") and result["generations_run"] < 4
    metrics = [json.loads(line) for line in capture.released["metrics.jsonl"].decode().splitlines()]
    assert metrics[-1]["error_share_estimate"] > 0.5 and metrics[-1]["error_share_noise_std"] > 0
    ledger = PrivacyLedger.from_jsonl(capture.run_dir / "ledger.jsonl")
    assert len(ledger.entries) == result["generations_run"]  # the count rides on each scoring charge
    assert all(e.metadata["error_noise_multiplier"] == 3 * e.metadata["noise_multiplier"] for e in ledger.entries)
    flat = " ".join(capture.stdout.split())
    assert "stopped on failures" in flat and SECRET not in flat and "3520" not in flat


def worker_dies_on_third_call():
    """A scoring backend that dies (a worker process lost) on its third call, quoting a record."""
    from dp_textgrad.dp_es.scoring_backends import LocalScoring

    totals = LocalScoring.totals
    calls = [0]

    def dying(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError(f"worker lost while scoring {SECRET}: 3520 tokens")
        return totals(self, *args, **kwargs)

    return dying


def test_a_dying_scoring_worker_keeps_the_charge_and_resumes(tmp_path, monkeypatch) -> None:
    from dp_textgrad.dp_es.scoring_backends import LocalScoring

    monkeypatch.setattr(LocalScoring, "totals", worker_dies_on_third_call())
    capture = run_twin(tmp_path, secret_rows(40), monkeypatch, SCHEDULE.replace("generations = 2", "generations = 3"))
    monkeypatch.undo()
    assert capture.exit_code == 1
    line = assert_clean_failure(capture, (SECRET, "3520"))
    assert "charge for this step stays in the ledger" in line and "--resume" in line
    run_dir = capture.run_dir
    assert ledger_entries(run_dir) == 3  # two generations, then the third's charge: kept after the failure
    assert json.loads((run_dir / "checkpoint.json").read_text())["generation"] == 2
    errors = (run_dir / "operator" / "errors.log").read_text()
    assert "3520" in errors  # the operator keeps the detail, apart from what is shared

    from typer.testing import CliRunner

    from dp_textgrad import cli
    from dp_textgrad.settings import EngineSection

    monkeypatch.setattr(EngineSection, "build", lambda section: LengthTimedEngine())
    resumed = CliRunner().invoke(cli.app, ["optimize", "--resume", str(run_dir)])
    # The failed step's charge stays spent and is taken over, not paid again: the engine's
    # scores are deterministic, so the same secret subsample is scored again and the noise
    # drawn afresh (docs/privacy.md, "Interruptions"); the whole plan fits and the run ends.
    assert resumed.exit_code == 0, resumed.output
    assert "Stopped early" not in " ".join(resumed.output.split())
    ledger = PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl")
    # The failed step's charge stays, once: the ledger is the plan's three generations.
    labels = [e.label for e in ledger.entries if e.label.startswith("generation ")]
    assert [label.split(":")[0] for label in labels] == ["generation 0", "generation 1", "generation 2"]
    assert ledger.epsilon() <= 4.0 + 1e-9
    result = json.loads((run_dir / "result.json").read_text())
    assert result["epsilon"] == pytest.approx(ledger.epsilon())
    # Public usage counts every generation of the run, those before the resume included.
    history = result["history"]
    assert result["public_usage"]["calls"] == sum(h["public_calls"] for h in history)
    assert result["public_usage"]["prompt_tokens"] == sum(h["public_prompt_tokens"] for h in history)


DRIVER_IMPORTS = textwrap.dedent("""
    import sys
    from dp_textgrad import cli
    from dp_textgrad.dp_es.scoring_backends import LocalScoring
    from dp_textgrad.settings import EngineSection
    from tests.privacy.test_release_boundary import worker_dies_on_third_call
    from tests.twin import LengthTimedEngine
""")
DRIVER = textwrap.dedent("""
    EngineSection.build = lambda section: LengthTimedEngine()
    LocalScoring.totals = worker_dies_on_third_call()
    sys.argv = ["dp-textgrad", "--debug", "optimize", "--config", sys.argv[1]]
    cli.app()
""")


def test_debug_traceback_shows_no_locals_and_no_private_value(tmp_path, monkeypatch) -> None:
    # Build the run's files with the harness, then rerun the same config in a subprocess.
    from dp_textgrad.dp_es.scoring_backends import LocalScoring

    schedule = SCHEDULE.replace("generations = 2", "generations = 3")
    monkeypatch.setattr(LocalScoring, "totals", worker_dies_on_third_call())
    capture = run_twin(tmp_path, secret_rows(40), monkeypatch, schedule)
    assert capture.exit_code == 1
    env = {**os.environ, "COLUMNS": "120", "TERM": "dumb"}
    done = run_driver(DRIVER_IMPORTS, DRIVER, str(tmp_path / "run.toml"), cwd=tmp_path, env=env,
                      expect_exit=1, raises="RuntimeError")
    output = done.output
    # What ended the run is the private-scoring failure, re-raised by the CLI as its
    # release-safe RuntimeError (the backend's own message never reaches the console).
    flat = " ".join(done.stderr.split())
    assert "Traceback (most recent call last)" in flat, output[-3000:]  # --debug: the traceback, not one line
    assert "except PrivateScoringError as exc:" in flat, output[-3000:]
    assert ("RuntimeError: generation 2: noisy scores of 3 candidates: scoring the private records failed "
            "(engine or task error); the charge for this step stays in the ledger; resume with") in flat, flat[-3000:]
    assert "worker lost" not in output  # the backend's own error stays inside
    for word in (SECRET, "3520"):
        assert word not in output, word
    assert "locals" not in output.lower()


def test_private_scoring_errors_carry_no_context() -> None:
    from dp_textgrad.privacy.data import PrivateScoringError
    from dp_textgrad.dp_es.scorer import DPScorer

    def boom():
        raise ValueError(f"record {SECRET} has 3520 tokens")

    with pytest.raises(PrivateScoringError) as caught:
        DPScorer._read_private("generation 1: noisy scores", boom)
    error = caught.value
    assert error.__context__ is None and error.__cause__ is None
    assert SECRET not in str(error) and "3520" not in str(error)
    assert SECRET in error.operator_detail


def test_loader_prints_no_statistics_of_the_private_file(tmp_path, recwarn) -> None:
    from dp_textgrad.tasks.loaders import build_task_from_files

    rows = [("charged twice", "bill")] * 30 + [("app crashes", "tech")]
    for name in ("train.csv", "test.csv"):
        (tmp_path / name).write_text("text,label\n" + "\n".join(f"{t},{label}" for t, label in rows) + "\n")
    build_task_from_files("t", tmp_path / "train.csv", tmp_path / "test.csv")
    private_warnings = [str(w.message) for w in recwarn if "train.csv" in str(w.message)]
    assert private_warnings == []


def test_callbacks_and_results_carry_only_released_fields() -> None:
    from dp_textgrad.dp_es.reports import GenerationReport, GenerationTelemetry, SearchResult

    for name in GenerationReport.__dataclass_fields__:
        assert release.classify("metrics", name) != release.OPERATOR_ONLY, name
    for name in GenerationTelemetry.__dataclass_fields__:
        assert release.classify("metrics", name) == release.OPERATOR_ONLY, name
    for name in SearchResult.__dataclass_fields__:
        assert release.classify("result", name) != release.OPERATOR_ONLY, name


def test_warnings_raised_while_private_records_are_read_stay_inside() -> None:
    import warnings

    from dp_textgrad.dp_es.scorer import DPScorer

    def noisy_read():
        warnings.warn(f"record {SECRET} is odd", RuntimeWarning)
        return 7

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert DPScorer._read_private("generation 0", noisy_read) == 7
    assert not [w for w in caught if SECRET in str(w.message)]


def test_the_private_files_path_is_operator_only(tmp_path, monkeypatch) -> None:
    # The command line's settings hold the private file's absolute path: they stay under operator/
    # (issue 47). What is released names the file only as the run file did (the task's label).
    capture = run_twin(tmp_path, base_rows(40), monkeypatch, SCHEDULE)
    assert capture.exit_code == 0, capture.stderr
    private_dir = str(tmp_path / "data").encode()
    leaks = [name for name, data in capture.released.items() if private_dir in data]
    assert not leaks, leaks
    assert "cli_settings.json" not in capture.released
    settings = json.loads(capture.operator["operator/cli_settings.json"])
    assert settings["task"]["train"].endswith("train.csv")
