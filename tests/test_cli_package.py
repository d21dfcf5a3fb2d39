"""The ``dp_textgrad.cli`` package: what each command loads, ``python -m dp_textgrad.cli``, the local
model's thread count and the console kept free of other libraries' warnings."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.settings import EngineSection
from tests.subprocess_driver import run_driver

REPO_ROOT = Path(__file__).resolve().parents[1]

LOADED = """
heavy = ["textgrad", "dp_textgrad.engines", "dp_textgrad.workflow", "dp_textgrad.dp_es.optimizer",
         "dp_textgrad.audit.statistics", "dp_textgrad.audit.stats", "sklearn", "matplotlib", "ray", "flwr"]
print("HEAVY", sorted(name for name in heavy if name in sys.modules))
print("ACCOUNTING", "dp_accounting" in sys.modules)
"""


@pytest.mark.parametrize("argv, accounting", [
    (["--help"], False),
    (["budget", "--epsilon", "4", "--generations", "4", "--population", "6", "--dataset-size", "1000"], True),
], ids=["help", "budget"])
def test_a_command_loads_only_what_it_uses(argv: list[str], accounting: bool) -> None:
    # `dp-textgrad --help` and `budget` start fast: no engine, TextGrad, audit statistics or plots.
    body = (f"sys.argv = ['dp-textgrad', *{argv!r}]\n"
            "try:\n    app()\nexcept SystemExit as stop:\n    assert not stop.code, stop.code\n" + LOADED)
    out = run_driver("import sys\nfrom dp_textgrad.cli import app", body).stdout
    assert "HEAVY []" in out, out
    assert f"ACCOUNTING {accounting}" in out, out  # budget calibrates; --help does not even load the accountants
    if accounting:
        assert "noise multiplier z = " in out, out


def test_python_dash_m_runs_the_command_line() -> None:
    # What `python -m dp_textgrad.cli budget ...` runs: the package's __main__ module, as __main__.
    body = ("sys.argv = ['dp_textgrad.cli', 'budget', '--epsilon', '4', '--dataset-size', '1000']\n"
            "try:\n    runpy.run_module('dp_textgrad.cli', run_name='__main__')\n"
            "except SystemExit as stop:\n    assert not stop.code, stop.code\n")
    out = run_driver("import runpy, sys", body, cwd=REPO_ROOT).stdout
    assert "noise multiplier z = " in out and "(smallest valid bound)" in out, out


@pytest.mark.parametrize("argv, expected", [([], 2), (["--threads", "3"], 3)], ids=["environment", "flag"])
def test_audit_canaries_honours_dp_textgrad_threads(monkeypatch, argv: list[str], expected: int) -> None:
    # `audit canaries` built its engine with --threads (default 1) and ignored DP_TEXTGRAD_THREADS.
    monkeypatch.setenv("DP_TEXTGRAD_THREADS", "2")
    built = []

    def build(section: EngineSection):
        built.append(section)
        raise ValueError("engine: stopped here by the test")

    monkeypatch.setattr(EngineSection, "build", build)
    result = CliRunner().invoke(cli.app, ["audit", "canaries", "--canaries", "2", "--records", "2", "--no-log",
                                          *argv])
    assert result.exit_code == cli.EXIT_BAD_INPUT and "stopped here by the test" in result.output, result.output
    (section,) = built
    assert (section.kind, section.options["n_threads"]) == ("llama_cpp", expected)


def test_the_ray_pool_keeps_rays_accelerator_tip_off_the_console(monkeypatch) -> None:
    # `optimize --distributed` opened with Ray's FutureWarning about accelerator variables.
    from dp_textgrad.distributed import RayScoringPool

    class Started(Exception):
        pass

    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: False

    def init(**options) -> None:  # what ray.init emits on every driver start
        warnings.warn("Tip: In future versions of Ray, Ray will no longer override accelerator visible devices "
                      "env var if num_gpus=0 or num_gpus=None (default).", FutureWarning, stacklevel=2)
        warnings.warn("another FutureWarning, not ours to hide", FutureWarning, stacklevel=2)
        raise Started  # no Ray: the test ends here

    fake.init = init
    monkeypatch.setitem(sys.modules, "ray", fake)
    task = types.SimpleNamespace(private_train=[])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Started):
            RayScoringPool(lambda: None, actors=1)(task, None, None, True)
    assert [str(w.message) for w in caught] == ["another FutureWarning, not ours to hide"]
