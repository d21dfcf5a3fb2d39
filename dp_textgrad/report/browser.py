"""Render a report in headless Chromium: screenshot it and check that it displays cleanly.

Chromium is optional (Debian package ``chromium``). The check loads a copy of the page with
a small probe script in front that records script errors, console errors and images that
did not decode, then reads the probe's verdict from the DOM Chromium dumps after loading.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
ENV_VARIABLE = "DP_TEXTGRAD_CHROMIUM"
_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--virtual-time-budget=5000",
)
_MARKER = "dp-textgrad-probe"
_PROBE = """<script>
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    errors.push(e.message || ("failed to load " + ((e.target && (e.target.src || e.target.href)) || "a resource")));
  }, true);
  var original = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, " "));
    original.apply(console, arguments);
  };
  window.addEventListener("load", function () {
    var images = Array.prototype.slice.call(document.images);
    var broken = images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                       .map(function (i) { return i.alt || i.src.slice(0, 40); });
    var out = document.createElement("pre");
    out.id = "{marker}";
    out.textContent = JSON.stringify({images: images.length, broken: broken, errors: errors});
    document.body.appendChild(out);
  });
})();
</script>""".replace("{marker}", _MARKER)


class BrowserUnavailable(RuntimeError):
    """No Chromium executable was found."""


@dataclass
class PageCheck:
    images: int
    broken_images: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.broken_images and not self.errors


def find_chromium() -> str:
    """The Chromium executable: ``$DP_TEXTGRAD_CHROMIUM``, else the first on PATH."""
    explicit = os.environ.get(ENV_VARIABLE)
    if explicit:
        if shutil.which(explicit) is None:
            raise BrowserUnavailable(f"{ENV_VARIABLE}={explicit!r} is not an executable")
        return explicit
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserUnavailable(
        f"no Chromium found on PATH (install the Debian package 'chromium', or set {ENV_VARIABLE} to the executable)"
    )


def _run(arguments: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="dp-textgrad-chromium-") as profile:
        return subprocess.run(
            [find_chromium(), *_FLAGS, f"--user-data-dir={profile}", *arguments],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def check_page(html_file: Path, *, timeout: float = 60.0) -> PageCheck:
    """Load ``html_file`` with the probe in front and report errors and undecodable images."""
    page = Path(html_file).read_text(encoding="utf-8")
    head = page.find("<head>")
    probed = page[: head + 6] + _PROBE + page[head + 6 :] if head >= 0 else _PROBE + page
    with tempfile.TemporaryDirectory(prefix="dp-textgrad-page-") as folder:
        copy = Path(folder) / "page.html"
        copy.write_text(probed, encoding="utf-8")
        done = _run(["--dump-dom", copy.as_uri()], timeout)
    start = done.stdout.find(f'<pre id="{_MARKER}">')
    if start < 0:
        raise RuntimeError(f"chromium did not render the page (exit {done.returncode}): {done.stderr[-500:]}")
    end = done.stdout.index("</pre>", start)
    import html

    verdict = json.loads(html.unescape(done.stdout[start + len(f'<pre id="{_MARKER}">') : end]))
    return PageCheck(int(verdict["images"]), list(verdict["broken"]), list(verdict["errors"]))


def screenshot(
    html_file: Path, png_file: Path, *, width: int = 1000, height: int = 3200, timeout: float = 60.0
) -> Path:
    """A PNG of the page as Chromium draws it at ``width`` x ``height`` CSS pixels."""
    png_file = Path(png_file).resolve()
    png_file.parent.mkdir(parents=True, exist_ok=True)
    done = _run(
        [f"--window-size={width},{height}", f"--screenshot={png_file}", Path(html_file).resolve().as_uri()], timeout
    )
    if not png_file.exists() or png_file.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-500:]}")
    return png_file
