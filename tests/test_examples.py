"""The example scripts run as users run them."""

from __future__ import annotations

from pathlib import Path

from tests.subprocess_driver import run_script

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_scripted_runs_and_prints_the_ledger(tmp_path: Path) -> None:
    proc = run_script(ROOT / "examples" / "quickstart_scripted.py", cwd=tmp_path, timeout=600)
    out = proc.stdout
    assert "released prompt:" in out
    assert "ledger:" in out
    # The scripted "model" reads the support task's labels: a prompt listing them must win.
    (accuracy_line,) = [line for line in out.splitlines() if line.startswith("test accuracy")]
    seed_accuracy = float(accuracy_line.split("seed ")[1].split(",")[0])
    released_accuracy = float(accuracy_line.split("released ")[1])
    assert released_accuracy > seed_accuracy + 0.1, accuracy_line
    ledger_lines = [line for line in out.splitlines() if line.strip().startswith("[") and "epsilon so far" in line]
    # The DP count of N first (the example declares no size), then one charge per generation.
    assert len(ledger_lines) == 6
    assert "dataset size: DP count" in ledger_lines[0]
    final = float(ledger_lines[-1].split("epsilon so far")[1].split()[0])
    assert 0 < final <= 4.0 + 1e-6
    assert not (tmp_path / "logs").exists()
