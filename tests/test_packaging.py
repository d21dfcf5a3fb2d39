"""The package as a distribution: licence metadata in pyproject.toml and the wheel it builds.

setuptools deprecated ``project.license`` as a TOML table (PEP 639); it warns on every build
and says such builds stop being supported after 2027-02-18. The project declares its licence
as an SPDX expression with ``license-files``, and the wheel carries the licence text.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

from tests.subprocess_driver import run_driver

REPO_ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = REPO_ROOT / "pyproject.toml"
# PEP 639's fields are read from setuptools 77.0.0 on; 77.0.3 fixed its first license-files bugs.
PEP_639_SETUPTOOLS = (77, 0, 3)


def _pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


def _setuptools_floor(requires: list[str]) -> tuple[int, ...]:
    """The lowest setuptools version that build-system.requires allows (``setuptools>=X.Y.Z``)."""
    for requirement in requires:
        found = re.fullmatch(r"\s*setuptools\s*>=\s*([0-9][0-9.]*)\s*", requirement)
        if found:
            return tuple(int(part) for part in found.group(1).split("."))
    raise AssertionError(f"build-system.requires has no 'setuptools>=X' floor: {requires}")


def test_license_is_an_spdx_expression_with_its_file() -> None:
    project = _pyproject()["project"]
    assert project.get("license") == "MIT", (
        f"project.license must be the SPDX string 'MIT' (PEP 639), not {project.get('license')!r}")
    assert project.get("license-files") == ["LICENSE"]
    license_text = (REPO_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License")
    assert "Copyright (c) 2026 The dp-textgrad authors" in license_text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\"" in license_text
    # No licence classifier beside the expression: setuptools refuses the two together.
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]


def test_build_requires_a_setuptools_that_reads_pep_639() -> None:
    requires = _pyproject()["build-system"]["requires"]
    floor = _setuptools_floor(requires)
    assert floor >= PEP_639_SETUPTOOLS, (
        f"setuptools>={'.'.join(map(str, floor))} cannot read a PEP 639 licence expression; "
        f"require setuptools>={'.'.join(map(str, PEP_639_SETUPTOOLS))}")


# -- the contributor guide names only files, tests and modules that exist -----------------------
# A repository path (a top-level folder followed by a path) or a file name with its folders
# (``dp_es/selector.py``, resolved under the repository or the package); ``::name`` a test in it.
_GUIDE_PATH = re.compile(r"(?<![\w/.<-])((?:[\w*.-]+/)*[\w*-]+\.(?:py|md|toml)"
                         r"|(?:\.ci|tests|dp_textgrad|benchmarks|docs)/[\w/*.-]*[\w*])(?:::(\w+))?")
_GUIDE_MODULE = re.compile(r"python -m (dp_textgrad(?:\.\w+)+)")
_GUIDE_LINK = re.compile(r"\]\(([^)#:]+)(?:#([\w-]+))?\)")


def _guide_problems(text: str) -> list[str]:
    """What a guide's text names that the repository lacks: paths, ``file::test`` names, ``python -m``
    modules and relative links (with their heading anchors)."""
    problems = []
    for found in _GUIDE_PATH.finditer(text):
        path, test = found.group(1), found.group(2)
        matches = [m for base in (REPO_ROOT, REPO_ROOT / "dp_textgrad") for m in base.glob(path)]
        if not matches:
            problems.append(f"no such path: {path}")
        elif test and not any(re.search(rf"^def {test}\(", m.read_text(encoding="utf-8"), re.MULTILINE)
                              for m in matches if m.is_file()):
            problems.append(f"no test {test} in {path}")
    for found in _GUIDE_MODULE.finditer(text):
        parts = found.group(1).split(".")
        if not (REPO_ROOT.joinpath(*parts).with_suffix(".py").is_file()
                or REPO_ROOT.joinpath(*parts, "__main__.py").is_file()):
            problems.append(f"no module to run: {found.group(1)}")
    for found in _GUIDE_LINK.finditer(text):
        target, anchor = REPO_ROOT / found.group(1), found.group(2)
        if not target.exists():
            problems.append(f"broken link: {found.group(1)}")
        elif anchor:
            headings = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                        for line in target.read_text(encoding="utf-8").splitlines() if line.startswith("#")}
            if anchor not in headings:
                problems.append(f"no heading #{anchor} in {found.group(1)}")
    return problems


def test_the_contributor_guide_names_what_exists() -> None:
    problems = _guide_problems((REPO_ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    assert not problems, "CONTRIBUTING.md is out of date:\n" + "\n".join(problems)


def test_the_guide_check_finds_a_missing_file_test_module_and_anchor() -> None:
    planted = ("Run `python -m pytest tests/privacy/test_gone.py` and `tests/test_packaging.py::test_gone`, "
               "edit `dp_es/gone.py`, run `python -m dp_textgrad.gone`, read "
               "[the boundary](docs/privacy.md#no-such-heading) and [x](docs/gone.md).")
    assert set(_guide_problems(planted)) == {
        "no such path: tests/privacy/test_gone.py", "no test test_gone in tests/test_packaging.py",
        "no such path: dp_es/gone.py", "no module to run: dp_textgrad.gone",
        "no heading #no-such-heading in docs/privacy.md", "broken link: docs/gone.md",
        "no such path: docs/gone.md"}
    assert _guide_problems("see `runs.py`, `dp_es/selector.py`, `.ci/run` and "
                           "[privacy](docs/privacy.md#the-release-boundary)") == []


@pytest.mark.slow
def test_wheel_builds_without_deprecation_and_carries_the_license(tmp_path: Path) -> None:
    """Build the wheel as pip does (isolated build environment, verbose so the backend's
    warnings show) from a copy of the sources, so no ``build/`` left in the checkout can add
    stale modules, and the checkout is not written to."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO_ROOT / name).exists():  # a missing LICENSE fails below, on the wheel's contents
            shutil.copy2(REPO_ROOT / name, source / name)
    shutil.copytree(REPO_ROOT / "dp_textgrad", source / "dp_textgrad",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheels"
    # pip as `python -m pip`, through the driver helper (a pip that fails fails the test with its log).
    pip_main = "sys.argv[0] = 'pip'\nrunpy.run_module('pip', run_name='__main__', alter_sys=True)"
    log = run_driver("import runpy, sys", pip_main, "wheel", str(source), "--no-deps", "-v", "-w", str(out),
                     cwd=tmp_path, timeout=600).output
    # The backend ran (its own lines reach the verbose log), so a missing warning means something.
    assert "running bdist_wheel" in log, f"the build backend's output is not in the log:\n{log[-4000:]}"
    assert "SetuptoolsDeprecationWarning" not in log, log[log.find("SetuptoolsDeprecationWarning") - 500:][:3000]
    assert not re.search(r"(?i)warning.*licen[cs]e", log), log[-4000:]

    wheels = list(out.glob("dp_textgrad-*.whl"))
    assert len(wheels) == 1, f"expected one wheel, found {wheels}"
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        licenses = [n for n in names if re.fullmatch(r"dp_textgrad-[^/]+\.dist-info/licenses/LICENSE", n)]
        assert licenses, f"no LICENSE in the wheel's .dist-info/licenses: {[n for n in names if 'dist-info' in n]}"
        assert wheel.read(licenses[0]) == (REPO_ROOT / "LICENSE").read_bytes()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(metadata_name).decode("utf-8")
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: MIT" in headers, "\n".join(headers)
    assert "License-File: LICENSE" in headers, "\n".join(headers)
    assert not [h for h in headers if h.startswith("License:")], "the deprecated License field is still written"
