"""`dp-textgrad audit` is mounted on the main CLI."""

from typer.testing import CliRunner

from dp_textgrad.cli import app


def test_audit_is_a_subcommand_of_the_main_cli() -> None:
    result = CliRunner().invoke(app, ["audit", "mechanisms", "--help"])
    assert result.exit_code == 0, result.output
    assert "--runs" in result.output


def test_audit_mechanisms_runs_from_the_main_cli(tmp_path) -> None:
    result = CliRunner().invoke(app, ["audit", "mechanisms", "--runs", "1000", "--controller-runs", "60",
                                      "--only", "exponential", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run_metadata.jsonl").exists()
