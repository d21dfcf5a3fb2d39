"""Budgets across crashes and reruns, through the command line (issue: a budget you can trust).

Each test reproduces one finding: reruns spending again unseen, a crash in generation 0
that could not be resumed or left no run-log line, a kill after result.json, an early
stop that exited 0 without saying why. Scripted engine only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli, runs
from dp_textgrad.settings import EngineSection
from dp_textgrad.engines.base import EngineError
from dp_textgrad.privacy.accounting import PrivacyLedger
from dp_textgrad.privacy.accounting.lifetime import LifetimeBudget
from tests.test_cli import CUES, scripted, write_csv

runner = CliRunner()
FLAGS = ["--epsilon", "4", "--generations", "2", "--population", "3", "--parents", "2", "--sampling-rate", "0.5",
         "--seed", "1"]


def log_lines(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "run_metadata.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture()
def files(tmp_path) -> dict[str, Path]:
    (tmp_path / "data").mkdir()
    write_csv(tmp_path / "data" / "train.csv", 120)
    write_csv(tmp_path / "data" / "test.csv", 15)
    return {"train": tmp_path / "data" / "train.csv", "test": tmp_path / "data" / "test.csv",
            "runs": tmp_path / "runs"}


def optimize(files, *extra: str, engine=None, monkeypatch=None):
    monkeypatch.setattr(EngineSection, "build", lambda section: engine if engine is not None else scripted())
    return runner.invoke(cli.app, ["optimize", "--train", str(files["train"]), "--test", str(files["test"]),
                                   "--runs-root", str(files["runs"]), *FLAGS, *extra], terminal_width=240)


def store_charges(files) -> int:
    store = LifetimeBudget(runs.lifetime_store(files["runs"]))
    return sum(r.charges for d in store.datasets() for r in store.runs(d))


def test_rerun_on_the_same_data_is_shown_and_composed(files, monkeypatch) -> None:
    first = optimize(files, monkeypatch=monkeypatch)
    assert first.exit_code == 0, first.output
    assert "Lifetime budget" in first.output and "no earlier charges" in first.output
    # The same records in another order are the same dataset.
    lines = files["train"].read_text().splitlines()
    files["train"].write_text("\n".join([lines[0]] + lines[:0:-1]) + "\n")
    second = optimize(files, monkeypatch=monkeypatch)
    assert second.exit_code == 0, second.output
    assert "Lifetime budget" in second.output and "spent in" in second.output
    listing = runner.invoke(cli.app, ["ledger", "--dataset", str(files["train"]), "--runs-root", str(files["runs"])],
                            terminal_width=240)
    assert listing.exit_code == 0, listing.output
    assert listing.output.count("run-") == 2 and "all charges composed" in listing.output
    spent = [json.loads(p.read_text())["epsilon"] for p in files["runs"].glob("run-*/result.json")]
    lifetime = float(listing.output.split("lifetime epsilon ")[1].split()[0])
    assert max(spent) < lifetime < sum(spent)  # composed across runs (PLD), not summed
    other = files["train"].with_name("other.csv")
    write_csv(other, 90)
    fresh = runner.invoke(cli.app, ["ledger", "--dataset", str(other), "--runs-root", str(files["runs"])])
    assert fresh.exit_code == 0 and "no runs recorded" in fresh.output


def test_lifetime_cap_refuses_before_any_charge_and_an_override_is_recorded(files, monkeypatch) -> None:
    assert optimize(files, monkeypatch=monkeypatch).exit_code == 0
    charges = store_charges(files)
    refused = optimize(files, "--lifetime-cap", "5", monkeypatch=monkeypatch)
    assert refused.exit_code == 2, refused.output
    assert "lifetime budget" in refused.stderr and "--override-lifetime-cap" in refused.stderr
    assert store_charges(files) == charges
    for ledger in files["runs"].glob("run-*/ledger.jsonl"):  # the refused run's ledger holds no charge
        assert len(PrivacyLedger.from_jsonl(ledger).entries) in (0, charges)
    forced = optimize(files, "--lifetime-cap", "5", "--override-lifetime-cap", monkeypatch=monkeypatch)
    assert forced.exit_code == 0, forced.output
    assert "OVERRIDDEN" in forced.output
    headers = [json.loads(p.read_text().splitlines()[0]) for p in files["runs"].glob("run-*/ledger.jsonl")]
    assert {"cap": 5.0, "cap_overridden": True} in [h["lifetime"] for h in headers]


def crashing(files, *extra: str, monkeypatch) -> object:
    """An optimize run whose scoring worker dies in generation 0, after the charge (a crash
    mid-generation; a failure on a record is data and would not end the run)."""
    from dp_textgrad.dp_es.scoring_backends import LocalScoring

    def dies(self, *args, **kwargs):
        raise RuntimeError("scoring worker lost")

    with pytest.MonkeyPatch.context() as crash:
        crash.setattr(LocalScoring, "totals", dies)
        return optimize(files, *extra, monkeypatch=monkeypatch)


def inexact_engine():
    """The scripted engine without the promise of deterministic scores (like a real engine's): a
    resumed run cannot replay the interrupted charge and pays it again (docs/privacy.md, "Interruptions")."""
    engine = scripted()
    engine.deterministic_scores = False
    return engine


def test_a_crash_in_generation_0_resumes_keeps_its_charge_and_says_why_it_stops(files, monkeypatch) -> None:
    three = ("--generations", "3")
    crashed = crashing(files, *three, monkeypatch=monkeypatch)
    assert crashed.exit_code == 1, crashed.output
    (run_dir,) = files["runs"].glob("run-*")
    assert "--resume" in crashed.stderr
    assert [line["event"] for line in log_lines(files["runs"])] == ["started", "failed"]  # the run log knows
    spent = PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl")
    # Generation 0's charge (after the DP count of N, when N is not declared), in the store too.
    assert spent.entries[-1].label.startswith("generation 0") and store_charges(files) == len(spent.entries)
    # A kill between the store's write and the ledger file's: the ledger file lost its last entry.
    lines = (run_dir / "ledger.jsonl").read_text().splitlines()
    (run_dir / "ledger.jsonl").write_text("\n".join(lines[:-1]) + "\n")

    monkeypatch.setattr(EngineSection, "build", lambda section: inexact_engine())
    resumed = runner.invoke(cli.app, ["optimize", "--resume", str(run_dir)], terminal_width=240)
    text = " ".join(resumed.output.split())
    after = PrivacyLedger.from_jsonl(run_dir / "ledger.jsonl")
    assert after.entries[len(spent.entries) - 1].event_dict == spent.entries[-1].event_dict  # adopted, not lost
    assert after.epsilon() > spent.epsilon() and store_charges(files) == len(after.entries)  # they agree
    assert "already spent" in text and "interrupted generation" in text
    # Generation 0 runs again; the lost charge means the third generation no longer fits: said, exit 3.
    assert resumed.exit_code == 3, resumed.output
    result = json.loads((run_dir / "result.json").read_text())
    assert 1 <= result["generations_run"] < 3 and "interrupted generation" in result["stopped_because"]
    assert f"Stopped early after {result['generations_run']} of 3 generations" in text
    events = [line["event"] for line in log_lines(files["runs"])]
    assert events == ["started", "failed", "resumed", "finished"]
    assert log_lines(files["runs"])[-1]["stopped_early"] is True


def test_a_crash_whose_lost_charge_leaves_no_room_says_so(files, monkeypatch) -> None:
    assert crashing(files, monkeypatch=monkeypatch).exit_code == 1
    (run_dir,) = files["runs"].glob("run-*")
    monkeypatch.setattr(EngineSection, "build", lambda section: inexact_engine())
    resumed = runner.invoke(cli.app, ["optimize", "--resume", str(run_dir)])
    assert resumed.exit_code == 1
    assert "interrupted generation" in resumed.stderr and "nothing was released" in resumed.stderr


def test_a_kill_after_result_json_loses_no_run_log_line(files, monkeypatch) -> None:
    assert optimize(files, monkeypatch=monkeypatch).exit_code == 0
    (run_dir,) = files["runs"].glob("run-*")
    log = files["runs"] / "run_metadata.jsonl"
    kept = [line for line in log.read_text().splitlines() if '"finished"' not in line]
    log.write_text("\n".join(kept) + "\n")  # as if killed right after result.json
    again = runner.invoke(cli.app, ["optimize", "--resume", str(run_dir)])
    assert again.exit_code == 2 and "restored" in again.stderr
    assert [line["event"] for line in log_lines(files["runs"])] == ["started", "finished"]
    assert runner.invoke(cli.app, ["optimize", "--resume", str(run_dir)]).stderr.count("restored") == 0


def test_early_stop_by_budget_exits_3_and_says_so(files, monkeypatch) -> None:
    from dp_textgrad.dp_es import optimizer as optimizer_module

    # The ledger refuses generation 1's charge (as a lost charge would): a prompt is still released.
    real_spend = PrivacyLedger.spend

    def spend(self, event, label, metadata=None):
        if label.startswith("generation 1"):
            from dp_textgrad.privacy.accounting import BudgetExceeded

            raise BudgetExceeded(label, 9.9, self.epsilon_budget, self.delta)
        return real_spend(self, event, label, metadata)

    monkeypatch.setattr(PrivacyLedger, "spend", spend)
    assert optimizer_module  # the optimizer calls the patched method through the ledger
    result = optimize(files, monkeypatch=monkeypatch)
    assert result.exit_code == 3, result.output
    assert "Stopped early after 1 of 2 generations" in " ".join(result.output.split())
    (run_dir,) = files["runs"].glob("run-*")
    saved = json.loads((run_dir / "result.json").read_text())
    assert saved["stopped_because"].startswith("budget exhausted before generation 2 of 2")
    finished = [line for line in log_lines(files["runs"]) if line["event"] == "finished"]
    assert finished[0]["stopped_early"] is True and "budget exhausted" in finished[0]["stopped_because"]


def test_a_non_private_baseline_says_before_it_runs_that_the_lifetime_becomes_infinite(files, monkeypatch) -> None:
    # Correct, but surprising: a baseline reads the records without noise, so every later run on
    # the same data shows an infinite lifetime bound. Said before it runs, with the scratch key (issue 47).
    config = files["runs"].parent / "baseline.toml"
    config.write_text('[dp]\nprivacy = "off"\n', encoding="utf-8")
    baseline = optimize(files, "--config", str(config), monkeypatch=monkeypatch)
    assert baseline.exit_code == 0, baseline.output
    text = " ".join(baseline.output.split())
    assert "THIS RUN IS NOT PRIVATE" in text and "--dataset-key scratch-baselines" in text
    assert text.index("THIS RUN IS NOT PRIVATE") < text.index("Budget")  # before anything runs
    later = optimize(files, monkeypatch=monkeypatch)
    assert "inf (a run was not private)" in " ".join(later.output.split()) or "were not private" in later.output
    # Under the scratch key the data's own lifetime stays finite.
    scratch = optimize(files, "--config", str(config), "--dataset-key", "scratch-baselines", monkeypatch=monkeypatch)
    assert scratch.exit_code == 0 and "THIS RUN IS NOT PRIVATE" not in " ".join(scratch.output.split())


def test_cues_cover_the_labels() -> None:
    assert len(CUES) == 5


def test_an_unreachable_server_is_found_before_any_charge(files, monkeypatch) -> None:
    # Finding 2: epsilon was spent, then the run failed on the engine. The real OpenAI engine
    # at a loopback port nobody listens on: preflight stops the run before the first charge.
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends
    config = files["train"].parent / "run.toml"
    config.write_text(f'[engine]\nkind = "openai"\nmodel = "nobody"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
                      '[engine.options]\ntimeout = 2\nmax_retries = 0\n', encoding="utf-8")
    result = runner.invoke(cli.app, ["optimize", "--config", str(config), "--train", str(files["train"]),
                                     "--test", str(files["test"]), "--runs-root", str(files["runs"]), *FLAGS],
                           terminal_width=240)
    assert result.exit_code == 1, result.output
    assert "preflight" in result.stderr and "before anything was charged" in result.stderr
    for ledger in files["runs"].glob("run-*/ledger.jsonl"):
        assert PrivacyLedger.from_jsonl(ledger).entries == []
    assert store_charges(files) == 0


def test_an_unwritable_runs_root_is_found_before_any_charge(files, monkeypatch) -> None:
    # A runs root that cannot hold a run directory (here under a regular file: unwritable
    # even for root, unlike a read-only directory) stops the run before any charge.
    blocked = files["train"].parent / "not-a-directory"
    blocked.write_text("a file\n", encoding="utf-8")
    files["runs"] = blocked / "runs"
    result = optimize(files, monkeypatch=monkeypatch)
    assert result.exit_code in (1, 2), result.output
    assert "output.runs_root: cannot create a run directory" in result.stderr and "nothing was charged" in result.stderr
    assert blocked.read_text() == "a file\n"


def test_a_declared_dataset_key_composes_versions_of_the_data(files, monkeypatch) -> None:
    # Issue 35, item 7: runs on D and on D plus one record were two datasets (keyed by content),
    # so a person in both was under-counted. The owner names the dataset; its versions share it.
    first = optimize(files, "--dataset-key", "support-tickets", monkeypatch=monkeypatch)
    assert first.exit_code == 0, first.output
    assert "dataset key 'support-tickets'" in " ".join(first.output.split())
    write_csv(files["train"], 121)  # the next version: one record more
    second = optimize(files, "--dataset-key", "support-tickets", monkeypatch=monkeypatch)
    assert second.exit_code == 0, second.output
    text = " ".join(second.output.split())
    assert "dataset key 'support-tickets'" in text and "spent in" in text
    listing = runner.invoke(cli.app, ["ledger", "--dataset", "support-tickets", "--runs-root", str(files["runs"])],
                            terminal_width=240)
    assert listing.exit_code == 0, listing.output
    assert listing.output.count("run-") == 2 and "support-tickets" in listing.output
    config = files["train"].parent / "owner.toml"
    config.write_text('[output]\ndataset_key = "support-tickets"\n', encoding="utf-8")
    for how in (["--dataset-key", "support-tickets"], ["--config", str(config), "--task", "support"]):
        again = runner.invoke(cli.app, ["ledger", *how, "--runs-root", str(files["runs"])], terminal_width=240)
        assert again.exit_code == 0 and again.output == listing.output, again.output
    # Without a key the new version is another dataset: the console says what it charges.
    third = optimize(files, monkeypatch=monkeypatch)
    assert third.exit_code == 0, third.output
    assert "no earlier charges" in third.output and "fingerprint" in " ".join(third.output.split())
