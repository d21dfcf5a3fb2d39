"""``dp-textgrad report``: rebuild a finished run's report; optionally check and screenshot
it in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import typer

from dp_textgrad.cli._console import EXIT_BAD_INPUT, EXIT_FAILURE, bad_input_types, console, fail


def report(
    run_dir: Path = typer.Argument(..., help="a run directory under runs/"),
    check: bool = typer.Option(
        False,
        "--check",
        help="load report.html in headless Chromium: fail on script or "
        "console errors and on images that do not display",
    ),
    screenshot: Path | None = typer.Option(
        None, "--screenshot", help="also save a PNG of report.html as headless Chromium draws it (implies --check)"
    ),
) -> None:
    """Rebuild report.md and report.html of a finished run."""

    try:
        from dp_textgrad.report import HTML_NAME, write_report

        if not run_dir.is_dir():
            raise FileNotFoundError(f"run_dir: {run_dir} is not a directory")
        path = write_report(run_dir)
    except bad_input_types() as exc:
        fail(exc, EXIT_BAD_INPUT)
    console.print(f"Report: {path} and {path.with_name(HTML_NAME)}", soft_wrap=True)
    if not (check or screenshot):
        return
    from dp_textgrad.report.browser import BrowserUnavailable, check_page
    from dp_textgrad.report.browser import screenshot as take_screenshot

    try:
        verdict = check_page(path.with_name(HTML_NAME))
        if not verdict.ok:
            raise RuntimeError(
                f"report.html: {len(verdict.errors)} error(s) {verdict.errors[:3]} and "
                f"{len(verdict.broken_images)} image(s) that do not display {verdict.broken_images[:3]}"
            )
        console.print(f"Chromium: no errors, {verdict.images} image(s) displayed")
        if screenshot:
            console.print(f"Screenshot: {take_screenshot(path.with_name(HTML_NAME), screenshot)}", soft_wrap=True)
    except BrowserUnavailable as exc:
        fail(ValueError(f"--check/--screenshot: {exc}"), EXIT_BAD_INPUT)
    except (RuntimeError, OSError) as exc:
        fail(exc, EXIT_FAILURE)
