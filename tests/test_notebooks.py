"""The example notebooks run top to bottom, and docs/api.md matches the docstrings."""

from __future__ import annotations

import importlib.util
import re
import runpy
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CELL_TIMEOUT_S = 600

needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama_cpp is not installed (pip install -e '.[local]')",
)
needs_dspy = pytest.mark.skipif(
    importlib.util.find_spec("dspy") is None,
    reason="dspy is not installed (pip install -e '.[dspy]')",
)


def execute_notebook(name: str, workdir: Path) -> nbformat.NotebookNode:
    """Run every cell in a fresh python3 kernel with ``workdir`` as cwd; raise on any cell error."""
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",  # ipykernel registers this name for its own environment
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    return notebook


def _outputs_text(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output.get("text", ""))
            elif "data" in output:
                parts.append(str(output["data"].get("text/plain", "")))
    return "".join(parts)


@pytest.mark.parametrize("name", ["quickstart.ipynb", "budget_planning.ipynb", "custom_task.ipynb",
                                  "extraction.ipynb", "dspy.ipynb"])
def test_notebook_is_committed_without_outputs(name: str) -> None:
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: strip outputs"
            # TextGrad only through the side-effect-free importer.
            assert "import textgrad" not in cell.source and "from textgrad" not in cell.source


def test_budget_planning_notebook_runs(tmp_path: Path) -> None:
    notebook = execute_notebook("budget_planning.ipynb", tmp_path)
    text = _outputs_text(notebook)
    assert "noise multiplier z =" in text
    for accountant in ("rdp", "pld", "basic"):
        assert f"{accountant}: epsilon =" in text
    # The plot cell produced a figure.
    assert any(
        "image/png" in output.get("data", {})
        for cell in notebook.cells for output in cell.get("outputs", [])
    )
    assert not list(tmp_path.iterdir()), "the notebook must not write into its working directory"


@pytest.mark.slow
@needs_llama
def test_quickstart_notebook_runs(tmp_path: Path) -> None:
    text = _outputs_text(execute_notebook("quickstart.ipynb", tmp_path))
    assert re.search(r"generation \d+: best noisy estimate -?\d", text)
    spent = re.search(r"epsilon = ([0-9.]+) of ([0-9.]+) at delta", text)
    assert spent and float(spent.group(1)) <= float(spent.group(2))
    assert "test accuracy: seed" in text


@pytest.mark.slow
@needs_llama
def test_custom_task_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DP_TEXTGRAD_BASE_URL", raising=False)  # the server cell must stay inert
    text = _outputs_text(execute_notebook("custom_task.ipynb", tmp_path))
    assert "released prompt:" in text
    assert "skipping the server example" in text


@pytest.mark.slow
@needs_llama
def test_extraction_notebook_runs(tmp_path: Path) -> None:
    text = _outputs_text(execute_notebook("extraction.ipynb", tmp_path))
    assert "metric: exact" in text and "released prompt:" in text
    spent = re.search(r"epsilon spent: ([0-9.]+) of ([0-9.]+)", text)
    assert spent and float(spent.group(1)) <= float(spent.group(2))
    assert re.search(r"test exact \(n=40\): seed [0-9.]+ \[", text) and "McNemar p =" in text
    assert not list(tmp_path.iterdir()), "the notebook must not write into its working directory"


@pytest.mark.slow
@needs_llama
@needs_dspy
def test_dspy_notebook_runs(tmp_path: Path) -> None:
    text = _outputs_text(execute_notebook("dspy.ipynb", tmp_path))
    copied = re.search(r"LabeledFewShot: (\d+) of 24 private messages in the saved program", text)
    assert copied and int(copied.group(1)) > 0  # the stock optimizer ships private records
    assert "DPES: 0 of 24 private messages in the saved program" in text
    spent = re.search(r"guarantee: epsilon = ([0-9.]+) at delta = ", text)
    assert spent and float(spent.group(1)) <= 4.0 + 1e-9
    assert re.search(r"test accuracy \(n=20\): seed instruction [0-9.]+, DPES [0-9.]+, LabeledFewShot [0-9.]+", text)
    assert "instruction and guarantee survive save/load: True" in text
    assert not list(tmp_path.iterdir()), "the notebook must not write into its working directory"


def test_api_reference_matches_docstrings(tmp_path: Path) -> None:
    generator = runpy.run_path(str(REPO / "docs" / "gen_api.py"))
    regenerated = tmp_path / "api.md"
    assert generator["main"](["gen_api.py", str(regenerated)]) == 0
    committed = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    assert regenerated.read_text(encoding="utf-8") == committed, (
        "docs/api.md is out of date: run `python docs/gen_api.py` and commit the result"
    )
